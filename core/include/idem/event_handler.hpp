// EventHandler: what a transport (the in-process Bus, the RabbitMQ consumer, a user's own) calls
// for each delivery, and BusProxy, what a handler may do with the bus that delivered it.
//
// A transport hands each delivery to an EventHandler and settles it by the outcome: a
// HandleResult (processed or duplicate) means acknowledge; an exception means do not
// acknowledge, deliver again later. IdempotentHandler (handler.hpp) is the EventHandler that
// runs its side effects once; any other EventHandler runs them every time it is called.
//
// Thread-safety: a transport may call one EventHandler from many threads at once (the Bus does
// with several workers), so implementations must be thread-safe. CollectingBusProxy is.
#pragma once

#include <exception>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/event.hpp"

namespace idem {

class Transaction;

// What one call did.
enum class HandleResult {
  processed,  // handle ran and the event is now marked processed
  duplicate,  // the event was already processed for this consumer; handle did not run
};
std::string_view to_string(HandleResult result) noexcept;

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

}  // namespace idem
