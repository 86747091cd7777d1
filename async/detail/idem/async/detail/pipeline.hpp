// Pipeline<Derived, Call, Value>: the engine under idem's pipelined connections (Redis's
// AsyncConnection, PostgreSQL's). Not installed.
//
// A pipelined connection lets any number of coroutines share one socket: calls queue up, are
// written together, and their replies come back in the order the calls were written. What does
// not depend on the protocol is written here, once:
//  * The calls. A queue of calls not written yet and a list of calls written ("in flight"),
//    oldest first, whose replies are awaited; each caller's Completion (completion.hpp), handed
//    to the caller's executor (the strand when its handler has none) with the outcome moved.
//  * Cancellation by id, from the caller's cancellation slot. A queued call is withdrawn
//    (operation_aborted; nothing reached the server), whatever the cancellation type. A call in
//    flight is the protocol's to judge (cancel_sent below): its reply is read and dropped either
//    way, so the pipeline stays in step.
//  * Failing every call at once: those in flight (a lost connection), those queued (a refused
//    connect).
//  * The ends. shut_down() (the owner's destructor): every call ends with operation_aborted and
//    the transport closes. The end of the executor's execution context (its destructor, nothing
//    runs it any more): every call is destroyed without being completed — Asio's rule for the
//    handlers pending on a context that goes — and the transport closes (ShutdownRegistry,
//    DESIGN-NOTES §65). Work in flight keeps the engine alive, never its owner.
//  * The strand everything runs on, and when calls are written (pump()): a call to an idle
//    connection (nothing queued, nothing in flight, no pump due) at once, from start() when the
//    caller's thread may enter the strand; calls that queue behind others once per turn of the
//    event loop, so the calls made in one turn go out in one write.
//  * The socket's readiness waits and the protocol's one timer, whose handlers never run once
//    the transport they were armed for has ended (end_transport(): a generation count).
//  * A readiness step (the handler of a socket wait) completes its calls only once it has returned
//    and the strand is free: the callers whose executor is running on this thread resume at once
//    (Completion::dispatch, no further turn of the loop), the others are posted to. The calls the
//    resumed callers start go out in writes of kFlushEvery calls while the others still resume,
//    the rest in one write after them (done()), and then the protocol hears that the step and its
//    callers are over (settle()). Writing one batch while the next is being made keeps the server
//    at work while the client resumes callers: a single write after all of them would leave the
//    server idle for that time and the client idle while the server answers (DESIGN-NOTES §101).
// The protocol (Derived) keeps what is its own: connecting and its handshake, encoding calls,
// decoding replies, its deadlines, and what a failure means for each call.
//
// Derived derives from Pipeline<Derived, Call, Value>, is made with std::make_shared, and
// provides, on the strand:
//   void pump();
//       Calls were queued (or the protocol asked, schedule_pump()): connect, or write them
//       (send_next()).
//   std::exception_ptr cancel_sent(const Call& call, asio::cancellation_type type);
//       The caller of a call in flight cancelled it with `type`: the error it ends with now, or
//       null to let it wait for its reply. A call whose effect may already have happened (a
//       write) may end early only when allows_side_effects(type), and then in doubt.
//   void close_transport() noexcept;
//       Close the socket and forget the session (end_transport() was called just before).
// and may provide
//   void settle();
//       A readiness step ran and so did the callers it resumed on this thread, with the calls they
//       started written: what is idle now stays idle until a caller starts a call (the engine's
//       does nothing; Redis stops its command timer there).
//
// Thread safety: start(), shut_down(), load(), cancelled() and get_executor() from any thread;
// everything else on the strand (the protocol's own code). No protocol code runs while a caller
// is resumed: a completion never runs inside the protocol's handlers, so a caller that starts a
// call, cancels one or destroys the connection from its completion finds the engine between
// steps, as after a post.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/cancellation_type.hpp>
#include <asio/dispatch.hpp>
#include <asio/error.hpp>
#include <asio/posix/stream_descriptor.hpp>
#include <asio/post.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/system_error.hpp>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <system_error>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "idem/async/detail/completion.hpp"
#include "idem/async/detail/shutdown_registry.hpp"

namespace idem::async::detail {

// What a call ends with when it was withdrawn, or its connection closed.
inline std::exception_ptr operation_aborted() {
  return std::make_exception_ptr(asio::system_error(asio::error::operation_aborted));
}

template <class Derived, class Call, class Value>
class Pipeline : public std::enable_shared_from_this<Derived> {
 public:
  using executor_type = asio::strand<asio::any_io_executor>;
  using CallCompletion = Completion<void(std::exception_ptr, Value)>;
  using WaitType = asio::posix::descriptor_base::wait_type;

  // One call: the protocol's part and its caller's completion, empty for the protocol's own calls
  // (a handshake) and once the caller was completed (cancelled while in flight).
  struct Pending {
    explicit Pending(Call c) : call(std::move(c)) {}
    std::uint64_t id = 0;  // 0 for the protocol's own calls
    Call call;
    CallCompletion completion;
  };
  using Entry = std::unique_ptr<Pending>;

  explicit Pipeline(const asio::any_io_executor& executor)
      : strand_(asio::make_strand(executor)),
        // Its waits complete outside the strand (when_ready()).
        descriptor_(strand_.get_inner_executor()),
        timer_(strand_),
        // Made after the strand's, the reactor's and the timer's services, so shut down before
        // them: the calls' handlers are dropped while every service they touch still exists.
        registry_(Registry::of(strand_.get_inner_executor())) {
    registry_.add(this);
  }

  ~Pipeline() {
    registry_.remove(this);
    unwatch();
  }

  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  // ---- any thread ------------------------------------------------------------------------------

  // The strand the connection runs on.
  const executor_type& get_executor() const noexcept { return strand_; }

  // Starts a call: `handler` is completed once with (error, value) on its own executor.
  template <class Handler>
  void start(Handler&& handler, Call call) {
    auto pending = std::make_unique<Pending>(std::move(call));
    pending->id = next_id_.fetch_add(1, std::memory_order_relaxed);
    pending->completion.emplace(std::forward<Handler>(handler), strand_);
    load_.fetch_add(1, std::memory_order_relaxed);
    if (auto slot = pending->completion.slot(); slot.is_connected()) {
      // Runs where the caller emits; the calls are only touched on the strand.
      slot.assign([weak = this->weak_from_this(), id = pending->id](asio::cancellation_type type) {
        if (type == asio::cancellation_type::none) return;
        if (auto self = weak.lock()) {
          Pipeline& engine = *self;
          asio::post(engine.strand_, [self = std::move(self), id, type] {
            static_cast<Pipeline&>(*self).cancel(id, type);
          });
        }
      });
    }
    // At once when this thread may enter the strand (it runs the connection's execution context
    // and the strand is free): the caller has suspended before start() is called, and submit()
    // completes nobody inline, so no caller runs inside another's start().
    asio::dispatch(strand_, [self = this->shared_from_this(), p = std::move(pending)]() mutable {
      static_cast<Pipeline&>(*self).submit(std::move(p));
    });
  }

  // Ends every call with operation_aborted and closes the transport; calls started later end
  // the same way. For the owner's destructor.
  void shut_down() {
    asio::post(strand_, [self = this->shared_from_this()] {
      Pipeline& engine = *self;
      engine.closed_ = true;
      engine.fail_in_flight([](const Pending&) { return operation_aborted(); });
      engine.fail_queued([](const Pending&) { return operation_aborted(); });
      engine.close();
    });
  }

  // Calls started and not completed yet (queued or in flight).
  std::size_t load() const noexcept { return load_.load(std::memory_order_relaxed); }
  // Calls that ended early because their callers cancelled them.
  std::uint64_t cancelled() const noexcept { return cancelled_.load(std::memory_order_relaxed); }

  // The execution context is shutting down (ShutdownRegistry; not for the protocol to call):
  // every call is destroyed without being completed, and the transport closes.
  void abandon() noexcept {
    closed_ = true;
    auto queued = std::move(queued_);
    auto in_flight = std::move(in_flight_);
    queued_.clear();
    in_flight_.clear();
    close();
    load_.store(0, std::memory_order_relaxed);
    // `queued` and `in_flight` go here, with the handlers (and coroutine frames) they own.
  }

 protected:
  // ---- the calls (on the strand) ----------------------------------------------------------------

  // True after shut_down() or abandon().
  bool closed() const noexcept { return closed_; }
  bool has_queued() const noexcept { return !queued_.empty(); }
  bool has_in_flight() const noexcept { return !in_flight_.empty(); }

  // The oldest queued call becomes the newest in flight (the protocol writes it).
  Pending& send_next() {
    in_flight_.push_back(std::move(queued_.front()));
    queued_.pop_front();
    return *in_flight_.back();
  }
  // A call of the protocol's own (no caller), newest in flight.
  Pending& send_own(Call call) {
    in_flight_.push_back(std::make_unique<Pending>(std::move(call)));
    return *in_flight_.back();
  }
  // The oldest call in flight (whose reply comes next), and taking it out of the list.
  Pending& oldest() noexcept { return *in_flight_.front(); }
  Entry pop_oldest() {
    Entry done = std::move(in_flight_.front());
    in_flight_.pop_front();
    return done;
  }

  // The caller of `pending` hears the outcome (once: nothing when it already did): posted, or
  // within a readiness step kept until the step has returned (the top of the file).
  void complete(Pending& pending, std::exception_ptr error, Value value) {
    if (!pending.completion) return;
    load_.fetch_sub(1, std::memory_order_relaxed);
    if (stepping_) {
      ready_.push_back(Ready{std::move(pending.completion), std::move(error), std::move(value)});
      return;
    }
    pending.completion.post(std::move(error), std::move(value));
  }

  // Every call in flight whose caller still waits ends with error_for(pending); the list is then
  // empty (the protocol's own calls go too).
  template <class ErrorFor>
  void fail_in_flight(ErrorFor&& error_for) {
    auto lost = std::move(in_flight_);
    in_flight_.clear();
    for (auto& pending : lost)
      if (pending->completion) complete(*pending, error_for(*pending), Value{});
  }
  // Every queued call ends with error_for(pending); the queue is then empty.
  template <class ErrorFor>
  void fail_queued(ErrorFor&& error_for) {
    auto failed = std::move(queued_);
    queued_.clear();
    for (auto& pending : failed)
      complete(*pending, error_for(*pending), Value{});
  }

  // The protocol's settle() when it has none (the top of the file).
  void settle() {}

  // pump() once more, after what is already posted to the strand (the calls posted meanwhile
  // join the same write).
  void schedule_pump() {
    if (pump_scheduled_) return;
    pump_scheduled_ = true;
    asio::post(strand_, [self = this->shared_from_this()] {
      Pipeline& engine = *self;
      engine.pump_scheduled_ = false;
      if (!engine.closed_) self->pump();
    });
  }

  // ---- the transport (on the strand) ------------------------------------------------------------

  // Watches the socket `fd` for readiness from now on, in place of the one watched before, whose
  // waits end unseen. The engine watches its own duplicate of `fd`: the protocol's library owns
  // `fd` and may close it on its own (libpq does on a read failure, and when it moves on to the
  // next host), after which the number can belong to another thread's socket. Had the reactor
  // registered the number itself, its later deregistration would reach that socket; the duplicate
  // is the engine's until unwatch(), so it cannot. Throws std::system_error when the process is
  // out of descriptors.
  void watch(int fd) {
    unwatch();
    const int own = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (own < 0) throw std::system_error(errno, std::generic_category(), "dup");
    descriptor_.assign(own);
  }
  // Stops watching and closes the duplicate; the waits end unseen. The transport's generation
  // stays (the protocol's timer still applies): for trying the next address of a host.
  void unwatch() noexcept {
    if (descriptor_.is_open()) {
      // Deregistered while still open (release), then closed: closing alone would leave the
      // registration behind while the protocol's descriptor keeps the socket open.
      const int own = descriptor_.release();
      ::close(own);
    }
    reading_ = writing_ = false;
  }
  // Whether a socket is watched.
  bool watching() const noexcept { return descriptor_.is_open(); }

  // on_ready(Derived&, const asio::error_code&) on the strand once the socket is ready for
  // `what` (or its wait failed), unless the transport ended meanwhile: a readiness step, whose
  // completions reach their callers once it has returned (the top of the file).
  template <class OnReady>
  void when_ready(WaitType what, OnReady on_ready) {
    // The wait completes on the strand's inner executor, outside the strand: the step enters the
    // strand, and what comes after it (resuming callers) runs once the strand is free again.
    descriptor_.async_wait(
        what, [self = this->shared_from_this(), generation = generation_,
               on_ready = std::move(on_ready)](const asio::error_code& ec) mutable {
          Pipeline& engine = *self;
          Delivery delivery;
          delivery.engine = &engine;
          Delivery* const enclosing = std::exchange(tl_delivery_, &delivery);
          try {
            asio::dispatch(engine.strand_,
                           [self, generation, ec, on_ready = std::move(on_ready)]() mutable {
                             Pipeline& stepping = *self;
                             if (generation != stepping.generation_) return;
                             stepping.step([&] { on_ready(*self, ec); });
                           });
          } catch (...) {
            tl_delivery_ = enclosing;
            throw;
          }
          tl_delivery_ = enclosing;
          if (delivery.stepped) engine.deliver(self, delivery);
        });
  }
  // The same, with at most one read wait and one write wait pending: a call while one is pending
  // (or while nothing is watched) does nothing. A write may wait for the socket to be readable
  // (TLS).
  template <class OnReady>
  void when_readable(OnReady on_ready) {
    if (reading_ || !descriptor_.is_open()) return;
    reading_ = true;
    when_ready(WaitType::wait_read,
               [on_ready = std::move(on_ready)](Derived& self, const asio::error_code& ec) mutable {
                 static_cast<Pipeline&>(self).reading_ = false;
                 on_ready(self, ec);
               });
  }
  template <class OnReady>
  void when_writable(WaitType what, OnReady on_ready) {
    if (writing_ || !descriptor_.is_open()) return;
    writing_ = true;
    when_ready(what,
               [on_ready = std::move(on_ready)](Derived& self, const asio::error_code& ec) mutable {
                 static_cast<Pipeline&>(self).writing_ = false;
                 on_ready(self, ec);
               });
  }
  bool write_waiting() const noexcept { return writing_; }

  // The protocol's one timer (connect timeout, backoff, a reply's deadline). on_fire(Derived&,
  // const asio::error_code&) runs when it fires or is cancelled, unless the transport ended
  // meanwhile.
  asio::steady_timer& timer() noexcept { return timer_; }
  template <class OnFire>
  void when_timer(OnFire on_fire) {
    timer_.async_wait([self = this->shared_from_this(), generation = generation_,
                       on_fire = std::move(on_fire)](const asio::error_code& ec) mutable {
      if (generation != static_cast<Pipeline&>(*self).generation_) return;
      on_fire(*self, ec);
    });
  }

  // Ends the transport: nothing is watched, the timer is cancelled, and the handlers armed for it
  // never run. The protocol then closes its socket.
  void end_transport() noexcept {
    ++generation_;
    unwatch();
    timer_.cancel();
  }
  // Changes with each end_transport(): for handlers the protocol arms itself.
  std::uint64_t generation() const noexcept { return generation_; }

 private:
  using Registry = ShutdownRegistry<Pipeline>;

  Derived& derived() noexcept { return static_cast<Derived&>(*this); }

  // A completion kept during a readiness step, with its outcome.
  struct Ready {
    CallCompletion completion;
    std::exception_ptr error;
    Value value;
  };

  // A readiness step's handler, on the thread it runs on (on its stack, outside the strand):
  // where the step leaves its completions when it ran inline, and whether the callers are being
  // resumed (their calls on this connection wait for done()).
  struct Delivery {
    Pipeline* engine = nullptr;
    bool stepped = false;       // the step ran inline and left its completions here
    bool resuming = false;      // the callers are being resumed
    std::size_t unwritten = 0;  // calls the resumed callers queued since the last write
    std::vector<Ready> ready;
  };
  // While callers resume, their calls are written each time this many have queued (the top of
  // the file). Large enough that a write's system call (and the server's read and reply) is
  // shared by many calls; small enough that the server starts on a batch while the client is
  // still resuming the callers that make the next one.
  static constexpr std::size_t kFlushEvery = 16;
  // The innermost Delivery of this thread (a caller resumed by one connection's step may be
  // resumed on another connection's: each finds its own by `engine`).
  static inline thread_local Delivery* tl_delivery_ = nullptr;

  // The Delivery of this engine's readiness step on this thread, if any.
  Delivery* delivery_here() noexcept {
    Delivery* d = tl_delivery_;
    return d != nullptr && d->engine == this ? d : nullptr;
  }

  // Runs a readiness step (on the strand), keeping its completions; then hands them to the
  // handler waiting on this thread, or (the step was queued behind other work on the strand and
  // runs on its own) posts them and settles.
  template <class Body>
  void step(Body&& body) {
    stepping_ = true;
    try {
      body();
    } catch (...) {
      stepping_ = false;
      post_ready();
      throw;
    }
    stepping_ = false;
    if (Delivery* d = delivery_here(); d != nullptr && !d->stepped && !d->resuming) {
      d->stepped = true;
      d->ready.swap(ready_);
      return;
    }
    post_ready();
    derived().settle();
  }

  void post_ready() {
    auto ready = std::move(ready_);
    ready_.clear();
    for (Ready& r : ready)
      r.completion.post(std::move(r.error), std::move(r.value));
  }

  // After an inline readiness step, with the strand free: the callers resume (at once when their
  // executor runs on this thread), then the calls they started are written in one go (done()).
  static void deliver(const std::shared_ptr<Derived>& self, Delivery& delivery) {
    Pipeline& engine = *self;
    Delivery* const enclosing = std::exchange(tl_delivery_, &delivery);
    delivery.resuming = true;
    std::size_t next = 0;
    try {
      for (; next < delivery.ready.size(); ++next) {
        Ready& r = delivery.ready[next];
        r.completion.dispatch(std::move(r.error), std::move(r.value));
        if (delivery.unwritten >= kFlushEvery) {
          delivery.unwritten = 0;
          // The strand is free (no caller runs in it now): this writes at once.
          asio::dispatch(engine.strand_, [self] { static_cast<Pipeline&>(*self).write_queued(); });
        }
      }
    } catch (...) {
      // A caller's handler threw (out of run(), as from a posted one): the others still hear.
      tl_delivery_ = enclosing;
      for (++next; next < delivery.ready.size(); ++next) {
        Ready& r = delivery.ready[next];
        r.completion.post(std::move(r.error), std::move(r.value));
      }
      asio::post(engine.strand_, [self] { static_cast<Pipeline&>(*self).done(); });
      throw;
    }
    tl_delivery_ = enclosing;
    asio::dispatch(engine.strand_, [self] { static_cast<Pipeline&>(*self).done(); });
  }

  // Writes the calls the resumed callers queued so far (while others are still resumed).
  void write_queued() {
    if (!closed_ && !queued_.empty()) derived().pump();
  }

  // The callers a readiness step resumed have run: the calls they queued go out in one write, and
  // the protocol settles.
  void done() {
    if (closed_) return;
    if (!queued_.empty()) derived().pump();
    derived().settle();
  }

  void submit(Entry pending) {
    if (closed_) {
      complete(*pending, operation_aborted(), Value{});
      return;
    }
    queued_.push_back(std::move(pending));
    if (Delivery* d = delivery_here(); d != nullptr && d->resuming) {
      // A caller resumed by a readiness step of this connection, on this thread: written with
      // the calls of the other callers it resumed (deliver(), done()).
      ++d->unwritten;
      return;
    }
    if (queued_.size() == 1 && in_flight_.empty() && !pump_scheduled_) {
      // An idle connection: nothing to wait for, so written now, not at the next turn.
      derived().pump();
      return;
    }
    schedule_pump();
  }

  void cancel(std::uint64_t id, asio::cancellation_type type) {
    for (auto it = queued_.begin(); it != queued_.end(); ++it) {
      if ((*it)->id != id) continue;
      Entry withdrawn = std::move(*it);
      queued_.erase(it);
      cancelled_.fetch_add(1, std::memory_order_relaxed);
      complete(*withdrawn, operation_aborted(), Value{});
      return;
    }
    for (auto& pending : in_flight_) {
      if (pending->id != id) continue;
      if (!pending->completion) return;
      std::exception_ptr error = derived().cancel_sent(pending->call, type);
      if (!error) return;  // it waits for its reply
      cancelled_.fetch_add(1, std::memory_order_relaxed);
      complete(*pending, std::move(error), Value{});  // its reply is read and dropped
      return;
    }
  }

  void close() noexcept {
    end_transport();
    derived().close_transport();
  }

  executor_type strand_;
  asio::posix::stream_descriptor descriptor_;  // a duplicate of the protocol's socket
  asio::steady_timer timer_;
  Registry& registry_;
  std::deque<Entry> queued_;
  std::deque<Entry> in_flight_;
  std::uint64_t generation_ = 0;
  bool closed_ = false;
  bool pump_scheduled_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool stepping_ = false;     // in a readiness step: completions are kept in ready_
  std::vector<Ready> ready_;  // empty outside a readiness step
  std::atomic<std::uint64_t> next_id_{1};
  std::atomic<std::size_t> load_{0};
  std::atomic<std::uint64_t> cancelled_{0};
};

}  // namespace idem::async::detail
