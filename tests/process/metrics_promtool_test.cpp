// The Prometheus text idem writes, checked by Prometheus's own parser and linter: `promtool check
// metrics` (a child process) reads what an idem::Metrics wrote after real handler deliveries and
// real operation calls of every outcome — names that need escaping included — and what
// PrometheusWriter writes for odd values. (The counts themselves are unit/metrics_test's.)
#include <gtest/gtest.h>

#include <latch>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../promtool.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/handler.hpp"
#include "idem/idempotency.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/metrics.hpp"
#include "idem/operation.hpp"
#include "idem/prometheus.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::testing::ManualClock;

struct Declined : std::runtime_error {
  Declined() : std::runtime_error("declined") {}
};

idem::Event event(const std::string& id, const std::string& payload = "ok") {
  idem::Event e = idem::Event::make("order.placed", payload);
  e.id = id;
  return e;
}

void deliver_every_outcome(const std::shared_ptr<idem::Metrics>& metrics,
                           const std::shared_ptr<ManualClock>& clock) {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>(
      idem::InMemoryRecorderOptions{.clock = clock});
  auto handle = [clock](const std::string& payload) {
    clock->advance(7ms);
    if (payload == "fail") throw Declined();
  };
  idem::CollectingBusProxy bus("c");
  // A consumer name a label value has to escape (a quote and a backslash; names have no line
  // feeds, being keys).
  auto exclusive = idem::make_idempotent_handler(
      "bill\"ing\\eu", recorder, handle,
      idem::HandlerOptions{
          .mode = idem::HandlerMode::exclusive, .clock = clock, .observer = metrics});
  (*exclusive)(event("e-1"), bus);
  (*exclusive)(event("e-1"), bus);
  EXPECT_THROW((*exclusive)(event("e-2", "fail"), bus), Declined);
  ASSERT_EQ(recorder->claim("bill\"ing\\eu", "e-3", 1min).status, idem::Claim::Status::acquired);
  EXPECT_THROW((*exclusive)(event("e-3"), bus), idem::AlreadyInProgress);
  auto batch = idem::make_idempotent_handler(
      "shipping", recorder, handle,
      idem::HandlerOptions{
          .mode = idem::HandlerMode::check_then_mark, .clock = clock, .observer = metrics});
  const std::vector<idem::Event> window{event("s-1"), event("s-1"), event("s-2", "fail")};
  batch->handle_batch(window, bus);
}

void call_every_outcome(const std::shared_ptr<idem::Metrics>& metrics,
                        const std::shared_ptr<ManualClock>& clock) {
  auto store =
      std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.clock = clock});
  auto pay = idem::resilient(
      [clock](const std::string& id, int) {
        clock->advance(40ms);
        if (id == "decline") throw Declined();
        if (id == "slow") throw idem::TimeoutError("no answer");
        return id;
      },
      {.name = "pay\nments \"eu\" \\ west",
       .observer = metrics,
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_scope = "payments",  // a scope has no control characters; a name may
       .idempotency_store = store,
       .idempotency_in_progress = idem::InProgressPolicy::reject,
       .clock = clock});
  pay("r-1", 1);
  pay("r-1", 1);
  EXPECT_THROW(pay("r-1", 2), idem::KeyReuseError);
  EXPECT_THROW(pay("decline", 1), idem::OperationError);
  EXPECT_THROW(pay("slow", 1), idem::OperationError);
  EXPECT_THROW(pay(std::string("bad\nkey"), 1), idem::InvalidKey);
  ASSERT_EQ(
      store->claim(idem::scoped_idempotency_key("payments", "busy"), std::nullopt, 1min).status,
      idem::ClaimOutcome::Status::acquired);
  EXPECT_THROW(pay("busy", 1), idem::AlreadyInProgress);

  std::latch started(1);
  std::latch release(1);
  auto slow = idem::resilient(
      [&](int) {
        started.count_down();
        release.wait();
        return 1;
      },
      {.name = "slow", .observer = metrics, .idempotency_key = [](int) {
         return std::string("k");
       }});
  std::thread owner([&] { slow(1); });
  started.wait();
  std::thread joiner([&] { slow(1); });
  const auto coordinator = idem::IdempotencyCoordinator::for_store(nullptr);
  while (coordinator->waiters(idem::scoped_idempotency_key("slow", "k")) < 1)
    std::this_thread::yield();
  release.count_down();
  owner.join();
  joiner.join();

  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .recovery_time = 1h, .clock = clock});
  const auto guarded = idem::operation("guarded", []() -> int { throw Declined(); })
                           .with_circuit_breaker(breaker)
                           .with_observer(metrics)
                           .with_clock(clock);
  EXPECT_THROW(guarded.run(), idem::OperationError);
  EXPECT_THROW(guarded.run(), idem::OperationError);
}

TEST(MetricsPromtool, EveryOutcomeOfBothFacesIsValidText) {
  auto clock = std::make_shared<ManualClock>();
  auto metrics = std::make_shared<idem::Metrics>();
  deliver_every_outcome(metrics, clock);
  call_every_outcome(metrics, clock);
  const std::string text = metrics->prometheus();
  EXPECT_NE(text.find("consumer=\"bill\\\"ing\\\\eu\""), std::string::npos) << text;
  EXPECT_NE(text.find("operation=\"pay\\nments \\\"eu\\\" \\\\ west\""), std::string::npos) << text;
  EXPECT_NE(text.find("outcome=\"rejected_circuit_open\"} 1\n"), std::string::npos) << text;
  IDEM_EXPECT_PROMTOOL_ACCEPTS(text);
}

TEST(MetricsPromtool, CustomBucketsAndAnEmptyMetricsAreValidText) {
  IDEM_EXPECT_PROMTOOL_ACCEPTS(idem::Metrics().prometheus());
  idem::Metrics custom(idem::MetricsOptions{.buckets = {0.001, 0.5, 3600}});
  custom.on_call({.operation = "x", .outcome = idem::CallOutcome::executed, .duration = 2h});
  custom.on_delivery({.consumer = "c", .outcome = idem::DeliveryOutcome::duplicate});
  IDEM_EXPECT_PROMTOOL_ACCEPTS(custom.prometheus());
}

TEST(MetricsPromtool, TheWritersValuesAndEscapesAreValidText) {
  idem::PrometheusWriter out;
  out.family("idem_test_values", idem::PrometheusWriter::Type::gauge,
             "Odd values: \\ and a\nline feed in the help.");
  out.sample("idem_test_values", {{"v", "inf"}}, std::numeric_limits<double>::infinity());
  out.sample("idem_test_values", {{"v", "-inf"}}, -std::numeric_limits<double>::infinity());
  out.sample("idem_test_values", {{"v", "nan"}}, std::numeric_limits<double>::quiet_NaN());
  out.sample("idem_test_values", {{"v", "tiny"}}, 1e-300);
  out.sample("idem_test_values", {{"v", "negative"}}, -42);
  out.sample("idem_test_values", {{"v", "\"\\\n"}, {"empty", ""}}, std::uint64_t{1} << 63);
  out.family("idem_test_seconds", idem::PrometheusWriter::Type::histogram, "A histogram.");
  const std::vector<double> bounds{1e-6, 0.5, 1e6};
  const std::vector<std::uint64_t> counts{1, 0, 2, 3};
  out.histogram("idem_test_seconds", {{"op", "a"}}, bounds, counts, 12.25);
  out.histogram("idem_test_seconds", {{"op", "b"}}, bounds, std::vector<std::uint64_t>(4, 0), 0);
  IDEM_EXPECT_PROMTOOL_ACCEPTS(out.text());
}

}  // namespace
