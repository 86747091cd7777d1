// idem::async::operation: the builder face of idem::async::resilient — immutable values whose
// with_*() replace one policy and check it at once, run() as the coroutine engine's call, and
// run_with()/call_with() honouring a waiting caller's stop token and wait deadline.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <thread>

#include "../async_names.hpp"
#include "../async_test_support.hpp"
#include "../thrown_by.hpp"
#include "../timed_out_call.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/operation.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::async_names;

const idem::Backoff kFast{.base = 1ms, .multiplier = 1.0, .cap = 1ms, .jitter = 0.0};

struct Flaky : std::runtime_error {
  using std::runtime_error::runtime_error;
};

TEST(AsyncOperation, WithLeavesTheBaseUnchanged) {
  asio::io_context io;
  int calls = 0;
  const auto base = idem::async::operation("flaky", [&](int x) -> Task<int> {
    if (++calls % 3 != 0) throw Flaky("not yet");
    co_return x;
  });
  const auto patient = base.with_retries(2).with_retry({.max_attempts = 3, .backoff = kFast});
  EXPECT_EQ(base.name(), "flaky");
  EXPECT_EQ(patient.name(), "flaky");
  // The base still makes one attempt.
  const auto error = idem::test::thrown_by<idem::OperationError>([&] { run(io, base.run(7)); });
  ASSERT_TRUE(error) << "expected OperationError";
  EXPECT_EQ(error->report().attempts.size(), 1u);
  calls = 0;
  auto result = run(io, patient.run(7));
  EXPECT_EQ(result.value, 7);
  EXPECT_EQ(result.report.attempts.size(), 3u);
  // A with_*() replaces its policy: with_retries(0) on the patient one gives one attempt again.
  calls = 0;
  EXPECT_THROW(run(io, patient.with_retries(0).run(7)), idem::OperationError);
  EXPECT_EQ(calls, 1);
}

TEST(AsyncOperation, NamedSignatureAndVoid) {
  asio::io_context io;
  int total = 0;
  auto touch = idem::async::operation<Task<void>(const std::string&)>(
      "touch", [&](const auto& who) -> Task<void> {
        total += static_cast<int>(who.size());
        co_return;
      });
  auto result = run(io, touch.with_retries(1).run(std::string("abc")));
  EXPECT_EQ(total, 3);
  EXPECT_EQ(result.report.status, idem::OperationStatus::succeeded);
}

TEST(AsyncOperation, RetriesWithBackoff) {
  asio::io_context io;
  auto flaky = idem::async::operation("flaky", [](idem::AttemptContext& context) -> Task<int> {
                 if (context.attempt < 3) throw Flaky("not yet");
                 co_return context.attempt;
               }).with_retry({.max_attempts = 4, .backoff = kFast});
  auto result = run(io, flaky.run());
  EXPECT_EQ(result.value, 3);
  ASSERT_EQ(result.report.attempts.size(), 3u);
  EXPECT_EQ(result.report.attempts[0].status, idem::AttemptStatus::failed);
  EXPECT_EQ(result.report.attempts[2].status, idem::AttemptStatus::succeeded);
}

TEST(AsyncOperation, TimeoutCancelsTheAttemptSoItsLaterEffectNeverHappens) {
  asio::io_context io;
  std::atomic<int> effects{0};
  auto slow = idem::async::operation("slow", [&] {
                return idem::test::slow_effect(effects);
              }).with_timeout(20ms);
  idem::test::expect_timed_out_without_effect(
      io, [&] { return slow.run(); }, effects);
}

TEST(AsyncOperation, ValidationRejectsAndRetries) {
  asio::io_context io;
  int calls = 0;
  auto op = idem::async::operation("count", [&]() -> Task<int> { co_return ++calls; })
                .with_retries(3)
                .with_retry({.max_attempts = 4, .backoff = kFast})
                .with_validation({{"at_least_3", [](const int& v) { return v >= 3; }}});
  auto result = run(io, op.run());
  EXPECT_EQ(result.value, 3);
  EXPECT_EQ(result.report.metadata.at("valid"), "true");
}

TEST(AsyncOperation, FallbacksAfterThePrimaryGivesUp) {
  asio::io_context io;
  auto op =
      idem::async::operation("lookup",
                             [](int x) -> Task<int> {
                               throw Flaky("down");
                               co_return x;
                             })
          .with_fallbacks({{"broken",
                            [](const idem::FallbackContext&, int) -> Task<int> {
                              throw Flaky("also down");
                              co_return 0;
                            }},
                           {"cache", [](const idem::FallbackContext& why, int x) -> Task<int> {
                              EXPECT_EQ(why.primary_attempts, 1);
                              co_return x + 100;
                            }}});
  auto result = run(io, op.run(1));
  EXPECT_EQ(result.value, 101);
  EXPECT_TRUE(result.report.fallback_used);
  EXPECT_EQ(result.report.fallback_source, "fallback:cache");
  // fallback_on: a failure it does not name propagates without the chain.
  auto picky = op.with_fallbacks(
      {{"cache", [](const idem::FallbackContext&, int x) -> Task<int> { co_return x; }}},
      [](const std::exception& e) { return dynamic_cast<const std::logic_error*>(&e) != nullptr; });
  EXPECT_THROW(run(io, picky.run(1)), idem::OperationError);
}

TEST(AsyncOperation, CircuitBreakerRejectsOnceOpen) {
  asio::io_context io;
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.name = "dep", .failure_threshold = 2});
  int calls = 0;
  auto op = idem::async::operation("dep",
                                   [&]() -> Task<int> {
                                     ++calls;
                                     throw Flaky("down");
                                     co_return 0;
                                   })
                .with_retry({.max_attempts = 5, .backoff = kFast})
                .with_circuit_breaker(breaker);
  EXPECT_THROW(run(io, op.run()), idem::OperationError);
  EXPECT_EQ(calls, 2);  // the third attempt was rejected by the open breaker
  EXPECT_EQ(breaker->state(), idem::CircuitState::open);
  // Null removes it: the attempts run again.
  calls = 0;
  EXPECT_THROW(run(io, op.with_circuit_breaker(nullptr).run()), idem::OperationError);
  EXPECT_EQ(calls, 5);
}

TEST(AsyncOperation, IdempotencyJoinsOneExecutionAndDoesNotCacheFailures) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto charge = idem::async::operation("charge",
                                       [&](std::string order) -> Task<std::string> {
                                         if (++calls == 1) throw Flaky("card declined");
                                         co_await nap(30ms);
                                         co_return "receipt-" + order;
                                       })
                    .with_idempotency({.key = [](const std::string& order) { return order; },
                                       .store = stores.async});
  // A failure is not cached: the next caller executes again.
  EXPECT_THROW(run(io, charge.run("o-1")), idem::OperationError);
  auto first = asio::co_spawn(io, charge.run("o-1"), asio::use_future);
  auto second = asio::co_spawn(io, charge.run("o-1"), asio::use_future);
  io.restart();
  io.run();
  const auto a = first.get();
  const auto b = second.get();
  EXPECT_EQ(a.value, "receipt-o-1");
  EXPECT_EQ(b.value, "receipt-o-1");
  EXPECT_EQ(status_of(a.report), "executed");
  EXPECT_EQ(status_of(b.report), "joined");
  EXPECT_EQ(calls.load(), 2);
  // callable() shares the configuration: it replays the recorded success.
  auto replay = run(io, charge.callable()("o-1"));
  EXPECT_EQ(status_of(replay.report), "replayed");
  // without_idempotency() executes every call.
  EXPECT_EQ(run(io, charge.without_idempotency().run("o-1")).value, "receipt-o-1");
  EXPECT_EQ(calls.load(), 3);
}

TEST(AsyncOperation, BadSettingsThrowConfigErrorAtOnce) {
  auto op = idem::async::operation("op", [](int x) -> Task<int> { co_return x; });
  EXPECT_THROW(op.with_retries(-1), idem::ConfigError);
  EXPECT_THROW(op.with_idempotency({}), idem::ConfigError);
  EXPECT_THROW(op.with_timeout(0ms), idem::ConfigError);
  EXPECT_THROW(op.with_validation({{"", [](const int&) { return true; }}}), idem::ConfigError);
  EXPECT_THROW(op.with_idempotency({.key = [](int) { return std::string("k"); }, .ttl = 0ms}),
               idem::ConfigError);
  EXPECT_THROW(op.with_fallbacks({}, [](const std::exception&) { return true; }),
               idem::ConfigError);
  EXPECT_THROW(idem::async::operation("", [](int x) -> Task<int> { co_return x; }),
               idem::ConfigError);
}

// A joiner's CallOptions: it gives up at its wait deadline (TimeoutError) or on its stop token
// (Cancelled); the owner and the other joiners are unaffected.
TEST(AsyncOperation, RunWithLetsAJoinerGiveUp) {
  asio::io_context io;
  Stores stores;
  std::atomic<int> calls{0};
  auto charge = idem::async::operation("charge",
                                       [&](std::string order) -> Task<std::string> {
                                         ++calls;
                                         co_await nap(300ms);
                                         co_return "receipt-" + order;
                                       })
                    .with_idempotency({.key = [](const std::string& order) { return order; },
                                       .store = stores.async});
  const auto now = std::chrono::steady_clock::now();
  std::stop_source stop;
  std::stop_source stopped_already;
  stopped_already.request_stop();
  // Named: g++ 12 can mishandle a temporary made in the call that starts a coroutine
  // (idem/async/task.hpp).
  const idem::CallOptions passed{.wait_deadline = now};
  const idem::CallOptions soon{.wait_deadline = now + 20ms};
  const idem::CallOptions stoppable{.stop = stop.get_token()};
  const idem::CallOptions stopped_before{.stop = stopped_already.get_token()};
  const idem::CallOptions far_off{.wait_deadline = now + 60s};
  auto owner = asio::co_spawn(io, charge.run("o-1"), asio::use_future);
  auto late = asio::co_spawn(io, charge.run_with(passed, "o-1"), asio::use_future);
  auto impatient = asio::co_spawn(io, charge.run_with(soon, "o-1"), asio::use_future);
  auto stopped = asio::co_spawn(io, charge.run_with(stoppable, "o-1"), asio::use_future);
  auto gone = asio::co_spawn(io, charge.run_with(stopped_before, "o-1"), asio::use_future);
  // Bounded far off: it joins, and its deadline's timer ends with the wait.
  auto patient = asio::co_spawn(io, charge.callable().call_with(far_off, "o-1"), asio::use_future);
  std::thread stopper([&] {
    std::this_thread::sleep_for(10ms);
    stop.request_stop();  // from another thread
  });
  io.run();
  stopper.join();
  EXPECT_THROW(late.get(), idem::TimeoutError);
  EXPECT_THROW(impatient.get(), idem::TimeoutError);
  EXPECT_THROW(stopped.get(), idem::Cancelled);
  EXPECT_THROW(gone.get(), idem::Cancelled);
  const auto joined = patient.get();
  EXPECT_EQ(joined.value, "receipt-o-1");
  EXPECT_EQ(status_of(joined.report), "joined");
  EXPECT_EQ(status_of(owner.get().report), "executed");
  EXPECT_EQ(calls.load(), 1);
  // Given up waiting, not dropped: the execution was recorded for the next caller.
  EXPECT_EQ(status_of(run(io, charge.run_with(passed, "o-1")).report), "replayed");
}

// With an injected clock the wait deadline is that clock's time: the joiner gives up when the
// clock passes it, however little real time went by.
TEST(AsyncOperation, RunWithDeadlineOnTheOperationsClock) {
  asio::io_context io;
  Stores stores;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  std::atomic<int> calls{0};
  auto op =
      idem::async::operation("slow",
                             [&](std::string) -> Task<int> {
                               ++calls;
                               co_await nap(200ms);
                               co_return 1;
                             })
          .with_clock(clock)
          .with_idempotency({.key = [](const std::string& k) { return k; }, .store = stores.async});
  auto owner = asio::co_spawn(io, op.run("k"), asio::use_future);
  const idem::CallOptions in_an_hour{.wait_deadline = clock->steady_now() + 1h};
  auto joiner = asio::co_spawn(io, op.run_with(in_an_hour, "k"), asio::use_future);
  asio::steady_timer later(io, 10ms);
  later.async_wait([&](asio::error_code) { clock->advance(2h); });
  io.run();
  EXPECT_THROW(joiner.get(), idem::TimeoutError);
  EXPECT_EQ(owner.get().value, 1);
  EXPECT_EQ(calls.load(), 1);
}

TEST(AsyncOperation, RunWithBoundsTheWaitForAnotherProcess) {
  asio::io_context io;
  Stores stores;
  const std::string stored = idem::scoped_idempotency_key("op", "k");
  auto other = stores.memory->claim(stored, std::nullopt, idem::Millis(60000));
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  int calls = 0;
  auto op = idem::async::operation("op", [&](std::string) -> Task<int> { co_return ++calls; })
                .with_idempotency({.key = [](const std::string& k) { return k; },
                                   .store = stores.async,
                                   .max_wait = idem::Millis(60000)});
  const idem::CallOptions soon{.wait_deadline = std::chrono::steady_clock::now() + 30ms};
  EXPECT_THROW(run(io, op.run_with(soon, "k")), idem::TimeoutError);
  std::stop_source stop;
  stop.request_stop();
  const idem::CallOptions stopped{.stop = stop.get_token()};
  EXPECT_THROW(run(io, op.callable().call_with(stopped, "k")), idem::Cancelled);
  EXPECT_EQ(calls, 0);
  // The other process lets go: a bounded caller executes.
  (void)stores.memory->release(stored, other.token);
  const idem::CallOptions later{.wait_deadline = std::chrono::steady_clock::now() + 60s};
  auto r = run(io, op.run_with(later, "k"));
  EXPECT_EQ(r.value, 1);
  EXPECT_EQ(status_of(r.report), "executed");
}

}  // namespace
