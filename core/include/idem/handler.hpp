// IdempotentHandler: runs an event handler's side effects once, however often the event arrives.
//
// Transports deliver at least once: after a crash, a lost ack or a retry, the same event (same
// Event::id) comes again. An IdempotentHandler for consumer C asks C's IdempotencyRecorder
// whether the event was handled and runs `handle` only if not. Three modes trade cost for
// strength (docs/consumers.md compares them):
//
//   check_then_mark  is_processed → drop; else handle; success → mark_processed; throw → nothing
//                    marked, the exception propagates (the transport redelivers).
//                    Window: two deliveries running at the same time both pass the check and
//                    both run `handle`; a crash between handle and mark runs it again.
//   exclusive        claim(lease) first: processed → drop; held by a live lease → throw
//                    AlreadyInProgress (not acknowledged: redeliver later, it is then dropped);
//                    acquired → handle, its lease renewed every lease/3 by a background
//                    heartbeat while handle runs → complete(token). handle throws → release(token)
//                    and the exception propagates. A crashed owner's claim is taken over once its
//                    lease passes. If the lease was lost anyway (a stall longer than the lease)
//                    complete() is refused and LeaseLost is thrown: the side effect ran, and the
//                    new owner may run it too.
//                    Window: a crash between handle and complete runs it again (after the lease).
//   transactional    recorder->run_transactional(): handle runs inside the database transaction
//                    that inserts the marker; its own writes go through BusProxy::transaction().
//                    Both commit or neither — no window for writes made in that transaction.
//                    Events published from handle are held back and handed to the caller's proxy
//                    only after the commit (dropped on rollback), so a rolled-back handler never
//                    leaks follow-up events. (The other modes publish at once: a handler that
//                    publishes and then throws has published.)
//                    With HandlerOptions::outbox, published events are instead written to the
//                    outbox table in that same transaction (idem/outbox.hpp): they commit with
//                    the marker and an OutboxRelay publishes them after, with confirms.
//   automatic        exclusive when recorder->supports_claims(), else check_then_mark.
//
// The options are in handler_options.hpp; the interface a transport calls (EventHandler,
// BusProxy) in event_handler.hpp.
//
// Payloads are decoded with idem::Codec<Payload> (codec.hpp); a payload that does not decode
// throws DecodeError, marks nothing, and so is redelivered (and in the end dead-lettered by the
// bus). Consumer names are validated at construction and event ids on every call (InvalidKey;
// nothing is marked and handle does not run).
//
// Thread-safety: an IdempotentHandler may be called from many threads at once (the Bus does);
// `handle` then runs concurrently for different events, so it must be thread-safe itself. In
// exclusive mode the handler owns one background lease renewal thread (detail::LeaseRenewer),
// started on first use and joined by the destructor; do not destroy a handler while a call is
// running.
//
// fork(): a handler made before fork() belongs to the parent: called in a child it throws
// ConfigError. It may be destroyed there (its lease renewal thread is the parent's and is
// abandoned, not joined) unless that destroys the last reference to a recorder that must be
// leaked instead (docs/guarantees.md §9).
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/codec.hpp"
#include "idem/detail/handler_core.hpp"
#include "idem/event.hpp"
#include "idem/event_handler.hpp"
#include "idem/handler_options.hpp"
#include "idem/recorder.hpp"

namespace idem {

template <class Payload = std::string>
class IdempotentHandler : public EventHandler {
 public:
  IdempotentHandler(std::string consumer, std::shared_ptr<IdempotencyRecorder> recorder,
                    HandlerOptions options = {})
      : core_(std::move(consumer), std::move(recorder), std::move(options)) {}

  const std::string& consumer() const noexcept final { return core_.consumer(); }
  // The resolved mode (never automatic).
  HandlerMode mode() const noexcept { return core_.mode(); }

  HandleResult operator()(const Event& event, BusProxy& bus) final {
    return core_.run(event, bus, [this, &event](BusProxy& proxy) { invoke(event, proxy); });
  }

  // check_then_mark: one is_processed_many for the window, handle for each event not yet
  // processed (a repeat of an id handled earlier in the same window is a duplicate), then one
  // mark_processed_many for the ones that succeeded. This widens check_then_mark's crash window
  // from one event to the window: a crash (or a failed batch mark, reported as every marked
  // event's error) after some handles ran and before the batch mark runs those handles again on
  // redelivery. Exclusive and transactional modes handle each event as operator() does.
  std::vector<HandleOutcome> handle_batch(std::span<const Event> events, BusProxy& bus) final {
    return core_.run_batch(events, bus,
                           [this](const Event& event, BusProxy& proxy) { invoke(event, proxy); });
  }

 protected:
  // The side effects. Runs at most once per successful event (see the header comment for the
  // windows each mode leaves). Throw to fail the delivery: nothing is marked.
  virtual void handle(const Payload& payload, BusProxy& bus, const Event& event) = 0;

 private:
  void invoke(const Event& event, BusProxy& proxy) {
    if constexpr (std::is_same_v<Payload, std::string>) {
      handle(event.payload, proxy, event);  // no copy for raw payloads
    } else {
      handle(detail::decode_payload<Payload>(event, core_.consumer()), proxy, event);
    }
  }

  detail::HandlerCore core_;
};

namespace detail {

template <class Payload, class Fn>
class FunctionHandler final : public IdempotentHandler<Payload> {
 public:
  FunctionHandler(std::string consumer, std::shared_ptr<IdempotencyRecorder> recorder, Fn fn,
                  HandlerOptions options)
      : IdempotentHandler<Payload>(std::move(consumer), std::move(recorder), std::move(options)),
        fn_(std::move(fn)) {}

 protected:
  void handle(const Payload& payload, BusProxy& bus, const Event& event) override {
    if constexpr (std::is_invocable_v<Fn&, const Payload&, BusProxy&, const Event&>) {
      fn_(payload, bus, event);
    } else if constexpr (std::is_invocable_v<Fn&, const Payload&, BusProxy&>) {
      fn_(payload, bus);
    } else {
      fn_(payload);
    }
  }

 private:
  Fn fn_;
};

}  // namespace detail

// Functional form. fn is called as fn(const Payload&, BusProxy&, const Event&), or with the
// leading (payload, bus) or (payload) arguments if that is all it takes. fn may run on several
// threads at once when the handler is shared (e.g. by a Bus with several workers).
template <class Payload = std::string, class Fn>
std::shared_ptr<EventHandler> make_idempotent_handler(std::string consumer,
                                                      std::shared_ptr<IdempotencyRecorder> recorder,
                                                      Fn fn, HandlerOptions options = {}) {
  static_assert(std::is_invocable_v<Fn&, const Payload&, BusProxy&, const Event&> ||
                    std::is_invocable_v<Fn&, const Payload&, BusProxy&> ||
                    std::is_invocable_v<Fn&, const Payload&>,
                "make_idempotent_handler: fn must be callable as fn(const Payload&, BusProxy&, "
                "const Event&), fn(const Payload&, BusProxy&) or fn(const Payload&)");
  return std::make_shared<detail::FunctionHandler<Payload, Fn>>(
      std::move(consumer), std::move(recorder), std::move(fn), std::move(options));
}

}  // namespace idem
