// The run's states (trainer/states.h) and status.json's codec (trainer/run_records.h): every
// name read back gives its value, and what encode_status writes decode_status reads unchanged.
#include <gtest/gtest.h>

#include <string>

#include "trainer/error.h"
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
  s.time = 1764110000.5;
  const std::string text = encode_status(s);
  EXPECT_EQ(text.find("{\"status\":\"FAILED\",\"exit_code\":3,"), 0u) << text;
  EXPECT_NE(text.find("\"failure\":\"out_of_memory\",\"phase\":\"backward\""), std::string::npos) << text;
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

}  // namespace
}  // namespace trainer
