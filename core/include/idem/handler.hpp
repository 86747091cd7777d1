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
// Payloads are decoded with idem::Codec<Payload> (codec.hpp); a payload that does not decode
// throws DecodeError, marks nothing, and so is redelivered (and in the end dead-lettered by the
// bus). Consumer names are validated at construction and event ids on every call (InvalidKey;
// nothing is marked and handle does not run).
//
// Thread-safety: an IdempotentHandler may be called from many threads at once (the Bus does);
// `handle` then runs concurrently for different events, so it must be thread-safe itself. In
// exclusive mode the handler owns one background heartbeat thread, started on first use and
// joined by the destructor; do not destroy a handler while a call is running.
//
// fork(): a handler made before fork() belongs to the parent: called in a child it throws
// ConfigError. It may be destroyed there (its lease keeper's thread is the parent's and is
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

#include "idem/clock.hpp"
#include "idem/codec.hpp"
#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/recorder.hpp"

namespace idem {

class Outbox;

enum class HandlerMode {
  automatic,        // exclusive when recorder->supports_claims(), else check_then_mark
  check_then_mark,  // is_processed → drop; else handle; success → mark_processed
  exclusive,        // atomic claim with a lease before handle; concurrent duplicate → throws
                    // AlreadyInProgress
  transactional,    // handle and marker commit in one recorder transaction
};
std::string_view to_string(HandlerMode mode) noexcept;

struct HandlerOptions {
  // Which protocol to run. Default: automatic (exclusive when the recorder supports claims).
  HandlerMode mode = HandlerMode::automatic;
  // Exclusive mode: the claim's lease, renewed every lease/3 while handle runs. It only has to
  // outlive a stalled renewal, not the handler. Must be positive. Default 30 s.
  Millis lease = std::chrono::seconds(30);
  // Time for the heartbeat schedule. Default (null): idem::system_clock(). (Lease deadlines
  // themselves are computed by the recorder with its own clock.)
  std::shared_ptr<Clock> clock = nullptr;
  // Transactional mode only (ConfigError otherwise): events the handler publishes are written to
  // this outbox, on the recorder's database, in the handler's transaction, and relayed after the
  // commit by an OutboxRelay (idem/outbox.hpp). An event published with an empty id gets
  // follow_up_id(consumer, incoming event id, n), n counting the run's publishes from 0. Default
  // (null): held back and handed to the caller's BusProxy after the commit.
  std::shared_ptr<Outbox> outbox = nullptr;
};

// What one call did.
enum class HandleResult {
  processed,  // handle ran and the event is now marked processed
  duplicate,  // the event was already processed for this consumer; handle did not run
};
std::string_view to_string(HandleResult result) noexcept;

// Exclusive mode: handle ran, but complete() refused the token because another delivery took
// the claim over after this one's lease lapsed (a stall longer than the lease). This delivery did
// not write the marker, and the new owner may run the side effect as well. Retryable (redeliver:
// the event is then dropped once the new owner completes) and in doubt (the side effect ran).
class LeaseLost : public Error {
 public:
  explicit LeaseLost(const std::string& message)
      : Error(ErrorCode::already_in_progress, message, /*retryable=*/true, /*in_doubt=*/true) {}
};

// What a handler can do with the bus that delivered the event.
class BusProxy {
 public:
  virtual ~BusProxy() = default;
  // Publishes a follow-up event. The Bus enqueues it (never delivers on the caller's stack).
  virtual void publish(Event event) = 0;
  // The consumer name being served.
  virtual std::string_view consumer() const = 0;
  // The backend transaction (transactional mode only); null otherwise.
  virtual Transaction* transaction() noexcept { return nullptr; }
};

// What one event of a batch came to: exactly one of the two is set.
struct HandleOutcome {
  std::optional<HandleResult> result;  // handled: processed or duplicate (ack it)
  std::exception_ptr error;            // what operator() would have thrown for it (do not ack)
};

// The type-erased handler a bus (or any transport) calls.
class EventHandler {
 public:
  virtual ~EventHandler() = default;
  virtual const std::string& consumer() const noexcept = 0;
  // Returns processed/duplicate. Throws AlreadyInProgress (do not ack, redeliver later) or
  // whatever the business code threw (do not ack, redeliver).
  virtual HandleResult operator()(const Event& event, BusProxy& bus) = 0;
  // A window of deliveries at once (the RabbitMQ consumer passes what the broker prefetched):
  // outcomes[i] is what events[i] came to, with the meaning of operator()'s result or exception.
  // The transport settles the events after the call returns. Events run in order, on the
  // calling thread. Default: operator() for each event. IdempotentHandler in check_then_mark
  // mode overrides it to check the whole window with one is_processed_many and mark its
  // successes with one mark_processed_many (see there for the window this widens).
  virtual std::vector<HandleOutcome> handle_batch(std::span<const Event> events, BusProxy& bus);
};

// A BusProxy that keeps what is published, for running handlers outside a bus and in tests.
// Thread-safe.
class CollectingBusProxy : public BusProxy {
 public:
  explicit CollectingBusProxy(std::string consumer = "collector");

  void publish(Event event) override;
  std::string_view consumer() const override { return consumer_; }

  // A copy of everything published so far, in order.
  std::vector<Event> published() const;
  // Everything published so far, leaving the proxy empty.
  std::vector<Event> take();

 private:
  std::string consumer_;
  mutable std::mutex mutex_;
  std::vector<Event> published_;
};

namespace detail {

class LeaseKeeper;

// The mode logic of IdempotentHandler, compiled once for every Payload type.
class HandlerCore {
 public:
  HandlerCore(std::string consumer, std::shared_ptr<IdempotencyRecorder> recorder,
              HandlerOptions options);
  ~HandlerCore();
  HandlerCore(const HandlerCore&) = delete;
  HandlerCore& operator=(const HandlerCore&) = delete;

  const std::string& consumer() const noexcept { return consumer_; }
  HandlerMode mode() const noexcept { return mode_; }

  // Runs the protocol of mode() around `invoke`, which decodes the payload and calls handle
  // with the proxy it is given.
  HandleResult run(const Event& event, BusProxy& bus, const std::function<void(BusProxy&)>& invoke);

  // The batch form (EventHandler::handle_batch): check_then_mark checks and marks the window
  // with one recorder call each; the other modes run() each event.
  std::vector<HandleOutcome> run_batch(std::span<const Event> events, BusProxy& bus,
                                       const std::function<void(const Event&, BusProxy&)>& invoke);

 private:
  HandleResult run_check_then_mark(const Event& event, BusProxy& bus,
                                   const std::function<void(BusProxy&)>& invoke);
  HandleResult run_exclusive(const Event& event, BusProxy& bus,
                             const std::function<void(BusProxy&)>& invoke);
  HandleResult run_transactional(const Event& event, BusProxy& bus,
                                 const std::function<void(BusProxy&)>& invoke);
  LeaseKeeper& keeper();
  // ConfigError in a child of fork(): the handler (its recorder, its LeaseKeeper thread) is the
  // parent's.
  void check_process() const;

  detail::ForkOwner owner_;
  std::string consumer_;
  std::shared_ptr<IdempotencyRecorder> recorder_;
  HandlerMode mode_;
  Millis lease_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<Outbox> outbox_;
  std::once_flag keeper_once_;
  std::unique_ptr<LeaseKeeper> keeper_;
};

// Codec<Payload>::decode, with any failure reported as DecodeError naming the event.
[[noreturn]] void throw_payload_decode_error(const Event& event, std::string_view consumer,
                                             std::string_view reason);

template <class Payload>
Payload decode_payload(const Event& event, std::string_view consumer) {
  static_assert(HasCodec<Payload>,
                "no idem::Codec for this Payload: give it to_json/from_json or specialise "
                "idem::Codec");
  try {
    return Codec<Payload>::decode(event.payload);
  } catch (const Error& e) {
    throw_payload_decode_error(event, consumer, e.what());
  } catch (const std::exception& e) {
    throw_payload_decode_error(event, consumer, e.what());
  }
}

}  // namespace detail

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
