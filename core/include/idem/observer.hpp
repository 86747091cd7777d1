// Observer: what idem tells a monitoring system, on both faces, blocking and async alike.
//
// One interface for everything idem decides:
//   * on_delivery — an idempotent consumer (IdempotentHandler, AsyncIdempotentHandler, and so
//     every transport that calls them: idem::Bus, idem::rabbitmq::Consumer) handled one delivery:
//     processed, duplicate (dropped), failed, or in_progress (another delivery holds its claim;
//     not acknowledged), with how long `handle` ran when it ran;
//   * on_call — a call of a resilient operation (idem::resilient, idem::operation and their
//     async twins) ended: executed, joined, replayed, failed, timed out, cancelled, rejected by the
//     circuit breaker or a rate limit, rejected because the key is in progress elsewhere or was
//     reused with other arguments, or another error; with how long the call took.
//
// Attach one with HandlerOptions::observer, ResilientOptions::observer or
// Operation::with_observer. idem::Metrics (metrics.hpp) is an Observer that keeps counters and
// duration histograms and writes them in the Prometheus text format; implement Observer to feed
// anything else (docs/observability.md bridges it to OpenTelemetry).
//
// Cost: with no observer set, a delivery or a call pays one null check. With one, a delivery
// or call reads the clock twice and makes one virtual call.
//
// Guarantees: an observer that throws never breaks the delivery or call it observes; the
// exception is swallowed and counted (observer_failures()).
//
// Thread-safety: on_delivery and on_call are called concurrently from every thread (and
// executor) that runs a handler or an operation, so an Observer must be safe for that. The
// string_views in an observation are valid only during the call.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace idem {

// What one delivery came to.
enum class DeliveryOutcome {
  processed,    // handle ran and the event is marked processed
  duplicate,    // already processed for this consumer: dropped, handle did not run
  failed,       // handle (or the recorder, or decoding the payload) threw: not marked
  in_progress,  // another delivery holds the event's claim (AlreadyInProgress): not acknowledged
};
inline constexpr std::size_t kDeliveryOutcomeCount = 4;
// "processed", "duplicate", "failed", "in_progress".
std::string_view to_string(DeliveryOutcome outcome) noexcept;

struct DeliveryObservation {
  std::string_view consumer{};
  std::string_view event_id{};
  DeliveryOutcome outcome = DeliveryOutcome::processed;
  // How long `handle` ran (processed, or failed while handling); unset when it did not run.
  // Measured on HandlerOptions::clock (default: the system clock's steady time).
  std::optional<std::chrono::nanoseconds> handler_duration{};
};

// What one call of a resilient operation came to.
enum class CallOutcome {
  executed,               // ran (retries, fallbacks and all) and succeeded
  joined,                 // shared the result of a call with the same key in flight
  replayed,               // returned a stored result of an earlier call with the same key
  failed,                 // OperationError: retries and fallbacks exhausted
  timed_out,              // the last attempt timed out, or a waiter gave up at its deadline
  cancelled,              // the caller cancelled the call or its wait
  rejected_circuit_open,  // the circuit breaker refused the last attempt
  rejected_rate_limit,    // rate limited, and the wait before a retry was too long
  rejected_in_progress,   // the key is in progress in another process (AlreadyInProgress)
  rejected_key_reuse,     // the key was used before with other arguments (KeyReuseError)
  error,                  // anything else: a bad key, a store error, a re-entry, ...
};
inline constexpr std::size_t kCallOutcomeCount = 11;
// "executed", "joined", ..., "rejected_key_reuse", "error".
std::string_view to_string(CallOutcome outcome) noexcept;

struct CallObservation {
  std::string_view operation{};
  CallOutcome outcome = CallOutcome::executed;
  // From the call to its result or error, on the operation's clock (ResilientOptions::clock).
  std::chrono::nanoseconds duration{0};
  // The call had an idempotency key (executed, joined and replayed then say what the key did).
  bool keyed = false;
};

class Observer {
 public:
  virtual ~Observer() = default;
  // May throw; idem swallows and counts the exception.
  virtual void on_delivery(const DeliveryObservation& /*observation*/) {}
  virtual void on_call(const CallObservation& /*observation*/) {}
};

// How many exceptions observers have thrown (and idem swallowed) in this process.
std::uint64_t observer_failures() noexcept;

namespace detail {
// Calls the observer, swallowing (and counting) what it throws.
void notify(Observer& observer, const DeliveryObservation& observation) noexcept;
void notify(Observer& observer, const CallObservation& observation) noexcept;
}  // namespace detail

}  // namespace idem
