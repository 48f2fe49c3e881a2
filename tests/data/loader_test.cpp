// The loader that reads training batches ahead of the step (trainer/loader.h): the same
// batches in the same order whatever the number of workers, at most `prefetch` read ahead, a
// worker's error thrown to the step that asks for that batch, retried and unplanned batches,
// and whole runs that end bit-identical with 0, 1 and 2 workers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <future>
#include <set>
#include <thread>

#include "support/test_util.h"
#include "trainer/error.h"
#include "trainer/loader.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

/// Sample i of epoch e is the value 1000 e + i; counts the reads and the threads they ran on.
class Numbers final : public Dataset {
 public:
  explicit Numbers(std::int64_t n, std::int64_t fail_at = -1) : n_(n), fail_at_(fail_at) {}
  std::int64_t size() const override { return n_; }
  Batch get(const at::Tensor& indices) const override { return get_in_epoch(indices, 0); }
  Batch get_in_epoch(const at::Tensor& indices, std::int64_t epoch) const override {
    reads.fetch_add(1);
    {
      std::lock_guard<std::mutex> lock(m);
      threads.insert(std::this_thread::get_id());
    }
    if (fail_at_ >= 0 && (indices == fail_at_).any().item<bool>()) {
      throw Error("sample " + std::to_string(fail_at_) + " cannot be read");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a read takes a while
    return {indices.to(at::kFloat).unsqueeze(1) + 1000.0 * static_cast<double>(epoch), indices.clone()};
  }
  DataSpec spec() const override { return {{1}, 2}; }

  mutable std::atomic<std::int64_t> reads{0};
  mutable std::mutex m;
  mutable std::set<std::thread::id> threads;

 private:
  std::int64_t n_, fail_at_;
};

std::vector<at::Tensor> batches_of(const at::Tensor& order, std::int64_t batch) {
  std::vector<at::Tensor> out;
  for (std::int64_t b = 0; b < order.size(0); b += batch)
    out.push_back(order.slice(0, b, std::min(order.size(0), b + batch)));
  return out;
}

TEST(BatchLoader, SameBatchesInTheSameOrderWhateverTheWorkers) {
  auto gen = at::detail::createCPUGenerator(7);
  const at::Tensor order = at::randperm(100, gen, at::TensorOptions(at::kLong));
  std::vector<at::Tensor> reference;
  for (std::int64_t workers : {0, 1, 2, 3}) {
    auto ds = std::make_shared<Numbers>(100);
    BatchLoader loader(ds, workers, 4);
    std::vector<at::Tensor> got;
    for (std::int64_t epoch : {0, 1}) {
      loader.plan(epoch, batches_of(order, 16));
      for (const auto& b : batches_of(order, 16)) got.push_back(loader.next(b).inputs);
    }
    EXPECT_EQ(ds->reads.load(), 14) << workers << " workers";  // each batch read once
    if (workers == 0) {
      EXPECT_EQ(ds->threads, std::set<std::thread::id>{std::this_thread::get_id()});
    } else {  // every planned batch is read by a worker, none on the step's thread
      EXPECT_GE(ds->threads.size(), 1u);
      EXPECT_EQ(ds->threads.count(std::this_thread::get_id()), 0u) << workers << " workers";
    }
    if (reference.empty()) {
      reference = got;
    } else {
      ASSERT_EQ(got.size(), reference.size());
      for (std::size_t i = 0; i < got.size(); ++i)
        EXPECT_TRUE(torch::equal(got[i], reference[i])) << workers << " " << i;
    }
  }
  EXPECT_EQ(reference[7][0].item<double>(), 1000.0 + order[16 * 0].item<double>());  // epoch 1's first batch
}

TEST(BatchLoader, ReadsAtMostPrefetchBatchesAhead) {
  auto ds = std::make_shared<Numbers>(200);
  BatchLoader loader(ds, 2, 3);
  const auto batches = batches_of(at::arange(200, at::kLong), 10);
  loader.plan(0, batches);
  // Nothing is taken: the workers stop after 3 batches.
  for (int i = 0; i < 2000 && ds->reads.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ds->reads.load(), 3);
  loader.next(batches[0]);
  for (int i = 0; i < 2000 && ds->reads.load() < 4; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(ds->reads.load(), 4);
  EXPECT_EQ(loader.ready() + loader.waited(), 1);
}

TEST(BatchLoader, SkippingBatchesPastTheReadAheadWindowGivesTheOneAskedFor) {
  // Plugins that skip steps at BatchStart make the step ask for a batch beyond the window the
  // workers filled and stopped at (prefetch 2 here): they must go on from there.
  auto ds = std::make_shared<Numbers>(160);
  auto loader = std::make_unique<BatchLoader>(ds, 2, 2);
  const auto batches = batches_of(at::arange(160, at::kLong), 10);
  loader->plan(0, batches);
  loader->next(batches[0]);
  for (int i = 0; i < 2000 && ds->reads.load() < 3; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the workers are idle, the window full
  ASSERT_EQ(ds->reads.load(), 3);
  auto got = std::async(std::launch::async, [&] { return loader->next(batches[7]); });
  if (got.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "next() waits for a batch no worker reads";
    std::_Exit(1);  // the loader cannot be destroyed while next() waits
  }
  EXPECT_TRUE(torch::equal(got.get().targets, batches[7]));
  EXPECT_TRUE(torch::equal(loader->next(batches[8]).targets, batches[8]));  // and reads on from there
  loader->next(batches[15]);                                                // to the last one
  loader.reset();
}

TEST(BatchLoader, AWorkersErrorIsThrownToTheStepThatAsksForThatBatch) {
  auto ds = std::make_shared<Numbers>(64, /*fail_at=*/37);
  BatchLoader loader(ds, 2, 4);
  const auto batches = batches_of(at::arange(64, at::kLong), 16);
  loader.plan(0, batches);
  EXPECT_NO_THROW(loader.next(batches[0]));
  EXPECT_NO_THROW(loader.next(batches[1]));
  try {
    loader.next(batches[2]);
    FAIL() << "the worker's error was lost";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("sample 37 cannot be read"), std::string::npos);
  }
  EXPECT_NO_THROW(loader.next(batches[3]));
}

TEST(BatchLoader, RetriedAndUnplannedBatchesAndANewPlan) {
  auto ds = std::make_shared<Numbers>(64);
  BatchLoader loader(ds, 2, 2);
  const auto batches = batches_of(at::arange(64, at::kLong), 16);
  loader.plan(2, batches);
  const Batch a = loader.next(batches[0]);
  const Batch again = loader.next(batches[0]);  // a retried step: the same batch, not read again
  EXPECT_TRUE(again.inputs.is_same(a.inputs));
  const Batch other = loader.next(at::arange(3, at::kLong));  // not planned: read now, in epoch 2
  EXPECT_EQ(other.inputs[2].item<double>(), 2002.0);
  loader.plan(3, batches);  // a new plan: what was read ahead for epoch 2 is dropped
  EXPECT_EQ(loader.next(batches[0]).inputs[0].item<double>(), 3000.0);
}

constexpr const char* kRun = R"(
[run]
seed = 3
[model]
name = "mlp"
hidden = [32]
dropout = 0.3
[dataset]
name = "fashion_mnist"
limit = 512
[training]
epochs = 2
batch_size = 64
[optim]
name = "adamw"
lr = 0.003
[eval]
every_epochs = 1
[checkpoint]
every_epochs = 0
at_end = false
[metrics]
console = false
)";

class LoaderRuns : public testing::TrainerTest {};

TEST_F(LoaderRuns, EndBitIdenticalWithZeroOneAndTwoWorkers) {
  fix_threads();
  std::vector<at::Tensor> reference;
  double loss = 0;
  for (const char* workers : {"0", "1", "2"}) {
    Trainer t(options_for(kRun, {std::string("+loader.workers=") + workers, "+loader.prefetch=2"},
                          std::string("w") + workers));
    const RunResult r = t.fit();
    ASSERT_EQ(r.exit_code, kExitOk) << r.message;
    std::vector<at::Tensor> params;
    for (const auto& p : t.model()->parameters()) params.push_back(p.detach().clone());
    if (reference.empty()) {
      reference = params;
      loss = r.final_metrics.at("eval/loss");
      continue;
    }
    EXPECT_EQ(r.final_metrics.at("eval/loss"), loss) << workers;
    for (std::size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(torch::equal(params[i], reference[i])) << workers;
  }
}

TEST_F(LoaderRuns, DebiansDatasetsAreFoundUnderTrainerDatasetsDirWhenItIsSet) {
  // A machine with Debian's dataset files elsewhere (the GPU bundle unpacked under /tmp): a
  // root under /usr/share/datasets is looked up there.
  namespace fs = std::filesystem;
  // Where the files are on this machine: Debian's folder, or the one the environment already
  // names (scripts/gpu-check.sh, whose bundle carries them).
  const char* set = std::getenv("TRAINER_DATASETS_DIR");
  const std::string before = set != nullptr ? set : "";
  const std::string source = before.empty() ? "/usr/share/datasets" : before;
  const std::string moved = tmp_ / "datasets";
  fs::create_directories(moved + "/fashion-mnist");
  for (const auto& e : fs::directory_iterator(source + "/fashion-mnist")) {
    fs::create_symlink(e.path(), moved + "/fashion-mnist/" + e.path().filename().string());
  }
  struct Env {
    Env(const std::string& v, std::string before) : before_(std::move(before)) {
      ::setenv("TRAINER_DATASETS_DIR", v.c_str(), 1);
    }
    ~Env() {
      if (before_.empty()) {
        ::unsetenv("TRAINER_DATASETS_DIR");
      } else {
        ::setenv("TRAINER_DATASETS_DIR", before_.c_str(), 1);
      }
    }
    std::string before_;
  };
  {
    Env env(moved, before);
    Trainer t(options_for(kRun, {"training.epochs=1"}, "moved"));
    const RunResult r = t.fit();
    EXPECT_EQ(r.exit_code, kExitOk) << r.message;
  }
  {
    Env env(tmp_ / "empty", before);
    Trainer t(options_for(kRun, {"training.epochs=1"}, "empty"));
    const RunResult r = t.fit();
    EXPECT_NE(r.exit_code, kExitOk);
    EXPECT_NE(
        r.message.find("in " + tmp_ / "empty/fashion-mnist ($TRAINER_DATASETS_DIR in place of /usr/share/datasets)"),
        std::string::npos)
        << r.message;
  }
}

}  // namespace
}  // namespace trainer
