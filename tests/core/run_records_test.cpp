// The run's states (trainer/states.h) and the codecs of its directory's records
// (trainer/run_records.h): every name read back gives its value, and what each encoder writes
// its decoder reads unchanged.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "trainer/error.h"
#include "trainer/json.h"
#include "trainer/run_records.h"
#include "trainer/states.h"

namespace trainer {
namespace {

TEST(States, EveryNameReadsBackAsItsValueAndUnknownNamesAreNone) {
  for (auto s : {RunStatus::Running, RunStatus::Finished, RunStatus::Failed, RunStatus::Killed}) {
    EXPECT_EQ(run_status_named(run_status_name(s)), s) << run_status_name(s);
  }
  for (auto k :
       {FailureKind::None, FailureKind::OutOfMemory, FailureKind::Usage, FailureKind::NoDevice, FailureKind::Error}) {
    EXPECT_EQ(failure_kind_named(failure_kind_name(k)), k) << failure_kind_name(k);
  }
  for (auto p : {OomPhase::Data, OomPhase::Forward, OomPhase::Backward, OomPhase::AllReduce, OomPhase::OptimizerStep,
                 OomPhase::Eval, OomPhase::Checkpoint}) {
    EXPECT_EQ(oom_phase_named(oom_phase_name(p)), p) << oom_phase_name(p);
  }
  EXPECT_STREQ(run_status_name(RunStatus::Finished), "FINISHED");  // MLflow's name
  EXPECT_STREQ(failure_kind_name(FailureKind::OutOfMemory), "out_of_memory");
  EXPECT_STREQ(oom_phase_name(OomPhase::OptimizerStep), "optimizer_step");
  EXPECT_FALSE(run_status_named("finished"));
  EXPECT_FALSE(failure_kind_named(""));
  EXPECT_FALSE(oom_phase_named("step"));
  EXPECT_FALSE(oom_phase_micro_batch_helps(OomPhase::OptimizerStep));
  EXPECT_TRUE(oom_phase_micro_batch_helps(OomPhase::Backward));
}

TEST(StatusJson, AFailedRunOutOfMemoryRoundTripsWithItsKindAndPhase) {
  RunStatusRecord s;
  s.status = RunStatus::Failed;
  s.exit_code = 3;
  s.global_step = 12;
  s.epoch = 1;
  s.message = "out of memory in backward on cpu \"quoted\"\n";
  s.last_checkpoint = "runs/r/checkpoints/step_00000012.pt";
  s.failure = FailureKind::OutOfMemory;
  s.oom_phase = OomPhase::Backward;
  s.micro_batch = 16;
  s.time = 1764110000.5;
  const std::string text = encode_status(s);
  EXPECT_EQ(text.find("{\"status\":\"FAILED\",\"exit_code\":3,"), 0u) << text;
  EXPECT_NE(text.find("\"failure\":\"out_of_memory\",\"phase\":\"backward\",\"micro_batch\":16"), std::string::npos)
      << text;
  EXPECT_EQ(text.find("stopped_by"), std::string::npos) << text;
  EXPECT_EQ(text.back(), '\n');
  const RunStatusRecord back = decode_status(text);
  EXPECT_EQ(back.status, RunStatus::Failed);
  EXPECT_EQ(back.exit_code, 3);
  EXPECT_EQ(back.global_step, 12);
  EXPECT_EQ(back.epoch, 1);
  EXPECT_EQ(back.message, s.message);
  EXPECT_EQ(back.last_checkpoint, s.last_checkpoint);
  EXPECT_EQ(back.failure, FailureKind::OutOfMemory);
  EXPECT_EQ(back.oom_phase, OomPhase::Backward);
  EXPECT_EQ(back.micro_batch, 16);
  EXPECT_DOUBLE_EQ(back.time, s.time);
}

TEST(StatusJson, RunningHasANullExitCodeAndOnlyAFailedRunSaysAFailure) {
  RunStatusRecord s;
  s.failure = FailureKind::Error;  // ignored: the run has not failed
  const std::string running = encode_status(s);
  EXPECT_NE(running.find("\"exit_code\":null"), std::string::npos) << running;
  EXPECT_EQ(running.find("failure"), std::string::npos) << running;
  EXPECT_EQ(running.find("\"time\""), std::string::npos) << running;  // no time given, none written
  s.status = RunStatus::Finished;
  s.stopped_by = "early_stopping";
  s.reason = "no improvement";
  const RunStatusRecord back = decode_status(encode_status(s));
  EXPECT_EQ(back.status, RunStatus::Finished);
  EXPECT_EQ(back.failure, FailureKind::None);
  EXPECT_EQ(back.stopped_by, "early_stopping");
  EXPECT_EQ(back.reason, "no improvement");
}

TEST(StatusJson, TheMemorySaversOnAreWrittenOnlyWhileOnAndReadBackChecked) {
  RunStatusRecord s;
  s.status = RunStatus::Finished;
  const std::string none = encode_status(s);
  EXPECT_EQ(none.find("checkpointed_blocks"), std::string::npos) << none;
  EXPECT_EQ(none.find("optimizer_moment_bits"), std::string::npos) << none;
  EXPECT_EQ(none.find("optimizer_offload"), std::string::npos) << none;
  s.checkpointed_blocks = 6;
  s.optimizer_moment_bits = 16;
  s.optimizer_offload = true;
  const std::string on = encode_status(s);
  EXPECT_NE(on.find("\"checkpointed_blocks\":6,\"optimizer_moment_bits\":16,\"optimizer_offload\":true"),
            std::string::npos)
      << on;
  const RunStatusRecord back = decode_status(on);
  EXPECT_EQ(back.checkpointed_blocks, 6);
  EXPECT_EQ(back.optimizer_moment_bits, 16);
  EXPECT_TRUE(back.optimizer_offload);
  // A file's nonsense reads as nothing on: negative blocks, bits AdamW's moments are never in.
  const RunStatusRecord bad = decode_status(
      R"({"status":"FINISHED","checkpointed_blocks":-3,"optimizer_moment_bits":12,"optimizer_offload":1})");
  EXPECT_EQ(bad.checkpointed_blocks, 0);
  EXPECT_EQ(bad.optimizer_moment_bits, 0);
  EXPECT_FALSE(bad.optimizer_offload);  // not a boolean
}

TEST(StatusJson, AnOlderFileReadsWithDefaultsAndABadOneSaysWhatIsWrong) {
  // Written before "failure" existed; mistyped optional fields keep their defaults.
  const RunStatusRecord old = decode_status(
      R"({"status":"KILLED","exit_code":130,"global_step":"7","epoch":2.9,"message":5,"last_checkpoint":""})");
  EXPECT_EQ(old.status, RunStatus::Killed);
  EXPECT_EQ(old.exit_code, 130);
  EXPECT_EQ(old.global_step, 0);
  EXPECT_EQ(old.epoch, 2);
  EXPECT_EQ(old.message, "");
  EXPECT_EQ(old.failure, FailureKind::None);
  EXPECT_FALSE(old.oom_phase);
  const auto error_of = [](const std::string& text) {
    try {
      decode_status(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("[1]"), "is not a JSON object");
  EXPECT_EQ(error_of("{\"status\":1}"), "has no \"status\" string");
  EXPECT_EQ(error_of("{\"status\":\"DONE\"}"),
            "has \"status\" \"DONE\", which is not one of RUNNING, FINISHED, FAILED, KILLED");
  EXPECT_EQ(error_of(std::string(100, '[') + std::string(100, ']')), "is not a JSON object");  // not parsed
}

TEST(MetricsJsonl, ALineRoundTripsAndValuesThatAreNotNumbersTravelByName) {
  const MetricRecord m{12, "train/loss \"quoted\"", 0.25, 1764110000.5};
  const std::string line = encode_metric(m);
  EXPECT_EQ(line, "{\"step\":12,\"name\":\"train/loss \\\"quoted\\\"\",\"value\":0.25,\"time\":1764110000.5}\n");
  const auto back = decode_metric(line.substr(0, line.size() - 1));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->step, 12);
  EXPECT_EQ(back->name, m.name);
  EXPECT_EQ(back->value, 0.25);
  EXPECT_EQ(back->time, m.time);
  for (const double v : {std::numeric_limits<double>::quiet_NaN(), std::numeric_limits<double>::infinity(),
                         -std::numeric_limits<double>::infinity()}) {
    const std::string text = encode_metric({3, "x", v, 1.0});
    EXPECT_NE(text.find(std::string("\"value\":\"") + json_nonfinite_name(v) + "\""), std::string::npos) << text;
    const auto read = decode_metric(text);
    ASSERT_TRUE(read) << text;
    if (std::isnan(v)) {
      EXPECT_TRUE(std::isnan(read->value));
    } else {
      EXPECT_EQ(read->value, v);
    }
  }
  // Written by Python's json module: a float step that is whole, no time.
  const auto python = decode_metric(R"({"step": 7.0, "name": "eval/accuracy", "value": 0.9})");
  ASSERT_TRUE(python);
  EXPECT_EQ(python->step, 7);
  EXPECT_TRUE(std::isnan(python->time));
}

TEST(MetricsJsonl, WhatIsNotAMetricLineIsRejected) {
  for (const char* line : {"", "not json", "[1, 2]", R"({"name": "x", "value": 1})", R"({"step": 1, "value": 1})",
                           R"({"step": 1, "name": "", "value": 1})", R"({"step": 1, "name": "x"})",
                           R"({"step": 1, "name": "x", "value": "nan"})", R"({"step": 1, "name": "x", "value": [1]})",
                           R"({"step": 1e30, "name": "x", "value": 1})", R"({"step": "1", "name": "x", "value": 1})",
                           R"({"step": 7.5, "name": "x", "value": 1})",
                           R"({"step": 1, "name": "x", "value": {"a": [[[[[[[[[1]]]]]]]]]}})"}) {
    EXPECT_FALSE(decode_metric(line)) << line;
  }
}

TEST(CheckpointDigest, TheDigestRoundTripsAndAnythingElseIsNotOne) {
  const std::string text = encode_digest({1234, 0x0a1b2c3d});
  EXPECT_EQ(text, "size 1234 crc32 0a1b2c3d\n");
  const auto back = decode_digest(text);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->size, 1234);
  EXPECT_EQ(back->crc32, 0x0a1b2c3du);
  EXPECT_FALSE(decode_digest(""));
  EXPECT_FALSE(decode_digest("size -1 crc32 00000000\n"));
  EXPECT_FALSE(decode_digest("crc32 0a1b2c3d size 1234\n"));
  EXPECT_FALSE(decode_digest(std::string(100000, 'x')));
}

}  // namespace
}  // namespace trainer
