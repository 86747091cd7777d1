// Completion<void(Args...)>: one asynchronous operation's completion handler, type-erased and
// move-only, for idem's own asynchronous operations (the coordinator's latch and joiners, the
// SQLite offload, the pipelined connections of Redis and PostgreSQL). Not installed.
//
// It is what asio::any_completion_handler is in Asio 1.24 and later (Debian 12 ships 1.22): it
// holds
//  * the handler, inline when it fits in InlineSize bytes and moves without throwing (the
//    handler of asio::use_awaitable, with its work, does: an operation that completes a waiting
//    coroutine allocates nothing for its completion), else on the heap;
//  * outstanding work on the handler's associated executor (outstanding_work.tracked), so
//    io_context::run() does not return while the operation is pending on another thread;
//  * through the handler, its associated cancellation slot (slot()).
// post(args...) posts the handler to its associated executor (the fallback given at
// construction when it has none) with the arguments moved, never copied: an exception_ptr the
// caller reads is then released where it is read, not on the thread that completed it. On that
// executor the handler's cancellation slot is cleared before the handler runs, so a cancellation
// handler that refers to the operation is gone before the caller resumes. dispatch(args...) is
// the same with asio::dispatch: the handler runs before dispatch() returns when its executor
// allows it (this thread runs that executor's context, and a strand is free), else it is posted;
// for a party that calls it where no state of its own is in the middle of a change (the pipelined
// engine, after a readiness step has left the strand). post() or dispatch() may be called
// once; the Completion is empty afterwards. Called from a thread that does not run the handler's
// context, neither touches that context once the handler can run: its owner may destroy the
// context as soon as the handler has run, even while other work is outstanding. Destroying a
// Completion that was not posted destroys the handler without calling it (and ends its work): what
// Asio does with the handlers of a context that shuts down.
//
// Cancellation types (asio::cancellation_type; Asio's definitions): an operation that installs a
// cancellation handler on slot() decides which types it honours. idem's rule:
//  * withdrawing work that has not started has no side effects, so any type withdraws it;
//  * work that has started and may have had an effect (a write that reached a server) may end
//    early only for `terminal` or `partial` — and then reports the effect as in doubt, never as
//    "nothing happened"; a `total` request leaves it to end with its real outcome
//    (allows_side_effects() below).
//
// Thread safety: none; a Completion is used by one party at a time (an operation hands it over
// under its own lock or atomic state).
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/associated_cancellation_slot.hpp>
#include <asio/associated_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/strand.hpp>
#include <asio/system_executor.hpp>
#include <atomic>
#include <cstddef>
#include <memory>
#include <new>
#include <thread>
#include <type_traits>
#include <utility>

namespace idem::async::detail {

// True when a cancellation of `type` accepts that work already started may have had effects
// (terminal or partial); false for total (and none).
constexpr bool allows_side_effects(asio::cancellation_type type) noexcept {
  return (type & (asio::cancellation_type::terminal | asio::cancellation_type::partial)) !=
         asio::cancellation_type::none;
}

// Room for a use_awaitable handler and the tracked any_io_executor of its work, with a margin.
inline constexpr std::size_t kCompletionInline = 80;

template <class Signature, std::size_t InlineSize = kCompletionInline>
class Completion;

template <class... Args, std::size_t InlineSize>
class Completion<void(Args...), InlineSize> {
 public:
  Completion() noexcept = default;

  // The handler's work and completion go to its associated executor (asio::system_executor when
  // it has none).
  template <class Handler>
  requires(!std::is_same_v<std::decay_t<Handler>, Completion>) explicit Completion(
      Handler&& handler) {
    emplace(std::forward<Handler>(handler));
  }
  // The same, with `fallback` for a handler that has no associated executor.
  template <class Handler, class Executor>
  Completion(Handler&& handler, const Executor& fallback) {
    emplace(std::forward<Handler>(handler), fallback);
  }

  Completion(Completion&& other) noexcept { take(other); }
  Completion& operator=(Completion&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion() { reset(); }

  // Holds `handler` (and its work) in place of what this held (which is destroyed, not called).
  template <class Handler>
  void emplace(Handler&& handler) {
    emplace(std::forward<Handler>(handler), asio::system_executor());
  }
  template <class Handler, class Executor>
  void emplace(Handler&& handler, const Executor& fallback) {
    using Stored = Holder<std::decay_t<Handler>, Executor>;
    reset();
    if constexpr (stored_inline<Stored>()) {
      new (storage_) Stored(std::forward<Handler>(handler), fallback);
    } else {
      *reinterpret_cast<Stored**>(storage_) = new Stored(std::forward<Handler>(handler), fallback);
    }
    ops_ = &kOps<Stored>;
  }

  // True when a Handler (completed through Executor when it has none) is kept without a heap
  // allocation.
  template <class Handler, class Executor = asio::system_executor>
  static constexpr bool fits_inline() noexcept {
    return stored_inline<Holder<std::decay_t<Handler>, Executor>>();
  }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  // The handler's associated cancellation slot (an unconnected one when empty).
  asio::cancellation_slot slot() const noexcept {
    return ops_ != nullptr ? ops_->slot(storage_) : asio::cancellation_slot();
  }

  // Posts the handler with `args` (see the top of the file). Requires a handler (operator bool).
  void post(Args... args) {
    const Ops* ops = std::exchange(ops_, nullptr);
    ops->post(storage_, std::move(args)...);
  }

  // Dispatches the handler with `args` (see the top of the file). Requires a handler.
  void dispatch(Args... args) {
    const Ops* ops = std::exchange(ops_, nullptr);
    ops->dispatch(storage_, std::move(args)...);
  }

  // Destroys the handler without calling it; the Completion is empty afterwards.
  void reset() noexcept {
    if (const Ops* ops = std::exchange(ops_, nullptr)) ops->destroy(storage_);
  }

 private:
  template <class Handler, class Executor>
  struct Holder {
    using WorkExecutor = std::decay_t<decltype(asio::prefer(
        std::declval<asio::associated_executor_t<Handler, Executor>>(),
        asio::execution::outstanding_work.tracked))>;

    template <class H>
    Holder(H&& h, const Executor& fallback)
        : handler(std::forward<H>(h)),
          work(asio::prefer(asio::get_associated_executor(handler, fallback),
                            asio::execution::outstanding_work.tracked)) {}

    Handler handler;
    WorkExecutor work;
  };

  struct Ops {
    void (*relocate)(unsigned char* from, unsigned char* to) noexcept;
    void (*destroy)(unsigned char* storage) noexcept;
    void (*post)(unsigned char* storage, Args&&... args);
    void (*dispatch)(unsigned char* storage, Args&&... args);
    asio::cancellation_slot (*slot)(const unsigned char* storage) noexcept;
  };

  template <class Stored>
  static constexpr bool stored_inline() noexcept {
    return sizeof(Stored) <= InlineSize && alignof(Stored) <= alignof(std::max_align_t) &&
           std::is_nothrow_move_constructible_v<Stored>;
  }

  template <class Stored>
  static Stored* get(unsigned char* storage) noexcept {
    if constexpr (stored_inline<Stored>()) {
      return std::launder(reinterpret_cast<Stored*>(storage));
    } else {
      return *reinterpret_cast<Stored**>(storage);
    }
  }
  template <class Stored>
  static const Stored* get(const unsigned char* storage) noexcept {
    return get<Stored>(const_cast<unsigned char*>(storage));
  }

  template <class Stored>
  static void relocate(unsigned char* from, unsigned char* to) noexcept {
    if constexpr (stored_inline<Stored>()) {
      Stored* source = get<Stored>(from);
      new (to) Stored(std::move(*source));
      source->~Stored();
    } else {
      *reinterpret_cast<Stored**>(to) = *reinterpret_cast<Stored**>(from);
    }
  }

  template <class Stored>
  static void destroy(unsigned char* storage) noexcept {
    if constexpr (stored_inline<Stored>()) {
      get<Stored>(storage)->~Stored();
    } else {
      delete get<Stored>(storage);
    }
  }

  template <class Stored>
  static void post_stored(unsigned char* storage, Args&&... args) {
    complete<Stored>(storage, false, std::move(args)...);
  }

  template <class Stored>
  static void dispatch_stored(unsigned char* storage, Args&&... args) {
    complete<Stored>(storage, true, std::move(args)...);
  }

  // post() and dispatch(). Two cases, told apart by running_in_this_thread() below:
  //  * this thread runs the handler's context: the handler is posted, or run at once by
  //    dispatch() when the executor allows it. The context cannot go away meanwhile: its run()
  //    is below us.
  //  * another thread (the SQLite offload's worker, a blocking leader telling an async joiner):
  //    once the handler can run, this thread must no longer touch the context, since the
  //    handler's owner may destroy it as soon as it has its result, even while work was
  //    outstanding. So the posted function first waits for `released`, which this thread sets
  //    after asio::post has returned and the handler's work has ended (the posted function is
  //    itself outstanding work, so ending the handler's cannot make run() return).
  template <class Stored>
  static void complete(unsigned char* storage, bool allow_inline, Args&&... args) {
    Stored* stored = get<Stored>(storage);
    // Out of the storage first: the handler may destroy the object that holds this Completion.
    auto handler = std::move(stored->handler);
    auto work = std::move(stored->work);
    destroy<Stored>(storage);
    if (running_in_this_thread(asio::get_associated_executor(handler, work))) {
      const auto executor = asio::get_associated_executor(handler, work);
      auto function = [handler = std::move(handler), ... args = std::move(args)]() mutable {
        asio::get_associated_cancellation_slot(handler).clear();
        std::move(handler)(std::move(args)...);
      };
      if (allow_inline) {
        asio::dispatch(executor, std::move(function));
      } else {
        asio::post(executor, std::move(function));
      }
      return;
    }
    auto released = std::make_shared<std::atomic<bool>>(false);
    // Never waited for on this thread: an executor that ran the function inline, against
    // asio::post's rule, would otherwise wait for itself.
    const std::thread::id poster = std::this_thread::get_id();
    {
      // The executor may be the work itself (a handler without one of its own): it goes with
      // this scope, before `released` is set.
      const auto executor = asio::get_associated_executor(handler, work);
      asio::post(executor, [handler = std::move(handler), released, poster,
                            ... args = std::move(args)]() mutable {
        while (!released->load(std::memory_order_acquire) && std::this_thread::get_id() != poster) {
          std::this_thread::yield();
        }
        asio::get_associated_cancellation_slot(handler).clear();
        std::move(handler)(std::move(args)...);
      });
    }
    { [[maybe_unused]] const auto ended = std::move(work); }
    released->store(true, std::memory_order_release);
  }

  // True when the calling thread runs the context below `executor`: an io_context's executor,
  // a strand over one (inside the strand or not), or either inside an any_io_executor. False
  // when it cannot tell, which is always safe.
  template <class Executor>
  static bool running_in_this_thread(const Executor& executor) {
    if constexpr (requires { executor.get_inner_executor(); }) {
      return running_in_this_thread(executor.get_inner_executor());
    } else if constexpr (requires { executor.running_in_this_thread(); }) {
      return executor.running_in_this_thread();
    } else if constexpr (std::is_same_v<Executor, asio::any_io_executor>) {
      using Io = asio::io_context::executor_type;
      if (const auto* io = executor.template target<Io>()) return running_in_this_thread(*io);
      if (const auto* s = executor.template target<asio::strand<Io>>()) {
        return running_in_this_thread(*s);
      }
      if (const auto* s = executor.template target<asio::strand<asio::any_io_executor>>()) {
        return running_in_this_thread(*s);
      }
      return false;
    } else {
      return false;
    }
  }

  template <class Stored>
  static asio::cancellation_slot slot_of(const unsigned char* storage) noexcept {
    return asio::get_associated_cancellation_slot(get<Stored>(storage)->handler);
  }

  template <class Stored>
  static constexpr Ops kOps{&relocate<Stored>, &destroy<Stored>, &post_stored<Stored>,
                            &dispatch_stored<Stored>, &slot_of<Stored>};

  void take(Completion& other) noexcept {
    if (other.ops_ == nullptr) return;
    other.ops_->relocate(other.storage_, storage_);
    ops_ = std::exchange(other.ops_, nullptr);
  }

  alignas(std::max_align_t) unsigned char storage_[InlineSize < sizeof(void*) ? sizeof(void*)
                                                                              : InlineSize];
  const Ops* ops_ = nullptr;
};

}  // namespace idem::async::detail
