// Idempotent execution of one call per key: join, replay, or execute.
//
// IdempotencyCoordinator sits between a resilient operation and an IdempotencyStore and decides,
// for each call with a key, whether it
//   * executes  — it claimed the key; it runs the whole resilience lifecycle (retries, timeout,
//                 breaker, fallbacks) once, then completes (success) or releases (failure);
//   * joins     — another caller in this process is executing the same key right now: it waits
//                 for that execution and gets its value or its exception (no store round trip,
//                 no serialization, no retries or fallbacks of its own);
//   * replays   — a completed record is live: it gets the stored value and the original report.
// Failures are never cached. While the owner runs, its lease is renewed in the background, so
// only a dead owner's claim is ever taken over.
//
// Callers in other processes that find the key IN_PROGRESS either wait (bounded) and then replay
// or execute, or get AlreadyInProgress — IdempotencyPolicy::in_progress decides.
//
// The coordinator is type-erased (values travel as std::shared_ptr<const void>); the typed
// front-ends (idem::resilient, idem::operation) wrap it.
//
// Thread-safety: IdempotencyCoordinator is safe to share between threads. One coordinator
// exists per store instance (for_store), so every callable using a store joins the others.
//
// fork(): the registry behind for_store() and the default store are per process, so a child of
// fork() starts with neither the parent's coordinators nor its in-memory results. A coordinator
// made before fork() (and so every keyed resilient()/operation() callable made before it) throws
// ConfigError from run() in the child, before its store is touched; it may be destroyed there
// (its heartbeat thread is the parent's and is abandoned, not joined) — docs/guarantees.md §9.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/report.hpp"

namespace idem {

namespace detail {
struct FlightEntry;
class FlightWaiter;
}  // namespace detail

enum class IdempotencyStatus { executed, joined, replayed };

// "executed", "joined", "replayed".
std::string_view to_string(IdempotencyStatus status) noexcept;

// What a caller does when the key is IN_PROGRESS in another process (no in-process owner).
enum class InProgressPolicy {
  wait,    // wait (bounded by max_wait) for the owner, then replay its result or execute
  reject,  // throw AlreadyInProgress at once
};

struct IdempotencyPolicy {
  // The store. Null: the process-wide default InMemoryIdempotencyStore.
  std::shared_ptr<IdempotencyStore> store{};
  // How long a successful result is replayed, counted from completion. Default 1 h.
  Millis ttl = std::chrono::hours(1);
  // The owner's lease. Renewed every lease/3 while the owner runs, so it only has to outlive a
  // stalled renewal, not the operation. Default 30 s.
  Millis lease = std::chrono::seconds(30);
  // Callers that find the key in progress in another process. Default: wait.
  InProgressPolicy in_progress = InProgressPolicy::wait;
  // The longest a caller waits for another process's owner before AlreadyInProgress. 30 s.
  Millis max_wait = std::chrono::seconds(30);
  // Time source for the coordinator's waits (max_wait, wait_deadline) and the lease renewal
  // schedule (every lease/3). Leases and expiries themselves are decided by the store with the
  // store's clock. Default (null): the system clock.
  std::shared_ptr<Clock> clock{};
};

// Encodes/decodes the typed value for stores that need bytes (see codec.hpp). Unused by
// in-process stores.
struct ErasedCodec {
  std::function<std::string(const void* object)> encode;  // object may be null (void)
  std::function<std::shared_ptr<const void>(std::string_view bytes)> decode;
};

// The owner's successful outcome, handed back to the coordinator.
struct Execution {
  std::shared_ptr<const void> value;  // null for void operations
  ExecutionReport report;
};

// What the coordinator gives every caller.
struct CoordinatedResult {
  std::shared_ptr<const void> value;
  ExecutionReport report;  // idempotency_* metadata merged in
  IdempotencyStatus status = IdempotencyStatus::executed;
  // executed only: this caller's claim took over the claim of an owner whose lease had passed
  // (it crashed or stalled; its work may have run in part). False for joiners and replays.
  bool took_over = false;
  // False when the store did not record the success (the claim was fenced off by a takeover,
  // or complete() failed): the value is real, but a later caller with this key executes again.
  // Joiners share the owner's flag; replays are always recorded.
  bool recorded = true;
};

// Keeps a failed execution's key claimed while work it started is still running (an attempt
// that timed out but did not stop). The executor calls retain() and hands the token to that
// work; the key is released only when execute() has returned/thrown AND every token is gone.
// New callers meanwhile join nothing (the owner already failed); they wait for the release and
// then execute — never beside the lingering attempt.
class ClaimHold {
 public:
  virtual ~ClaimHold() = default;
  virtual std::shared_ptr<void> retain() = 0;
};

// Per-call parameters.
struct IdempotentCall {
  std::string key{};                          // validated with validate_key()
  std::optional<std::string> fingerprint{};   // of the arguments, see fingerprint.hpp
  const ErasedCodec* codec = nullptr;         // required when the store needs bytes
  std::optional<std::type_index> type{};      // the value type, checked on replay
  std::stop_token stop{};                     // a waiter stops waiting (Cancelled); never the owner
  std::optional<SteadyTime> wait_deadline{};  // a waiter gives up then (TimeoutError); policy.clock
  std::string operation{};                    // operation name, for messages and events
  // The key as the caller's key function returned it, before scoping: what messages and
  // KeyReuseError::key() name. Empty: `key`.
  std::string caller_key{};
};

// Re-entrancy is detected per execution context: the keys owned by the current thread. Work
// that an owner moves to another thread (an attempt run under a timeout) carries the context
// along with these two calls, so a nested call with the same key from there is caught too. The
// async face makes every handler of an owner's coroutine run with its context current
// (detail::FlightLead::owned_keys()).
class OwnedKeys;
std::shared_ptr<const OwnedKeys> current_owned_keys();
class OwnedKeysScope {
 public:
  explicit OwnedKeysScope(std::shared_ptr<const OwnedKeys> keys);
  ~OwnedKeysScope();
  OwnedKeysScope(const OwnedKeysScope&) = delete;
  OwnedKeysScope& operator=(const OwnedKeysScope&) = delete;

 private:
  std::shared_ptr<const OwnedKeys> previous_;
};

class IdempotencyCoordinator {
 public:
  virtual ~IdempotencyCoordinator() = default;

  // The coordinator for `store` (created on first use, shared by every caller of that store
  // instance). A null store means the process-wide default InMemoryIdempotencyStore.
  static std::shared_ptr<IdempotencyCoordinator> for_store(std::shared_ptr<IdempotencyStore> store);

  // Runs `execute` at most once among concurrent callers with the same key and replays its
  // success for policy.ttl. Throws: KeyReuseError (fingerprint mismatch, nothing run),
  // ReentryError (this execution context already owns `key`), AlreadyInProgress (reject policy
  // or max_wait passed), Cancelled / TimeoutError (a waiter gave up), StoreError, and whatever
  // `execute` threw (for the owner and its joiners alike, any exception type).
  virtual CoordinatedResult run(const IdempotencyPolicy& policy, const IdempotentCall& call,
                                const std::function<Execution(ClaimHold&)>& execute) = 0;

  // How many callers are waiting in this coordinator on `key` right now: joiners of a running
  // execution, and new callers waiting for a failed execution's key to be released. For tests
  // and diagnostics (e.g. hold an owner until N joiners wait).
  virtual std::size_t waiters(std::string_view /*key*/) const { return 0; }

  // The non-blocking entry (see detail::FlightLead): leads the key's flight, or lists `waiter`
  // on it (to be notified once). Throws KeyReuseError / DecodeError when the running flight has
  // other arguments or another value type, ReentryError as run() does (this thread's owned keys),
  // InvalidKey; `waiter` is then not listed. Only call.key, fingerprint, type and operation are
  // read; a waiter's stop and deadline are the caller's business (FlightWaiter::detach()).
  // Default: NotSupported. Used by the async face; the types are in idem/detail/flight.hpp, a
  // header internal to idem (core/internal/, not installed).
  virtual detail::FlightEntry enter(const IdempotentCall& call,
                                    std::shared_ptr<detail::FlightWaiter> waiter);
};

// A coordinator with no store of its own: only the in-process flight table (enter()); run()
// throws ConfigError. For an async store without a blocking twin (AsyncStore::blocking_store()
// null), whose coroutine callers still join each other in this process.
std::shared_ptr<IdempotencyCoordinator> make_in_process_coordinator();

// A coordinator of its own over `store` (null: the default store), not shared with for_store()
// or with other make_idempotency_coordinator() results: callers of two such coordinators meet
// only through the store, exactly like two processes. For tests that simulate another process,
// and for isolating a subsystem.
std::shared_ptr<IdempotencyCoordinator> make_idempotency_coordinator(
    std::shared_ptr<IdempotencyStore> store);

}  // namespace idem
