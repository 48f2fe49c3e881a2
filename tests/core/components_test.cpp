// Built-in registry components: schedules, models, optimizers, datasets.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include "support/test_util.h"
#include "trainer/data.h"
#include "trainer/error.h"
#include "trainer/model.h"
#include "trainer/optim.h"

namespace trainer {
namespace {

std::unique_ptr<LrSchedule> schedule(const std::string& name, const std::string& toml, double lr, std::int64_t total) {
  return schedule_registry().get(name).factory(Config::parse(toml), lr, total);
}

TEST(Schedules, ConstantWarmsUpLinearly) {
  auto s = schedule("constant", "warmup_steps = 4", 1.0, 100);
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.25);
  EXPECT_DOUBLE_EQ(s->lr_at(3), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_at(50), 1.0);
}

TEST(Schedules, StepDecaysEveryStepSize) {
  auto s = schedule("step", "warmup_steps = 0\nstep_size = 10\ngamma = 0.5", 2.0, 100);
  EXPECT_DOUBLE_EQ(s->lr_at(9), 2.0);
  EXPECT_DOUBLE_EQ(s->lr_at(10), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_at(25), 0.5);
}

TEST(Schedules, CosineReachesTheFloorAtTheLastStep) {
  auto s = schedule("cosine", "warmup_steps = 10\nmin_lr_ratio = 0.1", 1.0, 110);
  EXPECT_DOUBLE_EQ(s->lr_at(9), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_at(10), 1.0);
  EXPECT_NEAR(s->lr_at(59), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * 49.0 / 99.0)), 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_at(109), 0.1);
}

TEST(Schedules, ExponentialMultipliesEveryStep) {
  auto s = schedule("exponential", "gamma = 2.0", 1e-3, 100);
  EXPECT_DOUBLE_EQ(s->lr_at(0), 1e-3);
  EXPECT_DOUBLE_EQ(s->lr_at(3), 8e-3);
  auto decay = schedule("exponential", "gamma = 0.5\nwarmup_steps = 2", 1.0, 100);
  EXPECT_DOUBLE_EQ(decay->lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(decay->lr_at(2), 0.25);
}

TEST(Schedules, LinearDecaysToTheFloorAtTheLastStep) {
  auto s = schedule("linear", "warmup_steps = 10\nmin_lr_ratio = 0.1", 1.0, 110);
  EXPECT_DOUBLE_EQ(s->lr_at(0), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(10), 1.0);
  EXPECT_NEAR(s->lr_at(59), 0.1 + 0.9 * (1.0 - 49.0 / 99.0), 1e-12);
  EXPECT_DOUBLE_EQ(s->lr_at(109), 0.1);
  EXPECT_DOUBLE_EQ(s->lr_at(200), 0.1);  // past the plan (a resume with more steps): the floor
}

// The values torch.optim.lr_scheduler.MultiStepLR([10, 30], gamma=0.5) gives for lr 2 at
// optimizer steps 9, 10, 29, 30 and 99 (the scheduler stepped after each optimizer step).
TEST(Schedules, MultiStepDecaysAtEachMilestoneAsTorchDoes) {
  auto s = schedule("multistep", "milestones = [10, 30]\ngamma = 0.5", 2.0, 100);
  EXPECT_DOUBLE_EQ(s->lr_at(9), 2.0);
  EXPECT_DOUBLE_EQ(s->lr_at(10), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_at(29), 1.0);
  EXPECT_DOUBLE_EQ(s->lr_at(30), 0.5);
  EXPECT_DOUBLE_EQ(s->lr_at(99), 0.5);
  auto warm = schedule("multistep", "milestones = [10]\nwarmup_steps = 4", 2.0, 100);
  EXPECT_DOUBLE_EQ(warm->lr_at(0), 0.5);
  EXPECT_DOUBLE_EQ(warm->lr_at(3), 2.0);
  EXPECT_THROW(schedule("multistep", "milestones = [30, 10]", 1.0, 100), UsageError);
  EXPECT_THROW(schedule("multistep", "milestones = []", 1.0, 100), UsageError);
}

// The values torch.optim.lr_scheduler.OneCycleLR(max_lr=1, total_steps=100) gives (printed by
// torch 1.13 to 17 digits), with its defaults and with a linear anneal, div_factor 10 and
// final_div_factor 100; a warm-up of 30 steps peaks where pct_start 0.3 does.
TEST(Schedules, OneCycleFollowsTorch) {
  auto cos = schedule("onecycle", "", 1.0, 100);
  EXPECT_NEAR(cos->lr_at(0), 0.040000000000000036, 1e-15);
  EXPECT_NEAR(cos->lr_at(10), 0.29516394846410077, 1e-15);
  EXPECT_NEAR(cos->lr_at(29), 1.0, 1e-15);
  EXPECT_NEAR(cos->lr_at(30), 0.9994965352845243, 1e-15);
  EXPECT_NEAR(cos->lr_at(50), 0.793893450575732, 1e-15);
  EXPECT_NEAR(cos->lr_at(99), 4e-06, 1e-15);
  auto line = schedule("onecycle", "anneal_strategy = \"linear\"\ndiv_factor = 10\nfinal_div_factor = 100", 1.0, 100);
  EXPECT_NEAR(line->lr_at(0), 0.1, 1e-15);
  EXPECT_NEAR(line->lr_at(10), 0.41034482758620694, 1e-15);
  EXPECT_NEAR(line->lr_at(30), 0.9857285714285714, 1e-15);
  EXPECT_NEAR(line->lr_at(50), 0.7003, 1e-15);
  EXPECT_NEAR(line->lr_at(99), 0.0010000000000000009, 1e-15);
  auto warm = schedule("onecycle", "warmup_steps = 30", 1.0, 100);
  for (const std::int64_t step : {0, 10, 29, 30, 50, 99}) EXPECT_DOUBLE_EQ(warm->lr_at(step), cos->lr_at(step)) << step;
  EXPECT_THROW(schedule("onecycle", "warmup_steps = 100", 1.0, 100), UsageError);
  // The edges as torch has them: a peak between the last two steps (pct_start 0.95 of 10), and a
  // peak before step 0 (0.3 of 3: torch starts falling at once).
  auto late = schedule("onecycle", "pct_start = 0.95", 1.0, 10);
  EXPECT_NEAR(late->lr_at(8), 0.9918270878482729, 1e-15);
  EXPECT_NEAR(late->lr_at(9), 4e-06, 1e-15);
  auto early = schedule("onecycle", "", 1.0, 3);
  EXPECT_NEAR(early->lr_at(0), 0.9944154354509117, 1e-15);
  EXPECT_NEAR(early->lr_at(1), 0.46263710266697505, 1e-15);
  EXPECT_NEAR(early->lr_at(2), 4e-06, 1e-15);
}

TEST(Models, ProduceLogitsPerClass) {
  const DataSpec spec{{1, 28, 28}, 10};
  for (const std::string name : {"mlp", "cnn"}) {
    Config c;
    if (name == "mlp") {
      c = Config::parse("hidden = [16]\ndropout = 0.0");
    } else {
      c = Config::parse("channels = [4, 8]\nhidden = 16\ndropout = 0.0\nbatch_norm = true");
    }
    auto m = model_registry().get(name).factory(c, spec);
    EXPECT_EQ(m->forward(torch::randn({3, 1, 28, 28})).sizes(), (std::vector<std::int64_t>{3, 10})) << name;
  }
}

TEST(Models, CnnRejectsTooManyPoolingStages) {
  const DataSpec spec{{1, 4, 4}, 10};
  auto c = Config::parse("channels = [4, 4, 4]\nhidden = 8\ndropout = 0.0\nbatch_norm = false");
  EXPECT_THROW(model_registry().get("cnn").factory(c, spec), Error);
}

TEST(Optimizers, SetAndGetLearningRate) {
  auto p = torch::zeros({2}, torch::requires_grad());
  auto opt = optimizer_registry().get("sgd").factory(
      Config::parse("lr = 0.1\nmomentum = 0.9\nnesterov = true\nweight_decay = 0.0"), {p});
  EXPECT_DOUBLE_EQ(get_learning_rate(*opt), 0.1);
  set_learning_rate(*opt, 0.02);
  EXPECT_DOUBLE_EQ(get_learning_rate(*opt), 0.02);
}

TEST(Optimizers, MovingStateCountsBytesAndLeavesStateOnItsDeviceAlone) {
  auto p = torch::ones({256}, torch::requires_grad());
  auto opt = optimizer_registry().get("adamw").factory(
      Config::parse("lr = 0.1\nweight_decay = 0.0\nbetas = [0.9, 0.999]\neps = 1e-8\namsgrad = true"), {p});
  ASSERT_TRUE(materialize_optimizer_state(*opt));
  const auto& st = static_cast<torch::optim::AdamWParamState&>(*opt->state().begin()->second);
  const void* before = st.exp_avg().data_ptr();
  // Already there: nothing copied, the very same tensors kept.
  EXPECT_EQ(move_optimizer_state(*opt, c10::Device(c10::kCPU)), 0);
  EXPECT_EQ(st.exp_avg().data_ptr(), before);
  // An optimizer whose state trainer does not know is refused, not half-moved.
  torch::optim::RMSprop rms({p}, torch::optim::RMSpropOptions(0.01));
  p.mutable_grad() = torch::ones({256});
  rms.step();
  EXPECT_THROW(move_optimizer_state(rms, c10::Device(c10::kCPU)), Error);
}

TEST(Optimizers, NesterovWithoutMomentumIsAConfigError) {
  auto p = torch::zeros({2}, torch::requires_grad());
  EXPECT_THROW(optimizer_registry().get("sgd").factory(
                   Config::parse("lr = 0.1\nmomentum = 0.0\nnesterov = true\nweight_decay = 0.0"), {p}),
               ConfigError);
}

TEST(Registries, UnknownNameListsTheKnownOnes) {
  try {
    model_registry().get("densenet");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown model 'densenet'; known: bert, cnn, mlp, resnet, torchscript, vit"),
              std::string::npos)
        << e.what();
  }
}

/// Writes an IDX file of unsigned bytes, gzip-compressed or plain.
void write_idx(const std::string& path, const std::vector<std::uint32_t>& dims, const std::vector<std::uint8_t>& data,
               bool gz, std::uint8_t magic_type = 0x08) {
  std::string bytes = {0, 0, static_cast<char>(magic_type), static_cast<char>(dims.size())};
  for (auto d : dims) {
    for (int s = 24; s >= 0; s -= 8) bytes += static_cast<char>((d >> s) & 0xff);
  }
  bytes.append(data.begin(), data.end());
  if (gz) {
    gzFile f = gzopen(path.c_str(), "wb");
    gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
    gzclose(f);
  } else {
    testing::write_file(path, bytes);
  }
}

TEST(ReadIdx, ReadsGzipAndPlainFiles) {
  testing::TempDir tmp;
  for (bool gz : {true, false}) {
    const std::string path = tmp / (gz ? "x.gz" : "x");
    write_idx(path, {2, 3}, {1, 2, 3, 4, 5, 6}, gz);
    const at::Tensor t = read_idx_file(path);
    EXPECT_EQ(t.sizes(), (std::vector<std::int64_t>{2, 3}));
    EXPECT_EQ(t[1][2].item<int>(), 6);
  }
}

TEST(ReadIdx, RejectsBadMagicAndTruncatedData) {
  testing::TempDir tmp;
  // The usage error reading `file` raises, or "" when it reads.
  const auto refusal = [](const std::string& file) -> std::string {
    try {
      read_idx_file(file);
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  };
  write_idx(tmp / "bad", {2}, {1, 2}, false, 0x0d);
  EXPECT_NE(refusal(tmp / "bad").find("not an unsigned-byte IDX file (bad magic number)"), std::string::npos);
  // Uncompressed, a header that claims more than the file holds is refused before the data is
  // allocated; gzip'd, the file is read until it ends short.
  write_idx(tmp / "short", {10}, {1, 2}, false);
  EXPECT_NE(refusal(tmp / "short").find("its IDX header says 10 bytes of data; the file can hold at most 2"),
            std::string::npos);
  write_idx(tmp / "short.gz", {10}, {1, 2}, true);
  EXPECT_NE(refusal(tmp / "short.gz").find("truncated IDX data (its header says 10 bytes)"), std::string::npos);
  // A gzip'd header beyond deflate's 1032:1 of the file is refused unread.
  write_idx(tmp / "claims.gz", {1 << 30}, {1, 2}, true);
  EXPECT_NE(refusal(tmp / "claims.gz").find("its IDX header says 1073741824 bytes of data; the file can hold at most"),
            std::string::npos);
}

TEST(Datasets, FashionMnistFromAnIdxTreeWithLimit) {
  testing::TempDir tmp;
  std::vector<std::uint8_t> pixels(5 * 28 * 28, 255);
  for (const char* split : {"train", "t10k"}) {
    write_idx(tmp / (std::string(split) + "-images-idx3-ubyte.gz"), {5, 28, 28}, pixels, true);
    write_idx(tmp / (std::string(split) + "-labels-idx1-ubyte.gz"), {5}, {0, 1, 2, 3, 9}, true);
  }
  auto ds = dataset_registry()
                .get("fashion_mnist")
                .factory(Config::parse("root = \"" + tmp.str() + "\"\nlimit = 3\neval_limit = 0"), Split::Train);
  EXPECT_EQ(ds->size(), 3);
  const Batch b = ds->get(torch::tensor({2, 0}, torch::kLong));
  EXPECT_EQ(b.inputs.sizes(), (std::vector<std::int64_t>{2, 1, 28, 28}));
  EXPECT_EQ(b.targets[0].item<std::int64_t>(), 2);
  EXPECT_NEAR(b.inputs.max().item<double>(), (1.0 - 0.2860) / 0.3530, 1e-5);
}

TEST(Datasets, SyntheticIsSeeded) {
  auto cfg = Config::parse("size = 8\neval_size = 4\nshape = [3]\nnum_classes = 2\nseed = 5");
  auto a = dataset_registry().get("synthetic").factory(cfg, Split::Train);
  auto b = dataset_registry().get("synthetic").factory(cfg, Split::Train);
  const auto idx = torch::arange(8, torch::kLong);
  EXPECT_TRUE(torch::equal(a->get(idx).inputs, b->get(idx).inputs));
  EXPECT_EQ(dataset_registry().get("synthetic").factory(cfg, Split::Test)->size(), 4);
}

}  // namespace
}  // namespace trainer
