// The coordinator's non-blocking entry, used by the async face (idem/async/resilient.hpp):
// IdempotencyCoordinator::enter() and what it hands back. Internal: users call resilient() /
// operation() or their async twins, or IdempotencyCoordinator::run().
//
// enter() never blocks and never touches a store: it only places the caller in the key's
// in-process flight, the same table run() uses, so blocking callers and enter() callers of one
// key join one execution whichever of them leads. A leader does the store work itself (through
// whatever store protocol it has) and reports each step to its FlightLead; a waiter is told once,
// through its FlightWaiter, when the flight it waits on ends.
//
// Memory: a waiter costs the coordinator one FlightWaiter (the caller's object, which holds its
// registration, so the caller can make registration and completion one allocation) and one
// slot in the flight's list; the outcome is built once per flight and shared by every waiter.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "idem/clock.hpp"
#include "idem/error.hpp"
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
    result,      // the owner's success or a replay: `result`
    error,       // the owner's failure (or its store's error): `error`
    start_over,  // nothing to share (a failed owner's key was released, a leader gave up):
                 // enter() again
  };
  Kind kind = Kind::start_over;
  // The flight's result as every joiner gets it (status joined or replayed, idempotency
  // metadata merged in): built once per flight, shared by all its waiters. Copy what you keep.
  std::shared_ptr<const CoordinatedResult> result{};
  std::exception_ptr error{};
};

struct FlightAccess;

// A waiter that entered through enter(): the caller's object, held by the flight from enter()
// until it is told (notify) or withdraws (detach). It carries its own registration, so the
// coordinator allocates nothing per waiter beyond a slot in the flight's list.
class FlightWaiter {
 public:
  FlightWaiter() = default;
  FlightWaiter(const FlightWaiter&) = delete;
  FlightWaiter& operator=(const FlightWaiter&) = delete;
  virtual ~FlightWaiter() = default;

  // Withdraws this waiter (its caller stopped waiting): after detach() returns, notify() is not
  // called unless it already was (or is running). Any thread; a second call does nothing.
  void detach();

  // Called once, on the thread that ends the flight (a blocking owner's thread, or wherever an
  // async leader reports), never under a coordinator lock. It must neither block nor throw: the
  // async face posts the outcome to the waiter's executor.
  virtual void notify(FlightOutcome outcome) noexcept = 0;

 private:
  friend struct FlightAccess;  // the coordinator's bookkeeping (core/src/idempotency.cpp)
  static constexpr std::size_t kUnlisted = static_cast<std::size_t>(-1);
  std::shared_ptr<void> flight_;   // set by enter(), before the waiter is listed; then constant
  std::size_t index_ = kUnlisted;  // its slot in the flight's list (the flight's mutex)
  bool joining_ = false;           // found the flight running (else: waits for a release)
};

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
  // The leader acquired the key in the store with `token` at `at`: what a joiner refused for
  // other arguments is told about the holder.
  virtual void claimed(std::uint64_t /*token*/, WallTime /*at*/) {}
  // The execution context of this leader's execution: the keys owned where enter() was called,
  // plus this key. Code of the execution that runs with it current (OwnedKeysScope) and calls
  // the same key again gets ReentryError instead of waiting for itself.
  virtual std::shared_ptr<const OwnedKeys> owned_keys() const { return nullptr; }
};

// The errors of the idempotency layer, shared by both faces' leaders. Each names the operation
// (IdempotentCall::operation) and the caller's key (IdempotentCall::caller_key, else key), and
// the claim that holds the key from `record`: its fencing token, and when it started and
// completed or until when its lease runs.
// A live record with another fingerprint (ClaimOutcome::mismatch).
KeyReuseError key_reuse_error(const IdempotentCall& call, const IdempotencyRecord* record);
// A live claim of another process: rejected at once (`waited` unset) or after waiting that long.
AlreadyInProgress in_progress_error(const IdempotentCall& call, const IdempotencyRecord* record,
                                    std::optional<Millis> waited = std::nullopt);
// "operation 'create_payment': idempotency key 'request-123'" (or without the operation).
std::string key_subject(const IdempotentCall& call);

struct FlightEntry {
  // Set: this caller leads the flight. Null: its FlightWaiter is listed and will be notified
  // (perhaps already was, during enter()).
  std::shared_ptr<FlightLead> lead;
};

}  // namespace idem::detail
