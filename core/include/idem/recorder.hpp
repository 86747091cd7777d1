// IdempotencyRecorder: remembers which events each consumer has processed.
//
// The consumer face of idem. A recorder answers "has consumer C processed event E?" and records
// that it has. Markers are keyed by (consumer, event_id): under fanout every consumer name keeps
// its own markers, so one consumer's progress never hides an event from another.
//
// Three levels of guarantee, used by IdempotentHandler's modes (see handler.hpp):
//   * check/mark            — is_processed() then mark_processed(); every recorder has them.
//                             Marking twice is harmless.
//   * claims                — an atomic claim with a lease and a fencing token, so two concurrent
//                             deliveries of one event never both run the handler
//                             (supports_claims()). A crashed owner's claim is taken over once its
//                             lease has passed; the old owner's token is then fenced off.
//   * transactions          — the handler's own writes and the marker commit in one database
//                             transaction (supports_transactions()): a crash leaves both or
//                             neither.
//
// All consumer names and event ids are checked with validate_key() before anything is read or
// written; bad input throws InvalidKey and marks nothing.
//
// Thread-safety: every IdempotencyRecorder implementation must be safe to share between threads
// without external locking. Durable implementations document how they share between processes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/purge_progress.hpp"

namespace idem {

// The answer of IdempotencyRecorder::claim().
struct Claim {
  enum class Status {
    acquired,     // the caller owns the claim: run the handler, then complete() or release()
    processed,    // the event is already marked processed for this consumer: drop it
    in_progress,  // another owner holds a live lease: do not run, do not acknowledge
  };
  Status status = Status::acquired;
  // Fencing token of the claim (acquired only). Tokens for one (consumer, event_id) only grow,
  // so a stale owner's complete()/release()/renew() is refused.
  std::uint64_t token = 0;
  // acquired: when our lease ends unless renewed; in_progress: when the holder's lease ends.
  WallTime lease_until{};
  // acquired by taking over a claim whose lease had passed (its owner crashed or stalled).
  bool took_over = false;
};

std::string_view to_string(Claim::Status status) noexcept;

// What a recorder holds for one consumer (IdempotencyRecorder::consumer_counts()).
struct ConsumerCounts {
  std::string consumer;
  std::uint64_t processed = 0;    // markers held (not yet purged)
  std::uint64_t in_progress = 0;  // claims under a live lease (lease_until > now)
};

// What a recorder holds for one (consumer, event_id) (IdempotencyRecorder::inspect()).
struct MarkerInspection {
  // An exclusive-mode claim that was neither completed nor released yet.
  struct OpenClaim {
    std::uint64_t token = 0;  // the current fencing token
    WallTime lease_until{};   // when the owner's lease ends (or ended)
    bool live = false;        // lease_until > now: another claim() would get in_progress
  };
  bool processed = false;                // a marker exists
  std::optional<WallTime> processed_at;  // its time, when the recorder keeps a readable one
  std::optional<OpenClaim> claim;        // the open claim, if any
};

// What purge(older_than) would find right now (IdempotencyRecorder::purgeable_markers()).
struct PurgeableMarkers {
  struct Consumer {
    std::string consumer;
    std::uint64_t old = 0;         // markers older than older_than: purge() deletes them
    std::uint64_t unreadable = 0;  // markers whose time the recorder cannot read: never purged
  };
  std::uint64_t old = 0;         // over every consumer: count_purgeable(older_than)
  std::uint64_t unreadable = 0;  // over every consumer
  // Consumers with old or unreadable markers, sorted by name. Empty when the recorder does not
  // split its count by consumer (the default implementation).
  std::vector<Consumer> consumers;
};

// A backend transaction handed to a transactional handler. Backends derive from it and expose
// their connection (e.g. idem::sqlite::SqliteTransaction::db()); handlers downcast to the
// backend they were written for.
class Transaction {
 public:
  virtual ~Transaction() = default;
};

// What a recorder can do beyond check and mark (IdempotencyRecorder::capabilities()).
struct RecorderCapabilities {
  bool claims = false;        // claim/complete/release/renew (exclusive mode)
  bool transactions = false;  // run_transactional (transactional mode)
};

class RecorderWrapper;

// The protocol. Its public calls are non-virtual: each checks its arguments once (consumer and
// event id with validate_key(), lease > 0, older_than >= 0) and then calls the private do_*
// virtual a backend implements, so a backend only ever sees valid arguments. A backend overrides
// do_is_processed, do_mark_processed and do_purge, and whatever else it supports.
class IdempotencyRecorder {
 public:
  virtual ~IdempotencyRecorder() = default;

  // True when `consumer` has marked `event_id` processed (and the marker was not purged).
  [[nodiscard]] bool is_processed(std::string_view consumer, std::string_view event_id);

  // Records that `consumer` processed `event_id`. Marking again is harmless (no error, no
  // duplicate). Returns only once the marker is as durable as the recorder promises.
  void mark_processed(std::string_view consumer, std::string_view event_id);

  // ---- batches (a transport settling a window of deliveries at once) --------------------
  // is_processed for every id, in order: result[i] is is_processed(consumer, event_ids[i]).
  // Every id is validated first (InvalidKey: nothing read). An empty span reads nothing.
  // Default: one is_processed per id; the idem backends answer in one query / round trip.
  [[nodiscard]] std::vector<bool> is_processed_many(std::string_view consumer,
                                                    std::span<const std::string> event_ids);

  // mark_processed for every id (repeats, in the span or already marked, are harmless). Every
  // id is validated first (InvalidKey: nothing written). Returns once all markers are as durable
  // as the recorder promises. When it throws, some markers may have been written and others
  // not — harmless, since the caller treats every id of a failed batch as unmarked and a repeat
  // mark is a no-op. Default: one mark_processed per id; the idem backends write the batch in
  // one transaction / round trip.
  void mark_processed_many(std::string_view consumer, std::span<const std::string> event_ids);

  // What this recorder supports beyond check and mark.
  [[nodiscard]] RecorderCapabilities capabilities() const noexcept { return do_capabilities(); }
  [[nodiscard]] bool supports_claims() const noexcept { return capabilities().claims; }
  [[nodiscard]] bool supports_transactions() const noexcept { return capabilities().transactions; }

  // ---- claims (exclusive mode) ----------------------------------------------------------
  // One atomic step: if processed → processed; else if a live claim exists → in_progress;
  // else (no claim, or its lease passed) → acquired with a new, larger token.
  // Without capabilities().claims: throws NotSupported.
  [[nodiscard]] Claim claim(std::string_view consumer, std::string_view event_id, Millis lease);

  // Marks the event processed and drops the claim, atomically — only if `token` is still the
  // current claim. Returns false (and writes nothing) when the token was fenced off.
  [[nodiscard]] bool complete(std::string_view consumer, std::string_view event_id,
                              std::uint64_t token);

  // Drops the claim without marking (the handler failed) — only if `token` is current.
  [[nodiscard]] bool release(std::string_view consumer, std::string_view event_id,
                             std::uint64_t token);

  // Extends the lease of a live claim to now + lease — only if `token` is current.
  [[nodiscard]] bool renew(std::string_view consumer, std::string_view event_id,
                           std::uint64_t token, Millis lease);

  // ---- transactions (transactional mode) ------------------------------------------------
  // In one transaction: insert the marker; if it already existed, roll back and return false
  // without calling `fn`; otherwise call fn(tx) and commit. If fn throws, the transaction is
  // rolled back (no marker, none of fn's writes) and the exception propagates.
  // Without capabilities().transactions: throws NotSupported.
  [[nodiscard]] bool run_transactional(std::string_view consumer, std::string_view event_id,
                                       const std::function<void(Transaction&)>& fn);

  // ---- retention ------------------------------------------------------------------------
  // Deletes markers (and dead claims) older than `older_than`, in bounded chunks, calling
  // `progress` (if any) between them with the number deleted so far (see purge_progress.hpp);
  // returns how many markers went. A purged event counts as unprocessed again, so keep markers
  // longer than the longest redelivery window of the transport.
  std::size_t purge(std::chrono::system_clock::duration older_than,
                    const PurgeProgress& progress = {});

  // ---- operator views -------------------------------------------------------------------
  // Markers and live claims per consumer, sorted by consumer name; consumers with neither are
  // absent. A snapshot: concurrent calls may change the numbers at once. It reads every marker
  // (or every key, on Redis), so it is for operators and tests, not for a hot path.
  // Default: throws NotSupported.
  [[nodiscard]] std::vector<ConsumerCounts> consumer_counts() { return do_consumer_counts(); }

  // How many markers purge(older_than) would delete right now (a dry run). Default: throws
  // NotSupported.
  [[nodiscard]] std::size_t count_purgeable(std::chrono::system_clock::duration older_than);

  // count_purgeable() per consumer, with the markers purge() never deletes because their time
  // cannot be read (a SQLite processed_log row another program wrote with a `ts` SQLite cannot
  // parse; a Redis marker whose value is not a time). Reads every marker. Default: the total of
  // count_purgeable(), no consumers, nothing unreadable (a recorder that writes every time
  // itself, as memory and PostgreSQL do).
  [[nodiscard]] PurgeableMarkers purgeable_markers(std::chrono::system_clock::duration older_than);

  // The marker and the open claim of one event. Bad keys throw InvalidKey.
  // Default: throws NotSupported.
  [[nodiscard]] MarkerInspection inspect(std::string_view consumer, std::string_view event_id);

 protected:
  // What a backend implements (protected, so that an override can call the base's default).
  // RecorderWrapper forwards to the wrapped recorder's do_* (arguments checked once, by the
  // outermost recorder).
  friend class RecorderWrapper;

  virtual bool do_is_processed(std::string_view consumer, std::string_view event_id) = 0;
  virtual void do_mark_processed(std::string_view consumer, std::string_view event_id) = 0;
  virtual std::vector<bool> do_is_processed_many(std::string_view consumer,
                                                 std::span<const std::string> event_ids);
  virtual void do_mark_processed_many(std::string_view consumer,
                                      std::span<const std::string> event_ids);
  virtual RecorderCapabilities do_capabilities() const noexcept { return {}; }
  virtual Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease);
  virtual bool do_complete(std::string_view consumer, std::string_view event_id,
                           std::uint64_t token);
  virtual bool do_release(std::string_view consumer, std::string_view event_id,
                          std::uint64_t token);
  virtual bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                        Millis lease);
  virtual bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                                    const std::function<void(Transaction&)>& fn);
  // Deletes in bounded chunks, calling progress (when set) between them.
  virtual std::size_t do_purge(std::chrono::system_clock::duration older_than,
                               const PurgeProgress& progress) = 0;
  virtual std::vector<ConsumerCounts> do_consumer_counts();
  virtual std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than);
  virtual PurgeableMarkers do_purgeable_markers(std::chrono::system_clock::duration older_than);
  virtual MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id);
};

}  // namespace idem
