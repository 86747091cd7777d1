// The operation face's behaviour shared with relprim 0.8/0.9 and its peers: outcomes
// (timed_out / cancelled, cooperative cancellation), rate limits (rate_limit_on, retry_after,
// max_rate_limit_wait), defaults (invalid results retried, fallback_on, record_failure_on), and
// report / event parity. Time is the manual clock's; nothing sleeps.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "../relprim_parity.hpp"
#include "../thrown_by.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/events.hpp"
#include "idem/operation.hpp"
#include "idem/rate_limit.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::test::type_names;
using idem::testing::ManualClock;

struct TooManyRequests : std::runtime_error {
  explicit TooManyRequests(std::optional<std::chrono::nanoseconds> after = std::nullopt)
      : std::runtime_error("429 too many requests"), retry_after(after) {}
  std::optional<std::chrono::nanoseconds> retry_after;
};

struct ProviderDown : std::runtime_error {
  ProviderDown() : std::runtime_error("503 provider down") {}
};

std::optional<std::chrono::nanoseconds> provider_delay(const std::exception& e) {
  if (const auto* limited = dynamic_cast<const TooManyRequests*>(&e)) return limited->retry_after;
  return std::nullopt;
}

// Throws the listed failures in order, then returns "ok".
struct Script {
  std::shared_ptr<std::vector<std::exception_ptr>> failures =
      std::make_shared<std::vector<std::exception_ptr>>();
  std::shared_ptr<std::atomic<int>> calls = std::make_shared<std::atomic<int>>(0);

  std::string operator()(int) const {
    const int n = (*calls)++;
    if (n < static_cast<int>(failures->size())) std::rethrow_exception((*failures)[n]);
    return "ok";
  }
};

template <class E>
std::exception_ptr error(E e) {
  return std::make_exception_ptr(std::move(e));
}

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// ---- rate limits ------------------------------------------------------------------------------

TEST(RateLimit, TheProvidersDelayReplacesTheBackoff) {
  auto clock = std::make_shared<ManualClock>();
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  Script script;
  script.failures->push_back(error(TooManyRequests(2500ms)));
  auto op = idem::resilient(script, {.name = "provider",
                                     .retries = 3,
                                     .backoff = {.base = 100ms, .jitter = 0},
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .max_rate_limit_wait = 30s,
                                     .events = {sink},
                                     .clock = clock});
  const auto result = op(0);
  EXPECT_EQ(result.value, "ok");
  EXPECT_EQ(clock->sleeps(), std::vector<std::chrono::nanoseconds>{2500ms});
  ASSERT_EQ(result.report.attempts.size(), 2u);
  const auto& limited = result.report.attempts[0].metadata;
  EXPECT_EQ(limited.at("rate_limited"), "true");
  EXPECT_EQ(limited.at("rate_limit_retry_after_seconds"), "2.5");
  EXPECT_EQ(limited.at("rate_limit_delay_seconds"), "2.5");
  EXPECT_EQ(limited.at("rate_limit_delay_source"), "provider");
  EXPECT_EQ(limited.at("rate_limit_wait_exceeded"), "false");
  EXPECT_EQ(result.report.metadata.at("rate_limit_encountered"), "true");
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_seconds"), "2.5");
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_exceeded"), "false");

  const auto events = sink->events();
  const auto detected = std::find_if(events.begin(), events.end(), [](const auto& e) {
    return e.type == idem::EventType::rate_limit_detected;
  });
  ASSERT_NE(detected, events.end());
  EXPECT_EQ(detected->fields.at("retry_after_seconds"), "2.5");
  const auto scheduled = std::find_if(events.begin(), events.end(), [](const auto& e) {
    return e.type == idem::EventType::retry_scheduled;
  });
  ASSERT_NE(scheduled, events.end());
  EXPECT_EQ(scheduled->fields.at("delay_source"), "provider");
  EXPECT_EQ(scheduled->fields.at("rate_limited"), "true");
  EXPECT_EQ(scheduled->fields.at("retry_after_seconds"), "2.5");
  EXPECT_EQ(scheduled->fields.at("delay_seconds"), "2.5");
}

TEST(RateLimit, WithoutAProviderHintTheBackoffApplies) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(TooManyRequests()));
  script.failures->push_back(error(TooManyRequests()));
  auto op = idem::operation("provider", script)
                .with_retry({.max_attempts = 4, .backoff = {.base = 500ms, .jitter = 0}})
                .with_rate_limit({.rate_limit_on = idem::failures_of<TooManyRequests>(),
                                  .retry_after = provider_delay})
                .with_clock(clock);
  const auto result = op.run(0);
  EXPECT_EQ(result.value, "ok");
  EXPECT_EQ(clock->sleeps(), (std::vector<std::chrono::nanoseconds>{500ms, 1s}));
  EXPECT_EQ(result.report.attempts[0].metadata.at("rate_limit_delay_source"), "backoff");
  EXPECT_EQ(result.report.attempts[0].metadata.count("rate_limit_retry_after_seconds"), 0u);
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_seconds"), "1.5");
}

TEST(RateLimit, ARateLimitIsRetriedEvenWhenRetryOnWouldNot) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(TooManyRequests(0ns)));
  auto op = idem::resilient(script, {.retries = 1,
                                     .retry_on = [](const std::exception&) { return false; },
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .clock = clock});
  EXPECT_EQ(op(0).value, "ok");
  EXPECT_EQ(clock->sleeps(), std::vector<std::chrono::nanoseconds>{0ns}) << "0 = retry at once";
}

TEST(RateLimit, RateLimitsAddNoAttempts) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(TooManyRequests(1s)));
  auto op = idem::resilient(script, {.rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .clock = clock});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().attempts.size(), 1u);
  EXPECT_EQ(failure->report().metadata.at("rate_limit_encountered"), "true");
  EXPECT_EQ(failure->report().attempts[0].metadata.at("rate_limited"), "true");
  EXPECT_THROW(std::rethrow_exception(failure->cause()), TooManyRequests);
  EXPECT_TRUE(clock->sleeps().empty());
}

TEST(RateLimit, ALongerWaitThanAllowedEndsTheRetriesWithAClearError) {
  auto clock = std::make_shared<ManualClock>();
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  Script script;
  script.failures->push_back(error(TooManyRequests(120s)));
  auto op = idem::resilient(script, {.name = "provider",
                                     .retries = 3,
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .events = {sink},
                                     .clock = clock});  // max_rate_limit_wait: 60 s by default
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().attempts.size(), 1u) << "nothing was waited, nothing retried";
  EXPECT_EQ(failure->report().metadata.at("rate_limit_wait_exceeded"), "true");
  EXPECT_EQ(failure->report().attempts[0].metadata.at("rate_limit_wait_exceeded"), "true");
  EXPECT_EQ(failure->report().attempts[0].metadata.count("rate_limit_delay_seconds"), 0u)
      << "no delay was taken";
  EXPECT_EQ(failure->report().attempts[0].metadata.at("rate_limit_retry_after_seconds"), "120");
  try {
    std::rethrow_exception(failure->cause());
  } catch (const idem::RateLimitWaitExceeded& exceeded) {
    EXPECT_EQ(exceeded.retry_after(), 120s);
    EXPECT_EQ(exceeded.max_wait(), 60s);
    EXPECT_EQ(exceeded.code(), idem::ErrorCode::rate_limit_wait_exceeded);
    EXPECT_THROW(std::rethrow_exception(exceeded.rate_limit_error()), TooManyRequests);
    EXPECT_NE(std::string(exceeded.what()).find("max_rate_limit_wait"), std::string::npos);
  }
  EXPECT_TRUE(clock->sleeps().empty());
  EXPECT_TRUE(contains(type_names(*sink), "rate_limit.wait_exceeded"));
  EXPECT_FALSE(contains(type_names(*sink), "retry.scheduled"));
}

TEST(RateLimit, AFallbackTakesOverWhenTheWaitIsTooLong) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(TooManyRequests(10s)));
  auto op = idem::resilient(script, {.retries = 3,
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .max_rate_limit_wait = 5s,
                                     .fallback = {"backup",
                                                  [](const idem::FallbackContext& why, int) {
                                                    // The fallback sees the rate-limited failure
                                                    // itself.
                                                    EXPECT_THROW(std::rethrow_exception(why.error),
                                                                 TooManyRequests);
                                                    return std::string("backup");
                                                  }},
                                     .clock = clock});
  const auto result = op(0);
  EXPECT_EQ(result.value, "backup");
  EXPECT_EQ(result.report.metadata.at("fallback_candidate_name"), "backup");
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_exceeded"), "true");
}

TEST(RateLimit, AFailingExtractorEndsTheRetries) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(TooManyRequests(1s)));
  auto op = idem::resilient(
      script, {.retries = 3,
               .rate_limit_on = idem::failures_of<TooManyRequests>(),
               .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
                 throw std::runtime_error("broken extractor");
               },
               .clock = clock});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().attempts.size(), 1u);
  try {
    std::rethrow_exception(failure->cause());
  } catch (const idem::RetryAfterExtractionError& failed) {
    EXPECT_THROW(std::rethrow_exception(failed.rate_limit_error()), TooManyRequests);
    ASSERT_TRUE(failed.cause());
    EXPECT_THROW(std::rethrow_exception(failed.cause()), std::runtime_error);
    EXPECT_FALSE(failed.retryable());
  }
  EXPECT_TRUE(clock->sleeps().empty());
}

TEST(RateLimit, ANegativeDelayIsAnExtractionError) {
  Script script;
  script.failures->push_back(error(TooManyRequests(-1s)));
  auto op = idem::resilient(script, {.retries = 1,
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .clock = std::make_shared<ManualClock>()});
  try {
    op(0);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_THROW(std::rethrow_exception(e.cause()), idem::RetryAfterExtractionError);
  }
}

TEST(RateLimit, OtherFailuresAreNotRateLimits) {
  auto clock = std::make_shared<ManualClock>();
  Script script;
  script.failures->push_back(error(ProviderDown()));
  auto op = idem::resilient(script, {.retries = 1,
                                     .backoff = {.base = 100ms, .jitter = 0},
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .clock = clock});
  const auto result = op(0);
  EXPECT_EQ(result.report.attempts[0].metadata.at("rate_limited"), "false");
  EXPECT_EQ(result.report.metadata.at("rate_limit_encountered"), "false");
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_seconds"), "0");
}

TEST(RateLimit, ABreakerCountsARateLimitedFailureOnceTheRetriesEnd) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .clock = clock});
  Script script;
  script.failures->push_back(error(TooManyRequests(600s)));
  auto op = idem::resilient(script, {.retries = 2,
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .circuit_breaker = breaker,
                                     .clock = clock});
  EXPECT_THROW(op(0), idem::OperationError);
  EXPECT_EQ(breaker->state(), idem::CircuitState::open);
}

TEST(RateLimit, ConfigErrors) {
  EXPECT_THROW(idem::resilient([](int) { return 1; }, {.retry_after = provider_delay}),
               idem::ConfigError);
  EXPECT_THROW(
      idem::resilient([](int) { return 1; }, {.rate_limit_on = idem::failures_of<TooManyRequests>(),
                                              .max_rate_limit_wait = -1s}),
      idem::ConfigError);
}

// ---- Retry-After parsing ----------------------------------------------------------------------

TEST(ParseRetryAfter, DelaySeconds) {
  const idem::WallTime now{std::chrono::seconds(1445412480)};
  EXPECT_EQ(idem::parse_retry_after("120", now), std::chrono::nanoseconds(120s));
  EXPECT_EQ(idem::parse_retry_after(" 0 ", now), std::chrono::nanoseconds(0));
  EXPECT_EQ(idem::parse_retry_after("", now), std::nullopt);
  EXPECT_EQ(idem::parse_retry_after("-5", now), std::nullopt);
  EXPECT_EQ(idem::parse_retry_after("1.5", now), std::nullopt);
  EXPECT_EQ(idem::parse_retry_after("soon", now), std::nullopt);
  EXPECT_TRUE(idem::parse_retry_after("99999999999999999999999", now).has_value());
}

TEST(ParseRetryAfter, HttpDatesInEveryForm) {
  // Wed, 21 Oct 2015 07:28:00 GMT is 1445412480 s after the epoch.
  const idem::WallTime now{std::chrono::seconds(1445412480 - 90)};
  const std::chrono::nanoseconds ninety = 90s;
  EXPECT_EQ(idem::parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now), ninety);
  EXPECT_EQ(idem::parse_retry_after("Wednesday, 21-Oct-15 07:28:00 GMT", now), ninety);
  EXPECT_EQ(idem::parse_retry_after("Wed Oct 21 07:28:00 2015", now), ninety);
  EXPECT_EQ(idem::parse_retry_after("Sun Nov  6 08:49:37 1994", now), std::chrono::nanoseconds(0))
      << "a date in the past means now";
  EXPECT_EQ(idem::parse_retry_after("Wed, 21 Oct 2015 07:28:00 UTC", now), std::nullopt);
  EXPECT_EQ(idem::parse_retry_after("Wed, 31 Feb 2015 07:28:00 GMT", now), std::nullopt);
  EXPECT_EQ(idem::parse_retry_after("Wed, 21 Oct 2015 25:28:00 GMT", now), std::nullopt);
}

// ---- outcomes ---------------------------------------------------------------------------------

TEST(Outcomes, ATimeoutIsTimedOutNotFailed) {
  auto release = std::make_shared<std::latch>(1);
  auto op = idem::resilient(
      [release](int) {
        release->wait();
        return 1;
      },
      {.name = "slow", .timeout = 1ms});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().status, idem::OperationStatus::timed_out);
  EXPECT_EQ(idem::to_string(failure->report().status), "timed_out");
  ASSERT_EQ(failure->report().attempts.size(), 1u);
  const auto& attempt = failure->report().attempts[0];
  EXPECT_EQ(attempt.status, idem::AttemptStatus::timed_out);
  EXPECT_EQ(attempt.metadata.at("timeout_seconds"), "0.001");
  EXPECT_EQ(attempt.metadata.at("stop_requested"), "true");
  EXPECT_EQ(attempt.metadata.at("attempt_stopped"), "false") << "it ignores its stop token";
  try {
    std::rethrow_exception(failure->cause());
  } catch (const idem::TimeoutError& timeout) {
    ASSERT_TRUE(timeout.timeout().has_value());
    EXPECT_EQ(*timeout.timeout(), 1ms);
    EXPECT_EQ(timeout.attempt_stopped(), std::optional<bool>(false));
    release->count_down();
    // The abandoned attempt ends once released; the error sees it end.
    const auto guard = std::chrono::steady_clock::now() + 60s;
    while (timeout.attempt_stopped() != std::optional<bool>(true) &&
           std::chrono::steady_clock::now() < guard) {
      std::this_thread::yield();
    }
    EXPECT_EQ(timeout.attempt_stopped(), std::optional<bool>(true));
  }
}

TEST(Outcomes, AStopTokenCallableIsAskedToStopAndTheReportSaysItDid) {
  auto op = idem::resilient(
      [](std::stop_token stop, int) {
        std::mutex mutex;
        std::condition_variable_any cv;
        std::unique_lock lock(mutex);
        cv.wait(lock, stop, [] { return false; });  // returns once stop is requested
        if (stop.stop_requested()) throw std::runtime_error("stopped");
        return 1;
      },
      {.name = "cooperative", .timeout = 1ms, .timeout_grace = 60s});
  static_assert(std::is_same_v<decltype(op), idem::Resilient<int(int)>>,
                "the leading std::stop_token is not one of the operation's parameters");
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().status, idem::OperationStatus::timed_out);
  EXPECT_EQ(failure->report().attempts[0].metadata.at("attempt_stopped"), "true");
  try {
    std::rethrow_exception(failure->cause());
  } catch (const idem::TimeoutError& timeout) {
    EXPECT_EQ(timeout.attempt_stopped(), std::optional<bool>(true));
    EXPECT_NE(std::string(timeout.what()).find("stopped when asked"), std::string::npos);
  }
}

TEST(Outcomes, CancelledIsItsOwnStatusAndNotRetried) {
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto op = idem::resilient(
      [calls](int) -> int {
        ++*calls;
        throw idem::Cancelled("caller went away");
      },
      {.retries = 3, .clock = std::make_shared<ManualClock>()});
  try {
    op(0);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().status, idem::OperationStatus::cancelled);
    EXPECT_EQ(e.report().attempts[0].status, idem::AttemptStatus::cancelled);
  }
  EXPECT_EQ(*calls, 1);
}

TEST(Outcomes, TimeoutErrorsOfAWaitCarryNoAttempt) {
  const idem::TimeoutError plain("gave up waiting");
  EXPECT_FALSE(plain.timeout().has_value());
  EXPECT_FALSE(plain.attempt_stopped().has_value());
}

// ---- defaults the peers share -----------------------------------------------------------------

TEST(Defaults, AnInvalidResultIsRetriedByDefault) {
  auto clock = std::make_shared<ManualClock>();
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto op = idem::resilient([calls](int) { return ++*calls; },
                            {.retries = 2,
                             .validate = {{"even", [](const int& v) { return v % 2 == 0; }}},
                             .events = {sink},
                             .clock = clock});
  const auto result = op(0);
  EXPECT_EQ(result.value, 2);
  EXPECT_EQ(result.report.retry_count(), 1);
  EXPECT_TRUE(result.report.retried());
  EXPECT_EQ(result.report.metadata.at("validation_performed"), "true");
  EXPECT_EQ(result.report.metadata.at("valid"), "true");
  EXPECT_EQ(result.report.metadata.at("validator_name"), "even");
  const auto names = type_names(*sink);
  EXPECT_TRUE(contains(names, "validation.failed"));
  EXPECT_TRUE(contains(names, "validation.succeeded"));
  ASSERT_NE(result.report.last_error(), nullptr);
  EXPECT_EQ(result.report.last_error()->error_type, "idem::ValidationError");
  EXPECT_EQ(result.report.attempts[0].metadata.at("validator_name"), "even");
}

TEST(Defaults, InvalidResultsCanStillBeFinal) {
  auto op = idem::resilient([](int) { return 1; },
                            {.retries = 2,
                             .retry_invalid_results = false,
                             .validate = {{"even", [](const int& v) { return v % 2 == 0; }}},
                             .clock = std::make_shared<ManualClock>()});
  try {
    op(0);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().attempts.size(), 1u);
    EXPECT_EQ(e.report().metadata.at("valid"), "false");
    EXPECT_EQ(e.report().metadata.at("validator_name"), "even");
    EXPECT_EQ(e.report().metadata.at("reason"), "rejected by even");
  }
}

TEST(Defaults, FallbackOnChoosesWhichFailuresStartTheChain) {
  auto op = idem::resilient(
      [](int kind) -> std::string {
        if (kind == 0) throw ProviderDown();
        throw std::invalid_argument("bad request");
      },
      {.fallback = {"cache", [](int) { return std::string("cached"); }},
       .fallback_on = idem::failures_of<ProviderDown>(),
       .clock = std::make_shared<ManualClock>()});
  EXPECT_EQ(op(0).value, "cached");
  try {
    op(1);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_FALSE(e.report().fallback_used);
    EXPECT_EQ(e.report().attempts.size(), 1u) << "the fallback never ran";
    EXPECT_THROW(std::rethrow_exception(e.cause()), std::invalid_argument);
  }
  EXPECT_THROW(
      idem::resilient([](int) { return 1; }, {.fallback_on = idem::failures_of<ProviderDown>()}),
      idem::ConfigError)
      << "fallback_on without a fallback";
}

TEST(Defaults, RecordFailureOnChoosesWhatOpensTheBreaker) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1,
                                  .clock = clock,
                                  .record_failure_on = idem::failures_of<ProviderDown>()});
  auto op = idem::resilient(
      [](int kind) -> int {
        if (kind == 0) throw std::invalid_argument("bad request");
        throw ProviderDown();
      },
      {.circuit_breaker = breaker, .clock = clock});
  EXPECT_THROW(op(0), idem::OperationError);
  EXPECT_EQ(breaker->state(), idem::CircuitState::closed) << "not a recorded failure";
  EXPECT_THROW(op(1), idem::OperationError);
  EXPECT_EQ(breaker->state(), idem::CircuitState::open);
  try {
    op(1);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().metadata.at("circuit_breaker_open"), "true");
    EXPECT_EQ(e.report().attempts[0].status, idem::AttemptStatus::rejected);
  }
}

// ---- report and event parity ------------------------------------------------------------------

TEST(Parity, FallbackMetadataAndAttemptStartTimes) {
  auto clock = std::make_shared<ManualClock>();
  const auto start = clock->wall_now();
  auto op = idem::resilient(
      [clock](int) -> std::string {
        clock->advance(5s);
        throw ProviderDown();
      },
      {.retries = 1,
       .backoff = {.base = 1s, .jitter = 0},
       .fallbacks = {{"first", [](int) -> std::string { throw std::runtime_error("no"); }},
                     {"second", [](int) { return std::string("second"); }}},
       .clock = clock});
  const auto result = op(0);
  EXPECT_EQ(result.value, "second");
  const auto& m = result.report.metadata;
  EXPECT_EQ(m.at("fallback_used"), "true");
  EXPECT_EQ(m.at("fallback_candidate_name"), "second");
  EXPECT_EQ(m.at("fallback_candidate_index"), "1");
  EXPECT_EQ(m.at("fallback_failure_count"), "1");
  EXPECT_EQ(m.at("circuit_breaker_open"), "false");
  EXPECT_EQ(m.at("validation_performed"), "false");
  ASSERT_EQ(result.report.attempts.size(), 4u);
  EXPECT_EQ(result.report.attempts[0].started_at, start);
  EXPECT_EQ(result.report.attempts[1].started_at, start + 6s) << "5 s attempt + 1 s backoff";
  EXPECT_EQ(result.report.attempts[2].started_at, start + 11s);
  EXPECT_EQ(result.report.retry_count(), 1) << "fallbacks are not retries";
  EXPECT_EQ(result.report.attempt_count(), 4);
  ASSERT_NE(result.report.last_error(), nullptr);
  EXPECT_EQ(result.report.last_error()->source, "fallback:first");
  // The attempt details survive the JSON a durable store keeps.
  const auto back = idem::ExecutionReport::from_json(result.report.to_json());
  EXPECT_EQ(back.attempts[1].started_at, start + 6s);
  EXPECT_EQ(back.metadata, result.report.metadata);
}

TEST(Parity, OperationStartedSaysWhichPoliciesAreOn) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::operation("charge", [](int v) { return v; })
                .with_retries(2)
                .with_validation({{"positive", [](const int& v) { return v > 0; }}})
                .with_events({sink});
  op.run(1);
  const auto started = sink->events().front();
  ASSERT_EQ(started.type, idem::EventType::operation_started);
  EXPECT_EQ(started.fields.at("retry_enabled"), "true");
  EXPECT_EQ(started.fields.at("max_attempts"), "3");
  EXPECT_EQ(started.fields.at("validation_enabled"), "true");
  EXPECT_EQ(started.fields.at("timeout_enabled"), "false");
  EXPECT_EQ(started.fields.at("fallback_enabled"), "false");
  EXPECT_EQ(started.fields.at("circuit_breaker_enabled"), "false");
  EXPECT_EQ(started.fields.at("rate_limit_enabled"), "false");
  EXPECT_EQ(started.fields.at("idempotency_enabled"), "false");
}

TEST(Parity, RetryScheduledCarriesItsDelaySource) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  Script script;
  script.failures->push_back(error(ProviderDown()));
  auto op = idem::resilient(script, {.retries = 1,
                                     .backoff = {.base = 250ms, .jitter = 0},
                                     .events = {sink},
                                     .clock = std::make_shared<ManualClock>()});
  op(0);
  for (const auto& event : sink->events()) {
    if (event.type != idem::EventType::retry_scheduled) continue;
    EXPECT_EQ(event.fields.at("delay_source"), "backoff");
    EXPECT_EQ(event.fields.at("delay_seconds"), "0.25");
    EXPECT_EQ(event.fields.at("rate_limited"), "false");
    return;
  }
  FAIL() << "no retry.scheduled";
}

TEST(Parity, NewEventNamesRoundTrip) {
  for (const char* name :
       {"validation.succeeded", "rate_limit.detected", "rate_limit.wait_exceeded"}) {
    const auto type = idem::event_type_from_string(name);
    ASSERT_TRUE(type.has_value()) << name;
    EXPECT_EQ(idem::to_string(*type), name);
  }
}

TEST(Parity, WithRetriesIsResilientsRetries) {
  auto clock = std::make_shared<ManualClock>();
  Script a;
  a.failures->push_back(error(ProviderDown()));
  a.failures->push_back(error(ProviderDown()));
  Script b = Script{};
  b.failures->push_back(error(ProviderDown()));
  b.failures->push_back(error(ProviderDown()));
  const auto via_options = idem::resilient(a, {.retries = 2, .clock = clock})(0);
  const auto via_builder = idem::operation("operation", b).with_retries(2).with_clock(clock).run(0);
  EXPECT_EQ(via_options.report.attempt_count(), 3);
  EXPECT_EQ(via_builder.report.attempt_count(), 3);
  // Neither retries unless asked.
  Script c;
  c.failures->push_back(error(ProviderDown()));
  EXPECT_THROW(idem::operation("once", c).with_clock(clock).run(0), idem::OperationError);
  EXPECT_EQ(*c.calls, 1);
}

// ---- relprim 0.9: the order of rate-limit events, and the report's keys ------------------------

// relprim evaluates the rate limit before it records the failed attempt, so rate_limit.detected
// and rate_limit.wait_exceeded come before attempt.failed.
TEST(RateLimit, DetectedAndWaitExceededComeBeforeTheFailedAttempt) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  Script script;
  script.failures->push_back(error(TooManyRequests(1s)));
  script.failures->push_back(error(TooManyRequests(120s)));
  auto op = idem::resilient(script, {.retries = 3,
                                     .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                     .retry_after = provider_delay,
                                     .events = {sink},
                                     .clock = std::make_shared<ManualClock>()});
  EXPECT_THROW(op(0), idem::OperationError);
  EXPECT_EQ(type_names(*sink), idem::test::kRateLimitedTwiceEvents);
}

// relprim writes the rate-limit keys on every attempt and the summary on every report, also
// without a rate-limit policy.
TEST(RateLimit, EveryAttemptAndEveryReportCarriesTheRateLimitKeys) {
  Script script;
  script.failures->push_back(error(ProviderDown()));
  auto op = idem::resilient(script, {.retries = 1, .clock = std::make_shared<ManualClock>()});
  const auto result = op(0);
  ASSERT_EQ(result.report.attempts.size(), 2u);
  for (const auto& attempt : result.report.attempts)
    idem::test::expect_not_rate_limited(attempt);
  idem::test::expect_no_rate_limit_in(result.report);
}

// The report's rate_limited and rate_limit_retry_after_seconds are the last attempt's.
TEST(RateLimit, TheReportCarriesTheLastAttemptsRateLimit) {
  Script limited;
  limited.failures->push_back(error(TooManyRequests(2s)));
  auto once = idem::resilient(limited, {.rate_limit_on = idem::failures_of<TooManyRequests>(),
                                        .retry_after = provider_delay,
                                        .clock = std::make_shared<ManualClock>()});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { once(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_EQ(failure->report().metadata.at("rate_limited"), "true");
  EXPECT_EQ(failure->report().metadata.at("rate_limit_retry_after_seconds"), "2");
  EXPECT_EQ(failure->report().metadata.at("rate_limit_wait_seconds"), "0") << "nothing was waited";
  Script recovered;
  recovered.failures->push_back(error(TooManyRequests(2s)));
  auto retried = idem::resilient(recovered, {.retries = 1,
                                             .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                             .retry_after = provider_delay,
                                             .clock = std::make_shared<ManualClock>()});
  const auto result = retried(0);
  EXPECT_EQ(result.report.metadata.at("rate_limited"), "false") << "the last attempt succeeded";
  EXPECT_EQ(result.report.metadata.count("rate_limit_retry_after_seconds"), 0u);
  EXPECT_EQ(result.report.metadata.at("rate_limit_encountered"), "true");
  EXPECT_EQ(result.report.metadata.at("rate_limit_wait_seconds"), "2");
}

// In relprim the extractor's RetryAfterExtractionError replaces the attempt's failure, and no
// rate_limit.detected is emitted for it.
TEST(RateLimit, AFailingExtractorsErrorIsTheAttemptsFailure) {
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  Script script;
  script.failures->push_back(error(TooManyRequests(1s)));
  auto op = idem::resilient(
      script, {.retries = 3,
               .rate_limit_on = idem::failures_of<TooManyRequests>(),
               .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
                 throw std::runtime_error("broken extractor");
               },
               .events = {sink},
               .clock = std::make_shared<ManualClock>()});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  ASSERT_EQ(failure->report().attempts.size(), 1u);
  const auto& attempt = failure->report().attempts[0];
  EXPECT_EQ(attempt.error_type, "idem::RetryAfterExtractionError");
  EXPECT_NE(attempt.error_message.find("broken extractor"), std::string::npos);
  EXPECT_FALSE(attempt.retryable);
  EXPECT_EQ(attempt.metadata.at("rate_limited"), "false");
  EXPECT_EQ(failure->report().metadata.at("rate_limit_encountered"), "false");
  const auto names = type_names(*sink);
  EXPECT_FALSE(contains(names, "rate_limit.detected"));
  for (const auto& event : sink->events()) {
    if (event.type != idem::EventType::attempt_failed) continue;
    EXPECT_EQ(event.fields.at("error_type"), "idem::RetryAfterExtractionError");
    EXPECT_EQ(event.fields.at("retryable"), "false");
  }
}

// relprim's FallbackChain applies fallback_on to each candidate: a failure it does not accept
// stops the chain and is raised as it is.
TEST(Defaults, FallbackOnStopsTheChainAtACandidateItDoesNotAccept) {
  std::atomic<int> third{0};
  auto op = idem::resilient(
      [](int) -> std::string { throw ProviderDown(); },
      {.fallbacks = {{"first", [](int) -> std::string { throw ProviderDown(); }},
                     {"second", [](int) -> std::string { throw std::invalid_argument("bad"); }},
                     {"third",
                      [&third](int) {
                        ++third;
                        return std::string("third");
                      }}},
       .fallback_on = idem::failures_of<ProviderDown>(),
       .clock = std::make_shared<ManualClock>()});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { op(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  EXPECT_THROW(std::rethrow_exception(failure->cause()), std::invalid_argument)
      << "the candidate's own failure, not a FallbackChainError";
  ASSERT_EQ(failure->report().attempts.size(), 3u);
  EXPECT_EQ(failure->report().attempts[2].source, "fallback:second");
  EXPECT_EQ(failure->report().metadata.at("fallback_used"), "true");
  EXPECT_EQ(failure->report().metadata.at("fallback_failed"), "true");
  EXPECT_EQ(failure->report().metadata.at("fallback_failure_count"), "2");
  EXPECT_EQ(third.load(), 0) << "the chain stopped before the third candidate";
}

// relprim's names are validation_valid, validation_validator_name and validation_reason; idem
// keeps its own (valid, validator_name, reason) beside them.
TEST(Parity, ValidationMetadataUsesRelprimsKeys) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient([&calls](int) { return ++calls; },
                            {.retries = 1,
                             .validate = {{"even", [](const int& v) { return v % 2 == 0; }}},
                             .clock = clock});
  const auto result = op(0);
  const auto& m = result.report.metadata;
  EXPECT_EQ(m.at("validation_valid"), "true");
  EXPECT_EQ(m.at("validation_validator_name"), "even");
  EXPECT_EQ(m.count("validation_reason"), 0u);
  EXPECT_EQ(m.at("valid"), "true");
  const auto& rejected = result.report.attempts[0].metadata;
  EXPECT_EQ(rejected.at("validation_valid"), "false");
  EXPECT_EQ(rejected.at("validation_validator_name"), "even");
  EXPECT_EQ(rejected.at("validation_reason"), "rejected by even");

  auto odd = idem::resilient(
      [](int) { return 1; },
      {.validate = {{"even", [](const int& v) { return v % 2 == 0; }}}, .clock = clock});
  const auto failure = idem::test::thrown_by<idem::OperationError>([&] { odd(0); });
  ASSERT_TRUE(failure) << "expected OperationError";
  const auto& failed = failure->report().metadata;
  EXPECT_EQ(failed.at("validation_valid"), "false");
  EXPECT_EQ(failed.at("validation_validator_name"), "even");
  EXPECT_EQ(failed.at("validation_reason"), "rejected by even");
  EXPECT_EQ(failed.at("reason"), "rejected by even");
}

// A fallback that ran ends the call, not the breaker: circuit_breaker_open is false once one
// did; fallback_used says a fallback ran and fallback_failed whether every one failed.
TEST(Parity, BreakerAndFallbackMetadata) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .clock = clock});
  auto down = [](int) -> std::string { throw ProviderDown(); };
  auto guarded = idem::resilient(down, {.circuit_breaker = breaker, .clock = clock});
  EXPECT_THROW(guarded(0), idem::OperationError);
  ASSERT_EQ(breaker->state(), idem::CircuitState::open);
  const auto rejected = idem::test::thrown_by<idem::OperationError>([&] { guarded(0); });
  ASSERT_TRUE(rejected) << "expected OperationError";
  EXPECT_EQ(rejected->report().metadata.at("circuit_breaker_open"), "true");
  EXPECT_EQ(rejected->report().metadata.at("fallback_used"), "false");
  EXPECT_EQ(rejected->report().metadata.count("fallback_failed"), 0u) << "no fallback ran";

  auto rescued =
      idem::resilient(down, {.circuit_breaker = breaker,
                             .fallback = {"cache", [](int) { return std::string("cached"); }},
                             .clock = clock});
  const auto result = rescued(0);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::rejected);
  EXPECT_EQ(result.report.metadata.at("circuit_breaker_open"), "false");
  EXPECT_EQ(result.report.metadata.at("fallback_used"), "true");
  EXPECT_EQ(result.report.metadata.at("fallback_failed"), "false");

  auto unrescued = idem::resilient(
      down, {.circuit_breaker = breaker, .fallback = {"cache", down}, .clock = clock});
  const auto failed = idem::test::thrown_by<idem::OperationError>([&] { unrescued(0); });
  ASSERT_TRUE(failed) << "expected OperationError";
  EXPECT_EQ(failed->report().metadata.at("circuit_breaker_open"), "false");
  EXPECT_EQ(failed->report().metadata.at("fallback_used"), "true");
  EXPECT_EQ(failed->report().metadata.at("fallback_failed"), "true");
  EXPECT_TRUE(failed->report().fallback_used);
  EXPECT_FALSE(failed->report().fallback_source.has_value());
}

}  // namespace
