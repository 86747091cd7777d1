// The Observer, idem::Metrics and the Prometheus text: real handler deliveries and real operation
// calls, every outcome of each, counted and timed (a ManualClock makes durations exact) and
// written as text. Also: the writer's escaping and its refusals, an observer that throws, and
// threads observing while another scrapes. process/metrics_promtool_test runs such text through
// `promtool check metrics`.

#include "idem/metrics.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <latch>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../core_names.hpp"
#include "../metrics_counts.hpp"
#include "../run_together.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/handler.hpp"
#include "idem/idempotency.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/operation.hpp"
#include "idem/prometheus.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;

constexpr double kInf = std::numeric_limits<double>::infinity();

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The count of the bucket whose upper bound is `bound` (not cumulative).
std::uint64_t bucket(const idem::HistogramSnapshot& h, double bound) {
  for (std::size_t i = 0; i < h.bounds.size(); ++i) {
    if (h.bounds[i] == bound) return h.buckets[i];
  }
  throw std::runtime_error("no bucket");
}

// ---- the writer ---------------------------------------------------------------------------

TEST(PrometheusWriter, EscapesLabelValuesAndHelp) {
  PrometheusWriter out;
  out.family("idem_test_total", PrometheusWriter::Type::counter, "a \\ back\nslash");
  out.sample("idem_test_total", {{"name", "a\"b\\c\nd"}, {"empty", ""}}, 3);
  EXPECT_EQ(out.text(),
            "# HELP idem_test_total a \\\\ back\\nslash\n"
            "# TYPE idem_test_total counter\n"
            "idem_test_total{name=\"a\\\"b\\\\c\\nd\",empty=\"\"} 3\n");
}

TEST(PrometheusWriter, WritesValuesExactly) {
  EXPECT_EQ(PrometheusWriter::format_value(0.25), "0.25");
  EXPECT_EQ(PrometheusWriter::format_value(2), "2");
  EXPECT_EQ(PrometheusWriter::format_value(1e-4), "0.0001");
  EXPECT_EQ(PrometheusWriter::format_value(0.00025), "0.00025");
  EXPECT_EQ(PrometheusWriter::format_value(1e-5), "1e-05");
  EXPECT_EQ(PrometheusWriter::format_value(60), "60");
  EXPECT_EQ(PrometheusWriter::format_value(123456), "123456");
  EXPECT_EQ(PrometheusWriter::format_value(1e6), "1e+06");
  EXPECT_EQ(PrometheusWriter::format_value(-2.5e7), "-2.5e+07");
  EXPECT_EQ(PrometheusWriter::format_value(0), "0");
  EXPECT_EQ(PrometheusWriter::format_value(kInf), "+Inf");
  EXPECT_EQ(PrometheusWriter::format_value(-kInf), "-Inf");
  EXPECT_EQ(PrometheusWriter::format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  PrometheusWriter out;
  out.family("idem_test_gauge", PrometheusWriter::Type::gauge, "g");
  out.sample("idem_test_gauge", {}, std::uint64_t{18446744073709551615u});
  out.sample("idem_test_gauge", {{"sign", "minus"}}, -5);
  EXPECT_TRUE(contains(out.text(), "idem_test_gauge 18446744073709551615\n"));
  EXPECT_TRUE(contains(out.text(), "idem_test_gauge{sign=\"minus\"} -5\n"));
}

TEST(PrometheusWriter, WritesHistogramsCumulatively) {
  PrometheusWriter out;
  out.family("idem_test_seconds", PrometheusWriter::Type::histogram, "h");
  const std::vector<double> bounds{0.1, 1};
  const std::vector<std::uint64_t> counts{2, 0, 3};
  out.histogram("idem_test_seconds", {{"op", "x"}}, bounds, counts, 7.5);
  EXPECT_EQ(out.text(),
            "# HELP idem_test_seconds h\n"
            "# TYPE idem_test_seconds histogram\n"
            "idem_test_seconds_bucket{op=\"x\",le=\"0.1\"} 2\n"
            "idem_test_seconds_bucket{op=\"x\",le=\"1\"} 2\n"
            "idem_test_seconds_bucket{op=\"x\",le=\"+Inf\"} 5\n"
            "idem_test_seconds_sum{op=\"x\"} 7.5\n"
            "idem_test_seconds_count{op=\"x\"} 5\n");
}

TEST(PrometheusWriter, RefusesBadInputAndWritesNothing) {
  PrometheusWriter out;
  EXPECT_THROW(out.family("1bad", PrometheusWriter::Type::gauge, "h"), idem::InvalidArgument);
  EXPECT_THROW(out.family("bad-name", PrometheusWriter::Type::gauge, "h"), idem::InvalidArgument);
  EXPECT_THROW(out.sample("idem_nothing_declared", {}, 1), idem::InvalidArgument);
  EXPECT_EQ(out.text(), "");
  out.family("idem_a", PrometheusWriter::Type::gauge, "h");
  const std::string declared = out.text();
  EXPECT_THROW(out.family("idem_a", PrometheusWriter::Type::gauge, "again"), idem::InvalidArgument);
  EXPECT_THROW(out.sample("idem_b", {}, 1), idem::InvalidArgument) << "not the current family";
  EXPECT_THROW(out.sample("idem_a", {{"__reserved", "x"}}, 1), idem::InvalidArgument);
  EXPECT_THROW(out.sample("idem_a", {{"a:b", "x"}}, 1), idem::InvalidArgument);
  EXPECT_THROW(out.sample("idem_a", {{"l", "x"}, {"l", "y"}}, 1), idem::InvalidArgument);
  const std::vector<double> bounds{1, 2};
  const std::vector<std::uint64_t> counts{1, 2, 3};
  EXPECT_THROW(out.histogram("idem_a", {}, bounds, counts, 1), idem::InvalidArgument)
      << "a gauge is no histogram";
  out.family("idem_h", PrometheusWriter::Type::histogram, "h");
  const std::string with_histogram = out.text();
  EXPECT_THROW(out.sample("idem_h", {}, 1), idem::InvalidArgument);
  EXPECT_THROW(out.histogram("idem_h", {}, bounds, std::vector<std::uint64_t>{1, 2}, 1),
               idem::InvalidArgument);
  EXPECT_THROW(out.histogram("idem_h", {}, std::vector<double>{2, 1}, counts, 1),
               idem::InvalidArgument);
  EXPECT_THROW(out.histogram("idem_h", {{"le", "1"}}, bounds, counts, 1), idem::InvalidArgument);
  EXPECT_EQ(out.text(), with_histogram) << "a refused call writes nothing";
  EXPECT_NE(declared, with_histogram);
  out.take();
  EXPECT_NO_THROW(out.family("idem_a", PrometheusWriter::Type::gauge, "h")) << "take() restarts";
}

// ---- a real consumer ----------------------------------------------------------------------

idem::Event event(const std::string& id, const std::string& payload = "ok") {
  idem::Event e = idem::Event::make("order.placed", payload);
  e.id = id;
  return e;
}

// handle takes 3 ms on `clock` and throws for the payload "fail".
std::shared_ptr<idem::EventHandler> timed_handler(
    const std::string& name, std::shared_ptr<idem::IdempotencyRecorder> recorder,
    std::shared_ptr<ManualClock> clock, std::shared_ptr<idem::Observer> observer,
    HandlerMode mode) {
  return idem::make_idempotent_handler(
      name, std::move(recorder),
      [clock](const std::string& payload) {
        clock->advance(3ms);
        if (payload == "fail") throw std::runtime_error("declined");
      },
      idem::HandlerOptions{.mode = mode, .clock = clock, .observer = std::move(observer)});
}

TEST(Metrics, CountsAndTimesEveryDeliveryOutcome) {
  auto clock = std::make_shared<ManualClock>();
  auto metrics = std::make_shared<Metrics>();
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>(
      idem::InMemoryRecorderOptions{.clock = clock});
  auto handler = timed_handler("billing", recorder, clock, metrics, HandlerMode::exclusive);
  idem::CollectingBusProxy bus("billing");

  EXPECT_EQ((*handler)(event("e-1"), bus), HandleResult::processed);
  EXPECT_EQ((*handler)(event("e-1"), bus), HandleResult::duplicate);
  EXPECT_THROW((*handler)(event("e-2", "fail"), bus), std::runtime_error);
  // Another delivery holds e-3's claim.
  ASSERT_EQ(recorder->claim("billing", "e-3", 1min).status, idem::Claim::Status::acquired);
  EXPECT_THROW((*handler)(event("e-3"), bus), idem::AlreadyInProgress);
  EXPECT_THROW((*handler)(event("bad\nid"), bus), idem::InvalidKey);

  // A batch through check_then_mark: a repeat inside the window is a duplicate.
  auto batch = timed_handler("shipping", recorder, clock, metrics, HandlerMode::check_then_mark);
  const std::vector<idem::Event> window{event("s-1"), event("s-1"), event("s-2", "fail"),
                                        event("s-3")};
  const auto outcomes = batch->handle_batch(window, bus);
  ASSERT_EQ(outcomes.size(), 4u);

  const auto snap = metrics->snapshot();
  ASSERT_NE(snap.consumer("billing"), nullptr);
  const auto& billing = *snap.consumer("billing");
  idem::test::expect_counts(billing, {{DeliveryOutcome::processed, 1},
                                      {DeliveryOutcome::duplicate, 1},
                                      {DeliveryOutcome::in_progress, 1}});
  EXPECT_EQ(billing.count(DeliveryOutcome::failed), 2u) << "the handler's error and the bad id";
  EXPECT_EQ(billing.delivered(), 5u);
  EXPECT_EQ(billing.handler_processed.count, 1u);
  EXPECT_EQ(bucket(billing.handler_processed, 0.005), 1u) << "3 ms: in (2.5 ms, 5 ms]";
  EXPECT_DOUBLE_EQ(billing.handler_processed.sum_seconds, 0.003);
  EXPECT_EQ(billing.handler_failed.count, 1u) << "the bad id never reached handle";

  ASSERT_NE(snap.consumer("shipping"), nullptr);
  const auto& shipping = *snap.consumer("shipping");
  idem::test::expect_counts(shipping, {{DeliveryOutcome::processed, 2},
                                       {DeliveryOutcome::duplicate, 1},
                                       {DeliveryOutcome::failed, 1}});
  EXPECT_EQ(shipping.handler_processed.count, 2u);
  EXPECT_EQ(shipping.handler_failed.count, 1u);

  const std::string text = metrics->prometheus();
  EXPECT_TRUE(contains(
      text, "idem_consumer_deliveries_total{consumer=\"billing\",outcome=\"in_progress\"} 1\n"));
  EXPECT_TRUE(contains(text,
                       "idem_consumer_handler_duration_seconds_bucket{consumer=\"shipping\","
                       "outcome=\"processed\",le=\"0.005\"} 2\n"));
}

// ---- real operations ----------------------------------------------------------------------

struct Declined : std::runtime_error {
  Declined() : std::runtime_error("declined") {}
};

TEST(Metrics, CountsAndTimesEveryCallOutcome) {
  auto clock = std::make_shared<ManualClock>();
  auto metrics = std::make_shared<Metrics>();
  auto store =
      std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.clock = clock});

  // 30 ms per execution; "decline" fails, "slow" times out.
  auto pay = idem::resilient(
      [clock](const std::string& id, int) {
        clock->advance(30ms);
        if (id == "decline") throw Declined();
        if (id == "slow") throw idem::TimeoutError("the gateway did not answer");
        return id;
      },
      {.name = "pay",
       .observer = metrics,
       .idempotency_key = [](const std::string& id, int) { return id; },
       .idempotency_store = store,
       .idempotency_in_progress = idem::InProgressPolicy::reject,
       .clock = clock});
  EXPECT_EQ(pay("r-1", 100).value, "r-1");                          // executed
  EXPECT_EQ(pay("r-1", 100).value, "r-1");                          // replayed
  EXPECT_THROW(pay("r-1", 999), idem::KeyReuseError);               // rejected_key_reuse
  EXPECT_THROW(pay("decline", 1), idem::OperationError);            // failed
  EXPECT_THROW(pay("slow", 1), idem::OperationError);               // timed_out
  EXPECT_THROW(pay(std::string("bad\nkey"), 1), idem::InvalidKey);  // error
  // Another process holds "busy" (a claim made on the store directly).
  const auto other = store->claim(idem::scoped_idempotency_key("pay", "busy"), std::nullopt, 1min);
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_THROW(pay("busy", 1), idem::AlreadyInProgress);  // rejected_in_progress

  // A joiner shares the owner's execution; a waiter that stops waiting is cancelled.
  std::latch owner_started(1);
  std::latch release_owner(1);
  auto slow = idem::resilient(
      [&](const std::string& id) {
        owner_started.count_down();
        release_owner.wait();
        return id;
      },
      {.name = "slow", .observer = metrics, .idempotency_key = [](const std::string& id) {
         return id;
       }});
  std::thread owner([&] { slow("k"); });
  owner_started.wait();
  std::thread joiner(
      [&] { EXPECT_EQ(slow("k").report.metadata.at("idempotency_status"), "joined"); });
  auto coordinator = idem::IdempotencyCoordinator::for_store(nullptr);
  const std::string stored = idem::scoped_idempotency_key("slow", "k");
  while (coordinator->waiters(stored) < 1)
    std::this_thread::yield();
  std::stop_source stop;
  stop.request_stop();
  EXPECT_THROW(slow.call_with(idem::CallOptions{.stop = stop.get_token()}, "k"), idem::Cancelled);
  release_owner.count_down();
  owner.join();
  joiner.join();

  // The breaker opens after one failure and refuses the next call; a rate limit asks for a
  // longer wait than allowed.
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .recovery_time = 1h, .clock = clock});
  auto guarded = idem::resilient(
      []() -> int { throw Declined(); },
      {.name = "guarded", .circuit_breaker = breaker, .observer = metrics, .clock = clock});
  EXPECT_THROW(guarded(), idem::OperationError);
  EXPECT_THROW(guarded(), idem::OperationError);
  auto limited = idem::resilient(
      []() -> int { throw Declined(); },
      {.name = "limited",
       .retries = 1,
       .rate_limit_on = idem::failures_of<Declined>(),
       .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
         return 2min;
       },
       .max_rate_limit_wait = 1min,
       .observer = metrics,
       .clock = clock});
  EXPECT_THROW(limited(), idem::OperationError);

  const auto snap = metrics->snapshot();
  ASSERT_NE(snap.operation("pay"), nullptr);
  const auto& p = *snap.operation("pay");
  idem::test::expect_counts(p, {{CallOutcome::executed, 1},
                                {CallOutcome::replayed, 1},
                                {CallOutcome::rejected_key_reuse, 1},
                                {CallOutcome::failed, 1},
                                {CallOutcome::timed_out, 1},
                                {CallOutcome::error, 1},
                                {CallOutcome::rejected_in_progress, 1}});
  const auto& executed = p.durations[static_cast<std::size_t>(CallOutcome::executed)];
  EXPECT_EQ(executed.count, 1u);
  EXPECT_EQ(bucket(executed, 0.05), 1u) << "30 ms: in (25 ms, 50 ms]";
  EXPECT_DOUBLE_EQ(executed.sum_seconds, 0.03);
  const auto& replayed = p.durations[static_cast<std::size_t>(CallOutcome::replayed)];
  EXPECT_EQ(bucket(replayed, 0.0001), 1u) << "a replay takes no time on the manual clock";

  ASSERT_NE(snap.operation("slow"), nullptr);
  const auto& s = *snap.operation("slow");
  idem::test::expect_counts(
      s, {{CallOutcome::executed, 1}, {CallOutcome::joined, 1}, {CallOutcome::cancelled, 1}});
  EXPECT_EQ(snap.operation("guarded")->count(CallOutcome::failed), 1u);
  EXPECT_EQ(snap.operation("guarded")->count(CallOutcome::rejected_circuit_open), 1u);
  EXPECT_EQ(snap.operation("limited")->count(CallOutcome::rejected_rate_limit), 1u);

  const std::string text = metrics->prometheus();
  EXPECT_TRUE(
      contains(text, "idem_operation_calls_total{operation=\"pay\",outcome=\"replayed\"} 1\n"));
  EXPECT_TRUE(
      contains(text, "idem_operation_calls_total{operation=\"pay\",outcome=\"joined\"} 0\n"))
      << "every outcome is written";
  EXPECT_TRUE(contains(text,
                       "idem_operation_call_duration_seconds_bucket{operation=\"pay\",outcome="
                       "\"executed\",le=\"0.05\"} 1\n"));
  EXPECT_FALSE(contains(text,
                        "idem_operation_call_duration_seconds_count{operation=\"pay\","
                        "outcome=\"joined\"}"))
      << "no histogram for an outcome that never occurred";
}

TEST(Metrics, BuilderAndNamesThatNeedEscaping) {
  auto metrics = std::make_shared<Metrics>();
  const auto op =
      idem::operation("quote\" back\\slash\nline", [](int x) { return x; }).with_observer(metrics);
  op.run(1);
  op.run(2);
  EXPECT_EQ(
      metrics->snapshot().operation("quote\" back\\slash\nline")->count(CallOutcome::executed), 2u);
  const std::string text = metrics->prometheus();
  EXPECT_TRUE(contains(text, "operation=\"quote\\\" back\\\\slash\\nline\""));
  EXPECT_NO_THROW(op.with_observer(nullptr).run(3)) << "null removes the observer";
  EXPECT_EQ(
      metrics->snapshot().operation("quote\" back\\slash\nline")->count(CallOutcome::executed), 2u);
}

TEST(Metrics, AnObserverThatThrowsBreaksNothing) {
  struct Throwing final : idem::Observer {
    void on_delivery(const idem::DeliveryObservation&) override { throw std::runtime_error("x"); }
    void on_call(const idem::CallObservation&) override { throw 42; }
  };
  auto observer = std::make_shared<Throwing>();
  const auto before = idem::observer_failures();
  auto op = idem::resilient([](int x) { return x + 1; }, {.observer = observer});
  EXPECT_EQ(op(1).value, 2);
  auto handler = idem::make_idempotent_handler(
      "c", std::make_shared<idem::InMemoryIdempotencyRecorder>(), [](const std::string&) {},
      idem::HandlerOptions{.observer = observer});
  idem::CollectingBusProxy bus("c");
  EXPECT_EQ((*handler)(event("e"), bus), HandleResult::processed);
  EXPECT_EQ(idem::observer_failures(), before + 2);
}

TEST(Metrics, BucketBoundsAreChecked) {
  EXPECT_THROW(Metrics(idem::MetricsOptions{.buckets = {0.1, 0.1}}), idem::InvalidArgument);
  EXPECT_THROW(Metrics(idem::MetricsOptions{.buckets = {-1}}), idem::InvalidArgument);
  EXPECT_THROW(Metrics(idem::MetricsOptions{.buckets = {kInf}}), idem::InvalidArgument);
  Metrics custom(idem::MetricsOptions{.buckets = {0.5, 1}});
  custom.on_call({.operation = "x", .outcome = CallOutcome::executed, .duration = 500ms});
  custom.on_call({.operation = "x", .outcome = CallOutcome::executed, .duration = 501ms});
  custom.on_call({.operation = "x", .outcome = CallOutcome::executed, .duration = 2s});
  const auto snap = custom.snapshot();
  const auto& h = snap.operation("x")->durations[0];
  EXPECT_EQ(h.buckets, (std::vector<std::uint64_t>{1, 1, 1})) << "a bound holds its own value";
}

TEST(Metrics, ThreadsObservingWhileAnotherScrapesAddUp) {
  constexpr int kThreads = 8;
  constexpr int kEach = 5000;
  Metrics metrics;
  idem::test::run_together_while(
      kThreads,
      [&](int t) {
        const std::string name = "name-" + std::to_string(t % 3);
        for (int i = 0; i < kEach; ++i) {
          metrics.on_call({.operation = name, .outcome = CallOutcome::replayed, .duration = 1ms});
          metrics.on_delivery({.consumer = name,
                               .event_id = "e",
                               .outcome = DeliveryOutcome::processed,
                               .handler_duration = 2ms});
        }
      },
      [&] {
        const std::string text = metrics.prometheus();
        EXPECT_FALSE(text.empty());
      });
  std::uint64_t calls = 0;
  std::uint64_t deliveries = 0;
  double handler_seconds = 0;
  const auto snap = metrics.snapshot();
  for (const auto& o : snap.operations)
    calls += o.count(CallOutcome::replayed);
  for (const auto& c : snap.consumers) {
    deliveries += c.delivered();
    handler_seconds += c.handler_processed.sum_seconds;
  }
  EXPECT_EQ(calls, std::uint64_t{kThreads} * kEach);
  EXPECT_EQ(deliveries, std::uint64_t{kThreads} * kEach);
  EXPECT_NEAR(handler_seconds, kThreads * kEach * 0.002, 1e-6);
}

}  // namespace
