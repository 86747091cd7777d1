#include "idem/events.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::EventType;
using idem::testing::ManualClock;
using ET = idem::EventType;

class ThrowingSink final : public idem::EventSink {
 public:
  void emit(const idem::OperationEvent&) override { throw std::runtime_error("sink is broken"); }
};

TEST(EventType, NamesRoundTrip) {
  std::set<std::string> names;
  for (std::size_t i = 0; i < idem::kEventTypeCount; ++i) {
    const auto type = static_cast<EventType>(i);
    const std::string name(idem::to_string(type));
    EXPECT_FALSE(name.empty());
    EXPECT_NE(name, "unknown");
    names.insert(name);
    EXPECT_EQ(idem::event_type_from_string(name), type);
  }
  EXPECT_EQ(names.size(), idem::kEventTypeCount);
  EXPECT_EQ(idem::to_string(ET::retry_scheduled), "retry.scheduled");
  EXPECT_EQ(idem::to_string(ET::circuit_breaker_state_changed), "circuit_breaker.state_changed");
  EXPECT_EQ(idem::to_string(ET::idempotency_rejected), "idempotency.rejected");
  EXPECT_EQ(idem::to_string(ET::idempotency_takeover), "idempotency.takeover");
  EXPECT_FALSE(idem::event_type_from_string("retry.maybe").has_value());
}

TEST(Events, RetriedThenSucceededCallInOrder) {
  auto clock = std::make_shared<ManualClock>();
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  int calls = 0;
  auto op = idem::resilient(
      [&](int x) {
        if (++calls < 3) throw std::runtime_error("flaky");
        return x;
      },
      {.name = "fetch",
       .retries = 3,
       .backoff = {.base = 100ms, .multiplier = 2.0, .jitter = 0.0},
       .events = {sink},
       .clock = clock});
  const auto start = clock->wall_now();
  op(1);
  EXPECT_EQ(sink->types(),
            (std::vector<ET>{ET::operation_started, ET::attempt_started, ET::attempt_failed,
                             ET::retry_scheduled, ET::attempt_started, ET::attempt_failed,
                             ET::retry_scheduled, ET::attempt_started, ET::attempt_succeeded,
                             ET::operation_succeeded}));
  const auto events = sink->events();
  for (const auto& event : events)
    EXPECT_EQ(event.operation, "fetch");
  EXPECT_EQ(events[0].time, start);
  EXPECT_EQ(events[1].attempt, 1);
  EXPECT_EQ(events[2].fields.at("error"), "flaky");
  EXPECT_EQ(events[2].fields.at("error_type"), "std::runtime_error");
  EXPECT_EQ(events[2].fields.at("retryable"), "true");
  EXPECT_EQ(events[3].fields.at("delay_ms"), "100");
  EXPECT_EQ(events[3].fields.at("next_attempt"), "2");
  EXPECT_EQ(events[6].fields.at("delay_ms"), "200");
  EXPECT_EQ(events[7].attempt, 3);
  EXPECT_EQ(events[9].fields.at("attempts"), "3");
  EXPECT_EQ(events[9].fields.at("duration_ms"), "300");
  EXPECT_EQ(events[9].time - events[0].time, 300ms);  // event times come from the clock
}

TEST(Events, FallbackFlowInOrder) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::resilient([]() -> int { throw std::runtime_error("down"); },
                            {.validate = {{"positive", [](const int& v) { return v > 0; }}},
                             .fallbacks = {{"zero", [] { return 0; }}, {"one", [] { return 1; }}},
                             .events = {sink}});
  op();
  EXPECT_EQ(sink->types(),
            (std::vector<ET>{ET::operation_started, ET::attempt_started, ET::attempt_failed,
                             ET::fallback_started, ET::validation_failed, ET::fallback_failed,
                             ET::fallback_started, ET::validation_succeeded, ET::fallback_succeeded,
                             ET::operation_succeeded}));
  const auto events = sink->events();
  EXPECT_EQ(events[3].fields.at("fallback"), "fallback:zero");
  EXPECT_EQ(events[4].fields.at("validator"), "positive");
  EXPECT_EQ(events[4].fields.at("reason"), "rejected by positive");
  EXPECT_EQ(events[7].fields.at("source"), "fallback:one");
  EXPECT_EQ(events[8].fields.at("fallback"), "fallback:one");
  EXPECT_EQ(events[9].fields.at("fallback_used"), "true");
  EXPECT_EQ(events[9].fields.at("fallback"), "fallback:one");
}

TEST(Events, FailedOperation) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::resilient([]() -> int { throw std::logic_error("bug"); }, {.events = {sink}});
  EXPECT_THROW(op(), idem::OperationError);
  EXPECT_EQ(sink->types(), (std::vector<ET>{ET::operation_started, ET::attempt_started,
                                            ET::attempt_failed, ET::operation_failed}));
  const auto last = sink->events().back();
  EXPECT_EQ(last.fields.at("error_type"), "std::logic_error");
  EXPECT_EQ(last.fields.at("error"), "bug");
}

TEST(Events, ThrowingSinkNeverBreaksTheOperationAndIsCounted) {
  auto good = std::make_shared<idem::InMemoryEventSink>();
  const auto before = idem::event_sink_failures();
  auto op = idem::resilient([](int x) { return x + 1; },
                            {.events = {std::make_shared<ThrowingSink>(), good}});
  EXPECT_EQ(op(1).value, 2);
  EXPECT_EQ(idem::event_sink_failures() - before, 4u);  // one per event
  EXPECT_EQ(good->size(), 4u) << "the other sinks still get every event";
}

TEST(Events, NoSinksNoEvents) {
  auto op = idem::resilient([](int x) { return x; });
  EXPECT_EQ(op(3).value, 3);  // nothing to observe; just must not crash or allocate sinks
}

TEST(Events, JsonLinesAreOneObjectPerLineEvenUnderConcurrency) {
  std::ostringstream out;
  auto sink = std::make_shared<idem::JsonLinesEventSink>(out);
  auto op = idem::resilient([](int x) { return x; }, {.name = "json", .events = {sink}});
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        op(i);
    });
  }
  for (auto& thread : threads)
    thread.join();
  std::istringstream lines(out.str());
  std::string line;
  int count = 0;
  while (std::getline(lines, line)) {
    const auto parsed = nlohmann::json::parse(line);  // throws on an interleaved line
    EXPECT_EQ(parsed["operation"], "json");
    EXPECT_TRUE(idem::event_type_from_string(parsed["type"].get<std::string>()).has_value());
    EXPECT_TRUE(parsed["fields"].is_object());
    EXPECT_TRUE(parsed["time"].get<std::string>().ends_with("Z"));
    ++count;
  }
  EXPECT_EQ(count, 8 * 50 * 4);
}

TEST(Events, EventToJson) {
  idem::OperationEvent event;
  event.type = ET::retry_scheduled;
  event.operation = "op";
  event.time = idem::WallTime(std::chrono::seconds(1893456000));
  event.attempt = 2;
  event.fields = {{"delay_ms", "100"}};
  const auto parsed = nlohmann::json::parse(event.to_json());
  EXPECT_EQ(parsed["type"], "retry.scheduled");
  EXPECT_EQ(parsed["operation"], "op");
  EXPECT_EQ(parsed["time"], "2030-01-01T00:00:00.000000000Z");
  EXPECT_EQ(parsed["attempt"], 2);
  EXPECT_EQ(parsed["fields"]["delay_ms"], "100");
}

TEST(Events, CountingSinkCountsByTypeAndScrapes) {
  auto counter = std::make_shared<idem::CountingEventSink>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        if (++calls % 2 == 1) throw std::runtime_error("odd");
        return calls.load();
      },
      {.retries = 1, .backoff = {.base = 0ns}, .events = {counter}});
  std::vector<std::thread> threads;
  std::atomic<int> done{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) {
        try {
          op();
        } catch (const idem::OperationError&) {
        }
        ++done;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(counter->count(ET::operation_started), 100u);
  EXPECT_EQ(counter->count(ET::operation_succeeded) + counter->count(ET::operation_failed), 100u);
  EXPECT_EQ(counter->count(ET::attempt_started),
            counter->count(ET::attempt_succeeded) + counter->count(ET::attempt_failed));
  const auto counts = counter->counts();
  EXPECT_EQ(counts.size(), idem::kEventTypeCount);
  EXPECT_EQ(counts.at("operation.started"), 100u);
  std::uint64_t sum = 0;
  for (const auto& [name, value] : counts)
    sum += value;
  EXPECT_EQ(sum, counter->total());
  const auto text = counter->scrape();
  EXPECT_NE(text.find("# TYPE idem_events_total counter"), std::string::npos);
  EXPECT_NE(text.find("idem_events_total{type=\"operation.started\"} 100\n"), std::string::npos);
}

TEST(Events, CallbackSink) {
  std::vector<std::string> seen;
  std::mutex mutex;
  auto sink = std::make_shared<idem::CallbackEventSink>([&](const idem::OperationEvent& e) {
    std::lock_guard lock(mutex);
    seen.emplace_back(idem::to_string(e.type));
  });
  auto op = idem::resilient([] { return 1; }, {.events = {sink}});
  op();
  EXPECT_EQ(seen, (std::vector<std::string>{"operation.started", "attempt.started",
                                            "attempt.succeeded", "operation.succeeded"}));
  EXPECT_THROW(idem::CallbackEventSink(nullptr), idem::InvalidArgument);
}

TEST(Events, InMemorySinkClear) {
  idem::InMemoryEventSink sink;
  sink.emit(idem::OperationEvent{});
  EXPECT_EQ(sink.size(), 1u);
  sink.clear();
  EXPECT_EQ(sink.size(), 0u);
  EXPECT_TRUE(sink.events().empty());
}

TEST(Events, NullSinkIsAConfigError) {
  EXPECT_THROW(idem::resilient([] { return 1; }, {.events = {nullptr}}), idem::ConfigError);
  EXPECT_THROW(idem::EventEmitter({nullptr}), idem::ConfigError);
}

}  // namespace
