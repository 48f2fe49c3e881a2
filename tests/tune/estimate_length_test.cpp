// `trainer estimate --lengths`: sequence length as a memory axis. A BERT-layout encoder on a
// text dataset is probed at three lengths (every batch padded to the length, the model over the
// full width) and its predictions are checked against real steps at (micro-batch, length)
// pairs that were not probed, lengths between and beside the probed ones included, and so is
// its evaluation peak (the CPU tracking allocator: deterministic bytes); the JSON that `trainer sweep` reads keeps the
// length terms; what cannot be probed over lengths is a usage error.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "estimate.h"
#include "short_run.h"
#include "support/test_util.h"
#include "support/tiny_text.h"
#include "trainer/error.h"

namespace {

using trainer::testing::TempDir;
using trainer::testing::write_file;
using trainer::tune::EstimateRequest;
using trainer::tune::MemoryEstimate;

/// The recipe of support/tiny_text.h: text_classification.toml's encoder on 1,000 short texts.
class EstimateLengths : public ::testing::Test {
 protected:
  void SetUp() override { write_file(recipe_, trainer::testing::tiny_text_recipe(tmp_.str())); }

  /// The peak of real steps at micro-batch m of a batch of `batch`, every batch `length` long.
  std::int64_t measured(std::int64_t batch, std::int64_t m, std::int64_t length) {
    trainer::tune::ShortRunSpec spec;
    spec.recipe = recipe_;
    spec.overrides = {"dataset.max_length=" + std::to_string(length), "dataset.padding=\"max_length\"",
                      "model.trim_padding=false"};
    spec.batch_size = batch;
    spec.micro_batch = m;
    spec.work_dir = tmp_ / "held-out";
    const auto r = trainer::tune::run_short(spec);
    EXPECT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.steps.size(), 3u);
    return r.peak();
  }

  /// The peak of an evaluation of `eval_batch` samples after steps of 4, every batch `length` long.
  std::int64_t measured_eval(std::int64_t eval_batch, std::int64_t length) {
    trainer::tune::ShortRunSpec spec;
    spec.recipe = recipe_;
    spec.overrides = {"dataset.max_length=" + std::to_string(length), "dataset.padding=\"max_length\"",
                      "model.trim_padding=false"};
    spec.batch_size = 4;
    spec.micro_batch = 4;
    spec.evaluate = true;
    spec.eval_batch = eval_batch;
    spec.work_dir = tmp_ / "held-out-eval";
    const auto r = trainer::tune::run_short(spec);
    EXPECT_EQ(r.exit_code, 0) << r.message;
    EXPECT_EQ(r.eval_samples, eval_batch);
    return r.eval_peak;
  }

  TempDir tmp_;
  std::string recipe_ = tmp_ / "recipe.toml";
};

// Probes at lengths 16, 32 and 64 (micro-batches 4, 8, 16 at 64, the same tokens at the shorter
// lengths); real steps at lengths 24 and 48 (between the probed ones), at 64 with micro-batches
// 4 and 8 times the largest probed there, and a step too small to rise above the floor: each
// prediction within 10 % of the measured peak. Memory per sample grows faster than the length (attention's scores: the
// L^2 term is positive), and the table by length rises with it.
TEST_F(EstimateLengths, HeldOutMicroBatchesAndLengthsArePredictedWithinTenPercent) {
  EstimateRequest req;
  req.recipe = recipe_;
  req.probe_sizes = {4, 8, 16};
  req.lengths = {32, 16, 64};
  req.work_dir = tmp_.str();
  const MemoryEstimate e = trainer::tune::estimate_memory(req);
  ASSERT_EQ(e.probes.size(), 12u);
  EXPECT_EQ(e.probes[0].length, 16);
  EXPECT_EQ(e.probes[0].micro_batch, 16);  // 4 at length 64: the same tokens
  EXPECT_EQ(e.probes[11].length, 64);
  EXPECT_EQ(e.probes[11].batch_size, 64);
  EXPECT_EQ(e.length, 64);  // the recipe's max_length
  EXPECT_GT(e.per_sample_l2, 0.0);
  ASSERT_EQ(e.by_length.size(), 3u);
  EXPECT_LT(e.by_length[0].peak, e.by_length[1].peak);
  EXPECT_LT(e.by_length[1].peak, e.by_length[2].peak);
  EXPECT_EQ(e.by_length[2].peak, e.peak);
  EXPECT_GT(e.eval_peak, 0);
  struct Point {
    std::int64_t batch, micro, length;
  };
  // A small step is on the floor (the gradients it creates, not its activations): (4, 4, 16).
  EXPECT_GT(e.floor, 0.0);
  for (const Point& p : {Point{4, 4, 16}, Point{128, 32, 24}, Point{128, 128, 24}, Point{64, 64, 48},
                         Point{128, 32, 48}, Point{64, 64, 64}, Point{128, 128, 64}}) {
    const std::int64_t real = measured(p.batch, p.micro, p.length);
    const std::int64_t predicted = e.predict_at(p.batch, p.micro, p.length);
    EXPECT_LT(std::fabs(double(predicted - real)) / double(real), 0.10)
        << "micro-batch " << p.micro << " of " << p.batch << " at length " << p.length << ": predicted " << predicted
        << ", measured " << real;
  }

  // The evaluation, fitted over the probes' lengths too: the recipe's evaluation batch at lengths
  // between the probed ones, and a smaller batch at one of them, within 10 % of its measured peak.
  for (const Point& p : {Point{64, 0, 24}, Point{64, 0, 48}, Point{32, 0, 64}}) {
    const std::int64_t real = measured_eval(p.batch, p.length);
    const std::int64_t predicted = e.predict_eval_at(p.batch, p.length);
    EXPECT_LT(std::fabs(double(predicted - real)) / double(real), 0.10)
        << "evaluation of " << p.batch << " at length " << p.length << ": predicted " << predicted << ", measured "
        << real;
  }

  // What `trainer sweep` reads back predicts the same at every length.
  std::ostringstream json;
  trainer::tune::print_estimate_json(e, json);
  const MemoryEstimate back = trainer::tune::estimate_from_json(json.str());
  for (const std::int64_t length : {16, 40, 64}) {
    EXPECT_EQ(back.predict_at(128, 32, length), e.predict_at(128, 32, length));
    EXPECT_EQ(back.predict_eval_at(64, length), e.predict_eval_at(64, length));
  }
  EXPECT_EQ(back.predict(64, 64), e.predict(64, 64));
  ASSERT_EQ(back.by_length.size(), 3u);
  EXPECT_EQ(back.by_length[1].peak, e.by_length[1].peak);
}

// Fewer than three lengths, a dataset without max_length, and a length beyond the model's
// positions are usage errors (exit 2) naming what is wrong.
TEST_F(EstimateLengths, WhatCannotBeProbedOverLengthsIsAUsageError) {
  const std::string cli = std::string(TRAINER_CLI) + " estimate --probe-sizes 4,8 --recipe ";
  auto o = trainer::testing::run_command(cli + recipe_ + " --lengths 16,32 2>&1");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("--lengths needs at least three distinct lengths"), std::string::npos) << o.text;
  o = trainer::testing::run_command(cli + recipe_ + " --lengths 16,x,32 2>&1");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("--lengths '16,x,32': expected positive integers"), std::string::npos) << o.text;
  o = trainer::testing::run_command(cli + TRAINER_SOURCE_DIR + "/recipes/fashion_mnist_tight.toml model=mlp" +
                                    " --lengths 16,32,64 2>&1");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("the recipe's dataset has no max_length"), std::string::npos) << o.text;
  o = trainer::testing::run_command(cli + recipe_ + " --lengths 16,32,128 2>&1");
  EXPECT_EQ(o.code, 2) << o.text;
  EXPECT_NE(o.text.find("max_position_embeddings"), std::string::npos) << o.text;
}

}  // namespace
