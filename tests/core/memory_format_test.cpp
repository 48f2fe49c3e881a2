// model.memory_format of the CNN: channels_last converts the conv weights and inputs and trains
// to the contiguous run's parameters; auto times both on this machine without side effects on
// the run (no BatchNorm statistics moved, no gradients left, no random numbers drawn).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::read_file;

constexpr const char* kFormatRecipe = R"(
[run]
seed = 5
[model]
name = "cnn"
channels = [8, 16]
hidden = 32
dropout = 0.2
[dataset]
name = "synthetic"
size = 128
eval_size = 64
[training]
epochs = 1
batch_size = 32
[optim]
name = "sgd"
lr = 0.05
[metrics]
console = false
)";

/// At ModelToDevice: whether every BatchNorm buffer is still at its initial value, no
/// parameter has a gradient, and which conv weights are channels-last.
class SetupProbe final : public Plugin {
 public:
  std::string name() const override { return "setup_probe"; }
  std::vector<Event> events() const override { return {Event::ModelToDevice}; }
  void on_event(EventContext& ctx, Control&) override {
    for (const auto& b : ctx.model->named_buffers()) {
      const bool fresh = b.key().find("running_var") != std::string::npos ? torch::all(b.value() == 1).item<bool>()
                                                                          : torch::all(b.value() == 0).item<bool>();
      buffers_fresh = buffers_fresh && fresh;
    }
    for (const auto& p : ctx.model->parameters()) {
      no_grads = no_grads && !p.grad().defined();
      // The first conv's weight [8, 1, 3, 3] is both formats at once (one input channel).
      if (p.dim() == 4 && p.size(1) > 1) channels_last.push_back(p.is_contiguous(at::MemoryFormat::ChannelsLast));
    }
    draw = torch::rand({4});  // what the run's generator gives next
  }
  bool buffers_fresh = true, no_grads = true;
  std::vector<bool> channels_last;
  at::Tensor draw;
};

class MemoryFormat : public testing::TrainerTest {
 protected:
  RunResult run(const std::string& name, const std::vector<std::string>& overrides, std::shared_ptr<SetupProbe> probe) {
    TrainerOptions o = options_for(kFormatRecipe, overrides, name, {probe});
    o.log_level = "info";
    Trainer t(std::move(o));
    RunResult r = t.fit();
    params.clear();
    for (const auto& p : t.model()->parameters()) params.push_back(p.detach().contiguous().clone());
    return r;
  }
  std::vector<at::Tensor> params;
};

TEST_F(MemoryFormat, ChannelsLastConvertsTheConvWeightsAndTrainsToTheContiguousRunsParameters) {
  auto nchw = std::make_shared<SetupProbe>(), nhwc = std::make_shared<SetupProbe>();
  ASSERT_EQ(run("nchw", {}, nchw).status, RunStatus::Finished);  // the CNN's default: contiguous
  const auto contiguous = params;
  ASSERT_EQ(run("nhwc", {"model.memory_format=\"channels_last\""}, nhwc).status, RunStatus::Finished);
  EXPECT_EQ(nchw->channels_last, (std::vector<bool>{false}));
  EXPECT_EQ(nhwc->channels_last, (std::vector<bool>{true}));
  ASSERT_EQ(params.size(), contiguous.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(torch::allclose(params[i], contiguous[i], 1e-4, 1e-5)) << "parameter " << i;
  }
}

TEST_F(MemoryFormat, AutoMeasuresBothAndLeavesNoTraceInTheRun) {
  auto plain = std::make_shared<SetupProbe>(), probed = std::make_shared<SetupProbe>();
  ASSERT_EQ(run("plain", {}, plain).status, RunStatus::Finished);
  const RunResult r = run("auto", {"model.memory_format=\"auto\""}, probed);
  ASSERT_EQ(r.status, RunStatus::Finished) << r.message;
  const std::string log = read_file(tmp_ / "auto/trainer.log");
  EXPECT_NE(log.find("(model.memory_format = auto: forward+backward "), std::string::npos) << log;
  EXPECT_TRUE(probed->buffers_fresh) << "the probe moved BatchNorm's running statistics";
  EXPECT_TRUE(probed->no_grads) << "the probe left gradients";
  EXPECT_TRUE(torch::equal(plain->draw, probed->draw)) << "the probe drew random numbers";
  const bool nhwc = log.find("memory format: channels_last") != std::string::npos;
  EXPECT_EQ(probed->channels_last, (std::vector<bool>{nhwc}));
}

TEST_F(MemoryFormat, AModelWithoutTheKeyRefusesIt) {
  std::string mlp = kFormatRecipe;
  mlp.replace(mlp.find("name = \"cnn\""), std::string("name = \"cnn\"").size(), "name = \"mlp\"");
  mlp.replace(mlp.find("channels = [8, 16]\n"), std::string("channels = [8, 16]\n").size(), "");
  mlp.replace(mlp.find("hidden = 32\n"), std::string("hidden = 32\n").size(), "");
  EXPECT_THROW(options_for(mlp, {"+model.memory_format=\"auto\""}, "mlp"), ConfigError);
}

}  // namespace
}  // namespace trainer
