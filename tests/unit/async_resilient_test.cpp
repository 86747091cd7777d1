// idem::async::resilient: the blocking face's policies as coroutines — retries and backoff on
// timers, a timeout that cancels its attempt, the caller's cancellation, breaker, fallback,
// validation and rate limits, with the blocking face's report and relprim 0.9's events and
// metadata keys (as operation_parity_test.cpp checks them on the blocking face).
#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "../async_names.hpp"
#include "../async_test_support.hpp"
#include "../cancelled_after.hpp"
#include "../relprim_parity.hpp"
#include "../thrown_by.hpp"
#include "../timed_out_call.hpp"
#include "idem/async/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::async_names;

const idem::Backoff kFast{.base = 1ms, .multiplier = 1.0, .cap = 1ms, .jitter = 0.0};

struct Flaky : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct TooManyRequests : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An operation every attempt of which the provider turns away ("429").
const auto always_rate_limited = []() -> Task<int> {
  throw TooManyRequests("429");
  co_return 0;
};

TEST(AsyncResilient, PlainCallReturnsValueAndReport) {
  asio::io_context io;
  auto twice = idem::async::resilient([](int x) -> Task<int> { co_return x * 2; });
  auto result = run(io, twice(21));
  EXPECT_EQ(result.value, 42);
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
  ASSERT_EQ(result.report.attempts.size(), 1u);
}

TEST(AsyncResilient, VoidOperationAndNamedSignature) {
  asio::io_context io;
  int calls = 0;
  auto touch = idem::async::resilient<Task<void>(const std::string&)>(
      [&](const std::string& who) -> Task<void> {
        calls += static_cast<int>(who.size());
        co_return;
      });
  auto result = run(io, touch(std::string("abc")));
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
}

TEST(AsyncResilient, RetriesWithBackoffOnTimers) {
  asio::io_context io;
  int calls = 0;
  auto flaky = idem::async::resilient(
      [&](idem::AttemptContext& context) -> Task<int> {
        ++calls;
        if (context.attempt < 3) throw Flaky("not yet");
        co_return context.attempt;
      },
      {.retries = 3, .backoff = kFast});
  auto result = run(io, flaky());
  EXPECT_EQ(result.value, 3);
  EXPECT_EQ(calls, 3);
  ASSERT_EQ(result.report.attempts.size(), 3u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::failed);
}

TEST(AsyncResilient, ManualClockBackoffAdvancesTheClockWithoutWaiting) {
  asio::io_context io;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  const auto before = clock->steady_now();
  auto flaky = idem::async::resilient(
      [&](idem::AttemptContext& context) -> Task<int> {
        if (context.attempt < 3) throw Flaky("not yet");
        co_return 7;
      },
      {.retries = 2,
       .backoff = {.base = 1h, .multiplier = 1.0, .cap = 1h, .jitter = 0.0},
       .clock = clock});
  EXPECT_EQ(run(io, flaky()).value, 7);
  EXPECT_EQ(clock->steady_now() - before, 2h);
}

TEST(AsyncResilient, FailureThrowsOperationErrorWithReport) {
  asio::io_context io;
  auto failing = idem::async::resilient(
      []() -> Task<int> {
        throw Flaky("down");
        co_return 0;
      },
      {.name = "failing", .retries = 1, .backoff = kFast});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, failing()); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(error->report().status, idem::OperationStatus::failed);
  EXPECT_EQ(error->report().attempts.size(), 2u);
  EXPECT_EQ(error->report().operation, "failing");
}

TEST(AsyncResilient, TimeoutCancelsTheAttemptSoItsLaterEffectNeverHappens) {
  asio::io_context io;
  std::atomic<int> effects{0};
  auto slow =
      idem::async::resilient([&] { return idem::test::slow_effect(effects); }, {.timeout = 20ms});
  idem::test::expect_timed_out_without_effect(
      io, [&] { return slow(); }, effects);
}

TEST(AsyncResilient, TimedOutAttemptsAreRetriedAndAFastOneWins) {
  asio::io_context io;
  int calls = 0;
  auto sometimes_slow = idem::async::resilient(
      [&]() -> Task<int> {
        if (++calls == 1) co_await nap(2s);
        co_return calls;
      },
      {.retries = 1, .backoff = kFast, .timeout = 50ms, .timeout_grace = 20ms});
  auto result = run(io, sometimes_slow());
  EXPECT_EQ(result.value, 2);
  ASSERT_EQ(result.report.attempts.size(), 2u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::timed_out);
  // Within its grace the cancelled attempt ended.
  EXPECT_EQ(result.report.attempts[0].metadata.at("attempt_stopped"), "true");
}

TEST(AsyncResilient, CallerCancellationStopsRetriesAndFallbacks) {
  asio::io_context io;
  int calls = 0;
  int fallbacks = 0;
  auto op = idem::async::resilient(
      [&]() -> Task<int> {
        ++calls;
        co_await nap(5s);
        co_return 1;
      },
      {.retries = 5, .backoff = kFast, .fallback = [&]() -> Task<int> {
         ++fallbacks;
         co_return 2;
       }});
  const auto error = idem::test::operation_error_cancelled_after(io, op(), 20ms);
  ASSERT_TRUE(error) << "expected a cancelled OperationError";
  EXPECT_EQ(error->report().status, idem::OperationStatus::cancelled);
  ASSERT_EQ(error->report().attempts.size(), 1u);
  EXPECT_EQ(error->report().attempts[0].status, idem::AttemptStatus::cancelled);
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(fallbacks, 0);
}

TEST(AsyncResilient, CallerCancellationDuringBackoff) {
  asio::io_context io;
  int calls = 0;
  auto op = idem::async::resilient(
      [&]() -> Task<int> {
        ++calls;
        throw Flaky("again");
        co_return 0;
      },
      {.retries = 5, .backoff = {.base = 10s, .multiplier = 1.0, .cap = 10s, .jitter = 0.0}});
  const auto error = idem::test::operation_error_cancelled_after(io, op(), 20ms);
  ASSERT_TRUE(error) << "expected a cancelled OperationError";
  EXPECT_EQ(error->report().status, idem::OperationStatus::cancelled);
  EXPECT_EQ(calls, 1);
}

TEST(AsyncResilient, CircuitBreakerRejectsOnceOpen) {
  asio::io_context io;
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.name = "dep", .failure_threshold = 2});
  int calls = 0;
  auto op = idem::async::resilient(
      [&]() -> Task<int> {
        ++calls;
        throw Flaky("down");
        co_return 0;
      },
      {.retries = 4, .backoff = kFast, .circuit_breaker = breaker});
  EXPECT_THROW(run(io, op()), idem::OperationError);
  EXPECT_EQ(calls, 2);  // the third attempt was rejected by the open breaker
  EXPECT_EQ(breaker->state(), idem::CircuitState::open);
}

TEST(AsyncResilient, FallbackAfterThePrimaryGivesUp) {
  asio::io_context io;
  auto op = idem::async::resilient(
      [](int x) -> Task<int> {
        throw Flaky("down");
        co_return x;
      },
      {.fallback = {"cache", [](const idem::FallbackContext& why, int x) -> Task<int> {
                      EXPECT_EQ(why.primary_attempts, 1);
                      co_return x + 100;
                    }}});
  auto result = run(io, op(1));
  EXPECT_EQ(result.value, 101);
  EXPECT_TRUE(result.report.fallback_used);
  EXPECT_EQ(result.report.fallback_source, "fallback:cache");
}

TEST(AsyncResilient, ValidationRejectsAndRetries) {
  asio::io_context io;
  int calls = 0;
  auto op =
      idem::async::resilient([&]() -> Task<int> { co_return ++calls; },
                             {.retries = 3,
                              .backoff = kFast,
                              .validate = {{"at_least_3", [](const int& v) { return v >= 3; }}}});
  auto result = run(io, op());
  EXPECT_EQ(result.value, 3);
  EXPECT_EQ(result.report.metadata.at("valid"), "true");
}

TEST(AsyncResilient, RateLimitWaitsTheProviderDelayOrGivesUp) {
  asio::io_context io;
  int calls = 0;
  auto op = idem::async::resilient(
      [&]() -> Task<int> {
        if (++calls == 1) throw TooManyRequests("429");
        co_return calls;
      },
      {.retries = 2,
       .rate_limit_on = idem::failures_of<TooManyRequests>(),
       .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
         return 5ms;
       }});
  auto result = run(io, op());
  EXPECT_EQ(result.value, 2);
  EXPECT_EQ(result.report.metadata.at("rate_limit_encountered"), "true");

  auto patient = idem::async::resilient(
      always_rate_limited,
      {.retries = 2,
       .rate_limit_on = idem::failures_of<TooManyRequests>(),
       .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
         return 1h;
       },
       .max_rate_limit_wait = 1s});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, patient()); });
  ASSERT_TRUE(error) << "expected RateLimitWaitExceeded";
  EXPECT_EQ(error->report().metadata.at("rate_limit_wait_exceeded"), "true");
  EXPECT_EQ(error->report().attempts.size(), 1u);
}

TEST(AsyncResilient, EventsAreTheBlockingFacesEvents) {
  asio::io_context io;
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::async::resilient(
      [](idem::AttemptContext& context) -> Task<int> {
        if (context.attempt == 1) throw Flaky("once");
        co_return 1;
      },
      {.name = "evented", .retries = 1, .backoff = kFast, .events = {sink}});
  run(io, op());
  const auto events = sink->events();
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events.back().type, idem::EventType::operation_succeeded);
}

TEST(AsyncResilient, RejectsContradictoryOptions) {
  EXPECT_THROW(idem::async::resilient([]() -> Task<int> { co_return 1; }, {.retries = -1}),
               idem::ConfigError);
  EXPECT_THROW(idem::async::resilient([]() -> Task<int> { co_return 1; },
                                      {.idempotency_ttl = idem::Millis(5)}),
               idem::ConfigError);
}

// ---- relprim 0.9: the order of rate-limit events, and the report's keys ------------------------

std::shared_ptr<idem::testing::ManualClock> manual_clock() {
  return std::make_shared<idem::testing::ManualClock>();
}

// A rate limit whose provider asks for `delay`.
auto asks_for(std::chrono::nanoseconds delay) {
  return
      [delay](const std::exception&) -> std::optional<std::chrono::nanoseconds> { return delay; };
}

TEST(AsyncResilient, RateLimitEventsComeBeforeTheFailedAttempt) {
  asio::io_context io;
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::async::resilient(
      [](idem::AttemptContext& context) -> Task<int> {
        // The first wait is accepted, the second (2 min) is longer than the 60 s allowed.
        if (context.attempt == 1) throw TooManyRequests("429, retry in 1 s");
        throw std::logic_error("429, retry in 2 min");
        co_return 0;
      },
      {.retries = 3,
       .rate_limit_on = idem::failures_of<TooManyRequests, std::logic_error>(),
       .retry_after = [](const std::exception& e) -> std::optional<std::chrono::nanoseconds> {
         if (dynamic_cast<const TooManyRequests*>(&e) != nullptr) return 1s;
         return 120s;
       },
       .events = {sink},
       .clock = manual_clock()});
  EXPECT_THROW(run(io, op()), idem::OperationError);
  EXPECT_EQ(idem::test::type_names(*sink), idem::test::kRateLimitedTwiceEvents);
}

TEST(AsyncResilient, EveryAttemptAndEveryReportCarriesTheRateLimitKeys) {
  asio::io_context io;
  auto plain = idem::async::resilient(
      [](idem::AttemptContext& context) -> Task<int> {
        if (context.attempt == 1) throw Flaky("once");
        co_return 1;
      },
      {.retries = 1, .clock = manual_clock()});
  const auto result = run(io, plain());
  ASSERT_EQ(result.report.attempts.size(), 2u);
  for (const auto& attempt : result.report.attempts)
    idem::test::expect_not_rate_limited(attempt);
  idem::test::expect_no_rate_limit_in(result.report);

  // The report's rate_limited and provider delay are the last attempt's; a wait too long leaves
  // that attempt's delay empty.
  auto patient = idem::async::resilient(always_rate_limited,
                                        {.retries = 2,
                                         .rate_limit_on = idem::failures_of<TooManyRequests>(),
                                         .retry_after = asks_for(120s),
                                         .clock = manual_clock()});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, patient()); });
  ASSERT_TRUE(error) << "expected OperationError";
  ASSERT_EQ(error->report().attempts.size(), 1u);
  const auto& attempt = error->report().attempts[0].metadata;
  EXPECT_EQ(attempt.at("rate_limited"), "true");
  EXPECT_EQ(attempt.at("rate_limit_wait_exceeded"), "true");
  EXPECT_EQ(attempt.count("rate_limit_delay_seconds"), 0u) << "no delay was taken";
  EXPECT_EQ(error->report().metadata.at("rate_limited"), "true");
  EXPECT_EQ(error->report().metadata.at("rate_limit_retry_after_seconds"), "120");
  EXPECT_EQ(error->report().metadata.at("rate_limit_wait_exceeded"), "true");
}

TEST(AsyncResilient, AFailingExtractorsErrorIsTheAttemptsFailure) {
  asio::io_context io;
  auto sink = std::make_shared<idem::InMemoryEventSink>();
  auto op = idem::async::resilient(
      always_rate_limited,
      {.retries = 3,
       .rate_limit_on = idem::failures_of<TooManyRequests>(),
       .retry_after = [](const std::exception&) -> std::optional<std::chrono::nanoseconds> {
         throw std::runtime_error("broken extractor");
       },
       .events = {sink},
       .clock = manual_clock()});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, op()); });
  ASSERT_TRUE(error) << "expected OperationError";
  ASSERT_EQ(error->report().attempts.size(), 1u);
  EXPECT_EQ(error->report().attempts[0].error_type, "idem::RetryAfterExtractionError");
  EXPECT_FALSE(error->report().attempts[0].retryable);
  EXPECT_EQ(error->report().attempts[0].metadata.at("rate_limited"), "false");
  EXPECT_THROW(std::rethrow_exception(error->cause()), idem::RetryAfterExtractionError);
  for (const auto& event : sink->events()) {
    EXPECT_NE(event.type, idem::EventType::rate_limit_detected);
    if (event.type == idem::EventType::attempt_failed) {
      EXPECT_EQ(event.fields.at("error_type"), "idem::RetryAfterExtractionError");
    }
  }
}

TEST(AsyncResilient, FallbackOnStopsTheChainAtACandidateItDoesNotAccept) {
  asio::io_context io;
  int third = 0;
  auto op = idem::async::resilient(
      []() -> Task<int> {
        throw Flaky("down");
        co_return 0;
      },
      {.fallbacks = {{"first",
                      []() -> Task<int> {
                        throw Flaky("also down");
                        co_return 0;
                      }},
                     {"second",
                      []() -> Task<int> {
                        throw std::invalid_argument("bad request");
                        co_return 0;
                      }},
                     {"third",
                      [&third]() -> Task<int> {
                        ++third;
                        co_return 3;
                      }}},
       .fallback_on = idem::failures_of<Flaky>()});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, op()); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_THROW(std::rethrow_exception(error->cause()), std::invalid_argument);
  ASSERT_EQ(error->report().attempts.size(), 3u);
  EXPECT_EQ(error->report().attempts[2].source, "fallback:second");
  EXPECT_EQ(error->report().metadata.at("fallback_failed"), "true");
  EXPECT_EQ(third, 0);
}

TEST(AsyncResilient, ValidationMetadataUsesRelprimsKeys) {
  asio::io_context io;
  int calls = 0;
  auto op = idem::async::resilient([&]() -> Task<int> { co_return ++calls; },
                                   {.retries = 1,
                                    .validate = {{"even", [](const int& v) { return v % 2 == 0; }}},
                                    .clock = manual_clock()});
  const auto result = run(io, op());
  EXPECT_EQ(result.report.metadata.at("validation_valid"), "true");
  EXPECT_EQ(result.report.metadata.at("validation_validator_name"), "even");
  EXPECT_EQ(result.report.metadata.at("valid"), "true");
  const auto& rejected = result.report.attempts[0].metadata;
  EXPECT_EQ(rejected.at("validation_valid"), "false");
  EXPECT_EQ(rejected.at("validation_validator_name"), "even");
  EXPECT_EQ(rejected.at("validation_reason"), "rejected by even");

  auto odd =
      idem::async::resilient([]() -> Task<int> { co_return 1; },
                             {.validate = {{"even", [](const int& v) { return v % 2 == 0; }}}});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, odd()); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(error->report().metadata.at("validation_valid"), "false");
  EXPECT_EQ(error->report().metadata.at("validation_validator_name"), "even");
  EXPECT_EQ(error->report().metadata.at("validation_reason"), "rejected by even");
}

TEST(AsyncResilient, BreakerAndFallbackMetadata) {
  asio::io_context io;
  auto clock = manual_clock();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .clock = clock});
  auto down = []() -> Task<int> {
    throw Flaky("down");
    co_return 0;
  };
  auto guarded = idem::async::resilient(down, {.circuit_breaker = breaker, .clock = clock});
  EXPECT_THROW(run(io, guarded()), idem::OperationError);
  ASSERT_EQ(breaker->state(), idem::CircuitState::open);
  const auto rejected = idem::test::thrown_by<idem::OperationError>([&] { run(io, guarded()); });
  ASSERT_TRUE(rejected) << "expected OperationError";
  EXPECT_EQ(rejected->report().metadata.at("circuit_breaker_open"), "true");
  EXPECT_EQ(rejected->report().metadata.count("fallback_failed"), 0u);

  auto rescued =
      idem::async::resilient(down, {.circuit_breaker = breaker,
                                    .fallback = {"cache", []() -> Task<int> { co_return 2; }},
                                    .clock = clock});
  const auto result = run(io, rescued());
  EXPECT_EQ(result.value, 2);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::rejected);
  EXPECT_EQ(result.report.metadata.at("circuit_breaker_open"), "false");
  EXPECT_EQ(result.report.metadata.at("fallback_used"), "true");
  EXPECT_EQ(result.report.metadata.at("fallback_failed"), "false");

  auto unrescued = idem::async::resilient(
      down, {.circuit_breaker = breaker, .fallback = {"cache", down}, .clock = clock});
  const auto failed = idem::test::thrown_by<idem::OperationError>([&] { run(io, unrescued()); });
  ASSERT_TRUE(failed) << "expected OperationError";
  EXPECT_EQ(failed->report().metadata.at("circuit_breaker_open"), "false");
  EXPECT_EQ(failed->report().metadata.at("fallback_used"), "true");
  EXPECT_EQ(failed->report().metadata.at("fallback_failed"), "true");
  EXPECT_TRUE(failed->report().fallback_used);
}

}  // namespace
