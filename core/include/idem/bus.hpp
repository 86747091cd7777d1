// Bus: an in-process publish/subscribe bus with at-least-once delivery.
//
// Handlers subscribe to an event type under a consumer name; publish() fans an event out to
// every consumer subscribed to its type, one delivery each (so each consumer keeps its own
// idempotency markers). Deliveries run on worker threads:
//   * the handler returns (processed or duplicate) → the delivery is acknowledged;
//   * the handler throws → the event is delivered again after a backoff (initial_backoff,
//     × backoff_multiplier per attempt, at most max_backoff), up to max_attempts deliveries,
//     then on_dead_letter is called with the event, the consumer, the attempt count and the last
//     error;
//   * the handler throws AlreadyInProgress (an exclusive-mode duplicate while the original is
//     still running) → requeued with the same backoff schedule, not counted as a failed attempt.
//     So that a claim that is never released cannot cycle forever, such requeues are bounded by
//     max_in_progress_requeues (generous: ~1000 s of waiting at the default 1 s cap, far past
//     the 30 s default lease after which a crashed owner's claim is taken over); past it the
//     delivery is dead-lettered.
// Handlers publish follow-up events through the BusProxy they are given; such events are
// enqueued, never delivered on the publishing handler's stack.
//
// Backoff waits go through the injected Clock (Clock::sleep_for on the bus's timer thread), so a
// ManualClock makes them instant and records them in ManualClock::sleeps().
//
// Not durable: the bus is memory only. Events still queued or waiting for a retry when the Bus
// is destroyed are dropped, and nothing survives a crash. It is for wiring handlers inside one
// process and for tests; for durable delivery put a broker in front of the same handlers.
//
// Ordering: with one worker thread first deliveries run in publish order; retries, and several
// workers, reorder. Handlers must not rely on order.
//
// Thread-safety: every member may be called from any thread, including from handlers (publish,
// subscribe, stats) — except wait_idle(), which a handler must not call (it would wait for its
// own delivery: InvalidArgument). Handlers may run concurrently on several workers. The
// destructor waits for running handlers to return, then drops the rest; do not call other
// members while it runs.
//
// fork(): a Bus made before fork() belongs to the parent: in a child subscribe(), publish() and
// wait_idle() throw ConfigError. Destroying it there is safe (its threads are the parent's and
// are abandoned, not joined); the handlers it holds are not destroyed with it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "idem/clock.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"

namespace idem {

// A delivery the bus gave up on.
struct DeadLetter {
  Event event;
  std::string consumer;
  int attempts = 0;          // failed deliveries (AlreadyInProgress requeues are not counted)
  std::exception_ptr error;  // the last error the handler threw
  std::string reason;        // its what(), for logging
};

struct BusOptions {
  // Deliveries of one event to one consumer before it is dead-lettered. Default 5; at least 1.
  int max_attempts = 5;
  // Wait before the first redelivery. Default 10 ms; 0 redelivers at once.
  Millis initial_backoff = std::chrono::milliseconds(10);
  // Each further wait is the previous one times this. Default 2.0; at least 1.0.
  double backoff_multiplier = 2.0;
  // Upper bound of any wait. Default 1 s.
  Millis max_backoff = std::chrono::seconds(1);
  // AlreadyInProgress requeues of one delivery before it is dead-lettered. Default 1000.
  int max_in_progress_requeues = 1000;
  // Delivery threads. Default 1; at least 1.
  std::size_t worker_threads = 1;
  // Backoff waits go through clock->sleep_for. Default (null): idem::system_clock().
  std::shared_ptr<Clock> clock = nullptr;
  // Called on a worker thread for each dead letter. Default: none (the event is dropped).
  // Exceptions it throws are swallowed.
  std::function<void(const DeadLetter&)> on_dead_letter = nullptr;
};

struct BusStats {
  std::uint64_t published = 0;             // publish() calls, follow-ups from handlers included
  std::uint64_t unrouted = 0;              // published events nobody subscribed to (dropped)
  std::uint64_t delivered = 0;             // deliveries acknowledged (processed or duplicate)
  std::uint64_t duplicates = 0;            // of those, HandleResult::duplicate
  std::uint64_t redeliveries = 0;          // deliveries scheduled again after the handler threw
  std::uint64_t dead_lettered = 0;         // deliveries given up
  std::uint64_t in_progress_requeued = 0;  // AlreadyInProgress requeues
};

class Bus {
 public:
  // Throws ConfigError for unusable options. Starts the worker and timer threads.
  explicit Bus(BusOptions options = {});
  // Stops the threads after running handlers return; undelivered events are dropped.
  ~Bus();

  Bus(const Bus&) = delete;
  Bus& operator=(const Bus&) = delete;

  // Delivers events of `event_type` to `handler` under handler->consumer(). A consumer name may
  // subscribe to a type once (InvalidArgument otherwise). Applies to events published after.
  void subscribe(std::string event_type, std::shared_ptr<EventHandler> handler);
  // A plain handler without idempotency: every delivery runs fn (returns → processed). Useful
  // when fn is naturally idempotent; otherwise subscribe an IdempotentHandler.
  void subscribe(std::string event_type, std::string consumer,
                 std::function<void(const Event&, BusProxy&)> fn);

  // Enqueues one delivery per consumer subscribed to event.type and returns. The event id must
  // be a valid key (InvalidKey) and the type non-empty (InvalidArgument). After destruction has
  // begun, events are dropped.
  void publish(Event event);

  // Blocks until no delivery is queued, waiting for a retry, or running — including deliveries
  // of events published by handlers meanwhile.
  void wait_idle();

  BusStats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace idem
