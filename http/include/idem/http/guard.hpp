// idem::http::Guard: HTTP idempotency (the Idempotency-Key draft, Stripe's semantics) for any
// server, on an idem::async::AsyncStore — memory, SQLite, Redis or PostgreSQL.
//
//   idem::http::Guard guard(store, options);
//   idem::http::Decision decision = co_await guard.begin(request);
//   if (decision.action() == idem::http::Decision::Action::respond) {
//     send(decision.response());                   // a replay, or a 400/409/422/503 problem
//   } else {
//     idem::http::Response upstream = co_await run_handler(request);   // the real work
//     send(co_await decision.finish(std::move(upstream)));   // kept or released, per policy
//   }
//
// begin() inspects the request (rules.hpp: route, key, principal, fingerprint) and claims its
// store key. Then:
//   * acquired           forward: the decision holds the claim, renewed every lease/3 until
//                        finish() or release(); if the process dies, another takes it over
//                        after the lease (never "pending forever")
//   * completed          the route's after_finished: replay the kept response (its status,
//                        stored fields and body, plus Idempotent-Replayed: true), or 409
//                        key-spent under `reject`
//   * in progress        while_running: wait (poll the store with backoff, up to max_wait, then
//                        decide again — a replay, or the claim if the first request released it)
//                        or 409 in-progress at once; 409 too when max_wait passes
//   * mismatch           422 fingerprint-mismatch, whichever state the record is in, also when a
//                        wait ends in a record of another request
//   * store error        503 store-unavailable (fail closed: nothing is forwarded)
//
// With GuardOptions::replay_cache on, a replay is remembered in the process for up to its
// max_age (and never past the record's expiry): a duplicate of that key then gets the same replay
// (or, with another fingerprint, the same 422) without a store round trip. A miss, a stale entry
// or the cache off take the path above.
//
// finish() classifies the upstream response (outcome_of): a kept outcome is completed in the
// store for the route's ttl (its response then carries Idempotency-Key-Expires); any other,
// or a body above max_stored_body, releases the key so the next request runs again. release()
// is for no response at all (upstream down, timed out). A Decision destroyed holding its claim
// releases it in the background.
//
// Thread-safety: a Guard may be shared by any number of coroutines on any executors (its replay
// cache is under a mutex). A Decision
// belongs to one request: use it from one coroutine at a time. begin() keeps a reference to
// `request` until it completes (pass a named object, as for every idem coroutine).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/clock.hpp"
#include "idem/http/message.hpp"
#include "idem/http/options.hpp"
#include "idem/http/rules.hpp"

namespace idem::http {

// What the Guard reports, once per event, to GuardHooks::observer (metrics, logs).
struct GuardEvent {
  enum class Kind {
    passed,    // forwarded unguarded (no route, or no key on an optional route)
    claimed,   // forwarded holding the key's claim (took_over: after a dead owner's lease)
    waiting,   // found the key's request running and began to wait for it (once per request)
    replayed,  // answered from the store (waited: after waiting for the first request)
    refused,   // answered with a problem (`refusal`)
    kept,      // finish() completed the record
    released,  // the claim was given up (finish() of an outcome not kept, release(), drop)
    fenced,    // finish() or a renewal found the claim taken over by another owner
  };
  Kind kind = Kind::passed;
  std::string_view route;                  // the route's name ("" when none matched)
  std::string_view key_digest;             // "" when unguarded
  Refusal refusal = Refusal::key_missing;  // refused
  int status = 0;           // replayed, kept, released: the response's status (0: none)
  bool waited = false;      // replayed/refused/claimed after waiting for a running request
  bool took_over = false;   // claimed
  bool cached = false;      // replayed, refused (mismatch): from the replay cache, not the store
  std::uint64_t token = 0;  // claimed, kept, released, fenced: the fencing token
};

struct GuardHooks {
  // Called on the coroutine's thread for every event; must not throw (an exception is dropped).
  std::function<void(const GuardEvent&)> observer;
  // Time for the waits, the lease renewals and the expiry fields. Default: the system clock. A
  // clock other than the SystemClock owns time, as in idem::async::resilient: a wait for
  // another request's claim polls the store and sleeps on this clock (a ManualClock advances at
  // once). Leases and expiries are decided by the store with its own clock.
  std::shared_ptr<Clock> clock;
};

class Decision;

class Guard {
 public:
  // Throws ConfigError (validate(options)) and InvalidArgument for a null store.
  Guard(std::shared_ptr<async::AsyncStore> store, GuardOptions options, GuardHooks hooks = {});
  ~Guard();
  Guard(const Guard&) = delete;
  Guard& operator=(const Guard&) = delete;

  // Decides about `request` (see above). Never throws for the request's content or a store
  // failure (those are responses); throws asio::system_error(operation_aborted) when the awaiting
  // coroutine is cancelled while it waits.
  async::Task<Decision> begin(const Request& request);

  const GuardOptions& options() const noexcept;
  const std::shared_ptr<async::AsyncStore>& store() const noexcept;

  struct Shared;  // the store, options and hooks the decisions share

 private:
  std::shared_ptr<Shared> shared_;
};

class Decision {
 public:
  enum class Action {
    forward,  // run the request (holds_claim(): guarded; else unguarded) then finish()
    respond,  // send response() instead
  };

  Decision() = default;
  Decision(Decision&&) noexcept;
  Decision& operator=(Decision&&) noexcept;
  Decision(const Decision&) = delete;
  Decision& operator=(const Decision&) = delete;
  ~Decision();  // releases a claim still held, in the background

  Action action() const noexcept { return action_; }
  bool holds_claim() const noexcept;
  // respond: the response to send.
  Response& response() noexcept { return response_; }
  const Inspection& inspection() const noexcept { return inspection_; }
  // forward with a claim: the matching route (null when unguarded).
  const Route* route() const noexcept { return inspection_.route; }

  // Whether a response with this status would be kept (a proxy that streams large bodies asks
  // before buffering). False when no claim is held.
  bool would_keep(int status) const noexcept;

  // forward: the upstream's response. Keeps it (completes the claim for the route's ttl, adding
  // Idempotency-Key-Expires to the returned response) or releases the key, per the route's
  // policy, and returns the response to send. Unguarded: returns `upstream` unchanged. A store
  // failure here never loses the response: the key is released (or left to its lease) and the
  // response returned as it is. Call at most once.
  async::Task<Response> finish(Response upstream);
  // forward: no response came (the upstream is down or timed out, the request was abandoned):
  // releases the key, so a retry runs. Nothing to do when unguarded.
  async::Task<void> release();

 private:
  friend class Guard;
  struct Claim;

  Action action_ = Action::respond;
  Response response_;
  Inspection inspection_;
  std::shared_ptr<Guard::Shared> shared_;
  std::shared_ptr<Claim> claim_;
};

}  // namespace idem::http
