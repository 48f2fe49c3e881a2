// Control applied by the table in events.h, end to end: a field the event does not honour is
// cleared (with a warning where the table says so) and changes nothing.
#include <gtest/gtest.h>

#include "support/test_util.h"
#include "trainer/trainer.h"

namespace trainer {
namespace {

using testing::json_num;
using testing::read_file;
using testing::read_lines;

constexpr const char* kControlRecipe = R"(
[model]
name = "mlp"
hidden = [16]
[dataset]
name = "synthetic"
size = 64
shape = [1, 4, 4]
[training]
epochs = 1
batch_size = 32
micro_batch_size = 16
[optim]
name = "sgd"
[eval]
every_epochs = 0
at_end = false
[metrics]
console = false
[plugins]
load = ["recording"]
)";

/// Asks for things in events that do not honour them.
class Misplaced final : public Plugin {
 public:
  std::string name() const override { return "misplaced"; }
  std::vector<Event> events() const override {
    return {Event::EpochStart, Event::BatchStart, Event::AfterOptimizerStep, Event::FitEnd};
  }
  void on_event(EventContext& ctx, Control& c) override {
    if (ctx.event == Event::EpochStart) c.micro_batch_size = 4;        // honoured in BatchStart/BatchEnd
    if (ctx.event == Event::BatchStart) c.retry_with_micro_batch = 4;  // honoured in OutOfMemory
    if (ctx.event == Event::AfterOptimizerStep) c.skip_step = true;    // too late: silently ignored
    if (ctx.event == Event::FitEnd) c.stop_training = true;            // the loop is over
  }
};

class ControlTable : public testing::TrainerTest {};

TEST_F(ControlTable, FieldsAnEventDoesNotHonourChangeNothing) {
  TrainerOptions o = options_for(kControlRecipe, {}, "run", {std::make_shared<Misplaced>()});
  o.log_level = "info";
  const RunResult r = Trainer(std::move(o)).fit();
  ASSERT_EQ(r.exit_code, kExitOk) << r.message;
  EXPECT_EQ(r.global_step, 2);  // both steps taken: skip_step in AfterOptimizerStep did nothing
  for (const auto& line : read_lines(tmp_ / "run/events.jsonl")) {
    if (testing::json_str(line, "event") == "BeforeForward") {
      EXPECT_EQ(*json_num(line, "micro_batch_size"), 16);
    }
  }
  const std::string log = read_file(tmp_ / "run/trainer.log");
  EXPECT_NE(log.find("micro_batch_size is honoured in BatchStart and BatchEnd only; ignored in EpochStart"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("retry_with_micro_batch is honoured in OutOfMemory only; ignored in BatchStart"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("skip_step"), std::string::npos) << log;
  EXPECT_EQ(log.find("a plugin asked to stop"), std::string::npos) << log;
}

}  // namespace
}  // namespace trainer
