// Running a blocking SQLite call on idem's own threads from a coroutine (idem::sqlite_async).
//
// WorkerPool is a fixed set of threads with one FIFO queue. offload(pool, work) is an Asio
// asynchronous operation: it queues `work`, suspends the awaiting coroutine, and resumes it on
// the coroutine's own executor (never on a pool thread) with work's result or exception. While
// the call is pending the executor counts as having outstanding work, so io_context::run() does
// not return under it.
//
// Cancellation (the awaiting coroutine's slot): a job still in the queue is withdrawn — it never
// runs and the call ends with operation_aborted; a job a thread has started runs to its end and
// the call reports its real outcome (SQLite cannot interrupt a commit halfway without leaving
// its outcome in doubt, and a mark that committed is better reported than hidden). A job may
// forward the cancellation to work it started itself (`on_cancel_running`).
//
// Arguments that work captures by reference (string views) stay valid: the coroutine stays
// suspended until the job has ended or been withdrawn, and a withdrawn job never touches them.
//
// Thread safety: submit() may be called from any thread. Emit cancellations from the thread
// that runs the awaiting coroutine (Asio's rule for every cancellable operation).
#pragma once

#include <asio/async_result.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/error.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "idem/async/detail/completion.hpp"
#include "idem/async/task.hpp"
#include "idem/error.hpp"

namespace idem::sqlite::detail {

class WorkerPool {
 public:
  // `threads` >= 1 (checked by make_worker_pool).
  explicit WorkerPool(std::size_t threads);
  // Runs what is still queued, then joins the threads.
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  void submit(std::function<void()> job);
  // True on one of this pool's threads.
  bool on_worker_thread() const noexcept;

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// The pool of an AsyncSqliteRecorder or AsyncSqliteStore: AsyncSqliteOptions::threads threads,
// ConfigError when that is 0.
inline std::unique_ptr<WorkerPool> make_worker_pool(std::size_t threads) {
  if (threads < 1) throw ConfigError("AsyncSqliteOptions::threads must be at least 1");
  return std::make_unique<WorkerPool>(threads);
}

// The result type of an offloaded void call.
struct Unit {};

// `queue` is anything with submit(std::function<void()>) that runs the job on another thread
// (a WorkerPool, or the statement queue of a transaction's thread). `withdrawable` false: the
// job is never withdrawn (a release, which a cancelled caller's cleanup needs).
//
// Callers pass `work` (and `on_cancel_running`) as named objects, never as a lambda converted in
// the co_await expression: g++ 12 destroys such temporaries twice.
template <class T, class Queue>
idem::async::Task<T> offload(
    Queue& queue, const std::function<T()>& work,
    const std::function<void(asio::cancellation_type)>* on_cancel_running = nullptr,
    bool withdrawable = true);

namespace offload_detail {

enum Phase : int { queued = 0, running = 1, withdrawn = 2 };

template <class T>
struct State {
  State(std::function<T()> w, std::function<void(asio::cancellation_type)> forward)
      : work(std::move(w)), on_cancel_running(std::move(forward)) {}

  std::atomic<int> phase{queued};
  // Posted once, by whoever moves `phase` from queued: the withdrawal or the job when it ends.
  idem::async::detail::Completion<void(std::exception_ptr, T)> completion;
  std::function<T()> work;
  std::function<void(asio::cancellation_type)> on_cancel_running;
};

template <class T, class Queue>
struct Initiation {
  Queue* queue;

  template <class Handler>
  void operator()(Handler handler, std::function<T()> work,
                  std::function<void(asio::cancellation_type)> on_cancel_running,
                  bool withdrawable) const {
    auto state = std::make_shared<State<T>>(std::move(work), std::move(on_cancel_running));
    state->completion.emplace(std::move(handler));
    // A queued job withdrawn has no side effects: every cancellation type withdraws it. A running
    // one hears the type through on_cancel_running.
    if (auto slot = state->completion.slot(); withdrawable && slot.is_connected()) {
      // The slot's handler holds the state until the completion clears the slot.
      slot.assign([state](asio::cancellation_type type) {
        if (type == asio::cancellation_type::none) return;
        int expected = queued;
        if (state->phase.compare_exchange_strong(expected, withdrawn)) {
          state->completion.post(
              std::make_exception_ptr(std::system_error(asio::error::operation_aborted)), T{});
        } else if (expected == running && state->on_cancel_running) {
          state->on_cancel_running(type);
        }
      });
    }
    queue->submit([state] {
      int expected = queued;
      if (!state->phase.compare_exchange_strong(expected, running)) return;  // withdrawn
      std::exception_ptr error;
      T value{};
      try {
        value = state->work();
      } catch (...) {
        error = std::current_exception();
      }
      state->completion.post(std::move(error), std::move(value));
    });
  }
};

}  // namespace offload_detail

template <class T, class Queue>
idem::async::Task<T> offload(Queue& queue, const std::function<T()>& work,
                             const std::function<void(asio::cancellation_type)>* on_cancel_running,
                             bool withdrawable) {
  // Not a coroutine itself: async_initiate makes the awaitable.
  std::function<void(asio::cancellation_type)> forward;
  if (on_cancel_running != nullptr) forward = *on_cancel_running;
  return asio::async_initiate<const asio::use_awaitable_t<>, void(std::exception_ptr, T)>(
      offload_detail::Initiation<T, Queue>{&queue}, asio::use_awaitable, work, std::move(forward),
      withdrawable);
}

}  // namespace idem::sqlite::detail
