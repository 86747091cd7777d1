// The Observer on the coroutine face: AsyncIdempotentHandler deliveries (one by one and as a
// check_then_mark batch) and idem::async::resilient / idem::async::operation calls, counted and
// timed by one idem::Metrics with the blocking face's.

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../async_test_support.hpp"
#include "../core_names.hpp"
#include "../metrics_counts.hpp"
#include "idem/async/handler.hpp"
#include "idem/async/memory_recorder.hpp"
#include "idem/async/operation.hpp"
#include "idem/async/resilient.hpp"
#include "idem/metrics.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;
using idem::test::run;

idem::Event event(const std::string& id, const std::string& payload = "ok") {
  idem::Event e = idem::Event::make("order.placed", payload);
  e.id = id;
  return e;
}

TEST(AsyncMetrics, CountsDeliveriesOfAnAsyncHandler) {
  asio::io_context io;
  auto clock = std::make_shared<ManualClock>();
  auto metrics = std::make_shared<idem::Metrics>();
  auto memory = std::make_shared<idem::InMemoryIdempotencyRecorder>(
      idem::InMemoryRecorderOptions{.clock = clock});
  auto recorder = std::make_shared<idem::async::AsyncMemoryRecorder>(memory);
  auto make = [&](const std::string& name, idem::HandlerMode mode) {
    return idem::async::make_async_idempotent_handler(
        name, recorder,
        [clock](const std::string& payload) -> idem::async::Task<void> {
          clock->advance(4ms);
          if (payload == "fail") throw std::runtime_error("declined");
          co_return;
        },
        idem::HandlerOptions{.mode = mode, .clock = clock, .observer = metrics});
  };
  auto handler = make("billing", idem::HandlerMode::exclusive);
  idem::CollectingBusProxy bus("billing");
  EXPECT_EQ(run(io, handler->handle_event(event("e-1"), bus)), HandleResult::processed);
  EXPECT_EQ(run(io, handler->handle_event(event("e-1"), bus)), HandleResult::duplicate);
  EXPECT_THROW(run(io, handler->handle_event(event("e-2", "fail"), bus)), std::runtime_error);
  ASSERT_EQ(memory->claim("billing", "e-3", 1min).status, idem::Claim::Status::acquired);
  EXPECT_THROW(run(io, handler->handle_event(event("e-3"), bus)), idem::AlreadyInProgress);

  auto batch = make("shipping", idem::HandlerMode::check_then_mark);
  const std::vector<idem::Event> window{event("s-1"), event("s-1"), event("s-2", "fail")};
  const auto outcomes = run(io, batch->handle_batch(window, bus));
  ASSERT_EQ(outcomes.size(), 3u);

  const auto snap = metrics->snapshot();
  ASSERT_NE(snap.consumer("billing"), nullptr);
  const auto& billing = *snap.consumer("billing");
  idem::test::expect_counts(billing, {{DeliveryOutcome::processed, 1},
                                      {DeliveryOutcome::duplicate, 1},
                                      {DeliveryOutcome::failed, 1},
                                      {DeliveryOutcome::in_progress, 1}});
  EXPECT_DOUBLE_EQ(billing.handler_processed.sum_seconds, 0.004);
  EXPECT_EQ(billing.handler_failed.count, 1u);
  ASSERT_NE(snap.consumer("shipping"), nullptr);
  const auto& shipping = *snap.consumer("shipping");
  idem::test::expect_counts(shipping, {{DeliveryOutcome::processed, 1},
                                       {DeliveryOutcome::duplicate, 1},
                                       {DeliveryOutcome::failed, 1}});
  EXPECT_EQ(shipping.handler_processed.count + shipping.handler_failed.count, 2u);
}

TEST(AsyncMetrics, CountsCallsOfBothFacesInOneMetrics) {
  asio::io_context io;
  auto clock = std::make_shared<ManualClock>();
  auto metrics = std::make_shared<idem::Metrics>();
  auto charge = idem::async::resilient(
      [clock](std::string order, int cents) -> idem::async::Task<int> {
        clock->advance(20ms);
        if (order == "decline") throw std::runtime_error("declined");
        co_return cents;
      },
      {.name = "charge",
       .observer = metrics,
       .idempotency_key = [](const std::string& order, int) { return order; },
       .clock = clock});
  EXPECT_EQ(run(io, charge("o-1", 5)).value, 5);
  EXPECT_EQ(run(io, charge("o-1", 5)).value, 5);
  EXPECT_THROW(run(io, charge("o-1", 6)), idem::KeyReuseError);
  EXPECT_THROW(run(io, charge("decline", 1)), idem::OperationError);

  // The builder, and the blocking face, report to the same Metrics.
  auto refund = idem::async::operation("refund", [](int cents) -> idem::async::Task<int> {
                  co_return cents;
                }).with_observer(metrics);
  EXPECT_EQ(run(io, refund.run(3)).value, 3);
  auto blocking = idem::resilient([](int x) { return x; }, {.name = "refund", .observer = metrics});
  EXPECT_EQ(blocking(4).value, 4);

  const auto snap = metrics->snapshot();
  ASSERT_NE(snap.operation("charge"), nullptr);
  const auto& c = *snap.operation("charge");
  idem::test::expect_counts(c, {{CallOutcome::executed, 1},
                                {CallOutcome::replayed, 1},
                                {CallOutcome::rejected_key_reuse, 1},
                                {CallOutcome::failed, 1}});
  EXPECT_DOUBLE_EQ(c.durations[static_cast<std::size_t>(CallOutcome::executed)].sum_seconds, 0.02);
  EXPECT_EQ(snap.operation("refund")->count(CallOutcome::executed), 2u);
}

}  // namespace
