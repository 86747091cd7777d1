// AsyncIdempotentHandler: the coroutine face of IdempotentHandler (idem/handler.hpp) — runs an
// event handler's side effects once, however often the event arrives, with `handle` a coroutine.
//
// The same three modes, the same guarantees and the same results and errors as the blocking
// handler (the decisions are shared: idem/detail/handler_logic.hpp), over an AsyncRecorder:
//   check_then_mark  co_await is_processed → duplicate; else co_await handle; success →
//                    mark_processed; a throw (or cancellation) marks nothing and propagates.
//   exclusive        co_await claim(lease): processed → duplicate; live lease → AlreadyInProgress;
//                    acquired → handle, while a coroutine on a strand of the caller's executor
//                    renews the lease every lease/3 → complete(token), or LeaseLost when the claim
//                    was taken over. handle throws or is cancelled → release(token) (run even for
//                    a cancelled caller) and the exception propagates.
//   transactional    run_transactional(): handle runs inside the transaction that inserts the
//                    marker; its statements go through transaction_of(bus) (an
//                    AsyncSqlTransaction); events it publishes are held back until the commit.
//   automatic        exclusive when the recorder's capabilities() has claims, else
//                    check_then_mark.
// The renewals follow the blocking handler's rules (idem/detail/lease_renewer.hpp), on
// HandlerOptions::clock (null: the system clock): a ManualClock moved by hand makes them due.
// The same clock times `handle` for HandlerOptions::observer.
//
// Cancellation: cancelling the awaiting coroutine (its cancellation slot) while handle runs
// reaches handle's own awaits (operation_aborted there); the delivery is then not marked, its
// claim is released (exclusive) or its transaction rolled back (transactional), and the
// exception propagates — the transport redelivers it.
//
// Everything runs on the awaiting coroutine's executor; `handle` may run concurrently for
// different events (on a multi-threaded executor, on several threads), so it must be safe for
// that. The Event, the payload and the BusProxy must outlive the awaited call.
//
// Thread safety: one handler may serve any number of coroutines at once, on any executors.
// To deliver from the in-process Bus or the RabbitMQ consumer, wrap it with
// idem::async::on_executor (idem/async/bus.hpp).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/async/recorder.hpp"
#include "idem/async/task.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"

namespace idem::async {

// The transaction of a transactional async handler's delivery, from the BusProxy its handle
// got; null in the other modes.
AsyncSqlTransaction* transaction_of(BusProxy& bus) noexcept;

// The type-erased coroutine handler the adapters call (AsyncIdempotentHandler is one).
class AsyncEventHandler {
 public:
  virtual ~AsyncEventHandler() = default;
  virtual const std::string& consumer() const noexcept = 0;
  // processed/duplicate; throws AlreadyInProgress (do not ack) or what handle threw.
  virtual Task<HandleResult> handle_event(const Event& event, BusProxy& bus) = 0;
  // outcomes[i] is what events[i] came to (EventHandler::handle_batch's meaning). Default:
  // handle_event for each, in order.
  virtual Task<std::vector<HandleOutcome>> handle_batch(std::span<const Event> events,
                                                        BusProxy& bus);
};

namespace detail {

// The mode logic of AsyncIdempotentHandler, compiled once for every Payload type.
class AsyncHandlerCore {
 public:
  using Invoke = std::function<Task<void>(const Event&, BusProxy&)>;

  AsyncHandlerCore(std::string consumer, std::shared_ptr<AsyncRecorder> recorder,
                   HandlerOptions options);

  const std::string& consumer() const noexcept { return consumer_; }
  HandlerMode mode() const noexcept { return mode_; }

  Task<HandleResult> run(const Event& event, BusProxy& bus, Invoke invoke);
  Task<std::vector<HandleOutcome>> run_batch(std::span<const Event> events, BusProxy& bus,
                                             Invoke invoke);

 private:
  Task<HandleResult> run_unobserved(const Event& event, BusProxy& bus, Invoke invoke);
  Task<HandleResult> run_observed(const Event& event, BusProxy& bus, Invoke invoke);
  Task<std::vector<HandleOutcome>> run_batch_check_then_mark(std::span<const Event> events,
                                                             BusProxy& bus, const Invoke& invoke);
  Task<HandleResult> run_check_then_mark(const Event& event, BusProxy& bus, const Invoke& invoke);
  Task<HandleResult> run_exclusive(const Event& event, BusProxy& bus, const Invoke& invoke);
  Task<HandleResult> run_transactional(const Event& event, BusProxy& bus, const Invoke& invoke);

  std::string consumer_;
  std::shared_ptr<AsyncRecorder> recorder_;
  HandlerMode mode_;
  Millis lease_;
  std::shared_ptr<Observer> observer_;
  std::shared_ptr<Clock> clock_;  // the renewal schedule's, and the observer's durations
};

}  // namespace detail

template <class Payload = std::string>
class AsyncIdempotentHandler : public AsyncEventHandler {
 public:
  // InvalidKey for a bad consumer name, InvalidArgument for a null recorder, NotSupported when
  // the mode needs a capability the recorder lacks, ConfigError for a non-positive lease.
  AsyncIdempotentHandler(std::string consumer, std::shared_ptr<AsyncRecorder> recorder,
                         HandlerOptions options = {})
      : core_(std::move(consumer), std::move(recorder), std::move(options)) {}

  const std::string& consumer() const noexcept final { return core_.consumer(); }
  // The resolved mode (never automatic).
  HandlerMode mode() const noexcept { return core_.mode(); }

  Task<HandleResult> handle_event(const Event& event, BusProxy& bus) final {
    return core_.run(event, bus, invoker());
  }

  // check_then_mark: one is_processed_many for the window, handle for each event not processed
  // yet, one mark_processed_many for the successes (the blocking handle_batch's window). The
  // other modes handle each event as handle_event does.
  Task<std::vector<HandleOutcome>> handle_batch(std::span<const Event> events,
                                                BusProxy& bus) final {
    return core_.run_batch(events, bus, invoker());
  }

 protected:
  // The side effects, as a coroutine. Throw (or let a cancellation through) to fail the
  // delivery: nothing is marked.
  virtual Task<void> handle(const Payload& payload, BusProxy& bus, const Event& event) = 0;

 private:
  detail::AsyncHandlerCore::Invoke invoker() {
    return [this](const Event& event, BusProxy& proxy) { return invoke(this, event, proxy); };
  }

  static Task<void> invoke(AsyncIdempotentHandler* self, const Event& event, BusProxy& proxy) {
    if constexpr (std::is_same_v<Payload, std::string>) {
      co_await self->handle(event.payload, proxy, event);  // no copy for raw payloads
    } else {
      const Payload payload = idem::detail::decode_payload<Payload>(event, self->consumer());
      co_await self->handle(payload, proxy, event);
    }
  }

  detail::AsyncHandlerCore core_;
};

namespace detail {

template <class Payload, class Fn>
class AsyncFunctionHandler final : public AsyncIdempotentHandler<Payload> {
 public:
  AsyncFunctionHandler(std::string consumer, std::shared_ptr<AsyncRecorder> recorder, Fn fn,
                       HandlerOptions options)
      : AsyncIdempotentHandler<Payload>(std::move(consumer), std::move(recorder),
                                        std::move(options)),
        fn_(std::move(fn)) {}

 protected:
  Task<void> handle(const Payload& payload, BusProxy& bus, const Event& event) override {
    if constexpr (std::is_invocable_v<Fn&, const Payload&, BusProxy&, const Event&>) {
      return fn_(payload, bus, event);
    } else if constexpr (std::is_invocable_v<Fn&, const Payload&, BusProxy&>) {
      return fn_(payload, bus);
    } else {
      return fn_(payload);
    }
  }

 private:
  Fn fn_;
};

}  // namespace detail

// Functional form: fn returns Task<void> and is called as fn(const Payload&, BusProxy&,
// const Event&), or with the leading (payload, bus) or (payload) arguments. A coroutine lambda
// should not capture what its body uses after its first suspension unless the lambda outlives
// the call (it does here: the handler keeps it).
template <class Payload = std::string, class Fn>
std::shared_ptr<AsyncEventHandler> make_async_idempotent_handler(
    std::string consumer, std::shared_ptr<AsyncRecorder> recorder, Fn fn,
    HandlerOptions options = {}) {
  static_assert(std::is_invocable_r_v<Task<void>, Fn&, const Payload&, BusProxy&, const Event&> ||
                    std::is_invocable_r_v<Task<void>, Fn&, const Payload&, BusProxy&> ||
                    std::is_invocable_r_v<Task<void>, Fn&, const Payload&>,
                "make_async_idempotent_handler: fn must return idem::async::Task<void> and take "
                "(const Payload&, BusProxy&, const Event&), (const Payload&, BusProxy&) or "
                "(const Payload&)");
  return std::make_shared<detail::AsyncFunctionHandler<Payload, Fn>>(
      std::move(consumer), std::move(recorder), std::move(fn), std::move(options));
}

}  // namespace idem::async
