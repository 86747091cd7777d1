// DuplicatePolicy: what a request that repeats a key gets, as one options struct.
//
// A key meets a duplicate in one of two windows, and each has its own policy (the split Temporal
// makes between a workflow id's conflict policy and its reuse policy):
//
//   while the first request runs     while_running: wait (join: wait up to max_wait, then answer
//                                    as the first request finished) or reject (at once)
//   after it finished, for `ttl`     after_finished: replay (the stored outcome, success or
//                                    error), rerun_failed (replay successes only: a failed
//                                    outcome is never kept, so the next request runs again), or
//                                    reject (the key is spent: every later request is refused)
//
// and an outcome is one of three kinds, of which the policy keeps some (a kept outcome is what
// later duplicates see for `ttl`; an outcome not kept releases the key, so the next request with
// it runs again):
//
//   success     kept always
//   failure     a terminal error the caller must not simply retry (HTTP: a chosen 4xx). Kept
//               when keep_failures (the IETF draft: replay "success or an error") and the
//               after_finished policy is not rerun_failed
//   transient   an error a retry may cure (HTTP: 5xx, 429, an upstream timeout). Kept only when
//               keep_transient (Stripe's v1 API stores 500s); released by default
//
// Two windows bound a key (Hatchet's TTL and status windows): `ttl` is the time a kept outcome
// answers after it completed; a ttl of zero guards the key only while its request runs (nothing
// answers once it finished: the status window alone).
//
// idem::http (http/include/idem/http/options.hpp) takes one per route. The operation face
// (resilient.hpp) has the while_running half as IdempotencyPolicy::in_progress / max_wait, and
// keeps successes only.
//
// Thread-safety: plain values; the functions are pure.
#pragma once

#include <chrono>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/idempotency.hpp"

namespace idem {

// What a request finding the key's earlier request finished gets.
enum class ReusePolicy {
  replay,        // the kept outcome, success or failure
  rerun_failed,  // successes replay; failures are never kept, so a retry runs again
  reject,        // refused: the key was used (for ttl)
};

// The kinds of outcome a policy keeps or releases.
enum class OutcomeKind { success, failure, transient };

struct DuplicatePolicy {
  // A request finding the key in progress: wait for it (join) or be refused at once.
  InProgressPolicy while_running = InProgressPolicy::wait;
  // The longest a joining request waits for the running one before it is refused. >= 0.
  Millis max_wait = std::chrono::seconds(30);
  // A request finding the key's outcome kept.
  ReusePolicy after_finished = ReusePolicy::replay;
  // How long a kept outcome answers duplicates, from completion. >= 0 (0: only while running).
  Millis ttl = std::chrono::hours(24);
  // The running request's lease, renewed every lease/3 while it runs, so only a dead owner's
  // claim is ever taken over (after the lease). Positive.
  Millis lease = std::chrono::seconds(30);
  // Keep terminal failures (replayed under ReusePolicy::replay and reject).
  bool keep_failures = true;
  // Keep transient failures too (Stripe's choice for 500s). Default: released.
  bool keep_transient = false;
};

// Whether `policy` keeps an outcome of `kind` (false: the key is released).
bool keeps(const DuplicatePolicy& policy, OutcomeKind kind) noexcept;

// Throws ConfigError naming the field when a duration is out of range (lease <= 0, max_wait < 0,
// ttl < 0). `what` prefixes the message ("route 'payments'").
void validate(const DuplicatePolicy& policy, std::string_view what);

// "replay", "rerun_failed", "reject"; "success", "failure", "transient"; "wait", "reject".
std::string_view to_string(ReusePolicy policy) noexcept;
std::string_view to_string(OutcomeKind kind) noexcept;
std::string_view to_string(InProgressPolicy policy) noexcept;

// The inverse of to_string. `wait` is also spelled "join". Throws ConfigError for other text,
// listing the accepted words.
ReusePolicy parse_reuse_policy(std::string_view text);
InProgressPolicy parse_in_progress_policy(std::string_view text);

}  // namespace idem
