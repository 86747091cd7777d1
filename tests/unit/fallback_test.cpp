#include "idem/fallback.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "../core_names.hpp"
#include "../thrown_by.hpp"
#include "idem/circuit_breaker.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;

struct Quote {
  std::string source;
  int price = 0;
};

TEST(Fallback, NotUsedWhenThePrimarySucceeds) {
  std::atomic<int> fallback_calls{0};
  auto op = idem::resilient(
      [](const std::string& sku) {
        return Quote{"live:" + sku, 10};
      },
      {.fallbacks = {{"cache", [&](const std::string&) {
                        ++fallback_calls;
                        return Quote{"cache", 9};
                      }}}});
  const auto result = op("a1");
  EXPECT_EQ(result.value.source, "live:a1");
  EXPECT_EQ(fallback_calls.load(), 0);
  EXPECT_FALSE(result.report.fallback_used);
  EXPECT_FALSE(result.report.fallback_source.has_value());
}

TEST(Fallback, TriedInOrderAfterRetriesAreExhausted) {
  auto clock = std::make_shared<ManualClock>();
  std::mutex order_mutex;
  std::vector<std::string> order;
  auto note = [&](std::string what) {
    std::lock_guard lock(order_mutex);
    order.push_back(std::move(what));
  };
  auto op = idem::resilient(
      [&](const std::string& sku) -> Quote {
        note("primary");
        throw std::runtime_error("pricing service down for " + sku);
      },
      {.retries = 1,
       .backoff = {.base = 1ms, .jitter = 0.0},
       .fallbacks = {{"cache",
                      [&](const std::string&) -> Quote {
                        note("cache");
                        throw std::runtime_error("cache miss");
                      }},
                     {"default",
                      [&](const std::string& sku) {
                        note("default");
                        return Quote{"default:" + sku, 1};
                      }},
                     {"never",
                      [&](const std::string&) {
                        note("never");
                        return Quote{"never", 0};
                      }}},
       .clock = clock});
  const auto result = op("b2");
  EXPECT_EQ(result.value.source, "default:b2");
  EXPECT_EQ(order, (std::vector<std::string>{"primary", "primary", "cache", "default"}));
  EXPECT_TRUE(result.report.fallback_used);
  EXPECT_EQ(result.report.fallback_source, "fallback:default");
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
  ASSERT_EQ(result.report.attempts.size(), 4u);
  EXPECT_EQ(result.report.attempts[2].source, "fallback:cache");
  EXPECT_EQ(result.report.attempts[2].status, idem::AttemptStatus::failed);
  EXPECT_EQ(result.report.attempts[2].number, 3);
  EXPECT_EQ(result.report.attempts[3].source, "fallback:default");
  EXPECT_EQ(result.report.attempts[3].status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(result.report.attempts[3].number, 4);
}

TEST(Fallback, AllFailingGivesAFallbackChainErrorListingEveryFailure) {
  auto op = idem::resilient(
      [](int) -> int { throw std::runtime_error("primary broke"); },
      {.fallbacks = {[](int) -> int { throw std::logic_error("first fallback broke"); },
                     [](int) -> int { throw 7; }}});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(1); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(error->report().status, idem::OperationStatus::failed);
  EXPECT_TRUE(error->report().fallback_used) << "fallbacks ran";
  EXPECT_FALSE(error->report().fallback_source.has_value()) << "none produced the value";
  ASSERT_EQ(error->report().attempts.size(), 3u);
  try {
    std::rethrow_exception(error->cause());
  } catch (const idem::FallbackChainError& chain) {
    EXPECT_EQ(chain.code(), idem::ErrorCode::fallback_chain_failed);
    const auto& failures = chain.failures();
    ASSERT_EQ(failures.size(), 3u);
    EXPECT_EQ(failures[0].source, "primary");
    EXPECT_EQ(failures[0].error_message, "primary broke");
    EXPECT_EQ(failures[0].error_type, "std::runtime_error");
    EXPECT_EQ(failures[1].source, "fallback:1");
    EXPECT_EQ(failures[1].error_message, "first fallback broke");
    EXPECT_EQ(failures[1].error_type, "std::logic_error");
    EXPECT_EQ(failures[2].source, "fallback:2");
    EXPECT_EQ(failures[2].error_type, "int");
    EXPECT_THROW(std::rethrow_exception(failures[1].error), std::logic_error);
    const std::string what = chain.what();
    EXPECT_NE(what.find("primary: primary broke"), std::string::npos);
    EXPECT_NE(what.find("fallback:1: first fallback broke"), std::string::npos);
    EXPECT_TRUE(chain.retryable()) << "the primary's failure was a transient one";
  }
}

TEST(Fallback, MayTakeTheReasonThePrimaryFailed) {
  auto op = idem::resilient(
      [](int) -> std::string { throw std::runtime_error("gateway 503"); },
      {.retries = 2,
       .backoff = {.base = 0ns},
       .fallback = {"explain", [](const idem::FallbackContext& why, int x) {
                      EXPECT_THROW(std::rethrow_exception(why.error), std::runtime_error);
                      return std::string(why.error_type) + "|" + std::string(why.error_message) +
                             "|" + std::to_string(why.primary_attempts) + "|" + std::to_string(x);
                    }}});
  const auto result = op(5);
  EXPECT_EQ(result.value, "std::runtime_error|gateway 503|3|5");
  EXPECT_EQ(result.report.fallback_source, "fallback:explain");
}

TEST(Fallback, SingleFallbackRunsBeforeTheList) {
  auto op = idem::resilient([]() -> int { throw std::runtime_error("x"); },
                            {.fallback = []() -> int { throw std::runtime_error("single"); },
                             .fallbacks = {{"list", [] { return 2; }}}});
  const auto result = op();
  EXPECT_EQ(result.value, 2);
  ASSERT_EQ(result.report.attempts.size(), 3u);
  EXPECT_EQ(result.report.attempts[1].source, "fallback:1");
  EXPECT_EQ(result.report.attempts[2].source, "fallback:list");
}

TEST(Fallback, ResultsAreValidatedToo) {
  auto op = idem::resilient([]() -> int { throw std::runtime_error("down"); },
                            {.validate = {{"positive", [](const int& v) { return v > 0; }}},
                             .fallbacks = {{"zero", [] { return 0; }}, {"one", [] { return 1; }}}});
  const auto result = op();
  EXPECT_EQ(result.value, 1);
  ASSERT_EQ(result.report.attempts.size(), 3u);
  EXPECT_EQ(result.report.attempts[1].source, "fallback:zero");
  EXPECT_EQ(result.report.attempts[1].error_type, "idem::ValidationError");
  EXPECT_EQ(result.report.fallback_source, "fallback:one");
}

TEST(Fallback, UsedAtOnceForANonRetryableFailure) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&]() -> int {
        ++calls;
        throw idem::InvalidArgument("never works");
      },
      {.retries = 5, .fallback = [] { return -1; }, .clock = clock});
  EXPECT_EQ(op().value, -1);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_TRUE(clock->sleeps().empty());
}

TEST(Fallback, UsedWhenTheBreakerIsOpen) {
  auto clock = std::make_shared<ManualClock>();
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.failure_threshold = 1, .clock = clock});
  breaker->acquire().failed();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        ++calls;
        return 1;
      },
      {.retries = 3,
       .circuit_breaker = breaker,
       .fallback = {"stale", [] { return 0; }},
       .clock = clock});
  const auto result = op();
  EXPECT_EQ(result.value, 0);
  EXPECT_EQ(calls.load(), 0);
  ASSERT_EQ(result.report.attempts.size(), 2u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::rejected);
  EXPECT_EQ(result.report.fallback_source, "fallback:stale");
}

TEST(Fallback, VoidOperations) {
  std::atomic<int> fallback_calls{0};
  auto op = idem::resilient([](int) { throw std::runtime_error("down"); },
                            {.fallback = [&](int) { ++fallback_calls; }});
  const auto result = op(1);
  EXPECT_TRUE(result.report.fallback_used);
  EXPECT_EQ(fallback_calls.load(), 1);
}

TEST(Fallback, EmptyFallbackIsAConfigError) {
  std::function<int(int)> empty;
  EXPECT_THROW(idem::resilient([](int x) { return x; }, {.fallbacks = {{"nothing", empty}}}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient([](int x) { return x; }, {.fallback = {"named only", empty}}),
               idem::ConfigError);
}

}  // namespace
