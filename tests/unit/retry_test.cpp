#include "idem/retry.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <random>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "../thrown_by.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/error.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/validation.hpp"

namespace {

using namespace std::chrono_literals;
using idem::Backoff;
using idem::RetryPolicy;
using idem::testing::ManualClock;
using std::chrono::nanoseconds;

std::exception_ptr as_ptr(auto error) {
  return std::make_exception_ptr(error);
}

// --- Backoff ---

TEST(Backoff, ExponentialWithoutJitter) {
  const Backoff backoff{.base = 100ms, .multiplier = 2.0, .cap = 10s, .jitter = 0.0};
  EXPECT_EQ(backoff.delay(1, 0.7), 100ms);
  EXPECT_EQ(backoff.delay(2, 0.7), 200ms);
  EXPECT_EQ(backoff.delay(3, 0.7), 400ms);
  EXPECT_EQ(backoff.delay(7, 0.7), 6400ms);
}

TEST(Backoff, CappedAndNeverOverflows) {
  const Backoff backoff{.base = 100ms, .multiplier = 2.0, .cap = 1s, .jitter = 0.0};
  EXPECT_EQ(backoff.delay(4, 0.0), 800ms);
  EXPECT_EQ(backoff.delay(5, 0.0), 1s);
  EXPECT_EQ(backoff.delay(1000, 0.0), 1s);
  EXPECT_EQ(backoff.delay(std::numeric_limits<int>::max(), 0.0), 1s);
}

TEST(Backoff, FullJitterSpansZeroToTheNominalDelay) {
  const Backoff backoff{.base = 100ms, .multiplier = 2.0, .cap = 10s, .jitter = 1.0};
  EXPECT_EQ(backoff.delay(2, 0.0), 200ms);  // u = 0 keeps the whole delay
  EXPECT_EQ(backoff.delay(2, 0.5), 100ms);  // half
  EXPECT_EQ(backoff.delay(2, 0.75), 50ms);
  const auto almost_one = backoff.delay(2, std::nextafter(1.0, 0.0));
  EXPECT_GE(almost_one, 0ns);
  EXPECT_LT(almost_one, 1us);
}

TEST(Backoff, PartialJitterKeepsTheLowerBound) {
  const Backoff backoff{.base = 1s, .multiplier = 1.0, .cap = 1s, .jitter = 0.25};
  EXPECT_EQ(backoff.delay(3, 0.0), 1s);
  EXPECT_EQ(backoff.delay(3, 0.5), 875ms);
  EXPECT_GT(backoff.delay(3, 0.999999), 750ms);
}

TEST(Backoff, OutOfRangeDrawsAreClamped) {
  const Backoff backoff{.base = 1s, .multiplier = 1.0, .cap = 1s, .jitter = 1.0};
  EXPECT_EQ(backoff.delay(1, -3.0), 1s);
  EXPECT_EQ(backoff.delay(1, std::numeric_limits<double>::quiet_NaN()), 1s);
  EXPECT_GE(backoff.delay(1, 5.0), 0ns);
  EXPECT_LT(backoff.delay(1, 5.0), 1us);
}

TEST(Backoff, ZeroBaseMeansNoWait) {
  const Backoff backoff{.base = 0ns, .multiplier = 3.0, .cap = 1s, .jitter = 0.0};
  EXPECT_EQ(backoff.delay(1, 0.0), 0ns);
  EXPECT_EQ(backoff.delay(5000, 0.0), 0ns);
}

TEST(Backoff, RejectsBadBounds) {
  EXPECT_NO_THROW(Backoff{}.validate("test"));
  EXPECT_THROW(Backoff{.base = -1ms}.validate("test"), idem::ConfigError);
  EXPECT_THROW(Backoff{.multiplier = 0.5}.validate("test"), idem::ConfigError);
  EXPECT_THROW(Backoff{.multiplier = std::numeric_limits<double>::infinity()}.validate("test"),
               idem::ConfigError);
  EXPECT_THROW((Backoff{.base = 2s, .cap = 1s}.validate("test")), idem::ConfigError);
  EXPECT_THROW(Backoff{.jitter = -0.1}.validate("test"), idem::ConfigError);
  EXPECT_THROW(Backoff{.jitter = 1.5}.validate("test"), idem::ConfigError);
  EXPECT_THROW(Backoff{.jitter = std::numeric_limits<double>::quiet_NaN()}.validate("test"),
               idem::ConfigError);
  try {
    Backoff{.jitter = 2.0}.validate("operation 'pay'");
    FAIL();
  } catch (const idem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("operation 'pay'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("jitter"), std::string::npos);
  }
}

TEST(Backoff, DefaultRandomStaysInRange) {
  for (int i = 0; i < 10000; ++i) {
    const double u = idem::default_random();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
  }
}

// --- which failures are retried ---

TEST(RetryDecision, DefaultRules) {
  const RetryPolicy policy;
  EXPECT_TRUE(policy.should_retry(as_ptr(std::runtime_error("network"))));
  EXPECT_TRUE(policy.should_retry(as_ptr(idem::TimeoutError("slow"))));
  EXPECT_TRUE(policy.should_retry(as_ptr(idem::StoreError("busy", /*retryable=*/true))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::StoreError("corrupt", /*retryable=*/false))));
  EXPECT_FALSE(policy.should_retry(as_ptr(42)));  // not a std::exception
  EXPECT_FALSE(policy.should_retry(nullptr));
}

TEST(RetryDecision, NeverRetried) {
  RetryPolicy policy;
  policy.retry_on = [](const std::exception&) { return true; };  // even a permissive predicate
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::InvalidArgument("bad amount"))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::ConfigError("bad option"))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::InvalidKey("empty key"))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::ReentryError("k", "nested"))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::KeyReuseError("k", "other args"))));
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::Cancelled("stop"))));
  EXPECT_FALSE(
      policy.should_retry(as_ptr(idem::CircuitOpenError("b", idem::CircuitState::open, 1s))));
}

TEST(RetryDecision, InDoubtOnlyWhenOptedIn) {
  const auto in_doubt =
      as_ptr(idem::StoreError("commit lost", /*retryable=*/true, /*in_doubt=*/true));
  RetryPolicy policy;
  EXPECT_FALSE(policy.should_retry(in_doubt));
  policy.retry_on = [](const std::exception&) { return true; };
  EXPECT_FALSE(policy.should_retry(in_doubt)) << "a predicate alone does not opt in";
  policy.retry_in_doubt = true;
  EXPECT_TRUE(policy.should_retry(in_doubt));
  RetryPolicy opted_in{.retry_in_doubt = true};
  EXPECT_TRUE(opted_in.should_retry(
      as_ptr(idem::StoreError("commit lost", /*retryable=*/false, /*in_doubt=*/true))));
}

TEST(RetryDecision, ValidationFailuresByDefaultUnlessTurnedOff) {
  RetryPolicy policy;
  EXPECT_TRUE(policy.should_retry(as_ptr(idem::ValidationError("v", "bad"))));
  policy.retry_invalid_results = false;
  EXPECT_FALSE(policy.should_retry(as_ptr(idem::ValidationError("v", "bad"))));
}

struct GatewayBusy : std::runtime_error {
  GatewayBusy() : std::runtime_error("busy") {}
};
struct GatewayRejected : std::runtime_error {
  GatewayRejected() : std::runtime_error("rejected") {}
};

TEST(RetryDecision, ByExceptionType) {
  const RetryPolicy policy{.retry_on = idem::retry_on_types<GatewayBusy, std::system_error>()};
  EXPECT_TRUE(policy.should_retry(as_ptr(GatewayBusy())));
  EXPECT_TRUE(
      policy.should_retry(as_ptr(std::system_error(std::make_error_code(std::errc::timed_out)))));
  EXPECT_FALSE(policy.should_retry(as_ptr(GatewayRejected())));
  EXPECT_FALSE(policy.should_retry(as_ptr(std::runtime_error("other"))));
}

TEST(RetryDecision, AThrowingPredicateMeansNoRetry) {
  const RetryPolicy policy{
      .retry_on = [](const std::exception&) -> bool { throw std::logic_error("predicate bug"); }};
  EXPECT_FALSE(policy.should_retry(as_ptr(std::runtime_error("x"))));
}

TEST(RetryPolicyValidation, RejectsBadMaxAttempts) {
  EXPECT_THROW(RetryPolicy{.max_attempts = 0}.validate("t"), idem::ConfigError);
  EXPECT_THROW(RetryPolicy{.max_attempts = -2}.validate("t"), idem::ConfigError);
  EXPECT_NO_THROW(RetryPolicy{.max_attempts = 1}.validate("t"));
}

// --- through a resilient operation ---

// An operation body that counts its calls in `calls` and throws `failure` from every one.
template <class E>
auto counted_throwing(std::atomic<int>& calls, E failure) {
  return [&calls, failure]() -> int {
    ++calls;
    throw failure;
  };
}

TEST(RetryInOperation, RetriesUntilSuccessAndRecordsTheBackoff) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](int x) {
        if (++calls < 3) throw std::runtime_error("flaky");
        return x * 2;
      },
      {.retries = 4,
       .backoff = {.base = 100ms, .multiplier = 3.0, .cap = 1s, .jitter = 0.0},
       .clock = clock});
  const auto result = op(21);
  EXPECT_EQ(result.value, 42);
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(clock->sleeps(), (std::vector<nanoseconds>{100ms, 300ms}));
  ASSERT_EQ(result.report.attempts.size(), 3u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::failed);
  EXPECT_TRUE(result.report.attempts[0].retryable);
  EXPECT_EQ(result.report.attempts[0].error_type, "std::runtime_error");
  EXPECT_EQ(result.report.attempts[0].error_message, "flaky");
  EXPECT_EQ(result.report.attempts[2].status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(result.report.attempts[2].number, 3);
  EXPECT_EQ(result.report.duration, 400ms);  // the ManualClock moved only by the backoff
}

TEST(RetryInOperation, GivesUpAfterRetriesPlusOneAttempts) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op =
      idem::resilient(counted_throwing(calls, std::runtime_error("down")),
                      {.retries = 2, .backoff = {.base = 10ms, .jitter = 0.0}, .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(calls.load(), 3);
  EXPECT_EQ(error->report().attempts.size(), 3u);
  EXPECT_EQ(error->report().status, idem::OperationStatus::failed);
  EXPECT_TRUE(error->retryable());
  EXPECT_EQ(clock->sleeps(), (std::vector<nanoseconds>{10ms, 20ms}));
}

TEST(RetryInOperation, NoRetriesByDefault) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(counted_throwing(calls, std::runtime_error("down")), {.clock = clock});
  EXPECT_THROW(op(), idem::OperationError);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(clock->sleeps().empty());
}

TEST(RetryInOperation, JitterComesFromTheInjectedRandomSource) {
  auto clock = std::make_shared<ManualClock>();
  std::vector<double> draws = {0.5, 0.25, 0.0};
  std::size_t next = 0;
  auto op =
      idem::resilient([]() -> int { throw std::runtime_error("down"); },
                      {.retries = 3,
                       .backoff = {.base = 100ms, .multiplier = 2.0, .cap = 10s, .jitter = 1.0},
                       .clock = clock,
                       .random = [&] { return draws[next++ % draws.size()]; }});
  EXPECT_THROW(op(), idem::OperationError);
  // nominal 100, 200, 400 ms; delay = nominal * (1 - u)
  EXPECT_EQ(clock->sleeps(), (std::vector<nanoseconds>{50ms, 150ms, 400ms}));
}

TEST(RetryInOperation, SeededEngineGivesReproducibleJitter) {
  auto run = [] {
    auto clock = std::make_shared<ManualClock>();
    auto op = idem::resilient([]() -> int { throw std::runtime_error("down"); },
                              {.retries = 5,
                               .backoff = {.base = 10ms, .jitter = 1.0},
                               .clock = clock,
                               .random = idem::random_source_from(std::mt19937(42))});
    EXPECT_THROW(op(), idem::OperationError);
    return clock->sleeps();
  };
  const auto first = run();
  EXPECT_EQ(first.size(), 5u);
  EXPECT_EQ(first, run());
}

TEST(RetryInOperation, JitteredDelaysStayWithinBounds) {
  auto clock = std::make_shared<ManualClock>();
  auto op = idem::resilient([]() -> int { throw std::runtime_error("down"); },
                            {.retries = 8,
                             .backoff = {.base = 10ms, .multiplier = 2.0, .cap = 1s, .jitter = 0.5},
                             .clock = clock});
  EXPECT_THROW(op(), idem::OperationError);
  const auto sleeps = clock->sleeps();
  ASSERT_EQ(sleeps.size(), 8u);
  nanoseconds nominal = 10ms;
  for (const auto& delay : sleeps) {
    EXPECT_LE(delay, nominal);
    EXPECT_GT(delay, nominal / 2);
    nominal = std::min<nanoseconds>(nominal * 2, 1s);
  }
}

TEST(RetryInOperation, InDoubtFailureIsNotRetriedUnlessOptedIn) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto body = counted_throwing(
      calls, idem::StoreError("commit outcome unknown", /*retryable=*/true, /*in_doubt=*/true));
  auto cautious = idem::resilient(body, {.retries = 3, .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { cautious(); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(calls.load(), 1);
  EXPECT_FALSE(error->report().attempts[0].retryable);
  EXPECT_TRUE(error->in_doubt());
  calls = 0;
  auto bold = idem::resilient(body, {.retries = 3, .retry_in_doubt = true, .clock = clock});
  EXPECT_THROW(bold(), idem::OperationError);
  EXPECT_EQ(calls.load(), 4);
}

TEST(RetryInOperation, RetryOnPredicateDecides) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&]() -> int {
        if (++calls == 1) throw GatewayBusy();
        throw GatewayRejected();
      },
      {.retries = 5, .retry_on = idem::retry_on_types<GatewayBusy>(), .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(calls.load(), 2);  // busy retried, rejected not
  ASSERT_EQ(error->report().attempts.size(), 2u);
  EXPECT_TRUE(error->report().attempts[0].retryable);
  EXPECT_FALSE(error->report().attempts[1].retryable);
  EXPECT_THROW(std::rethrow_exception(error->cause()), GatewayRejected);
}

TEST(RetryInOperation, NonRetryableIdemErrorStopsAtOnce) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op =
      idem::resilient(counted_throwing(calls, idem::InvalidArgument("amount must be positive")),
                      {.retries = 5, .clock = clock});
  EXPECT_THROW(op(), idem::OperationError);
  EXPECT_EQ(calls.load(), 1);
}

TEST(RetryInOperation, NonStdExceptionsAreNotRetriedAndKeepTheirType) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(counted_throwing(calls, 42), {.retries = 5, .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(error->report().attempts[0].error_type, "int");
  try {
    std::rethrow_exception(error->cause());
  } catch (int value) {
    EXPECT_EQ(value, 42);
  }
}

}  // namespace
