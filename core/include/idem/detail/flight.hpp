// The coordinator's non-blocking entry, used by the async face (idem/async/resilient.hpp):
// IdempotencyCoordinator::enter() and what it hands back. Internal: users call resilient() /
// operation() or their async twins, or IdempotencyCoordinator::run().
//
// enter() never blocks and never touches a store: it only places the caller in the key's
// in-process flight, the same table run() uses, so blocking callers and enter() callers of one
// key join one execution whichever of them leads. A leader does the store work itself (through
// whatever store protocol it has) and reports each step to its FlightLead; a waiter gets one
// callback when the flight it waits on ends.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <mutex>

#include "idem/idempotency.hpp"
#include "idem/idempotency_store.hpp"

namespace idem::detail {

// The ClaimHold an owner hands to execute(): retain() shares `owner` (whose destructor releases
// the key when the execution failed) until drop(), the owner's own let-go once execute() ended.
class SharedClaimHold final : public ClaimHold {
 public:
  explicit SharedClaimHold(std::shared_ptr<void> owner) : owner_(std::move(owner)) {}
  std::shared_ptr<void> retain() override;
  void drop();

 private:
  std::mutex mutex_;
  std::shared_ptr<void> owner_;
};

// What a waiter is told, once.
struct FlightOutcome {
  enum class Kind {
    result,      // the owner's success or a replay: `result` (idempotency metadata merged in)
    error,       // the owner's failure (or its store's error): `error`
    start_over,  // nothing to share (a failed owner's key was released, a leader gave up):
                 // enter() again
  };
  Kind kind = Kind::start_over;
  CoordinatedResult result{};
  std::exception_ptr error{};
};

// Called once, on the thread that ends the flight (a blocking owner's thread, or wherever an
// async leader reports), never under a coordinator lock. It must not block: the async face
// posts the outcome to the waiter's executor.
using FlightCallback = std::function<void(FlightOutcome)>;

// The leader's side of a flight. Exactly one of replay / abandon / succeeded / failed is called
// (replay and abandon may be preceded by nothing else; failed is followed by released).
// Thread-safety: one leader calls these, from any thread.
class FlightLead {
 public:
  virtual ~FlightLead() = default;
  // A live completed record: the replay for this caller and its joiners. Throws DecodeError (a
  // stored value of another type, or bytes without a codec), after ending the flight.
  virtual CoordinatedResult replay(IdempotencyRecord record) = 0;
  // Ends the flight without executing: joiners get `error`, or start over when it is null.
  virtual void abandon(std::exception_ptr error) = 0;
  // The owner succeeded; `recorded` is what complete() answered. Joiners share the result.
  virtual CoordinatedResult succeeded(Execution execution, bool recorded, bool took_over) = 0;
  // The owner failed: joiners get `error` now; new callers wait until released().
  virtual void failed(std::exception_ptr error) = 0;
  // The failed owner's claim is released in the store (or given up on): waiting callers start
  // over.
  virtual void released() = 0;
  // The execution context of this leader's execution: the keys owned where enter() was called,
  // plus this key. Code of the execution that runs with it current (OwnedKeysScope) and calls
  // the same key again gets ReentryError instead of waiting for itself.
  virtual std::shared_ptr<const OwnedKeys> owned_keys() const { return nullptr; }
};

// A waiter's registration. detach() withdraws it (the caller stopped waiting); after detach()
// returns the callback is not called, unless it was already running.
class FlightWait {
 public:
  virtual ~FlightWait() = default;
  virtual void detach() = 0;
};

struct FlightEntry {
  std::shared_ptr<FlightLead> lead;  // set: this caller leads the flight
  std::shared_ptr<FlightWait> wait;  // set: this caller waits; the callback will be called
};

}  // namespace idem::detail
