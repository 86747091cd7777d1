#include "idem/resilient.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <barrier>
#include <exception>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../core_names.hpp"
#include "../thrown_by.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::core_names;

struct Payment {
  std::string id;
  int amount = 0;
};

Payment charge(const std::string& request_id, int amount) {
  return Payment{request_id, amount};
}

TEST(Resilient, PlainCallReturnsValueAndReport) {
  auto op = idem::resilient([](const std::string& id, int amount) { return Payment{id, amount}; });
  const auto result = op("request-1", 2499);
  EXPECT_EQ(result.value.id, "request-1");
  EXPECT_EQ(result.value.amount, 2499);
  EXPECT_EQ(result.report.operation, "operation");
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
  ASSERT_EQ(result.report.attempts.size(), 1u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(result.report.attempts[0].source, "primary");
  EXPECT_FALSE(result.report.fallback_used);
}

TEST(Resilient, WrapsFunctionsAndFunctionPointers) {
  auto from_function = idem::resilient(charge, {.name = "charge"});
  auto from_pointer = idem::resilient(&charge);
  EXPECT_EQ(from_function("a", 1).value.id, "a");
  EXPECT_EQ(from_function("a", 1).report.operation, "charge");
  EXPECT_EQ(from_pointer("b", 2).value.amount, 2);
  static_assert(
      std::is_same_v<decltype(from_function), idem::Resilient<Payment(const std::string&, int)>>);
}

TEST(Resilient, GenericLambdaWithANamedSignature) {
  auto op = idem::resilient<std::string(int, int)>(
      [](auto a, auto b) { return std::to_string(a + b); }, {.name = "sum"});
  EXPECT_EQ(op(2, 3).value, "5");
}

struct Functor {
  int operator()(int x) const { return x * 3; }
};

TEST(Resilient, FunctionObjects) {
  auto op = idem::resilient(Functor{});
  EXPECT_EQ(op(4).value, 12);
}

TEST(Resilient, VoidOperationHasOnlyAReport) {
  std::atomic<int> calls{0};
  auto op = idem::resilient([&](int) { ++calls; });
  const idem::OperationResult<void> result = op(1);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
}

TEST(Resilient, AttemptContextIsDetectedAndNotPartOfTheSignature) {
  auto op = idem::resilient([](idem::AttemptContext& context, const std::string& s) {
    return s + ":" + std::to_string(context.attempt) + ":" + std::string(context.source);
  });
  static_assert(std::is_same_v<decltype(op), idem::Resilient<std::string(const std::string&)>>);
  EXPECT_EQ(op("x").value, "x:1:primary");
  auto with_const =
      idem::resilient([](const idem::AttemptContext& context) { return context.attempt; });
  EXPECT_EQ(with_const().value, 1);
}

TEST(Resilient, ByValueArgumentsAreFreshForEveryAttempt) {
  auto clock = std::make_shared<ManualClock>();
  auto op = idem::resilient(
      [](idem::AttemptContext& context, std::string text) {
        text += "!";  // mutates its own copy
        if (context.attempt < 3) throw std::runtime_error(text);
        return text;
      },
      {.retries = 2, .backoff = {.base = 0ns}, .clock = clock});
  EXPECT_EQ(op("hi").value, "hi!");
}

TEST(Resilient, ReferenceResultsAreCopiedOut) {
  static const std::string stored = "kept";
  auto op = idem::resilient([]() -> const std::string& { return stored; });
  const auto result = op();
  static_assert(std::is_same_v<decltype(op)::value_type, std::string>);
  EXPECT_EQ(result.value, "kept");
}

TEST(Resilient, MoveOnlyResults) {
  auto op = idem::resilient([](int x) { return std::make_unique<int>(x); });
  auto result = op(9);
  ASSERT_TRUE(result.value);
  EXPECT_EQ(*result.value, 9);
}

TEST(Resilient, FailureThrowsOperationErrorWithReportAndNestedCause) {
  auto op = idem::resilient([](int) -> int { throw std::out_of_range("no such account"); },
                            {.name = "lookup"});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(1); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(error->code(), idem::ErrorCode::operation_failed);
  EXPECT_EQ(error->report().operation, "lookup");
  EXPECT_EQ(error->report().status, idem::OperationStatus::failed);
  ASSERT_EQ(error->report().attempts.size(), 1u);
  EXPECT_EQ(error->report().attempts[0].error_type, "std::out_of_range");
  const std::string what = error->what();
  EXPECT_NE(what.find("operation 'lookup' failed after 1 attempt(s)"), std::string::npos);
  EXPECT_NE(what.find("no such account"), std::string::npos);
  EXPECT_THROW(std::rethrow_exception(error->cause()), std::out_of_range);
  EXPECT_THROW(std::rethrow_if_nested(*error), std::out_of_range);
}

TEST(Resilient, ValidationFailureIsFinalWhenRetriesOfInvalidResultsAreOff) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        ++calls;
        return Payment{"", 5};
      },
      {
          .retries = 3,
          .clock = clock,
      });
  EXPECT_NO_THROW(op());
  calls = 0;
  auto validated = idem::resilient(
      [&] {
        ++calls;
        return Payment{"", 5};
      },
      {.retries = 3,
       .retry_invalid_results = false,
       .validate = {{"has_id",
                     [](const Payment& r) -> std::optional<std::string> {
                       if (r.id.empty()) return "receipt without id";
                       return std::nullopt;
                     }}},
       .clock = clock});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { validated(); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(calls.load(), 1);
  try {
    std::rethrow_exception(error->cause());
  } catch (const idem::ValidationError& invalid) {
    EXPECT_EQ(invalid.validator(), "has_id");
    EXPECT_EQ(invalid.reason(), "receipt without id");
    EXPECT_FALSE(invalid.retryable());
  }
  EXPECT_EQ(error->report().attempts[0].error_type, "idem::ValidationError");
}

TEST(Resilient, ValidationFailureRetriedByDefault) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient([&] { return ++calls; },
                            {.retries = 5,
                             .backoff = {.base = 1ms, .jitter = 0.0},
                             .validate = {{"at_least_3", [](const int& v) { return v >= 3; }}},
                             .clock = clock});
  const auto result = op();
  EXPECT_EQ(result.value, 3);
  EXPECT_EQ(result.report.attempts.size(), 3u);
  EXPECT_TRUE(result.report.attempts[0].retryable);
}

TEST(Resilient, ManyThreadsCallOneCallable) {
  auto clock = std::make_shared<ManualClock>();
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](idem::AttemptContext& context, int x) {
        ++calls;
        if (context.attempt == 1 && x % 3 == 0) throw std::runtime_error("first try fails");
        return x * 2;
      },
      {.retries = 2, .backoff = {.base = 1ms, .jitter = 0.5}, .clock = clock});
  constexpr int kThreads = 16;
  constexpr int kCalls = 200;
  std::barrier start(kThreads);
  std::atomic<int> wrong{0};
  std::atomic<int> retried{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t, copy = op] {  // copies share one configuration
      start.arrive_and_wait();
      for (int i = 0; i < kCalls; ++i) {
        const int x = t * kCalls + i;
        try {
          const auto result = (i % 2 == 0 ? op : copy)(x);
          if (result.value != 2 * x || result.report.status != idem::OperationStatus::succeeded ||
              result.report.attempts.size() != (x % 3 == 0 ? 2u : 1u)) {
            ++wrong;
          }
          if (result.report.attempts.size() == 2) ++retried;
        } catch (...) {
          ++wrong;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0);
  const int expected_retries = (kThreads * kCalls + 2) / 3;  // x = 0, 3, 6, ... < 3200
  EXPECT_EQ(retried.load(), expected_retries);
  EXPECT_EQ(calls.load(), kThreads * kCalls + expected_retries);
  EXPECT_EQ(clock->sleeps().size(), static_cast<std::size_t>(expected_retries));
}

TEST(Resilient, RejectsContradictoryOptions) {
  auto fn = [](const std::string& id, int) { return id; };
  auto key = [](const std::string& id, int) { return "k:" + id; };
  EXPECT_THROW(idem::resilient(fn, {.retries = -1}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.name = ""}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.name = "  "}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.backoff = {.jitter = 1.5}}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.backoff = {.base = 2s, .cap = 1s}}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.backoff = {.multiplier = 0.9}}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.timeout = 0s}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.validate = {{"", [](const std::string&) { return true; }}}}),
               idem::ConfigError);
  std::function<bool(const std::string&)> empty_check;
  EXPECT_THROW(idem::resilient(fn, {.validate = {{"v", empty_check}}}), idem::ConfigError);
  // Idempotency settings need a key.
  EXPECT_THROW(idem::resilient(fn, {.idempotency_ttl = 1h}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_in_progress = idem::InProgressPolicy::reject}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_max_wait = 1s}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_lease = 1s}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_fingerprint = true}), idem::ConfigError);
  try {
    idem::resilient(fn, {.name = "pay", .idempotency_ttl = 1h});
    FAIL();
  } catch (const idem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("operation 'pay'"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("without an idempotency key"), std::string::npos);
  }
  // Bad idempotency values with a key.
  EXPECT_THROW(idem::resilient(fn, {.idempotency_key = key, .idempotency_ttl = 0ms}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_key = key, .idempotency_max_wait = -1ms}),
               idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.idempotency_key = key, .idempotency_lease = 0ms}),
               idem::ConfigError);
}

struct NoEncoding {
  int value = 0;
};

TEST(Resilient, FingerprintOfArgumentsWithoutAnEncodingIsAConfigError) {
  auto fn = [](const NoEncoding& o) { return o.value; };
  auto key = [](const NoEncoding& o) { return std::to_string(o.value); };
  EXPECT_THROW(idem::resilient(fn, {.idempotency_key = key, .idempotency_fingerprint = true}),
               idem::ConfigError);
  // A fingerprint function of one's own works for any argument type.
  EXPECT_NO_THROW(idem::resilient(
      fn, {.idempotency_key = key, .idempotency_fingerprint = [](const NoEncoding& o) {
             return std::to_string(o.value);
           }}));
}

TEST(Resilient, IdempotencyNeedsACopyableResult) {
  auto fn = [](int x) { return std::make_unique<int>(x); };
  EXPECT_THROW(idem::resilient(fn, {.idempotency_key = [](int x) { return std::to_string(x); }}),
               idem::ConfigError);
}

TEST(Resilient, KeyFunctionExceptionsReachTheCaller) {
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&](int x) {
        ++calls;
        return x;
      },
      {.idempotency_key = [](int) -> std::string { throw std::domain_error("no key for that"); }});
  EXPECT_THROW(op(1), std::domain_error);
  EXPECT_EQ(calls.load(), 0);
}

}  // namespace
