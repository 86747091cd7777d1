// What the async conformance suites (async_recorder_conformance.hpp, async_store_conformance.hpp)
// and the blocking-over-async adapters (blocking_over_async.hpp) need to drive coroutines from a
// test: an io_context of its own on a background thread (IoThread, the I/O executor of an async
// backend whose callers run elsewhere), and, in idem::testing::async_detail, running a coroutine
// to its end on a test's io_context (checked to resume on the thread that awaited it, or
// cancelled part-way), running an io_context on two threads, nap() on a timer, and a conformance
// factory's optional kShortLease and kCoroutines (short_lease(), coroutines()).
//
// Teardown order for a backend on an IoThread. The I/O thread posts every completion into the
// test's io_context; an io_context destroyed while that thread is still returning from its last
// post is a use after free (ThreadSanitizer reports it). So stop the IoThread (stop(): it joins
// its thread) before destroying any io_context the backend posts into, and before the backend;
// then destroy the io_contexts, the backend, and the IoThread last. The conformance fixtures do
// it with async_detail::stop_io_thread(factory), which also lets go of the exceptions kept for
// ThreadSanitizer's sake (async_detail::kept_exceptions()).
//
// Thread safety: run(), run_cancelled() and run_on_two_threads() drive `io` on the calling
// thread (and one more), so no other thread may run that io_context at the same time. IoThread's
// executor may be used from any thread; stop() from the thread that owns the IoThread. The
// kept-exception bookkeeping is for one test thread (the one that makes and stops IoThreads).
//
// Needs idem::async (standalone Asio) and GoogleTest: link idem::testing_async and GTest.
#pragma once

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/error.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/system_error.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/async/task.hpp"
#include "idem/clock.hpp"
#include "idem/error.hpp"
#include "idem/report.hpp"

namespace idem::testing::async_detail {

// Sleeps on a timer of the awaiting coroutine's executor.
inline idem::async::Task<void> nap(std::chrono::milliseconds duration) {
  asio::steady_timer timer(co_await asio::this_coro::executor, duration);
  co_await timer.async_wait(asio::use_awaitable);
}

// The factory's kShortLease: the lease or TTL a conformance case lets lapse in real time, on the
// backend's own clock (50 ms unless the factory says otherwise).
template <class Factory>
constexpr idem::Millis short_lease() {
  if constexpr (requires { Factory::kShortLease; }) {
    return Factory::kShortLease;
  } else {
    return idem::Millis(50);
  }
}

// The factory's kCoroutines: how many coroutines a conformance case starts at once (`fallback`
// unless the factory says otherwise).
template <class Factory>
constexpr int coroutines(int fallback) {
  if constexpr (requires { Factory::kCoroutines; }) {
    return Factory::kCoroutines;
  } else {
    return fallback;
  }
}

// The report's "idempotency_status" (executed, joined, replayed, ...).
inline std::string status_of(const idem::ExecutionReport& report) {
  return report.metadata.at("idempotency_status");
}

// The exceptions of the calls run() and run_cancelled() finished, kept until stop_io_thread()
// has joined the backend's I/O thread. An exception a backend makes on its I/O thread (an
// aborted call's operation_aborted) may still be referenced there after the test has read it;
// std::exception_ptr counts its references inside libstdc++, which ThreadSanitizer does not see,
// so a last release on the I/O thread would look like a free racing with the test's read. Kept
// here, the exception is freed on the test's thread, after the join.
// Only while an IoThread runs: without one every release happens on the test's thread anyway,
// and an exception kept past its io_context (a timed-out attempt holds a strand of it) would be
// freed after that io_context, at exit.
inline std::vector<std::exception_ptr>& kept_exceptions() {
  static std::vector<std::exception_ptr> kept;
  return kept;
}
inline int& live_io_threads() {
  static int live = 0;  // IoThreads are made and stopped on the test's thread
  return live;
}
inline void keep_exception(std::exception_ptr error) {
  if (error && live_io_threads() > 0) kept_exceptions().push_back(std::move(error));
}

// Runs `task` on `io` on this thread until it and everything it started are done, and returns
// its result (or rethrows its exception). A call still running after `limit` fails the test with
// std::runtime_error instead of hanging the suite (a re-entry that waits for itself, a backend
// that never answers). The outcome is taken on the io_context's thread (asio::use_future would
// complete on Asio's system executor threads, racing this thread's read of the exception).
template <class T>
T run(asio::io_context& io, idem::async::Task<T> task,
      std::chrono::steady_clock::duration limit = std::chrono::seconds(60)) {
  bool done = false;
  std::exception_ptr error;
  std::optional<std::conditional_t<std::is_void_v<T>, bool, T>> value;
  asio::co_spawn(io, std::move(task), [&](std::exception_ptr e, auto&&... v) {
    error = e;
    if constexpr (sizeof...(v) > 0) {
      if (!e) value.emplace(std::forward<decltype(v)>(v)...);
    }
    done = true;
  });
  io.restart();
  io.run_for(limit);
  if (!done) {
    throw std::runtime_error(
        "the async call did not finish in time (did it wait for itself, or did no work keep the "
        "loop alive?)");
  }
  keep_exception(error);
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<T>) return std::move(*value);
}

// `task`, and a check (a gtest failure) that the coroutine awaiting it resumes on `thread`: an
// async backend must resume its caller on the caller's executor, whatever thread did its I/O.
template <class T>
idem::async::Task<T> resuming_on(std::thread::id thread, idem::async::Task<T> task) {
  if constexpr (std::is_void_v<T>) {
    co_await std::move(task);
    EXPECT_EQ(std::this_thread::get_id(), thread) << "resumed off the caller's executor";
  } else {
    T value = co_await std::move(task);
    EXPECT_EQ(std::this_thread::get_id(), thread) << "resumed off the caller's executor";
    co_return value;
  }
}

// How a cancelled call ended: it went through, it was aborted (operation_aborted: it did
// nothing), or it failed in doubt (a StoreError with in_doubt()).
enum class Outcome { completed, aborted, in_doubt };

// Starts `task` on `io` with a cancellation slot, runs `steps` handlers of `io`, emits a terminal
// cancellation, then runs to completion and says how the call ended. Any other failure (a
// StoreError not in doubt, another error code) is a test failure or is rethrown.
template <class T>
Outcome run_cancelled(asio::io_context& io, idem::async::Task<T> task, int steps,
                      std::chrono::steady_clock::duration limit = std::chrono::seconds(60)) {
  asio::cancellation_signal signal;
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(io, std::move(task),
                 asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e, auto&&...) {
                   error = e;
                   done = true;
                 }));
  io.restart();
  for (int i = 0; i < steps; ++i)
    io.poll_one();
  signal.emit(asio::cancellation_type::terminal);
  io.run_for(limit);
  if (!done) throw std::runtime_error("the cancelled call did not finish in time");
  keep_exception(error);
  try {
    if (error) std::rethrow_exception(error);
    return Outcome::completed;
  } catch (const asio::system_error& e) {
    EXPECT_EQ(e.code(), asio::error::operation_aborted) << e.what();
    return Outcome::aborted;
  } catch (const idem::StoreError& e) {
    EXPECT_TRUE(e.in_doubt()) << "a cancelled call failed without being in doubt: " << e.what();
    return Outcome::in_doubt;
  }
}

// Runs `io` on this thread and one more until it runs out of work (the Race* cases: coroutines of
// one backend resumed on two threads at once).
inline void run_on_two_threads(asio::io_context& io) {
  io.restart();
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
}

}  // namespace idem::testing::async_detail

namespace idem::testing {

// An io_context run by a thread of its own: give an async backend whose I/O runs apart from its
// callers (Redis, PostgreSQL) its executor(), as a member `io` of the conformance factory. The
// destructor lets the work still queued (a backend's shut-down) finish before it joins the
// thread, so destroy whatever uses the executor first; or stop() it first (see the teardown
// order at the top of this file).
class IoThread {
 public:
  IoThread() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {
    ++async_detail::live_io_threads();
  }
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;
  ~IoThread() {
    work_.reset();
    if (thread_.joinable()) thread_.join();
    stopped();
  }

  asio::io_context::executor_type executor() noexcept { return io_.get_executor(); }

  // Stops the io_context at once and joins the thread: nothing runs on the executor any more
  // and nothing posts from this thread. What is still queued (a backend's pending reads, the
  // shut-down its destructor posts) never runs; it is destroyed with the IoThread. Idempotent.
  void stop() {
    work_.reset();
    io_.stop();
    if (thread_.joinable()) thread_.join();
    stopped();
  }

 private:
  // The thread is joined: what it may have released last is no longer racing the test's thread.
  void stopped() {
    if (counted_) {
      counted_ = false;
      if (--async_detail::live_io_threads() == 0) async_detail::kept_exceptions().clear();
    }
  }

  bool counted_ = true;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

namespace async_detail {

// Stops the IoThread that a conformance factory keeps as its member `io`, if it keeps one (the
// Redis and PostgreSQL factories do; the memory and SQLite ones have no I/O thread).
template <class Factory>
void stop_io_thread(Factory& factory) {
  if constexpr (requires { factory.io.stop(); }) factory.io.stop();
  kept_exceptions().clear();
}

// What the async conformance fixtures share: the factory, the backend it made (`subject_`), the
// io_contexts the cases run coroutines on, and their teardown order. The factory is declared
// first and destroyed last; io_ is declared last, so pending coroutines go before the backend;
// the factory's I/O thread (if it has one) is stopped before any of them goes, as it posts into
// them.
template <class Factory, class Subject>
class ConformanceFixture : public ::testing::Test {
 protected:
  // `noun` names the backend in the failure of a factory that returned none ("store").
  explicit ConformanceFixture(const char* noun) : noun_(noun) {}
  ~ConformanceFixture() override { stop_io_thread(factory_); }

  void SetUp() override {
    subject_ = factory_.make();
    ASSERT_NE(subject_, nullptr) << "the factory returned no " << noun_;
  }

  // Runs `task` to completion on io_ on this thread and returns its result (or rethrows). Checks
  // that the coroutine resumed on this thread (the io_context's only runner) after the call.
  template <class T>
  T run(idem::async::Task<T> task) {
    return async_detail::run(
        io_, async_detail::resuming_on(std::this_thread::get_id(), std::move(task)));
  }

  // Starts `task` with a cancellation slot, runs `steps` handlers of io_, emits a terminal
  // cancellation, then runs to completion and says how the call ended.
  template <class T>
  Outcome run_cancelled(idem::async::Task<T> task, int steps) {
    return async_detail::run_cancelled(io_, std::move(task), steps);
  }

  const char* noun_;
  Factory factory_;
  std::shared_ptr<Subject> subject_;
  asio::io_context threads_io_{2};  // the Race* cases run it on two threads
  asio::io_context io_;
};

}  // namespace async_detail

}  // namespace idem::testing
