// idem::async::detail::HolderWait, the step the operation coordinator and the HTTP guard take
// when a claim answers in_progress: on the system clock it awaits the store's wait() once per
// holder and polls after that (a wait for the same holder that ended while the claim still finds
// it must not become a busy loop); it polls when the store did not name the holder and under an
// injected clock, with a capped doubling delay on that clock; it hands on the store's failure;
// a cancelled caller gets false.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string_view>
#include <system_error>
#include <vector>

#include "idem/async/detail/holder_wait.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;
using idem::async::detail::HolderWait;

// An in-memory store whose wait() is observed: it counts its calls and can fail or block until
// its deadline (or the caller's cancellation).
class WaitObservedStore final : public idem::async::AsyncStore {
 public:
  WaitObservedStore()
      : inner_(std::make_shared<idem::async::AsyncMemoryStore>(
            std::make_shared<idem::InMemoryIdempotencyStore>())) {}
  std::atomic<int> waits{0};
  bool fail = false;
  bool block = false;

 private:
  bool do_needs_bytes() const noexcept override { return false; }
  Task<idem::ClaimOutcome> do_claim(std::string_view key, std::optional<std::string_view> fp,
                                    idem::Millis lease) override {
    co_return co_await inner_->claim(key, fp, lease);
  }
  Task<bool> do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                         const idem::ExecutionReport& report, idem::Millis ttl) override {
    co_return co_await inner_->complete(key, token, std::move(value), report, ttl);
  }
  Task<bool> do_release(std::string_view key, std::uint64_t token) override {
    co_return co_await inner_->release(key, token);
  }
  Task<bool> do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    co_return co_await inner_->renew(key, token, lease);
  }
  Task<std::optional<idem::IdempotencyRecord>> do_lookup(std::string_view key) override {
    co_return co_await inner_->lookup(key);
  }
  Task<std::optional<idem::IdempotencyRecord>> do_wait(std::string_view, idem::SteadyTime deadline,
                                                       std::stop_token) override {
    ++waits;
    if (fail) throw idem::StoreError("down", /*retryable=*/true);
    if (block) {
      asio::steady_timer timer(co_await asio::this_coro::executor);
      timer.expires_at(deadline);
      asio::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    co_return std::nullopt;
  }

  std::shared_ptr<idem::async::AsyncMemoryStore> inner_;
};

// Runs one HolderWait::once() to its end on `io` (bounded); nullopt when it threw.
std::optional<bool> once(asio::io_context& io, HolderWait& wait, WaitObservedStore& store,
                         std::optional<std::uint64_t> holder, idem::SteadyTime until,
                         std::exception_ptr* error = nullptr,
                         asio::cancellation_signal* cancel = nullptr) {
  std::optional<bool> waited;
  bool done = false;
  auto handler = [&](std::exception_ptr e, bool value) {
    if (e && error) *error = e;
    if (!e) waited = value;
    done = true;
  };
  auto task = wait.once(store, "k", holder, until);
  if (cancel) {
    asio::co_spawn(io, std::move(task), asio::bind_cancellation_slot(cancel->slot(), handler));
  } else {
    asio::co_spawn(io, std::move(task), handler);
  }
  io.restart();
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!done && std::chrono::steady_clock::now() < give_up)
    io.run_for(5ms);
  EXPECT_TRUE(done);
  return waited;
}

idem::SteadyTime in(std::chrono::nanoseconds d) {
  return idem::system_clock()->steady_now() + d;
}

TEST(AsyncHolderWait, AwaitsTheStoresWaitOncePerHolderThenPolls) {
  asio::io_context io;
  WaitObservedStore store;
  HolderWait wait(nullptr, 1ms, 4ms);
  EXPECT_EQ(once(io, wait, store, 7, in(5s)), true);
  EXPECT_EQ(store.waits.load(), 1);
  // The claim still found holder 7 after its wait ended: poll, do not wait again.
  EXPECT_EQ(once(io, wait, store, 7, in(5s)), true);
  EXPECT_EQ(once(io, wait, store, 7, in(5s)), true);
  EXPECT_EQ(store.waits.load(), 1);
  // Another holder took the key over: its end is awaited.
  EXPECT_EQ(once(io, wait, store, 8, in(5s)), true);
  EXPECT_EQ(store.waits.load(), 2);
}

TEST(AsyncHolderWait, PollsWhenTheStoreDidNotNameTheHolder) {
  asio::io_context io;
  WaitObservedStore store;
  HolderWait wait(nullptr, 1ms, 4ms);
  EXPECT_EQ(once(io, wait, store, std::nullopt, in(5s)), true);
  EXPECT_EQ(store.waits.load(), 0);
}

TEST(AsyncHolderWait, UnderAnInjectedClockPollsOnThatClockWithACappedDoubling) {
  asio::io_context io;
  WaitObservedStore store;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  HolderWait wait(clock, 10ms, 40ms);
  const idem::SteadyTime start = clock->steady_now();
  const idem::SteadyTime until = start + 1s;
  std::vector<std::chrono::nanoseconds> steps;
  idem::SteadyTime before = start;
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(once(io, wait, store, 7, until), true);
    steps.push_back(clock->steady_now() - before);
    before = clock->steady_now();
  }
  EXPECT_EQ(store.waits.load(), 0);  // the store's wait runs on real time: never used
  const std::vector<std::chrono::nanoseconds> expected{10ms, 20ms, 40ms, 40ms, 40ms};
  EXPECT_EQ(steps, expected);
}

TEST(AsyncHolderWait, NeverSleepsPastItsEnd) {
  asio::io_context io;
  WaitObservedStore store;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  HolderWait wait(clock, 100ms, 100ms);
  const idem::SteadyTime start = clock->steady_now();
  EXPECT_EQ(once(io, wait, store, std::nullopt, start + 30ms), true);
  EXPECT_EQ(clock->steady_now() - start, 30ms);
  EXPECT_EQ(once(io, wait, store, std::nullopt, start + 30ms), true);  // past it: no sleep
  EXPECT_EQ(clock->steady_now() - start, 30ms);
}

TEST(AsyncHolderWait, HandsOnTheStoresFailure) {
  asio::io_context io;
  WaitObservedStore store;
  store.fail = true;
  HolderWait wait(nullptr, 1ms, 4ms);
  std::exception_ptr error;
  EXPECT_EQ(once(io, wait, store, 7, in(5s), &error), std::nullopt);
  ASSERT_TRUE(error);
  EXPECT_THROW(std::rethrow_exception(error), idem::StoreError);
}

TEST(AsyncHolderWait, ACancelledCallerGetsFalse) {
  asio::io_context io;
  WaitObservedStore store;
  store.block = true;
  HolderWait wait(nullptr, 1ms, 4ms);
  asio::cancellation_signal cancel;
  asio::steady_timer soon(io, 50ms);
  soon.async_wait([&](asio::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  std::exception_ptr error;
  // Ends long before the store's deadline (once() gives up after 10 s).
  const std::optional<bool> waited = once(io, wait, store, 7, in(60s), &error, &cancel);
  if (error) {
    // A coroutine cancelled while it awaits may also end with operation_aborted.
    try {
      std::rethrow_exception(error);
    } catch (const std::system_error& e) {
      EXPECT_EQ(e.code(), asio::error::operation_aborted);
    }
  } else {
    EXPECT_EQ(waited, false);
  }
}

}  // namespace
