// IdempotencyStore: the record-per-key protocol behind idempotent operations.
//
// One record per idempotency key (docs/idempotency.md):
//
//   (absent) --claim--> IN_PROGRESS{token, lease_until, fingerprint}
//   IN_PROGRESS --complete(token, value, report, ttl)--> COMPLETED{value, report, expires_at}
//   IN_PROGRESS --release(token)--> (absent)                       (the operation failed)
//   IN_PROGRESS, lease_until <= now --claim--> IN_PROGRESS{larger token}   (takeover)
//   COMPLETED, expires_at <= now   --claim--> IN_PROGRESS{larger token}   (expired)
//
// claim() is one atomic store operation, never check-then-act. Tokens are fencing tokens:
// complete/release/renew with a token that is no longer current change nothing and return false.
// Expiry is decided by the store on every read against the injected clock; store-side TTLs only
// reclaim space. A record is expired when now >= expires_at (the boundary instant is expired).
//
// Values cross the protocol as StoredValue: an in-process store keeps the typed object
// (needs_bytes() == false, no serialization); a durable store asks for bytes
// (needs_bytes() == true) that the caller encodes with idem::Codec<T>.
//
// The coordinator that joins concurrent callers in one process, renews leases and decides
// executed/joined/replayed is written once (idempotency.hpp); stores implement only these
// primitives. A conformance suite for stores lives in idem/testing/store_conformance.hpp.
//
// Thread-safety: implementations must be safe to share between threads.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <string_view>
#include <typeindex>
#include <vector>

#include "idem/clock.hpp"
#include "idem/purge_progress.hpp"
#include "idem/report.hpp"

namespace idem {

// A result value crossing the store protocol: a typed in-process object, encoded bytes, or
// both. `object` is null for a void operation (and `bytes` then holds "").
struct StoredValue {
  std::shared_ptr<const void> object;   // the typed value (in-process stores)
  std::optional<std::type_index> type;  // the type of `object`, checked on replay
  std::optional<std::string> bytes;     // Codec<T>::encode output (durable stores)
};

struct IdempotencyRecord {
  enum class State { in_progress, completed };
  std::string key;
  State state = State::in_progress;
  std::uint64_t token = 0;                 // the current fencing token
  std::optional<std::string> fingerprint;  // of the arguments that claimed the key
  WallTime lease_until{};                  // in_progress: when the owner's lease ends
  WallTime completed_at{};                 // completed: when it completed
  WallTime expires_at{};                   // completed: completed_at + ttl
  StoredValue value;                       // completed
  std::optional<ExecutionReport> report;   // completed: the report of the execution
};

std::string_view to_string(IdempotencyRecord::State state) noexcept;

struct ClaimOutcome {
  enum class Status {
    acquired,     // the caller owns the key: execute, then complete() or release()
    completed,    // a live completed record exists: replay `record`
    in_progress,  // another owner holds a live lease (`record` says until when)
    mismatch,     // a live record exists with a different fingerprint: KeyReuseError
  };
  Status status = Status::acquired;
  std::uint64_t token = 0;                  // acquired: our fencing token
  bool took_over = false;                   // acquired by taking over an expired lease
  std::optional<IdempotencyRecord> record;  // completed / in_progress / mismatch

  // The answer to a claim that found the live `record` (for store implementations): mismatch
  // when both the caller and the record have a fingerprint and they differ; else completed or
  // in_progress by the record's state.
  static ClaimOutcome found(IdempotencyRecord record, std::optional<std::string_view> fingerprint);
};

std::string_view to_string(ClaimOutcome::Status status) noexcept;

// How many records a store holds, by state (IdempotencyStore::counts()). The four add up to
// entry_count() taken at the same instant.
struct StoreCounts {
  std::uint64_t in_progress = 0;  // claims under a live lease (lease_until > now)
  std::uint64_t abandoned = 0;    // claims whose lease passed; the next claim() takes them over
  std::uint64_t completed = 0;    // results that replay (expires_at > now)
  std::uint64_t expired = 0;      // results past expires_at, awaiting purge_expired()
};

// One page of IdempotencyStore::list(): the records whose key starts with a prefix.
struct RecordPage {
  // The records as the store holds them, live or not (an abandoned claim, an expired result not
  // yet purged), without their value and report (StoredValue and report stay empty): key,
  // state, token, fingerprint, lease_until (in progress), completed_at and expires_at
  // (completed). At most the `limit` list() was given.
  std::vector<IdempotencyRecord> records;
  // Where the next page starts (pass it as list()'s `cursor`); empty when the listing is
  // complete. A page may hold fewer records than `limit`, even none, while `next` is not empty:
  // a store that scans (Redis) bounds the work of one call, not only its answer.
  std::string next;
};

class StoreWrapper;

// The most records one IdempotencyStore::list() call returns.
inline constexpr std::size_t kMaxListLimit = 1000;

// The protocol. Its public calls are non-virtual: each checks its arguments once (the key with
// validate_key(), lease > 0, ttl >= 0) and then calls the private do_* virtual a backend
// implements, so a backend only ever sees valid arguments.
class IdempotencyStore {
 public:
  virtual ~IdempotencyStore() = default;

  // True when values must be passed as bytes (StoredValue::bytes) — durable stores.
  [[nodiscard]] bool needs_bytes() const noexcept { return do_needs_bytes(); }

  // Atomic claim. `fingerprint` (optional) is stored with the claim and compared against live
  // records: a different fingerprint gives `mismatch` (a record without a fingerprint, or a call
  // without one, never mismatches).
  [[nodiscard]] ClaimOutcome claim(std::string_view key,
                                   std::optional<std::string_view> fingerprint, Millis lease);

  // IN_PROGRESS(token) -> COMPLETED, expiring at now + ttl. False when `token` was fenced off.
  [[nodiscard]] bool complete(std::string_view key, std::uint64_t token, StoredValue value,
                              const ExecutionReport& report, Millis ttl);

  // IN_PROGRESS(token) -> absent. False when `token` was fenced off.
  [[nodiscard]] bool release(std::string_view key, std::uint64_t token);

  // Extends a live claim's lease to now + lease. False when `token` was fenced off.
  [[nodiscard]] bool renew(std::string_view key, std::uint64_t token, Millis lease);

  // The live record for `key`, if any (expired completed records are reported absent).
  [[nodiscard]] std::optional<IdempotencyRecord> lookup(std::string_view key);

  // Removes expired completed records in bounded chunks, calling `progress` (if any) between
  // them with the number deleted so far (see purge_progress.hpp); returns how many went.
  std::size_t purge_expired(const PurgeProgress& progress = {}) {
    return do_purge_expired(progress);
  }

  // Records held right now by state, decided with the store's clock. A snapshot that reads
  // every record (or key, on Redis): for operators and tests, not a hot path.
  // Default: throws NotSupported.
  [[nodiscard]] StoreCounts counts() { return do_counts(); }

  // Records currently held (live or not yet purged).
  [[nodiscard]] std::size_t entry_count() { return do_entry_count(); }

  // ---- operator calls (idem list / idem release; not for a hot path) ----------------------
  // The records whose key starts with `prefix` ("" lists every record), at most `limit` of them
  // (1..kMaxListLimit), from `cursor` ("" starts at the beginning; else a previous page's
  // `next`, opaque). Memory, SQLite and PostgreSQL list in the byte order of the keys, each key
  // once; Redis lists in SCAN order and, as SCAN does, may return a key twice. A key present for
  // the whole listing is returned; one written or deleted meanwhile may or may not be.
  // Throws InvalidArgument for a bad limit or cursor, InvalidKey for a prefix with a control
  // character or longer than a key. Default: throws NotSupported.
  [[nodiscard]] RecordPage list(std::string_view prefix, std::size_t limit,
                                std::string_view cursor = {});

  // Deletes the record of `key` whatever its state (a claim, live or abandoned; a result, live
  // or expired), if its token is still `token`; false (nothing changed) when the key is absent
  // or holds another token. For an operator clearing a stuck claim or forgetting a result: the
  // holder of `token` is fenced off (its complete/release/renew return false) and the next
  // claim of the key acquires it with a larger token. Default: throws NotSupported.
  [[nodiscard]] bool remove(std::string_view key, std::uint64_t token);

  // Waits until `key` is no longer in progress under a live lease, `deadline` passes or `stop`
  // is requested; returns the record then seen (nullopt: absent). The default polls lookup()
  // with capped exponential backoff; stores with server notifications override it.
  [[nodiscard]] std::optional<IdempotencyRecord> wait(std::string_view key, SteadyTime deadline,
                                                      std::stop_token stop);

 protected:
  // The clock used by wait()'s default polling. Stores set it from their options.
  std::shared_ptr<Clock> wait_clock_ = system_clock();

  // What a backend implements (protected, so that an override can call the base's default).
  // StoreWrapper forwards to the wrapped store's do_* (arguments checked once, by the outermost
  // store).
  friend class StoreWrapper;

  virtual bool do_needs_bytes() const noexcept = 0;
  virtual ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                                Millis lease) = 0;
  virtual bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                           const ExecutionReport& report, Millis ttl) = 0;
  virtual bool do_release(std::string_view key, std::uint64_t token) = 0;
  virtual bool do_renew(std::string_view key, std::uint64_t token, Millis lease) = 0;
  virtual std::optional<IdempotencyRecord> do_lookup(std::string_view key) = 0;
  virtual std::size_t do_purge_expired(const PurgeProgress& progress) = 0;
  virtual StoreCounts do_counts();
  virtual std::size_t do_entry_count() = 0;
  virtual RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor);
  virtual bool do_remove(std::string_view key, std::uint64_t token);
  virtual std::optional<IdempotencyRecord> do_wait(std::string_view key, SteadyTime deadline,
                                                   std::stop_token stop);
};

}  // namespace idem
