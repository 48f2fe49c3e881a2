#include "trainer/event_bus.h"

#include <c10/util/Exception.h>
#include <gtest/gtest.h>

#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>
#include <stdexcept>

namespace trainer {
namespace {

/// Records "<name>:<event>" into a shared log; optionally throws in one event.
class LogPlugin final : public Plugin {
 public:
  LogPlugin(std::string name, std::vector<std::string>* log, std::vector<Event> events, int priority = 0)
      : name_(std::move(name)), log_(log), events_(std::move(events)), priority_(priority) {}
  std::string name() const override { return name_; }
  std::vector<Event> events() const override { return events_; }
  int default_priority() const override { return priority_; }
  void on_event(EventContext& ctx, Control& c) override {
    log_->push_back(name_ + ":" + std::string(event_name(ctx.event)));
    ++calls;
    if (throw_in && *throw_in == ctx.event) throw std::runtime_error("boom");
    if (oom_in && *oom_in == ctx.event) TORCH_CHECK_WITH(OutOfMemoryError, false, "fake OOM");
    if (cuda_oom_in && *cuda_oom_in == ctx.event) throw c10::Error({"f", "file", 1}, "CUDA error: out of memory");
    if (stop_in && *stop_in == ctx.event) c.stop_training = true;
    if (!reason.empty()) c.reason = reason;
  }
  std::optional<Event> throw_in, oom_in, cuda_oom_in, stop_in;
  std::string reason;
  int calls = 0;

 private:
  std::string name_;
  std::vector<std::string>* log_;
  std::vector<Event> events_;
  int priority_;
};

EventContext ctx_for(Event e) {
  EventContext c;
  c.event = e;
  return c;
}

TEST(EventBus, RunsByPriorityThenLoadOrder) {
  std::vector<std::string> log;
  EventBus bus;
  bus.add(std::make_shared<LogPlugin>("late", &log, std::vector<Event>{Event::BatchStart}, 10));
  bus.add(std::make_shared<LogPlugin>("a", &log, std::vector<Event>{Event::BatchStart}, 0));
  bus.add(std::make_shared<LogPlugin>("b", &log, std::vector<Event>{Event::BatchStart}, 0));
  bus.add(std::make_shared<LogPlugin>("first", &log, std::vector<Event>{Event::BatchStart}, -5));
  auto c = ctx_for(Event::BatchStart);
  Control control;
  bus.dispatch(c, control);
  EXPECT_EQ(log, (std::vector<std::string>{"first:BatchStart", "a:BatchStart", "b:BatchStart", "late:BatchStart"}));
}

TEST(EventBus, ClosingEventsRunInReverseSoWrappersNest) {
  std::vector<std::string> log;
  EventBus bus;
  const std::vector<Event> evs{Event::BeforeForward, Event::AfterForward};
  bus.add(std::make_shared<LogPlugin>("outer", &log, evs, 0));
  bus.add(std::make_shared<LogPlugin>("inner", &log, evs, 1));
  Control control;
  auto before = ctx_for(Event::BeforeForward);
  bus.dispatch(before, control);
  auto after = ctx_for(Event::AfterForward);
  bus.dispatch(after, control);
  EXPECT_EQ(log, (std::vector<std::string>{"outer:BeforeForward", "inner:BeforeForward", "inner:AfterForward",
                                           "outer:AfterForward"}));
}

TEST(EventBus, DeliversOnlyDeclaredEvents) {
  std::vector<std::string> log;
  EventBus bus;
  auto p = std::make_shared<LogPlugin>("p", &log, std::vector<Event>{Event::EpochEnd});
  bus.add(p);
  Control control;
  for (Event e : {Event::Init, Event::EpochStart, Event::EpochEnd}) {
    auto c = ctx_for(e);
    bus.dispatch(c, control);
  }
  EXPECT_EQ(p->calls, 1);
  EXPECT_EQ(bus.subscribers(Event::EpochEnd), 1u);
  EXPECT_EQ(bus.subscribers(Event::Init), 0u);
}

TEST(EventBus, ObserverFailureIsLoggedAndTheOthersStillRun) {
  std::vector<std::string> log;
  EventBus bus;
  auto bad = std::make_shared<LogPlugin>("bad", &log, std::vector<Event>{Event::BatchEnd});
  bad->throw_in = Event::BatchEnd;
  auto good = std::make_shared<LogPlugin>("good", &log, std::vector<Event>{Event::BatchEnd});
  bus.add(good);
  bus.add(bad);
  auto c = ctx_for(Event::BatchEnd);
  Control control;
  EXPECT_NO_THROW(bus.dispatch(c, control));
  EXPECT_EQ(good->calls, 1);
  EXPECT_EQ(bus.swallowed_errors(), 1u);
}

TEST(EventBus, EssentialFailureNamesPluginAndEvent) {
  std::vector<std::string> log;
  EventBus bus;
  auto bad = std::make_shared<LogPlugin>("strict", &log, std::vector<Event>{Event::AfterBackward});
  bad->throw_in = Event::AfterBackward;
  bus.add(bad, std::nullopt, FailurePolicy::Essential);
  auto c = ctx_for(Event::AfterBackward);
  Control control;
  try {
    bus.dispatch(c, control);
    FAIL();
  } catch (const PluginError& e) {
    EXPECT_STREQ(e.what(), "plugin 'strict' failed in AfterBackward: boom");
  }
}

TEST(EventBus, OutOfMemoryPassesThroughUnchanged) {
  std::vector<std::string> log;
  EventBus bus;
  auto p = std::make_shared<LogPlugin>("p", &log, std::vector<Event>{Event::BeforeForward});
  p->oom_in = Event::BeforeForward;
  bus.add(p);
  auto c = ctx_for(Event::BeforeForward);
  Control control;
  EXPECT_THROW(bus.dispatch(c, control), c10::OutOfMemoryError);
}

TEST(EventBus, PlainC10OutOfMemoryErrorsPassThroughToo) {
  std::vector<std::string> log;
  EventBus bus;
  auto p = std::make_shared<LogPlugin>("p", &log, std::vector<Event>{Event::AfterBackward});
  p->cuda_oom_in = Event::AfterBackward;
  bus.add(p);  // an observer: any other error would be swallowed
  auto c = ctx_for(Event::AfterBackward);
  Control control;
  EXPECT_THROW(bus.dispatch(c, control), c10::Error);
  EXPECT_EQ(bus.swallowed_errors(), 0u);
}

TEST(EventBus, ControlRequestsReachTheCaller) {
  std::vector<std::string> log;
  EventBus bus;
  auto p = std::make_shared<LogPlugin>("p", &log, std::vector<Event>{Event::BatchEnd});
  p->stop_in = Event::BatchEnd;
  bus.add(p);
  auto c = ctx_for(Event::BatchEnd);
  Control control;
  bus.dispatch(c, control);
  EXPECT_TRUE(control.stop_training);
  EXPECT_TRUE(control.any());
}

TEST(Events, NamesRoundTrip) {
  for (std::size_t i = 0; i < kNumEvents; ++i) {
    const auto e = static_cast<Event>(i);
    EXPECT_EQ(event_from_name(event_name(e)), e);
  }
  EXPECT_FALSE(event_from_name("NoSuchEvent").has_value());
}

TEST(EventBus, EveryPluginsReasonIsKeptWithItsName) {
  std::vector<std::string> log;
  EventBus bus;
  auto a = std::make_shared<LogPlugin>("shrinker", &log, std::vector<Event>{Event::BatchEnd}, 0);
  a->reason = "8 fits better";
  auto b = std::make_shared<LogPlugin>("stopper", &log, std::vector<Event>{Event::BatchEnd}, 1);
  b->stop_in = Event::BatchEnd;
  b->reason = "target reached";
  auto c2 = std::make_shared<LogPlugin>("late_stopper", &log, std::vector<Event>{Event::BatchEnd}, 2);
  c2->stop_in = Event::BatchEnd;  // BatchEnd is closing: late_stopper runs first and is the one that stopped
  bus.add(a);
  bus.add(b);
  bus.add(c2);
  auto c = ctx_for(Event::BatchEnd);  // closing: late_stopper, stopper (stop already set), shrinker
  Control control;
  bus.dispatch(c, control);
  ASSERT_EQ(control.reasons.size(), 2u);
  EXPECT_EQ(control.reasons[0].plugin, "stopper");
  EXPECT_EQ(control.reasons[1].plugin, "shrinker");
  EXPECT_EQ(control.stopped_by, "late_stopper");
  EXPECT_EQ(control.reason_of("stopper"), "target reached");
  EXPECT_EQ(control.reason, "stopper: target reached; shrinker: 8 fits better");
}

TEST(EventBus, RepeatedObserverFailuresAreCountedNotSpammed) {
  std::ostringstream out;
  auto logger = std::make_shared<spdlog::logger>("bus_test", std::make_shared<spdlog::sinks::ostream_sink_mt>(out));
  std::vector<std::string> log;
  EventBus bus(logger);
  auto bad = std::make_shared<LogPlugin>("flaky", &log, std::vector<Event>{Event::BatchEnd, Event::EpochEnd});
  bad->throw_in = Event::BatchEnd;
  bus.add(bad);
  for (int i = 0; i < 57; ++i) {
    auto c = ctx_for(Event::BatchEnd);
    Control control;
    bus.dispatch(c, control);
  }
  EXPECT_EQ(bad->calls, 57);  // it still gets every event
  ASSERT_EQ(bus.observer_failures().size(), 1u);
  EXPECT_EQ(bus.observer_failures()[0].plugin, "flaky");
  EXPECT_EQ(bus.observer_failures()[0].where, "BatchEnd");
  EXPECT_EQ(bus.observer_failures()[0].count, 57);
  EXPECT_EQ(bus.observer_failures()[0].first_message, "boom");
  EXPECT_EQ(bus.swallowed_errors(), 57u);
  // Logged: the first failure, the second (saying the rest are counted), the tenth.
  std::vector<std::string> lines;
  std::istringstream in(out.str());
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  ASSERT_EQ(lines.size(), 3u) << out.str();
  EXPECT_NE(lines[0].find("plugin 'flaky' failed in BatchEnd: boom (observer plugin: the run continues)"),
            std::string::npos);
  EXPECT_NE(lines[1].find("further failures there are counted, not logged"), std::string::npos);
  EXPECT_NE(lines[2].find("plugin 'flaky' has failed 10 times in BatchEnd"), std::string::npos);
}

}  // namespace
}  // namespace trainer
