// SqliteIdempotencyStore: the record-per-key protocol of idem/idempotency_store.hpp in one SQLite
// file, shared by threads and by processes on one machine.
//
// The durable store for idempotent operations (idem::resilient / idem::operation with
// `.idempotency_store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path)`). One row
// per idempotency key in
//
//   idem_records(key TEXT PRIMARY KEY, state TEXT ('in_progress' | 'completed'), token INTEGER,
//                fingerprint TEXT, lease_until_ms INTEGER, completed_at_ms INTEGER,
//                expires_at_ms INTEGER, value BLOB, report TEXT, took_over INTEGER)
//
// (times in Unix epoch milliseconds from options.clock; `value` is the result's bytes as encoded
// by idem::Codec<T>, so needs_bytes() is true; `report` is ExecutionReport::to_json()). The file
// may be the one a SqliteIdempotencyRecorder uses: the tables are disjoint, and fencing tokens
// come from the same file-wide counter (idem_counters.claim_token), so they only grow, per key
// and overall, even after a release, an expiry, a purge or a reopen.
//
// claim() is one write transaction around one decisive statement:
//   INSERT INTO idem_records ... ON CONFLICT(key) DO UPDATE SET <a new claim>
//     WHERE (state = 'completed' AND expires_at_ms <= :now)
//        OR (state = 'in_progress' AND lease_until_ms <= :now)
//   RETURNING token, took_over
// A returned row means the caller owns the key (acquired; took_over when an abandoned claim was
// replaced). No row means a live record exists: it is read in the same transaction and answered
// as completed, in_progress or mismatch (both fingerprints set and different). complete(),
// release() and renew() are single UPDATE/DELETE statements conditioned on the token, so a
// fenced-off owner changes nothing. Concurrent writes of one store (claims, completions,
// releases, renewals from several threads) share write transactions, as the recorder's marks do
// (group commit, up to 64 writes per COMMIT): each returns once the transaction holding it
// committed, and a write that fails makes the others of its transaction run again alone, so its
// failure is never theirs. A result is expired when now >= expires_at, a lease has ended
// when now >= lease_until, exactly as in every other idem store.
//
// lookup() and wait() read on the writer connection when no thread holds it, else on pooled
// reader connections (WAL: they never wait for a writer);
// wait() is the default polling of IdempotencyStore (capped exponential backoff on the clock).
// purge_expired() deletes completed rows whose expiry has passed (run it from a maintenance job:
// nothing else deletes them, a new claim of the key just overwrites one in place).
//
// Errors: bad keys → InvalidKey; lease <= 0 or ttl < 0 → InvalidArgument; bad options →
// ConfigError; SQLite failures → SqliteError (sqlite_error.hpp: store_busy is retryable, a COMMIT
// whose outcome is unknown is in_doubt). A row idem cannot read (unknown state, NULL or a wrong
// type where a value must be, a report that does not parse) → StoreError with code
// store_corrupt_record naming the key and the column; it is never overwritten by a claim, so
// delete the row to reset the key.
//
// Thread-safety: one store may be shared by any number of threads (writes go through one
// connection behind a mutex; reads use the idle writer or a small pool of connections; a
// file-backed store owns one checkpoint thread, as the recorder does). Any number of processes
// may open the same file; each process should share one store per file.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/idempotency_store.hpp"
#include "idem/sqlite/sqlite_error.hpp"
#include "idem/sqlite/sqlite_options.hpp"

namespace idem::sqlite {

class SqliteIdempotencyStore final : public IdempotencyStore {
 public:
  // The version of the store's table (idem_schema row 'store'); a file with a newer version is
  // refused at open.
  static constexpr int kSchemaVersion = 1;

  // Opens (creating when missing, unless options.read_only or !options.create_schema) the
  // database at `path`, a file path or ":memory:" (a private in-memory database, gone with the
  // store). Checks the file first (a refused file is left unchanged), then switches it to WAL
  // and creates the tables when missing (neither with read_only or !create_schema). Uses
  // options.clock, busy_timeout, durability, read_only, create_schema and max_idle_readers
  // (max_batch_size concerns only the recorder). Throws InvalidArgument for an empty path,
  // ConfigError for bad options, SqliteError (store_open_failed, store_not_a_database,
  // store_corrupt, store_read_only, store_busy, ...) when the file cannot be used. A write on a
  // file deleted or renamed over since is refused with store_replaced (docs/sqlite.md §7).
  explicit SqliteIdempotencyStore(std::string path, SqliteOptions options = {});
  ~SqliteIdempotencyStore() override;

  SqliteIdempotencyStore(const SqliteIdempotencyStore&) = delete;
  SqliteIdempotencyStore& operator=(const SqliteIdempotencyStore&) = delete;

  const std::string& path() const noexcept;
  const SqliteOptions& options() const noexcept;

  // claim() for a caller that uses only a completed record's value: the outcome's
  // record->report is left empty (the column's type is checked, its JSON not parsed). What
  // AsyncSqliteStore::claim_without_report runs. Same checks, outcome and errors otherwise.
  ClaimOutcome claim_without_report(std::string_view key,
                                    std::optional<std::string_view> fingerprint, Millis lease);

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  bool do_needs_bytes() const noexcept override { return true; }
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override;
  // Stores value.bytes (an absent bytes is stored as "", a void result) and report.to_json().
  // ttl == 0 deletes the record: it is expired the instant it completes.
  ClaimOutcome claim_record(std::string_view key, std::optional<std::string_view> fingerprint,
                            Millis lease, bool with_report);
  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override;
  bool do_release(std::string_view key, std::uint64_t token) override;
  bool do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override;
  // Deletes in write transactions of at most 1,000 rows each (other writers and processes get
  // the lock between them); `progress` is called between chunks.
  std::size_t do_purge_expired(const PurgeProgress& progress) override;
  std::size_t do_entry_count() override;
  // One read on a reader connection (never the write lock); scans the table.
  StoreCounts do_counts() override;
  // One read on a reader connection: a range of the primary key, in byte order.
  RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor) override;
  bool do_remove(std::string_view key, std::uint64_t token) override;

  class Impl;  // connections and statements (sqlite_store.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::sqlite
