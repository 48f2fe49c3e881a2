// Checkpoints on disk and resuming from them: files published whole with their digest, a
// failed write that leaves no trace, falling back past truncated or damaged files, a resume
// that continues at the next sample whatever the batch size, and refusals that name what
// differs (data order, parameter shapes), out of memory while loading reported as such.
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "support/hostile_archive.h"
#include "support/test_util.h"
#include "support/zip_patch.h"
#include "trainer/memory.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::metric_by_step;
using testing::read_file;
using testing::write_file;

namespace fs = std::filesystem;

/// Records the dataset indices of every trained micro-batch, in order.
class IndexRecorder final : public Plugin {
 public:
  std::string name() const override { return "index_recorder"; }
  std::vector<Event> events() const override { return {Event::BeforeForward}; }
  void on_event(EventContext& ctx, Control&) override {
    const at::Tensor idx = ctx.indices->contiguous();
    seen.insert(seen.end(), idx.data_ptr<std::int64_t>(), idx.data_ptr<std::int64_t>() + idx.numel());
  }
  std::vector<std::int64_t> seen;
};

/// Leaves no memory to spare once the optimizer exists: the next allocation (loading the
/// checkpoint) fails.
class NoRoomAfterSetUp final : public Plugin {
 public:
  std::string name() const override { return "no_room_after_set_up"; }
  std::vector<Event> events() const override { return {Event::OptimizerCreated, Event::Shutdown}; }
  void on_event(EventContext& ctx, Control&) override {
    const c10::Device cpu(c10::kCPU);
    if (ctx.event == Event::OptimizerCreated) set_memory_limit(cpu, memory_stats(cpu).allocated + 1024);
    if (ctx.event == Event::Shutdown) set_memory_limit(cpu, 0);
  }
};

class Resume : public testing::TrainerTest {
 protected:
  RunResult run(const std::vector<std::string>& overrides, const std::string& name, const std::string& resume = "",
                std::vector<std::shared_ptr<Plugin>> extra = {}) {
    // Dropout (the random stream must resume) and AdamW (its state must), batches of 16.
    std::vector<std::string> all = {"+model.dropout=0.2", "training.batch_size=16", "optim.name=adamw",
                                    "optim.lr=0.01"};
    all.insert(all.end(), overrides.begin(), overrides.end());
    TrainerOptions o = options_for(testing::kSmallRun, all, name, extra);
    o.resume = resume;
    o.log_level = log_level_;
    Trainer t(std::move(o));
    return t.fit();
  }

  std::vector<std::string> files_in(const std::string& dir) {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string checkpoint(const std::string& run, int step) {
    char name[32];
    std::snprintf(name, sizeof name, "step_%08d.pt", step);
    return tmp_ / (run + "/checkpoints/" + name);
  }

  std::string log_level_ = "error";

  static void truncate_to_half(const std::string& file) { fs::resize_file(file, fs::file_size(file) / 2); }

  static void flip_a_byte_in_the_middle(const std::string& file) {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    const auto middle = static_cast<std::streamoff>(fs::file_size(file) / 2);
    f.seekg(middle);
    char c = 0;
    f.get(c);
    f.seekp(middle);
    f.put(static_cast<char>(c ^ 0x5a));
  }
};

TEST_F(Resume, CheckpointsArePublishedWithTheirDigestAndNoTemporaryFile) {
  ASSERT_EQ(run({"+checkpoint.every_steps=3", "checkpoint.keep_last=2"}, "run").exit_code, kExitOk);
  // Steps 3, 4 (epoch), 6, 8 (epoch): the newest two remain, with their digests.
  EXPECT_EQ(files_in(tmp_ / "run/checkpoints"),
            (std::vector<std::string>{"latest", "step_00000006.pt", "step_00000006.pt.sum", "step_00000008.pt",
                                      "step_00000008.pt.sum"}));
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/latest"), "step_00000008.pt\n");
  const std::string sum = read_file(checkpoint("run", 8) + ".sum");
  EXPECT_EQ(sum.rfind("size " + std::to_string(fs::file_size(checkpoint("run", 8))) + " crc32 ", 0), 0u) << sum;
}

TEST_F(Resume, AFailedCheckpointWriteLeavesNoTemporaryFileAndLatestAsItWas) {
  // A directory where step 2's checkpoint belongs: writing it fails when it is renamed there.
  write_file(tmp_ / "run/checkpoints/step_00000002.pt/in_the_way", "x");
  const RunResult r = run({"+checkpoint.every_steps=1"}, "run");
  EXPECT_EQ(r.exit_code, kExitTrainingFailed);
  EXPECT_NE(r.message.find("step_00000002.pt"), std::string::npos) << r.message;
  for (const auto& f : files_in(tmp_ / "run/checkpoints")) EXPECT_EQ(f.find(".tmp"), std::string::npos) << f;
  EXPECT_FALSE(fs::exists(tmp_ / "run/checkpoints/step_00000002.pt.sum"));  // no digest of what did not arrive
  EXPECT_EQ(read_file(tmp_ / "run/checkpoints/latest"), "step_00000001.pt\n");
  // That run resumes from its last complete checkpoint.
  const RunResult resumed = run({}, "resumed", tmp_ / "run");
  ASSERT_EQ(resumed.exit_code, kExitOk) << resumed.message;
  EXPECT_EQ(resumed.global_step, 8);
  EXPECT_EQ(metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss").size(), 7u);
}

TEST_F(Resume, FromARunDirectoryFallsBackToTheNewestCompleteCheckpoint) {
  fix_threads();
  ASSERT_EQ(run({}, "straight").exit_code, kExitOk);
  const auto straight = metric_by_step(tmp_ / "straight/metrics.jsonl", "train/loss");
  ASSERT_EQ(run({"+checkpoint.every_steps=1", "checkpoint.keep_last=4", "training.max_steps=6"}, "part").exit_code,
            kExitOk);
  truncate_to_half(checkpoint("part", 6));           // caught by its digest
  flip_a_byte_in_the_middle(checkpoint("part", 5));  // same size, other contents
  log_level_ = "warn";
  const RunResult r = run({}, "resumed", tmp_ / "part");
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 8);
  // Resumed after step 4: steps 5 to 8 again, exactly as the uninterrupted run trained them.
  const auto resumed = metric_by_step(tmp_ / "resumed/metrics.jsonl", "train/loss");
  ASSERT_EQ(resumed.size(), 4u);
  for (const auto& [step, loss] : resumed) EXPECT_DOUBLE_EQ(loss, straight.at(step)) << step;
  const std::string log = read_file(tmp_ / "resumed/trainer.log");
  EXPECT_NE(log.find("step_00000006.pt is truncated or damaged: it has "), std::string::npos) << log;
  EXPECT_NE(log.find("step_00000005.pt is truncated or damaged: its CRC-32 differs"), std::string::npos) << log;
  EXPECT_NE(log.find("resuming from " + checkpoint("part", 4) + ", the newest complete checkpoint"), std::string::npos)
      << log;
}

TEST_F(Resume, ADamagedCheckpointAskedForByNameIsRefused) {
  ASSERT_EQ(run({"+checkpoint.every_steps=1", "checkpoint.keep_last=4"}, "part").exit_code, kExitOk);
  truncate_to_half(checkpoint("part", 8));
  RunResult r = run({}, "resumed", checkpoint("part", 8));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("checkpoint " + checkpoint("part", 8) + " is truncated or damaged"), std::string::npos)
      << r.message;
  // Without its digest the archive's check finds the file cut short.
  fs::remove(checkpoint("part", 8) + ".sum");
  r = run({}, "resumed2", checkpoint("part", 8));
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(
      r.message.find(
          "is truncated or damaged: its archive is refused: a damaged zip archive: no end-of-central-directory record"),
      std::string::npos)
      << r.message;
}

TEST_F(Resume, ACompressedRecordDeclaringGigabytesIsRefusedBeforeLibTorchInflatesIt) {
  // LibTorch deflates a checkpoint's TorchScript code; its reader allocates the size an entry
  // declares before inflating it. A run directory from elsewhere may declare 4 GiB in a few
  // hundred bytes, its digest written to match.
  ASSERT_EQ(run({"+checkpoint.every_steps=1", "checkpoint.keep_last=4"}, "part").exit_code, kExitOk);
  const std::string file = checkpoint("part", 8);
  ASSERT_EQ(testing::declare_zip_entry_size(file, "/code/__torch__.py", 0xfffffff0u), 2);
  // A digest that matches the edited file: it says the file arrived whole, not who wrote it.
  const std::string bytes = read_file(file);
  char sum[64];
  std::snprintf(sum, sizeof sum, "size %zu crc32 %08lx\n", bytes.size(),
                ::crc32(0L, reinterpret_cast<const Bytef*>(bytes.data()), static_cast<uInt>(bytes.size())));
  write_file(file + ".sum", sum);
  const RunResult r = run({}, "resumed", file);
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("checkpoint " + file +
                           " is truncated or damaged: its archive is refused: a damaged zip archive: entry"),
            std::string::npos)
      << r.message;
  EXPECT_NE(r.message.find("is deflated to 4294967280 declared bytes"), std::string::npos) << r.message;
}

TEST_F(Resume, ALatestThatNamesAFileOutsideItsDirectoryIsRefused) {
  ASSERT_EQ(run({"+checkpoint.every_steps=1", "checkpoint.keep_last=2", "training.max_steps=2"}, "other").exit_code,
            kExitOk);
  ASSERT_EQ(run({"+checkpoint.every_steps=1", "checkpoint.keep_last=2"}, "part").exit_code, kExitOk);
  // A run directory from elsewhere whose latest points into another run.
  write_file(tmp_ / "part/checkpoints/latest", "../../other/checkpoints/step_00000002.pt\n");
  const RunResult r = run({}, "resumed", tmp_ / "part");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find(tmp_ / "part/checkpoints/latest" + " names '../../other/checkpoints/step_00000002.pt', "
                                                              "not a step_<N>.pt file beside it"),
            std::string::npos)
      << r.message;
}

TEST_F(Resume, AnotherBatchSizeContinuesAtTheNextSample) {
  auto first = std::make_shared<IndexRecorder>();
  ASSERT_EQ(run({"training.epochs=1", "training.max_steps=3"}, "part", "", {first}).exit_code, kExitOk);
  ASSERT_EQ(first->seen.size(), 48u);
  // Smaller batches after an out-of-memory error are the usual reason to resume this way.
  auto second = std::make_shared<IndexRecorder>();
  const RunResult r = run({"training.epochs=1", "training.batch_size=12"}, "resumed", tmp_ / "part", {second});
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(second->seen.size(), 16u);
  EXPECT_EQ(r.global_step, 3 + 2);  // 12 + 4 samples
  std::multiset<std::int64_t> all(first->seen.begin(), first->seen.end());
  all.insert(second->seen.begin(), second->seen.end());
  EXPECT_EQ(all.size(), 64u);
  for (std::int64_t i = 0; i < 64; ++i) EXPECT_EQ(all.count(i), 1u) << "sample " << i;
}

TEST_F(Resume, AChangeThatReordersTheDataIsRefusedNamingEachKey) {
  ASSERT_EQ(run({"training.max_steps=3"}, "part").exit_code, kExitOk);
  RunResult r = run({"run.seed=8"}, "seed", tmp_ / "part");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("order of the training samples would change: run.seed = 7 there, 8 now"), std::string::npos)
      << r.message;
  r = run({"training.shuffle=false", "dataset.size=80", "training.drop_last=true"}, "more", tmp_ / "part");
  EXPECT_EQ(r.exit_code, kExitUsage);
  for (const char* part : {"training.shuffle = true there, false now", "training.drop_last = false there, true now",
                           "training samples = 64 there, 80 now"}) {
    EXPECT_NE(r.message.find(part), std::string::npos) << r.message;
  }
  EXPECT_EQ(r.message.find("run.seed"), std::string::npos) << "no shuffle now: the seed does not order the data";
}

TEST_F(Resume, AModelOfAnotherShapeIsRefusedNamingTheParameter) {
  ASSERT_EQ(run({"training.max_steps=1"}, "part").exit_code, kExitOk);
  const RunResult r = run({"model.hidden=[16]"}, "resumed", tmp_ / "part");
  EXPECT_EQ(r.exit_code, kExitUsage);
  EXPECT_NE(r.message.find("model parameter 'body.0.bias' has shape [32] there, [16] in this model"), std::string::npos)
      << r.message;
}

TEST_F(Resume, ACheckpointThatWouldRunCodeIsRefusedAndNothingRuns) {
  ASSERT_EQ(run({"training.max_steps=1"}, "part").exit_code, kExitOk);
  // A TorchScript archive whose class's __setstate__ creates a file when LibTorch's reader
  // (torch::jit::load) reads it, planted as the run's newest checkpoint with `latest` naming it.
  const std::string planted = checkpoint("part", 2), marker = tmp_ / "ran";
  write_file(planted, testing::hostile_archive(marker));
  write_file(tmp_ / "part/checkpoints/latest", "step_00000002.pt\n");
  // Named, and as the run directory's newest: refused, not passed over for step 1's.
  for (const std::string& resume : {planted, std::string(tmp_ / "part")}) {
    const RunResult r = run({}, resume == planted ? "from_file" : "from_dir", resume);
    EXPECT_EQ(r.exit_code, kExitUsage) << resume;
    EXPECT_NE(r.message.find("--resume: checkpoint " + planted +
                             " is not one that trainer wrote: code/__torch__.py declares a method"),
              std::string::npos)
        << r.message;
    EXPECT_FALSE(fs::exists(marker)) << resume;
  }
}

TEST_F(Resume, RunningOutOfMemoryWhileLoadingIsReportedAsOutOfMemory) {
  ASSERT_EQ(run({"training.max_steps=1"}, "part").exit_code, kExitOk);
  const RunResult r = run({}, "resumed", tmp_ / "part", {std::make_shared<NoRoomAfterSetUp>()});
  EXPECT_EQ(r.exit_code, kExitTrainingFailed) << r.message;
  EXPECT_NE(r.message.find("out of memory while loading checkpoint " + checkpoint("part", 1) + " onto cpu"),
            std::string::npos)
      << r.message;
  // Typed as what it is, without a phase of the loop (status.json says the same).
  EXPECT_EQ(r.failure, FailureKind::OutOfMemory);
  EXPECT_FALSE(r.oom_phase);
}

}  // namespace
}  // namespace trainer
