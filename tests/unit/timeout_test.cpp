#include "idem/timeout.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <latch>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../thrown_by.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"

// Timeouts are real-time deadlines. These tests use short deadlines with operations held by
// latches, and assert only outcomes, never how long anything took.

namespace {

using namespace std::chrono_literals;
using idem::AttemptContext;
using idem::testing::ManualClock;

// Waits (without a timing assertion) until `flag` is set; a latch would do as well, but the
// abandoned attempt signals after the caller has moved on.
void wait_for(std::atomic<bool>& flag) {
  while (!flag.load())
    flag.wait(false);
}

TEST(Timeout, CooperativeOperationSeesTheStopRequest) {
  std::atomic<bool> stopped{false};
  std::latch entered(1);
  auto op = idem::resilient(
      [&](AttemptContext& context, int) -> int {
        EXPECT_TRUE(context.stop.stop_possible());
        EXPECT_TRUE(context.deadline.has_value());
        entered.count_down();
        std::mutex m;
        std::condition_variable_any cv;
        std::unique_lock lock(m);
        cv.wait(lock, context.stop, [] { return false; });  // until the deadline's stop request
        stopped = true;
        stopped.notify_all();
        throw idem::Cancelled("stopped at the deadline");
      },
      {.timeout = 20ms});
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { op(1); });
  ASSERT_TRUE(error) << "expected OperationError";
  ASSERT_EQ(error->report().attempts.size(), 1u);
  EXPECT_EQ(error->report().attempts[0].status, idem::AttemptStatus::timed_out);
  EXPECT_EQ(error->report().attempts[0].error_type, "idem::TimeoutError");
  EXPECT_THROW(std::rethrow_exception(error->cause()), idem::TimeoutError);
  EXPECT_TRUE(error->retryable());
  entered.wait();
  wait_for(stopped);
}

TEST(Timeout, NonCooperativeAttemptIsAbandonedAndFinishesLater) {
  auto release = std::make_shared<std::latch>(1);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  auto argument_seen = std::make_shared<std::string>();
  {
    auto op = idem::resilient(
        [release, finished, argument_seen](const std::string& text) {
          release->wait();        // ignores the stop token entirely
          *argument_seen = text;  // the argument copy must still be alive
          finished->store(true);
          finished->notify_all();
          return text.size();
        },
        {.timeout = 20ms});
    std::string caller_owned = "a string that dies with the caller's scope";
    EXPECT_THROW(op(caller_owned), idem::OperationError);
    caller_owned.assign(caller_owned.size(), 'x');  // the caller moves on and reuses its memory
  }  // the callable is gone too; the attempt shares ownership of what it needs
  EXPECT_FALSE(finished->load());
  release->count_down();
  wait_for(*finished);
  EXPECT_EQ(*argument_seen, "a string that dies with the caller's scope");
}

TEST(Timeout, FastAttemptReturnsItsValue) {
  auto op = idem::resilient(
      [](AttemptContext& context, int x) {
        EXPECT_EQ(context.attempt, 1);
        EXPECT_FALSE(context.stop_requested());
        return x + 1;
      },
      {.timeout = 10s});
  EXPECT_EQ(op(41).value, 42);
}

TEST(Timeout, ExceptionsOfTheAttemptReachTheCaller) {
  auto op =
      idem::resilient([](int) -> int { throw std::invalid_argument("bad"); }, {.timeout = 10s});
  try {
    op(1);
    FAIL();
  } catch (const idem::OperationError& e) {
    EXPECT_EQ(e.report().attempts[0].status, idem::AttemptStatus::failed);
    EXPECT_THROW(std::rethrow_exception(e.cause()), std::invalid_argument);
  }
}

TEST(Timeout, VoidOperation) {
  std::atomic<int> calls{0};
  auto op = idem::resilient([&] { ++calls; }, {.timeout = 10s});
  op();
  EXPECT_EQ(calls.load(), 1);
}

TEST(Timeout, RetriesAfterATimeoutWithAFreshAttempt) {
  auto clock = std::make_shared<ManualClock>();
  auto release = std::make_shared<std::latch>(1);
  auto first_done = std::make_shared<std::atomic<bool>>(false);
  auto op = idem::resilient(
      [release, first_done](AttemptContext& context) {
        if (context.attempt == 1) {
          release->wait();
          first_done->store(true);
          first_done->notify_all();
          return std::string("late");
        }
        return std::string("attempt ") + std::to_string(context.attempt);
      },
      // Later attempts return at once; a generous deadline and spare retries keep a slow
      // (sanitised, loaded) machine from timing them out too.
      {.retries = 5, .backoff = {.base = 5ms, .jitter = 0.0}, .timeout = 200ms, .clock = clock});
  const auto result = op();
  const auto& attempts = result.report.attempts;
  ASSERT_GE(attempts.size(), 2u);
  EXPECT_EQ(result.value, "attempt " + std::to_string(attempts.size()));
  EXPECT_EQ(attempts[0].status, idem::AttemptStatus::timed_out);
  EXPECT_TRUE(attempts[0].retryable);
  for (std::size_t i = 1; i + 1 < attempts.size(); ++i) {
    EXPECT_EQ(attempts[i].status, idem::AttemptStatus::timed_out);
  }
  EXPECT_EQ(attempts.back().status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(clock->sleeps().size(), attempts.size() - 1);
  EXPECT_EQ(clock->sleeps().front(), 5ms);
  release->count_down();
  wait_for(*first_done);
}

TEST(Timeout, WithoutTimeoutTheStopTokenIsNeverRequested) {
  auto op = idem::resilient([](const AttemptContext& context) {
    return context.stop.stop_possible() || context.deadline.has_value();
  });
  EXPECT_FALSE(op().value);
}

TEST(Timeout, ManyConcurrentCallsWithTimeouts) {
  auto op = idem::resilient([](int x) { return x * x; }, {.timeout = 10s});
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        if (op(t * 100 + i).value != (t * 100 + i) * (t * 100 + i)) ++wrong;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(Timeout, RejectsNonPositiveDeadlines) {
  auto fn = [](int x) { return x; };
  EXPECT_THROW(idem::resilient(fn, {.timeout = 0ms}), idem::ConfigError);
  EXPECT_THROW(idem::resilient(fn, {.timeout = -5ms}), idem::ConfigError);
}

struct MoveOnly {
  MoveOnly() = default;
  MoveOnly(MoveOnly&&) = default;
  MoveOnly(const MoveOnly&) = delete;
  int value = 7;
};

TEST(Timeout, RejectsArgumentsAnAbandonedAttemptCouldNotOwn) {
  // A non-const reference could dangle once the caller gave up on the attempt.
  auto by_reference = [](int& counter) { return ++counter; };
  EXPECT_THROW(idem::resilient(by_reference, {.timeout = 1s}), idem::ConfigError);
  int counter = 0;
  EXPECT_EQ(idem::resilient(by_reference)(counter).value, 1);  // fine without a timeout
  EXPECT_EQ(counter, 1);
  // A parameter that cannot be copied cannot be handed to the attempt's thread.
  auto move_only = [](const MoveOnly& m) { return m.value; };
  EXPECT_THROW(idem::resilient(move_only, {.timeout = 1s}), idem::ConfigError);
  EXPECT_EQ(idem::resilient(move_only)(MoveOnly{}).value, 7);
}

TEST(Timeout, RunWithTimeoutDirectly) {
  AttemptContext context;
  context.attempt = 3;
  const int value = idem::detail::run_with_timeout<int>(
      [](AttemptContext& c) { return c.attempt * 10; }, 10s, 0s, context, nullptr, "direct");
  EXPECT_EQ(value, 30);
  try {
    auto gate = std::make_shared<std::latch>(1);
    auto done = std::make_shared<std::atomic<bool>>(false);
    struct Release {
      std::shared_ptr<std::latch> gate;
      std::shared_ptr<std::atomic<bool>> done;
      ~Release() {
        gate->count_down();
        while (!done->load())
          done->wait(false);
      }
    } release{gate, done};
    idem::detail::run_with_timeout<void>(
        [gate, done](AttemptContext&) {
          gate->wait();
          done->store(true);
          done->notify_all();
        },
        1ms, 0s, context, nullptr, "direct");
    FAIL() << "expected TimeoutError";
  } catch (const idem::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("attempt 3 of 'direct'"), std::string::npos);
    EXPECT_EQ(e.timeout(), std::optional<std::chrono::nanoseconds>(1ms));
    // Release's destructor opened the gate and waited for the work's last statement before this
    // handler ran; the attempt counts as stopped once the work has returned, a moment later on
    // the attempt's thread, so wait (bounded) for that.
    const auto until = std::chrono::steady_clock::now() + 10s;
    while (e.attempt_stopped() != std::optional<bool>(true) &&
           std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(1ms);
    EXPECT_EQ(e.attempt_stopped(), std::optional<bool>(true));
  }
}

}  // namespace
