// idem::async::detail::renew_every and LeaseKeeper, the coroutine face's one lease renewal, on a
// ManualClock: due every lease/3 of the injected clock (never by itself), "fenced" (a renewal
// refused) ends it at once and for good, "cancelled" (while waiting or during a renewal) ends it
// without an error, a failing renewal is tried again next period — the blocking LeaseRenewer's
// rules, which the last test checks side by side.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/async/detail/renewal.hpp"
#include "idem/detail/lease_renewer.hpp"
#include "idem/error.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;
using idem::async::detail::LeaseKeeper;
using idem::async::detail::renew_every;
using idem::async::detail::RenewalEnd;
using idem::async::detail::RenewFn;
using idem::testing::ManualClock;

constexpr idem::Millis kLease{300};  // a renewal every 100 ms of the clock

// A ManualClock that counts how often it was read, so a test can let the loop look at the clock
// a few times (it polls an injected clock) before asserting that nothing became due.
class CountingClock final : public idem::Clock {
 public:
  idem::WallTime wall_now() const override { return inner_.wall_now(); }
  idem::SteadyTime steady_now() const override {
    ++reads_;
    return inner_.steady_now();
  }
  bool sleep_for(std::chrono::nanoseconds d, std::stop_token stop) override {
    return inner_.sleep_for(d, stop);
  }
  void advance(std::chrono::nanoseconds d) { inner_.advance(d); }
  std::chrono::nanoseconds elapsed() const { return inner_.steady_now() - idem::SteadyTime{}; }
  int reads() const { return reads_.load(); }

 private:
  ManualClock inner_;
  mutable std::atomic<int> reads_{0};
};

// Runs `io` until `done` (bounded, so a failure cannot hang the suite).
void run_until(asio::io_context& io, const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + 10s;
  while (!done() && std::chrono::steady_clock::now() < give_up) {
    io.restart();
    io.run_for(5ms);
  }
  ASSERT_TRUE(done());
}

// Lets the loop read the clock a few more times: long enough to have noticed a due renewal.
void let_it_look(asio::io_context& io, const CountingClock& clock) {
  const int seen = clock.reads();
  run_until(io, [&] { return clock.reads() >= seen + 5; });
}

struct Script {
  std::vector<std::chrono::nanoseconds> at;                    // the clock's time of each renewal
  std::function<bool(int)> answer = [](int) { return true; };  // the n-th renewal's
};

RenewFn scripted(std::shared_ptr<CountingClock> clock, std::shared_ptr<Script> script) {
  return [clock, script]() -> Task<bool> {
    script->at.push_back(clock->elapsed());
    co_return script->answer(static_cast<int>(script->at.size()));
  };
}

TEST(AsyncRenewal, DueEveryThirdOfTheLeaseOnTheInjectedClockOnly) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease, scripted(clock, script));
  let_it_look(io, *clock);
  EXPECT_TRUE(script->at.empty());  // real time does not move the clock
  clock->advance(99ms);
  let_it_look(io, *clock);
  EXPECT_TRUE(script->at.empty());
  clock->advance(1ms);
  run_until(io, [&] { return script->at.size() == 1; });
  clock->advance(100ms);
  run_until(io, [&] { return script->at.size() == 2; });
  EXPECT_EQ(script->at, (std::vector<std::chrono::nanoseconds>{100ms, 200ms}));
  EXPECT_FALSE(keeper.fenced());
  keeper.stop();
}

TEST(AsyncRenewal, AKeeperStartedLateIsTimedFromTheClaim) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  const idem::SteadyTime claimed = clock->steady_now();
  clock->advance(130ms);  // the claim is already past its first renewal's due time
  LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease, scripted(clock, script),
                     claimed);
  run_until(io, [&] { return script->at.size() == 1; });  // at once
  clock->advance(99ms);
  let_it_look(io, *clock);
  EXPECT_EQ(script->at.size(), 1u);  // then a third of the lease after that renewal
  clock->advance(1ms);
  run_until(io, [&] { return script->at.size() == 2; });
  EXPECT_EQ(script->at, (std::vector<std::chrono::nanoseconds>{130ms, 230ms}));
  keeper.stop();
}

TEST(AsyncRenewal, FencedEndsAtOnceAndForGood) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  script->answer = [](int n) { return n < 2; };  // the second renewal is refused
  std::optional<RenewalEnd> end;
  asio::co_spawn(io, renew_every(clock, kLease, scripted(clock, script), clock->steady_now()),
                 [&](std::exception_ptr error, RenewalEnd e) {
                   EXPECT_FALSE(error);
                   end = e;
                 });
  for (int i = 0; i < 2; ++i) {
    clock->advance(100ms);
    run_until(io, [&] { return script->at.size() == static_cast<std::size_t>(i + 1); });
  }
  run_until(io, [&] { return end.has_value(); });
  EXPECT_EQ(*end, RenewalEnd::fenced);
  clock->advance(1s);
  io.restart();
  io.poll();
  EXPECT_EQ(script->at.size(), 2u);
}

TEST(AsyncRenewal, AKeeperSaysFenced) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  script->answer = [](int) { return false; };
  LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease, scripted(clock, script));
  clock->advance(100ms);
  run_until(io, [&] { return keeper.fenced(); });
  EXPECT_EQ(script->at.size(), 1u);
}

TEST(AsyncRenewal, CancelledWhileWaitingEndsWithoutAnError) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  asio::cancellation_signal signal;
  std::optional<RenewalEnd> end;
  asio::co_spawn(
      io, renew_every(clock, kLease, scripted(clock, script), clock->steady_now()),
      asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr error, RenewalEnd e) {
        EXPECT_FALSE(error);
        end = e;
      }));
  let_it_look(io, *clock);
  signal.emit(asio::cancellation_type::terminal);
  run_until(io, [&] { return end.has_value(); });
  EXPECT_EQ(*end, RenewalEnd::cancelled);
  EXPECT_TRUE(script->at.empty());
}

TEST(AsyncRenewal, CancelledDuringARenewalEndsWithoutAnErrorAndRenewsNoMore) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  int renewals = 0;
  bool renewing = false;
  // A renewal that hangs (a store that does not answer) until it is cancelled.
  RenewFn hanging = [&]() -> Task<bool> {
    ++renewals;
    renewing = true;
    asio::steady_timer never(co_await asio::this_coro::executor, std::chrono::hours(1));
    co_await never.async_wait(asio::use_awaitable);
    co_return true;
  };
  asio::cancellation_signal signal;
  std::optional<RenewalEnd> end;
  asio::co_spawn(
      io, renew_every(clock, kLease, hanging, clock->steady_now()),
      asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr error, RenewalEnd e) {
        EXPECT_FALSE(error);
        end = e;
      }));
  clock->advance(100ms);
  run_until(io, [&] { return renewing; });
  signal.emit(asio::cancellation_type::terminal);
  run_until(io, [&] { return end.has_value(); });
  EXPECT_EQ(*end, RenewalEnd::cancelled);
  EXPECT_EQ(renewals, 1);
}

TEST(AsyncRenewal, AFailingRenewalIsTriedAgainNextPeriod) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto attempts = std::make_shared<std::vector<std::chrono::nanoseconds>>();
  RenewFn failing_once = [clock, attempts]() -> Task<bool> {
    attempts->push_back(clock->elapsed());
    if (attempts->size() == 1) throw idem::StoreError("the store is down", /*retryable=*/true);
    co_return true;
  };
  LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease, failing_once);
  clock->advance(100ms);
  run_until(io, [&] { return attempts->size() == 1; });
  clock->advance(100ms);
  run_until(io, [&] { return attempts->size() == 2; });
  EXPECT_EQ(*attempts, (std::vector<std::chrono::nanoseconds>{100ms, 200ms}));
  EXPECT_FALSE(keeper.fenced());
}

TEST(AsyncRenewal, AStoppedKeeperRenewsNoMore) {
  asio::io_context io;
  auto clock = std::make_shared<CountingClock>();
  auto script = std::make_shared<Script>();
  {
    LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease,
                       scripted(clock, script));
    clock->advance(100ms);
    run_until(io, [&] { return script->at.size() == 1; });
  }  // stopped
  io.restart();
  io.run();  // returns: the loop ended (nothing else keeps the context busy)
  clock->advance(1s);
  EXPECT_EQ(script->at.size(), 1u);
  EXPECT_EQ(io.poll(), 0u);
}

// The blocking renewer and the coroutine loop, given the same clock moves and the same answers,
// renew at the same times and end the same way.
TEST(AsyncRenewal, AgreesWithTheBlockingLeaseRenewer) {
  auto clock = std::make_shared<CountingClock>();
  const auto answer = [](int n) { return n < 3; };  // renewed, renewed, fenced

  idem::detail::LeaseRenewer renewer("test");
  std::mutex mutex;
  std::condition_variable changed;
  std::vector<std::chrono::nanoseconds> blocking;
  auto lease = renewer.add(clock, kLease, [&] {
    std::lock_guard lock(mutex);
    blocking.push_back(clock->elapsed());
    changed.notify_all();
    return answer(static_cast<int>(blocking.size()));
  });

  asio::io_context io;
  auto script = std::make_shared<Script>();
  script->answer = answer;
  LeaseKeeper keeper(asio::make_strand(io.get_executor()), clock, kLease, scripted(clock, script));

  for (int i = 1; i <= 3; ++i) {
    clock->advance(100ms);
    run_until(io, [&] { return script->at.size() == static_cast<std::size_t>(i); });
    std::unique_lock lock(mutex);
    ASSERT_TRUE(changed.wait_for(lock, 10s,
                                 [&] { return blocking.size() == static_cast<std::size_t>(i); }));
  }
  run_until(io, [&] { return keeper.fenced(); });
  // The blocking renewer marks the lease lost once the refused renewal returned.
  for (const auto give_up = std::chrono::steady_clock::now() + 10s;
       !lease->lost() && std::chrono::steady_clock::now() < give_up;) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(lease->lost());
  // Neither renews after being fenced: the loop has ended, the renewer dropped the lease.
  clock->advance(1s);
  io.restart();
  EXPECT_EQ(io.poll(), 0u);
  std::lock_guard lock(mutex);
  EXPECT_EQ(script->at, blocking);
  EXPECT_EQ(script->at, (std::vector<std::chrono::nanoseconds>{100ms, 200ms, 300ms}));
  renewer.remove(lease);
}

}  // namespace
