// SqliteIdempotencyRecorder: processed-event markers in one SQLite file, shared by threads and
// processes.
//
// idem's embedded default recorder. It implements every level of idem/recorder.hpp:
//   * check/mark    — markers live in `processed_log(consumer, event_id, ts)`, the table
//                     infinity_bus uses, so Python and C++ consumers can share one file;
//   * claims        — `idem_claims(consumer, event_id, token, lease_until_ms)`; claim() is one
//                     write transaction (check the marker, then an INSERT ... ON CONFLICT DO
//                     UPDATE ... WHERE <lease passed> RETURNING token);
//   * transactions  — run_transactional() runs the handler inside the transaction that inserts
//                     the marker (a "transactional inbox"): a crash leaves both or neither.
// Tokens come from one counter in the file, so they grow per key forever (even after a release
// or a purge) and are unique across keys.
//
// The file is opened in WAL mode with a busy timeout, so several processes can use it at once:
// reads never wait for the writer, writes take SQLite's one write lock in turn. Marker
// timestamps are ISO-8601 UTC strings in Python's datetime.isoformat() form,
// "2026-11-30T04:05:06.123456+00:00"; purge() compares them as instants (SQLite julianday()),
// so rows written by other programs with "Z" or without fractions are aged correctly too.
// Wall time comes from options.clock. See docs/sqlite.md for the schema, durability levels and
// limitations.
//
// Errors: bad keys → InvalidKey; bad options → ConfigError; SQLite failures → SqliteError
// (sqlite_error.hpp) with stable codes: store_open_failed (the path cannot be opened; the
// message names it), store_not_a_database, store_corrupt (a damaged page), store_read_only (at
// the first write), store_busy (locked past busy_timeout; retryable), store_replaced (a write on a
// file deleted or renamed over while open); a COMMIT whose outcome is unknown is in_doubt().
// Nothing is ever marked that the caller did not ask to mark.
//
// Thread-safety: one recorder may be shared by any number of threads. Writes go through one
// connection behind a mutex; concurrent mark_processed() calls are group-committed (one
// transaction for many marks, each call returning only after the commit that holds its mark).
// is_processed() reads on the writer connection when no thread holds it (its page cache is warm)
// and otherwise on a small pool of extra connections, so it never waits for a writer (":memory:"
// has one connection for everything). A file-backed recorder also owns one thread, with a
// connection of its own, that runs the WAL checkpoints SQLite would otherwise run inside a
// commit; the destructor stops it. Several processes may open the same file at once; each
// process should share one recorder per file.
//
// fork(): an object made before fork() belongs to the parent. In a child its calls throw
// ConfigError, and it must not be destroyed there either (its destructor would join the parent's
// threads and close connections the parent still uses): leak it, e.g. end the child with _exit(),
// and make new objects in the child (docs/guarantees.md §9).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/recorder.hpp"
#include "idem/sqlite/sqlite_error.hpp"
#include "idem/sqlite/sqlite_options.hpp"
#include "idem/sqlite/sqlite_transaction.hpp"

namespace idem::sqlite {

// The `ts` text idem writes for instant `t`: ISO-8601 UTC with microseconds and Python's
// "+00:00" suffix, e.g. "2026-11-30T04:05:06.123456+00:00" (what Python's
// datetime.now(timezone.utc).isoformat() gives, so datetime.fromisoformat() reads it back).
std::string marker_timestamp(WallTime t);

// Counters of one recorder (this process only), e.g. to see how well group commit batches.
struct SqliteRecorderStats {
  std::uint64_t marks = 0;         // markers committed by mark_processed() / _many() calls
  std::uint64_t mark_commits = 0;  // transactions that committed them (<= marks)
  std::size_t queued_marks = 0;    // mark calls (a batch counts once) waiting or committing now
};

class SqliteIdempotencyRecorder final : public IdempotencyRecorder {
 public:
  // The version of idem's own tables (idem_schema); a file with a newer version is refused.
  static constexpr int kSchemaVersion = 1;

  // Opens (creating when missing, unless options.read_only or !options.create_schema) the
  // database at `path`, a file path or ":memory:" (a private in-memory database: this recorder
  // only, gone when it is destroyed). Checks the file first (a refused file is left unchanged),
  // then switches it to WAL and creates the tables when missing (neither with read_only or
  // !create_schema: an infinity_bus file then keeps its rollback journal and gets no table).
  // Throws ConfigError for bad options, InvalidArgument for an empty path, SqliteError
  // (store_open_failed, store_not_a_database, store_corrupt, store_busy, ...) when the file
  // cannot be used.
  explicit SqliteIdempotencyRecorder(std::string path, SqliteOptions options = {});
  ~SqliteIdempotencyRecorder() override;

  SqliteIdempotencyRecorder(const SqliteIdempotencyRecorder&) = delete;
  SqliteIdempotencyRecorder& operator=(const SqliteIdempotencyRecorder&) = delete;

  // Counters of this recorder object (not of the file: see consumer_counts() for that).
  SqliteRecorderStats stats() const;

  const std::string& path() const noexcept;
  const SqliteOptions& options() const noexcept;

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = true};
  }
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override;
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  // One connection (the idle writer, else a reader; never waiting for the write lock) and one
  // SELECT ... WHERE consumer = ? AND event_id IN (...) per 512 ids.
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override;
  // The whole batch is one entry of the group-commit queue: all its markers are inserted in ONE
  // write transaction (one fsync with durability full), possibly shared with concurrent
  // mark_processed() calls. Called from inside run_transactional(): Error(reentry), as for
  // mark_processed().
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override;
  // lease must be > 0 (InvalidArgument otherwise).
  Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override;
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override;
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override;
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                Millis lease) override;
  // `fn` receives an idem::sqlite::SqliteTransaction. Mixed with exclusive mode: when another
  // owner holds a live claim on the same (consumer, event_id), nothing runs and
  // AlreadyInProgress is thrown (the delivery is redelivered later); a dead claim is dropped
  // with the commit, which also fences its old owner off.
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(Transaction&)>& fn) override;
  // Deletes markers whose ts is older than now - older_than (older_than must be >= 0) and claims
  // whose lease ended before that instant. Markers whose ts SQLite cannot parse are kept.
  // Deletes in write transactions that each scan at most 2,000 rows of processed_log (in rowid
  // order), so other writers and processes get the lock between chunks; `progress` is called
  // between them.
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const PurgeProgress& progress) override;
  // Both read on a reader connection (never the write lock). consumer_counts()
  // scans processed_log's primary key. inspect()'s processed_at is the marker's ts to the
  // millisecond, absent when SQLite cannot parse it.
  std::vector<ConsumerCounts> do_consumer_counts() override;
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override;
  PurgeableMarkers do_purgeable_markers(std::chrono::system_clock::duration older_than) override;
  MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override;

  class Impl;  // connections, the group-commit queue (sqlite_recorder.cpp)
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::sqlite
