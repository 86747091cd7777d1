// Per-attempt timeouts, and the AttemptContext an operation may take.
//
// An operation function may take a leading `idem::AttemptContext&` (or `const&`); idem detects it
// at compile time and passes the attempt number, the source ("primary") and a std::stop_token.
// A function that only needs cooperative cancellation may take a leading `std::stop_token`
// instead.
//
// With a timeout configured, each primary attempt runs on a thread of its own and the caller
// waits at most until the attempt's deadline. At the deadline idem requests the stop token
// (cooperative cancellation) and the caller gets idem::TimeoutError at once — it never waits for
// the attempt to notice — unless a timeout_grace is configured: then the caller first waits up to
// that long for the attempt to end (an attempt that honours its stop token ends within it). An
// attempt that ignores the request keeps running in the background to completion; it owns copies of
// the arguments and shares ownership of the operation, so it can never touch a dangling reference,
// and its result or exception is discarded. The TimeoutError carries the timeout and says whether
// the attempt has ended (attempt_stopped()); the report's attempt metadata records that as of the
// end of the call. Without a timeout the attempt runs on the caller's thread and the stop token is
// never requested.
//
// Timeouts are measured in real steady time (std::chrono::steady_clock), not with the injected
// Clock: a test clock such as ManualClock only moves when told to, so it could never end a
// blocked attempt. Backoff, breaker windows and report times do use the injected Clock.
//
// Thread-safety: AttemptContext belongs to one attempt. Its stop token may be read from any
// thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>

#include "idem/error.hpp"
#include "idem/idempotency.hpp"

namespace idem {

struct AttemptContext {
  int attempt = 1;                      // 1-based number of this attempt
  std::string_view source = "primary";  // valid for the attempt's lifetime
  std::stop_token stop{};               // requested at the deadline (timeouts only)
  std::optional<std::chrono::steady_clock::time_point> deadline{};  // set when a timeout applies

  bool stop_requested() const noexcept { return stop.stop_requested(); }
};

namespace detail {

template <class T>
struct AttemptSlot {
  std::mutex mutex{};
  std::condition_variable done_cv{};
  bool done = false;
  std::conditional_t<std::is_void_v<T>, bool, std::optional<T>> value{};
  std::exception_ptr error{};
  std::stop_source stop{};
  AttemptContext context{};
};

// Runs work(AttemptContext&) -> T on its own thread and returns its result, or throws
// TimeoutError once `timeout` has passed (requesting the context's stop token). `work` must own
// everything it touches: it may outlive this call. `hold` (may be null) is kept until the work
// finishes, so an idempotency key stays claimed while an abandoned attempt still runs. The
// caller's re-entrancy context (owned idempotency keys) is carried into the thread.
template <class T>
bool attempt_slot_done(const void* slot) {
  auto* s = const_cast<AttemptSlot<T>*>(static_cast<const AttemptSlot<T>*>(slot));
  std::lock_guard lock(s->mutex);
  return s->done;
}

template <class T, class Work>
T run_with_timeout(Work work, std::chrono::nanoseconds timeout, std::chrono::nanoseconds grace,
                   AttemptContext context, std::shared_ptr<void> hold, std::string_view operation) {
  auto slot = std::make_shared<AttemptSlot<T>>();
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(timeout);
  slot->context = context;
  slot->context.stop = slot->stop.get_token();
  slot->context.deadline = deadline;

  std::thread([slot, work = std::move(work), hold = std::move(hold),
               keys = current_owned_keys()]() mutable noexcept {
    try {
      OwnedKeysScope scope(keys);
      if constexpr (std::is_void_v<T>) {
        work(slot->context);
      } else {
        slot->value.emplace(work(slot->context));
      }
    } catch (...) {
      slot->error = std::current_exception();
    }
    {
      std::lock_guard lock(slot->mutex);
      slot->done = true;
    }
    slot->done_cv.notify_all();
    // Only now may the key be released: the attempt has stopped touching the outside world.
    hold.reset();
  }).detach();

  std::unique_lock lock(slot->mutex);
  if (!slot->done_cv.wait_until(lock, deadline, [&] { return slot->done; })) {
    slot->stop.request_stop();
    if (grace > std::chrono::nanoseconds::zero()) {
      slot->done_cv.wait_for(lock, grace, [&] { return slot->done; });
    }
    const bool stopped = slot->done;
    lock.unlock();
    throw TimeoutError(
        "attempt " + std::to_string(context.attempt) + " of '" + std::string(operation) +
            "' exceeded its timeout of " +
            std::to_string(std::chrono::duration_cast<std::chrono::microseconds>(timeout).count()) +
            " us" + (stopped ? " (it stopped when asked)" : " (still running, asked to stop)"),
        timeout, std::shared_ptr<const void>(slot), &attempt_slot_done<T>);
  }
  if (slot->error) std::rethrow_exception(slot->error);
  if constexpr (!std::is_void_v<T>) return std::move(*slot->value);
}

}  // namespace detail
}  // namespace idem
