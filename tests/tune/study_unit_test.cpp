// The parts of `trainer sweep` that need no trial process: the pruners on recorded reports,
// what a memory estimate lets a trial do, the journal's repair of a cut line, the checks of a
// replayed journal (each bad record named by its line), what a resume compares, which
// overrides share an estimate, and the estimate's JSON read back as the sweep reads it.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "admission.h"
#include "estimate.h"
#include "estimate_internal.h"
#include "pruner.h"
#include "study.h"
#include "study_journal.h"
#include "support/test_util.h"
#include "sweep.h"
#include "trainer/config.h"
#include "trainer/core_settings.h"
#include "trainer/error.h"
#include "trial_process.h"

namespace {

using trainer::testing::TempDir;
using trainer::testing::write_file;
using trainer::tune::MemoryEstimate;
using trainer::tune::SweepSettings;
using trainer::tune::TrialRecord;
using trainer::tune::TrialState;

constexpr std::int64_t kMiB = 1024 * 1024;

TrialRecord trial(std::int64_t n, const std::string& state, std::vector<double> reports) {
  TrialRecord t;
  t.number = n;
  t.state = *trainer::tune::trial_state_named(state);
  t.intermediate = std::move(reports);
  return t;
}

TEST(Pruner, MedianComparesTheSameReportOfCompletedTrialsOnly) {
  SweepSettings s;
  s.pruner = "median";
  s.pruner_min_trials = 3;
  std::map<std::int64_t, TrialRecord> trials{{0, trial(0, "COMPLETE", {0.5, 0.8})},
                                             {1, trial(1, "COMPLETE", {0.6, 0.82})},
                                             {2, trial(2, "COMPLETE", {0.7, 0.84})},
                                             {3, trial(3, "RUNNING", {0.1})}};
  // Report 1: the median of 0.5, 0.6, 0.7 is 0.6; 0.59 is worse (maximize).
  trials[4] = trial(4, "RUNNING", {0.59});
  EXPECT_NE(prune_reason(s, trials[4], trials).find("worse than the median 0.6 of 3 completed trials"),
            std::string::npos);
  trials[4].intermediate = {0.61};
  EXPECT_EQ(prune_reason(s, trials[4], trials), "");
  // Report 2: median 0.82.
  trials[4].intermediate = {0.61, 0.81};
  EXPECT_NE(prune_reason(s, trials[4], trials), "");
  // Minimize turns it round; the running trial 3 never counts.
  s.direction = "minimize";
  trials[4].intermediate = {0.59};
  EXPECT_EQ(prune_reason(s, trials[4], trials), "");
  // Too few completed trials with that report, or before the warm-up: nothing is pruned.
  s.direction = "maximize";
  s.pruner_min_trials = 4;
  EXPECT_EQ(prune_reason(s, trials[4], trials), "");
  s.pruner_min_trials = 3;
  s.pruner_warmup = 2;
  EXPECT_EQ(prune_reason(s, trials[4], trials), "");
}

TEST(Pruner, SuccessiveHalvingJudgesAtTheRungsOnly) {
  SweepSettings s;
  s.pruner = "successive_halving";
  s.reduction_factor = 2;
  s.min_resource = 1;
  // Rungs at 1, 2, 4 reports. Trials that reached a rung count whatever their state.
  std::map<std::int64_t, TrialRecord> trials{{0, trial(0, "COMPLETE", {0.5, 0.6, 0.7, 0.8})},
                                             {1, trial(1, "PRUNED", {0.9})},
                                             {2, trial(2, "RUNNING", {0.4, 0.55, 0.3})}};
  // At report 1: 0.4 against 0.5 and 0.9: the best 1 of 3 is 0.9.
  TrialRecord t = trial(2, "RUNNING", {0.4});
  EXPECT_NE(prune_reason(s, t, trials).find("not in the best 1 of 3"), std::string::npos) << prune_reason(s, t, trials);
  // Report 3 is no rung.
  t.intermediate = {0.95, 0.55, 0.3};
  EXPECT_EQ(prune_reason(s, t, trials), "");
  // Report 2: 0.65 against 0.6 (trial 0 only): best 1 of 2.
  t.intermediate = {0.95, 0.65};
  EXPECT_EQ(prune_reason(s, t, trials), "");
  s.pruner = "none";
  t.intermediate = {0.0};
  EXPECT_EQ(prune_reason(s, t, trials), "");
}

/// An estimate on a 100 MiB budget, margin 10 %: steps 50 MiB + 1 MiB per sample of the
/// micro-batch; evaluations 50 MiB + 0.1 MiB per sample.
MemoryEstimate toy_estimate() {
  MemoryEstimate e;
  e.device = "cpu";
  e.held = 50.0 * kMiB, e.per_sample = 1.0 * kMiB, e.per_batch_sample = 0;
  e.step_held = 40.0 * kMiB, e.step_per_batch_sample = 0;
  e.limit = 100 * kMiB;
  e.limit_source = "memory.limit_mb = 100";
  e.margin = 0.1;
  e.peak = e.predict(32, 32);
  e.eval_batch = 1000;
  e.eval_base = 50.0 * kMiB;
  e.eval_per_sample = 0.1 * kMiB;
  e.eval_peak = e.predict_eval(1000);
  return e;
}

TEST(Admission, WhatFitsRunsAsItIs) {
  const auto a = trainer::tune::admit_trial(toy_estimate(), {32, 32, 100, 0});
  EXPECT_TRUE(a.run);
  EXPECT_TRUE(a.overrides.empty());
  EXPECT_EQ(a.predicted_peak, 82 * kMiB);  // the step: 50 + 32
}

TEST(Admission, AStepThatCannotFitIsSkippedUnlessOomBackoffCanLowerItsMicroBatch) {
  const MemoryEstimate e = toy_estimate();
  auto a = trainer::tune::admit_trial(e, {64, 64, 0, 0});
  EXPECT_FALSE(a.run);
  EXPECT_EQ(a.reason.rfind("predicted out of memory: 114 MiB at batch 64, micro-batch 64 > 90.0 MiB usable", 0), 0u)
      << a.reason;
  // With oom_backoff (min_micro_batch 8): the largest micro-batch that fits, 40.
  a = trainer::tune::admit_trial(e, {64, 64, 0, 8});
  EXPECT_TRUE(a.run);
  EXPECT_EQ(a.overrides, std::vector<std::string>{"training.micro_batch_size=40"});
  EXPECT_EQ(a.reason.rfind("micro-batch 64 -> 40 (", 0), 0u) << a.reason;
  // Not below oom_backoff's floor.
  EXPECT_FALSE(trainer::tune::admit_trial(e, {64, 64, 0, 41}).run);
}

/// toy_estimate() with oom_backoff's ladder probed: 4 blocks, every one checkpointed leaves
/// 0.25 MiB of the 1 MiB per sample; a step takes 0.5 s + 0.1 s per micro-step + 1 s per sample,
/// and checkpointing every block 0.3 s more per sample.
MemoryEstimate ladder_estimate() {
  MemoryEstimate e = toy_estimate();
  e.model_blocks = 4;
  e.checkpointed_held = e.held;
  e.checkpointed_per_sample = 0.25 * kMiB;
  e.moment_bits = 32;
  e.step_seconds = 0.5, e.micro_step_seconds = 0.1, e.sample_seconds = 1.0, e.checkpoint_sample_seconds = 0.3;
  return e;
}

TEST(Admission, WhenNoMicroBatchFitsTheTrialStartsOnTheCheapestRungThatDoes) {
  const MemoryEstimate e = ladder_estimate();
  // Plain, micro-batch 48 needs 98 MiB > 90 usable. With k of 4 blocks checkpointed a sample
  // holds 1 - 0.1875 k MiB: 1 block fits micro-batch 49 (89.8 MiB; 0.5 + 2 x 0.1 + 64 x 1.075
  // = 69.5 s against 64.6 s plain), 2 blocks fit 64 (90 MiB, 74.2 s): the first is cheaper.
  auto a = trainer::tune::admit_trial(e, {64, 64, 0, 48});
  ASSERT_TRUE(a.run) << a.reason;
  EXPECT_EQ(a.overrides, (std::vector<std::string>{"training.micro_batch_size=49",
                                                   "plugins.oom_backoff.start_checkpointed_blocks=1"}));
  EXPECT_EQ(a.reason.rfind("on the ladder: micro-batch 49 with 1 of 4 blocks checkpointed, est. 1.08x step time (", 0),
            0u)
      << a.reason;
  EXPECT_EQ(a.predicted_peak, std::llround((50 + 0.8125 * 49) * kMiB));
  // Above 64 nothing fits at micro-batch 64 with fewer than 2 blocks: 2 it is.
  a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  ASSERT_TRUE(a.run) << a.reason;
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_checkpointed_blocks=2"});
  // Where a smaller micro-batch fits on its own, oom_backoff's floor allowing it, no rung.
  a = trainer::tune::admit_trial(e, {64, 64, 0, 8});
  EXPECT_EQ(a.overrides, std::vector<std::string>{"training.micro_batch_size=40"});
  // Without oom_backoff there is no ladder to start on.
  EXPECT_FALSE(trainer::tune::admit_trial(e, {64, 64, 0, 0}).run);
  // Nor where even every block checkpointed does not fit: 95 MiB held throughout.
  MemoryEstimate heavy = e;
  heavy.held = heavy.checkpointed_held = 95.0 * kMiB;
  a = trainer::tune::admit_trial(heavy, {64, 64, 0, 1});
  EXPECT_FALSE(a.run);
  EXPECT_EQ(a.reason.rfind("predicted out of memory: ", 0), 0u) << a.reason;
}

TEST(Admission, MomentsInFewerBitsOnlyWhenNothingExactFitsAndSaidSo) {
  MemoryEstimate e = ladder_estimate();
  e.model_blocks = 0;  // nothing to checkpoint
  e.moment_rungs = {{16, -30.0 * kMiB, -30.0 * kMiB, 0.01}, {8, -45.0 * kMiB, -45.0 * kMiB, 0.05}};
  auto a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  ASSERT_TRUE(a.run) << a.reason;
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_moment_bits=16"});
  EXPECT_NE(a.reason.find("AdamW's moments in 16 bits (inexact)"), std::string::npos) << a.reason;
  EXPECT_EQ(a.predicted_peak, 84 * kMiB);
  // With blocks to checkpoint, the exact rung wins even though it is slower.
  e.model_blocks = 4;
  a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_checkpointed_blocks=2"});
}

// The offload rung (probed on a GPU): exact, so it comes before moments in fewer bits, and by
// time against checkpointing. Plain, micro-batch 64 needs 114 MiB > 90 usable; with the moments
// in host memory (30 MiB off what the step holds throughout) 84 MiB fits at 64.
TEST(Admission, MomentsInHostMemoryAreExactAndChosenByTheirTime) {
  MemoryEstimate e = ladder_estimate();
  e.device = "cuda:0";
  e.model_blocks = 0;
  trainer::tune::MomentRung offload;
  offload.bits = 32;
  offload.offload = true;
  offload.held_delta = offload.step_held_delta = -30.0 * kMiB;
  offload.seconds_delta = 0.5;
  e.moment_rungs = {{16, -30.0 * kMiB, -30.0 * kMiB, 0.01}, offload};
  auto a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  ASSERT_TRUE(a.run) << a.reason;
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_offload=true"});
  // 0.5 + 0.1 + 64 + 0.5 s against 64.6 s.
  EXPECT_EQ(
      a.reason.rfind("on the ladder: micro-batch 64 with AdamW's moments in host memory, est. 1.01x step time (", 0),
      0u)
      << a.reason;
  EXPECT_EQ(a.predicted_peak, 84 * kMiB);
  // Checkpointing fits too (2 of 4 blocks at micro-batch 64: 74.2 s): the offload's 65.1 s wins;
  // an offload as slow as 10 s more per step (74.6 s) loses to it.
  e.model_blocks = 4;
  a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_offload=true"});
  e.moment_rungs[1].seconds_delta = 10.0;
  a = trainer::tune::admit_trial(e, {64, 64, 0, 64});
  EXPECT_EQ(a.overrides, std::vector<std::string>{"plugins.oom_backoff.start_checkpointed_blocks=2"});

  // The ladder's table lists the rung, and the estimate's JSON reads it back.
  e.moment_rungs[1].seconds_delta = 0.5;
  e.model_blocks = 0;
  e.batch_size = e.micro_batch = e.min_micro_batch = 64;  // (at micro-batch 40 the step fits plain)
  trainer::tune::set_ladder(e);
  ASSERT_EQ(e.rungs.size(), 3u);
  EXPECT_TRUE(e.rungs[2].offload);
  EXPECT_FALSE(e.rungs[2].inexact);
  EXPECT_EQ(e.rungs[2].moment_bits, 0);
  EXPECT_EQ(e.rungs[2].peak, 84 * kMiB);
  ASSERT_TRUE(e.cheapest.has_value());
  EXPECT_TRUE(e.cheapest->offload);
  std::ostringstream out;
  trainer::tune::print_estimate_json(e, out);
  const MemoryEstimate r = trainer::tune::estimate_from_json(out.str());
  ASSERT_NE(r.moment_rung(0, true), nullptr);
  EXPECT_EQ(r.moment_rung(0, true)->bits, 32);
  EXPECT_EQ(r.moment_rung(32, false), nullptr) << "the offload rung is not a rung of 32 bits on the device";
  EXPECT_EQ(r.predict_on_rung(64, 64, 0, 0, true), 84 * kMiB);
  EXPECT_DOUBLE_EQ(r.predict_seconds(64, 64, 0, 0, true), e.predict_seconds(64, 64, 0, 0, true));
  ASSERT_TRUE(r.cheapest.has_value());
  EXPECT_TRUE(r.cheapest->offload);
  EXPECT_TRUE(r.rungs[2].offload);
  std::ostringstream text;
  trainer::tune::print_estimate(e, text);
  EXPECT_NE(text.str().find("AdamW's moments in host memory"), std::string::npos) << text.str();
  // Offloaded moments are predicted in the recipe's bits only.
  EXPECT_THROW(e.predict_on_rung(64, 64, 0, 16, true), trainer::Error);
  // model.memory_format = "auto": the larger of the two formats' offload terms; a rung only one
  // format has is left out.
  MemoryEstimate other = e;
  other.moment_rungs[1].held_delta = -20.0 * kMiB;
  other.moment_rungs[1].seconds_delta = 0.25;
  trainer::tune::keep_larger_rungs(e, other);
  ASSERT_NE(e.moment_rung(0, true), nullptr);
  EXPECT_DOUBLE_EQ(e.moment_rung(0, true)->held_delta, -20.0 * kMiB);
  EXPECT_DOUBLE_EQ(e.moment_rung(0, true)->seconds_delta, 0.5);
  other.moment_rungs.pop_back();
  trainer::tune::keep_larger_rungs(e, other);
  EXPECT_EQ(e.moment_rung(0, true), nullptr);
  EXPECT_NE(e.moment_rung(16, false), nullptr);
}

TEST(Admission, AnEvaluationThatCannotFitGetsTheLargestEvalBatchThatDoes) {
  const MemoryEstimate e = toy_estimate();
  EXPECT_FALSE(e.eval_fits_at(1000));  // 150 MiB
  EXPECT_EQ(e.max_eval_batch(), 400);  // 50 + 0.1 x 400 = 90
  const auto a = trainer::tune::admit_trial(e, {32, 32, 1000, 0});
  EXPECT_TRUE(a.run);
  EXPECT_EQ(a.overrides, std::vector<std::string>{"eval.batch_size=400"});
  EXPECT_NE(a.reason.find("eval.batch_size 1000 -> 400 (evaluation 150 MiB"), std::string::npos) << a.reason;
  EXPECT_EQ(a.predicted_peak, 90 * kMiB);
  // With eval.limit_batches the same 3000 samples are evaluated: in batches that divide them.
  const auto limited = trainer::tune::admit_trial(e, {32, 32, 1000, 0, 3});
  EXPECT_EQ(limited.overrides, (std::vector<std::string>{"eval.batch_size=375", "eval.limit_batches=8"}));
  // Nothing fits when even the evaluation's start does not.
  MemoryEstimate full = e;
  full.eval_base = 95.0 * kMiB;
  EXPECT_FALSE(trainer::tune::admit_trial(full, {32, 32, 1000, 0}).run);
}

// With a length axis the estimate predicts at its `length`: the evaluation's rise per sample
// there (-0.05 MiB + 64 x 0.15/64 MiB = 0.1 MiB) gives the same largest batch as above, though
// its constant term alone is negative; the step's per-sample term grows with the length.
TEST(Admission, AtASequenceLengthTheLengthTermsCount) {
  MemoryEstimate e = toy_estimate();
  e.length = 64;
  e.eval_per_sample = -0.05 * kMiB;
  e.eval_per_sample_l1 = 0.15 * kMiB / 64;
  EXPECT_EQ(e.max_eval_batch(), 400);
  e.per_sample = 0.5 * kMiB;
  e.per_sample_l2 = 0.5 * kMiB / (64 * 64);  // 1 MiB per sample at 64, as above
  EXPECT_EQ(e.predict(32, 32), 82 * kMiB);
  EXPECT_EQ(e.predict_at(32, 32, 128), 50 * kMiB + 32 * 2.5 * kMiB);
  const auto a = trainer::tune::admit_trial(e, {64, 64, 0, 8});
  EXPECT_EQ(a.overrides, std::vector<std::string>{"training.micro_batch_size=40"});
  EXPECT_NE(a.reason.find("at batch 64, micro-batch 64, length 64 > 90.0 MiB usable"), std::string::npos) << a.reason;
}

// An estimate written before there was a length axis (no length terms, no floor, no lengths of
// probes) reads back with them 0: it predicts what it did.
TEST(EstimateReport, AnEstimateWithoutLengthTermsReadsBackAsItWas) {
  const MemoryEstimate e = toy_estimate();
  std::ostringstream out;
  trainer::tune::print_estimate_json(e, out);
  auto j = nlohmann::json::parse(out.str());
  for (const char* k : {"b_l1", "b_l2", "c_l1", "c2_l1", "slack_l1", "floor"}) j["fit"].erase(k);
  for (const char* k : {"per_sample_l1_bytes", "per_sample_l2_bytes"}) j["eval"].erase(k);
  j.erase("length");
  j.erase("by_length");
  const MemoryEstimate back = trainer::tune::estimate_from_json(j.dump());
  EXPECT_EQ(back.length, 0);
  EXPECT_EQ(back.predict(64, 64), e.predict(64, 64));
  EXPECT_EQ(back.predict_eval(1000), e.predict_eval(1000));
  EXPECT_EQ(back.max_eval_batch(), 400);
}

// The lengths a sweep's estimate probes: the shortest, middle and longest values of the space's
// dataset.max_length, its conditional cases included; none when it has fewer than three values,
// values that are not lengths, or no such parameter.
TEST(StudyLengths, TheShortestMiddleAndLongestOfTheSpacesLengths) {
  const auto lengths = [](const std::string& toml) {
    return trainer::tune::Study::lengths_to_probe(
        trainer::tune::SearchSpace::from_config(trainer::Config::parse(toml, "space.toml"), "sweep.space"));
  };
  EXPECT_EQ(lengths("[dataset.max_length]\ntype = \"choice\"\nvalues = [256, 128, 512, 384]\n"), "128,384,512");
  EXPECT_EQ(lengths("[dataset.max_length]\ntype = \"int\"\nlow = 128\nhigh = 512\nstep = 64\n"), "128,320,512");
  EXPECT_EQ(lengths("[model]\ntype = \"choice\"\nvalues = [\"a\", \"b\"]\n"
                    "[dataset.max_length]\ntype = \"choice\"\nvalues = [64, 128]\ncondition_on = \"model\"\n"
                    "[dataset.max_length.cases.b]\nvalues = [256]\n"),
            "64,128,256");
  EXPECT_EQ(lengths("[dataset.max_length]\ntype = \"choice\"\nvalues = [128, 512]\n"), "");
  EXPECT_EQ(lengths("[optim.lr]\ntype = \"choice\"\nvalues = [0.1, 0.2, 0.3]\n"), "");
}

TEST(EstimateReport, SaysWhichOfTheStepAndTheEvaluationDoesNotFit) {
  MemoryEstimate e = toy_estimate();
  e.batch_size = e.micro_batch = 32;
  e.run_peak = e.eval_peak;
  std::ostringstream out;
  trainer::tune::print_estimate(e, out);
  EXPECT_NE(out.str().find("the recipe's micro-batch 32 fits: predicted 82.0 MiB <= 90.0 MiB"), std::string::npos)
      << out.str();
  EXPECT_NE(out.str().find("evaluation at eval.batch_size 1000 does NOT fit: predicted 150 MiB > 90.0 MiB; largest "
                           "eval.batch_size that fits: 400"),
            std::string::npos)
      << out.str();
}

TEST(StudyJournal, ALineCutShortIsDroppedAndDoesNotSwallowTheNext) {
  TempDir tmp;
  const std::string path = tmp / "study.jsonl";
  write_file(path, "{\"event\":\"trial\",\"number\":0}\n{\"event\":\"end\",\"num");
  trainer::tune::StudyJournal j(path);
  j.append({{"event", "end"}, {"number", 0}});
  const auto records = j.read();
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].record["event"], "end");
  EXPECT_EQ(records[1].record["number"], 0);
  EXPECT_EQ(records[1].line, 2);
}

/// A space of one choice parameter, optim.lr in {0.01, 0.1}.
trainer::tune::SearchSpace lr_space() {
  return trainer::tune::SearchSpace::from_config(
      trainer::Config::parse("[optim.lr]\ntype = \"choice\"\nvalues = [0.01, 0.1]\n", "space.toml"), "sweep.space");
}

/// The message of the UsageError replay() throws for `text` as the journal ("" when none).
std::string replay_error(const std::string& text) {
  TempDir tmp;
  const std::string path = tmp / "study.jsonl";
  write_file(path, text);
  try {
    trainer::tune::replay(trainer::tune::StudyJournal(path).read(), lr_space(), path);
  } catch (const trainer::UsageError& e) {
    return e.what();
  }
  return "";
}

/// The journal text of `records`, one a line.
std::string lines(std::initializer_list<std::string> records) {
  std::string out;
  for (const auto& r : records) out += r + "\n";
  return out;
}

const std::string kStudyLine =
    R"({"event":"study","recipe":"r.toml","overrides":[],"objective":"eval/accuracy","direction":"maximize",)"
    R"("sampler":"grid","seed":42,"n_trials":2})";
const std::string kTrialLine = R"({"event":"trial","number":0,"params":{"optim.lr":"0.01"},"internal":{"optim.lr":0}})";

TEST(StudyJournal, AWholeJournalReplaysAndACutLastLineIsLeftOut) {
  TempDir tmp;
  const std::string path = tmp / "study.jsonl";
  write_file(path, lines({kStudyLine, kTrialLine, R"({"event":"report","number":0,"value":0.5})",
                          R"({"event":"end","number":0,"state":"COMPLETE","value":0.5})"}) +
                       R"({"event":"end","num)");
  const auto r = trainer::tune::replay(trainer::tune::StudyJournal(path).read(), lr_space(), path);
  ASSERT_EQ(r.trials.size(), 1u);
  EXPECT_EQ(r.trials.at(0).state, TrialState::Complete);
  EXPECT_EQ(r.trials.at(0).params.get("optim.lr"), "0.01");
  EXPECT_EQ(r.ended, 1);
}

TEST(StudyJournal, EachBadRecordIsNamedByItsLine) {
  const std::string e = replay_error(lines({
      kStudyLine,                                                                            // 1
      kTrialLine,                                                                            // 2
      R"({"event":"report","number":0})",                                                    // 3
      "not json",                                                                            // 4
      R"({"event":"end","number":"0","state":"COMPLETE"})",                                  // 5
      R"({"event":"end","number":0,"state":"DONE"})",                                        // 6
      R"({"event":"end","number":1,"state":"PRUNED"})",                                      // 7
      R"({"event":"ending","number":0})",                                                    // 8
      R"([1,2])",                                                                            // 9
      R"({"event":"trial","number":1,"params":{"optim.lr":"7"},"internal":{"optim.lr":5}})"  // 10
  }));
  const auto has = [&](const std::string& what) { return e.find(what) != std::string::npos; };
  EXPECT_TRUE(has("study.jsonl:3: \"report\" record: \"value\" is missing (a number)")) << e;
  EXPECT_TRUE(has("study.jsonl:4: not a JSON record")) << e;
  EXPECT_TRUE(has("study.jsonl:5: \"end\" record: \"number\" must be an integer >= 0, not \"0\" (a string)")) << e;
  EXPECT_TRUE(has("study.jsonl:6: \"end\" record: \"state\" must be one of COMPLETE, PRUNED, FAILED, SKIPPED")) << e;
  EXPECT_TRUE(has("study.jsonl:7: \"end\" record: trial 1 has no \"trial\" record before it")) << e;
  EXPECT_TRUE(has("study.jsonl:8: unknown event \"ending\"")) << e;
  EXPECT_TRUE(has("study.jsonl:9: a record is a JSON object")) << e;
  EXPECT_TRUE(has("study.jsonl:10: \"trial\" record: \"params\": optim.lr = \"7\" (a string) is none of its values"))
      << e;
  EXPECT_TRUE(has("is not the index of one of its values")) << e;
  EXPECT_FALSE(has("study.jsonl:1:")) << e;
  EXPECT_FALSE(has("study.jsonl:2:")) << e;
}

TEST(StudyJournal, AJournalThatDoesNotStartWithTheStudyRecordIsRefused) {
  const std::string e = replay_error(lines({kTrialLine, kStudyLine}));
  EXPECT_NE(e.find("study.jsonl:1: \"trial\" record: the journal's first record must be the study's"),
            std::string::npos)
      << e;
  const std::string bad_study = replay_error(lines({R"({"event":"study","objective":1})"}));
  EXPECT_NE(bad_study.find("\"objective\" must be a string, not 1 (an integer)"), std::string::npos) << bad_study;
}

TEST(StudyJournal, ARecordNestedTooDeepIsRefusedNotPrinted) {
  // Found beside tests/fuzz/study_journal_fuzz.cpp: printing it in the message overflowed the stack.
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  const std::string e =
      replay_error(lines({kStudyLine, deep, R"({"event":"report","number":0,"value":[[["]]]]"]]]})"}));
  EXPECT_NE(e.find("study.jsonl:2: not a JSON record (arrays and objects nested 200000 levels deep, more than the 64"),
            std::string::npos)
      << e.substr(0, 500);
  EXPECT_EQ(e.find("study.jsonl:3: not a JSON record"), std::string::npos) << e.substr(0, 500);  // "]]]]" in a string
}

TEST(StudyJournal, EveryDifferenceOfTwoStudyRecordsIsNamedButTheTrialCountMayChange) {
  using nlohmann::json;
  const json past{{"event", "study"},
                  {"version", 2},
                  {"recipe", "/a/r.toml"},
                  {"config_hash", "fnv1a64:1"},
                  {"config", {{"training.epochs", "1"}, {"memory.limit_mb", "100.0"}}},
                  {"overrides", {"sweep.n_trials=3", "optim.lr=0.1", "sweep.parallel=2"}},
                  {"objective", "eval/accuracy"},
                  {"direction", "maximize"},
                  {"sampler", "tpe"},
                  {"seed", 42},
                  {"n_trials", 3},
                  {"settings", {{"sweep.pruner", "median"}, {"sweep.budget_steps", 0}}},
                  {"space", json::array()}};
  json now = past;
  now["overrides"] = {"optim.lr=0.1", "sweep.n_trials=30"};
  now["n_trials"] = 30;
  EXPECT_TRUE(trainer::tune::study_differences(past, now).empty());
  now["recipe"] = "/b/r.toml";
  now["config"]["memory.limit_mb"] = "200.0";
  now["config_hash"] = "fnv1a64:2";
  now["overrides"] = {"optim.lr=0.2"};
  now["settings"]["sweep.pruner"] = "none";
  now["settings"]["sweep.budget_steps"] = 5;
  now["sampler"] = "random";
  const auto d = trainer::tune::study_differences(past, now);
  const std::vector<std::string> want{"recipe: journal has /a/r.toml, now /b/r.toml",
                                      "memory.limit_mb: journal has 100.0, now 200.0",
                                      "override optim.lr: journal has optim.lr=0.1, now optim.lr=0.2",
                                      "sweep.sampler: journal has tpe, now random",
                                      "sweep.budget_steps: journal has 0, now 5",
                                      "sweep.pruner: journal has median, now none"};
  EXPECT_EQ(d, want);
  // The hash alone differs: said as such.
  now = past;
  now["config_hash"] = "fnv1a64:2";
  EXPECT_EQ(trainer::tune::study_differences(past, now),
            std::vector<std::string>{"resolved config (content hash): journal has fnv1a64:1, now fnv1a64:2"});
}

TEST(StudyLock, OneStudyProcessPerDirectory) {
  TempDir tmp;
  std::ostringstream progress;
  trainer::tune::StudyLock first(tmp.str(), progress);
  ASSERT_TRUE(first.held());
  // This process holds it and is not a sweep: a second lock would wait for it, so the check
  // is made by a child (a live `trainer sweep` elsewhere is refused: tests/tune/sweep_test.cpp).
  EXPECT_EQ(trainer::testing::read_file(tmp / "study.lock"), std::to_string(::getpid()) + "\n");
}

TEST(MemoryKey, OverridesThatChangeMemoryGetAnEstimateOfTheirOwn) {
  // The keys of a config with SGD and a cosine schedule: which are memory_neutral() is
  // declared beside each key (KeySpec).
  trainer::Config cfg;
  cfg.set("optim.name", std::string("sgd"));
  cfg.set("sched.name", std::string("cosine"));
  const auto sections = trainer::core_config_sections(cfg);
  const auto memory_key = [&](const std::vector<std::string>& o) { return trainer::tune::memory_key(o, sections); };
  EXPECT_EQ(memory_key({"optim.lr=0.1", "training.batch_size=64", "eval.batch_size=100"}), memory_key({}));
  EXPECT_NE(memory_key({"optim.momentum=0"}), memory_key({"optim.momentum=0.9"}));  // SGD's momentum buffer
  EXPECT_NE(memory_key({"optim.weight_decay=0"}), memory_key({"optim.weight_decay=0.1"}));
  EXPECT_NE(memory_key({"model=mlp"}), memory_key({"model=cnn"}));
  EXPECT_EQ(memory_key({"sched.name=\"step\"", "+sched.warmup_steps=5", "sched.min_lr_ratio=0.1", "run.seed=3",
                        "checkpoint.keep_last=4", "training.max_steps=9"}),
            memory_key({}));
  EXPECT_NE(memory_key({"memory.limit_mb=100"}), memory_key({}));  // not declared neutral: counts
}

TEST(EstimateJson, ReadsBackWhatItWrites) {
  MemoryEstimate e = toy_estimate();
  e.probes.push_back({16, 16, 66 * kMiB, 66 * kMiB, 40 * kMiB, 70 * kMiB, false, ""});
  e.probes.push_back({64, 16, 0, 0, 0, 0, true, "out of memory"});
  e.notes = {"a \"quoted\" note"};
  e.test_samples = 500;
  std::ostringstream out;
  trainer::tune::print_estimate_json(e, out);
  const MemoryEstimate r = trainer::tune::estimate_from_json(out.str());
  EXPECT_EQ(r.held, e.held);
  EXPECT_EQ(r.per_sample, e.per_sample);
  EXPECT_EQ(r.limit, e.limit);
  EXPECT_EQ(r.margin, e.margin);
  EXPECT_EQ(r.limit_source, e.limit_source);
  EXPECT_EQ(r.eval_per_sample, e.eval_per_sample);
  EXPECT_EQ(r.test_samples, 500);
  EXPECT_EQ(r.predict(48, 24), e.predict(48, 24));
  EXPECT_EQ(r.predict_eval(1000), e.predict_eval(1000));
  ASSERT_EQ(r.probes.size(), 2u);
  EXPECT_TRUE(r.probes[1].out_of_memory);
  EXPECT_EQ(r.notes, e.notes);
  EXPECT_THROW(trainer::tune::estimate_from_json("{\"device\":\"cpu\"}"), trainer::Error);
  EXPECT_FALSE(r.has_ladder());
  EXPECT_FALSE(r.cheapest.has_value());

  // The ladder reads back: the same predictions on each rung and the same cheapest choice.
  MemoryEstimate l = ladder_estimate();
  l.moment_rungs = {{16, -30.0 * kMiB, -31.0 * kMiB, 0.01}};
  l.rungs = {{64, 0, 0, 114 * kMiB, 1.0, false}, {64, 1, 0, 102 * kMiB, 1.02, false}};
  l.cheapest = l.cheapest_fit(64, 64, 48);
  ASSERT_TRUE(l.cheapest.has_value());
  l.probes.push_back({16, 16, 66 * kMiB, 66 * kMiB, 40 * kMiB, 70 * kMiB, false, ""});
  std::ostringstream lout;
  trainer::tune::print_estimate_json(l, lout);
  const MemoryEstimate lr = trainer::tune::estimate_from_json(lout.str());
  ASSERT_TRUE(lr.has_ladder());
  EXPECT_EQ(lr.predict_on_rung(64, 48, 1, 0), l.predict_on_rung(64, 48, 1, 0));
  EXPECT_EQ(lr.predict_on_rung(64, 64, 0, 16), l.predict_on_rung(64, 64, 0, 16));
  EXPECT_DOUBLE_EQ(lr.predict_seconds(64, 48, 3, 16), l.predict_seconds(64, 48, 3, 16));
  ASSERT_EQ(lr.rungs.size(), 2u);
  EXPECT_EQ(lr.rungs[1].checkpointed_blocks, 1);
  ASSERT_TRUE(lr.cheapest.has_value());
  EXPECT_EQ(lr.cheapest->micro_batch, l.cheapest->micro_batch);
  EXPECT_EQ(lr.cheapest->checkpointed_blocks, l.cheapest->checkpointed_blocks);

  // An estimate written before the ladder (no "ladder", no probe savers or times) reads as one
  // without rungs.
  nlohmann::json old = nlohmann::json::parse(lout.str());
  old.erase("ladder");
  for (auto& p : old["probes"]) {
    for (const char* k : {"checkpointed_blocks", "moment_bits", "forward_backward_seconds", "optimizer_seconds"}) {
      p.erase(k);
    }
  }
  const MemoryEstimate before = trainer::tune::estimate_from_json(old.dump());
  EXPECT_FALSE(before.has_ladder());
  EXPECT_TRUE(before.rungs.empty());
  EXPECT_FALSE(before.cheapest.has_value());
  EXPECT_EQ(before.predict(48, 24), l.predict(48, 24));
  ASSERT_EQ(before.probes.size(), 1u);
  EXPECT_EQ(before.probes[0].checkpointed_blocks, 0);
  EXPECT_EQ(before.probes[0].forward_backward_seconds, 0.0);
}

}  // namespace

namespace {

TEST(TrialStates, EveryNameReadsBackAndOnlyRunningDoesNotEndATrial) {
  using trainer::tune::trial_state_name;
  using trainer::tune::trial_state_named;
  for (auto s :
       {TrialState::Running, TrialState::Complete, TrialState::Pruned, TrialState::Failed, TrialState::Skipped}) {
    EXPECT_EQ(trial_state_named(trial_state_name(s)), s) << trial_state_name(s);
    EXPECT_EQ(trainer::tune::trial_ended(s), s != TrialState::Running) << trial_state_name(s);
  }
  EXPECT_STREQ(trial_state_name(TrialState::Complete), "COMPLETE");  // Optuna's name, in the journal
  EXPECT_FALSE(trial_state_named("complete"));
}

// A study directory is resumed and may come from elsewhere: links planted at its journal, its
// lock or a trial's output file never take a write out of it (the journal and the lock refused
// naming them, a trial's output created as a file of its own).
TEST(StudyJournal, LinksPlantedInTheStudyDirectoryAreNeverWrittenThrough) {
  namespace fs = std::filesystem;
  TempDir tmp;
  write_file(tmp / "outside.txt", "keep me");
  fs::create_directories(tmp / "study/trials");
  fs::create_symlink(tmp / "outside.txt", tmp / "study/study.jsonl");
  fs::create_symlink(tmp / "outside.txt", tmp / "study/study.lock");
  fs::create_symlink(tmp / "outside.txt", tmp / "study/trials/trial_0000.out");
  const auto usage_error = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const trainer::UsageError& e) {
      return std::string(e.what());
    }
    return std::string("not refused");
  };
  trainer::tune::StudyJournal journal(tmp / "study/study.jsonl");
  EXPECT_NE(usage_error([&] {
              journal.append({{"type", "trial"}});
            }).find("study.jsonl is a symbolic link"),
            std::string::npos);
  std::ostringstream progress;
  EXPECT_NE(usage_error([&] {
              trainer::tune::StudyLock lock(tmp / "study", progress);
            }).find("study.lock is a symbolic link"),
            std::string::npos);
  const std::string out = tmp / "study/trials/trial_0000.out";
  EXPECT_EQ(trainer::tune::wait_exit(trainer::tune::spawn({"/bin/echo", "the trial's output"}, out, out)), 0);
  EXPECT_EQ(trainer::testing::read_file(tmp / "outside.txt"), "keep me");
  EXPECT_FALSE(fs::is_symlink(out));
  EXPECT_EQ(trainer::testing::read_file(out), "the trial's output\n");
}

}  // namespace
