#include "idem/operation.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::testing::ManualClock;

struct Flaky {
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);
  int failures_before_success = 2;
  int operator()(int x) const {
    if (++*calls <= failures_before_success) throw std::runtime_error("flaky");
    return x * 10;
  }
};

TEST(OperationBuilder, RunWithoutPolicies) {
  const auto op = idem::operation("double", [](int x) { return 2 * x; });
  const auto result = op.run(21);
  EXPECT_EQ(result.value, 42);
  EXPECT_EQ(result.report.operation, "double");
  EXPECT_EQ(op.name(), "double");
}

TEST(OperationBuilder, WithReturnsANewOperationAndLeavesTheOriginalUnchanged) {
  auto clock = std::make_shared<ManualClock>();
  Flaky flaky;
  const auto base = idem::operation("flaky", flaky).with_clock(clock);
  const auto retrying = base.with_retry({.max_attempts = 3, .backoff = {.base = 1ms, .jitter = 0}});
  // The original still has no retry policy: one attempt, then failure.
  EXPECT_THROW(base.run(1), idem::OperationError);
  EXPECT_EQ(flaky.calls->load(), 1);
  // The derived one retries.
  const auto result = retrying.run(1);
  EXPECT_EQ(result.value, 10);
  EXPECT_EQ(flaky.calls->load(), 3);
  EXPECT_EQ(result.report.attempts.size(), 2u);
  // Deriving again from `retrying` does not touch it either.
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  const auto observed = retrying.with_events({sink});
  retrying.run(2);
  EXPECT_EQ(sink->size(), 0u);
  observed.run(3);
  EXPECT_GT(sink->size(), 0u);
}

TEST(OperationBuilder, EveryPolicyTogether) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.name = "quotes", .failure_threshold = 10, .clock = clock});
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  std::atomic<int> calls{0};
  const auto op = idem::operation("quote",
                                  [&](idem::AttemptContext& context, const std::string& sku) {
                                    ++calls;
                                    if (context.attempt == 1)
                                      throw std::runtime_error("cold cache");
                                    return sku.size() == 3 ? -1 : static_cast<int>(sku.size());
                                  })
                      .with_retry({.max_attempts = 2, .backoff = {.base = 5ms, .jitter = 0.0}})
                      .with_timeout(10s)
                      .with_validation({{"non_negative", [](const int& v) { return v >= 0; }}})
                      .with_circuit_breaker(breaker)
                      .with_fallbacks({{"zero", [](const std::string&) { return 0; }}})
                      .with_events({sink})
                      .with_clock(clock);
  const auto ok = op.run("abcd");
  EXPECT_EQ(ok.value, 4);
  EXPECT_EQ(ok.report.attempts.size(), 2u);
  EXPECT_EQ(clock->sleeps(), (std::vector<std::chrono::nanoseconds>{5ms}));
  const auto fallback = op.run("abc");  // attempt 2, the last, fails validation: fallback
  EXPECT_EQ(fallback.value, 0);
  EXPECT_EQ(fallback.report.fallback_source, "fallback:zero");
  EXPECT_EQ(breaker->snapshot().consecutive_failures, 2) << "a validation failure counts too";
}

TEST(OperationBuilder, ReplacesAPolicyRatherThanAppending) {
  const auto op = idem::operation("v", [](int x) { return x; })
                      .with_validation({{"never", [](const int&) { return false; }}})
                      .with_validation({{"always", [](const int&) { return true; }}});
  EXPECT_EQ(op.run(1).value, 1);
  const auto without_breaker = op.with_circuit_breaker(nullptr);
  EXPECT_EQ(without_breaker.run(2).value, 2);
}

TEST(OperationBuilder, CallableSharesTheConfiguration) {
  const auto op = idem::operation("id", [](const std::string& s) { return s; });
  const idem::Resilient<std::string(const std::string&)> callable = op.callable();
  EXPECT_EQ(callable("x").value, "x");
  EXPECT_EQ(callable.name(), "id");
}

TEST(OperationBuilder, ChecksEachStep) {
  const auto op = idem::operation("checked", [](int x) { return x; });
  EXPECT_THROW(op.with_retry({.max_attempts = 0}), idem::ConfigError);
  EXPECT_THROW(op.with_retry({.backoff = {.jitter = -1.0}}), idem::ConfigError);
  EXPECT_THROW(op.with_timeout(0ms), idem::ConfigError);
  EXPECT_THROW(op.with_events({nullptr}), idem::ConfigError);
  EXPECT_THROW(op.with_idempotency({}), idem::ConfigError);  // no key
  EXPECT_THROW(
      op.with_idempotency({.key = [](const int&) { return std::string("k"); }, .ttl = 0ms}),
      idem::ConfigError);
  EXPECT_THROW(idem::operation("", [](int x) { return x; }), idem::ConfigError);
  // A failed step leaves the operation it started from usable.
  EXPECT_EQ(op.run(5).value, 5);
}

TEST(OperationBuilder, VoidAndGenericWithNamedSignature) {
  std::atomic<int> calls{0};
  const auto op =
      idem::operation<void(int)>("count", [&](auto) { ++calls; }).with_retry({.max_attempts = 1});
  op.run(1);
  op.callable()(2);
  EXPECT_EQ(calls.load(), 2);
}

TEST(OperationBuilder, WithoutIdempotencyRemovesIt) {
  std::atomic<int> calls{0};
  const auto op = idem::operation("count", [&](int x) {
                    ++calls;
                    return x;
                  }).without_idempotency();
  op.run(1);
  op.run(1);
  EXPECT_EQ(calls.load(), 2);
}

}  // namespace
