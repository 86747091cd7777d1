// PostgresIdempotencyRecorder: processed-event markers in PostgreSQL, shared by every process
// and machine that reaches the database.
//
// It implements every level of idem/recorder.hpp:
//   * check/mark    — markers live in <schema>.processed_log(consumer, event_id, ts timestamptz,
//                     PRIMARY KEY (consumer, event_id)); mark_processed() is one
//                     INSERT ... ON CONFLICT DO NOTHING;
//   * claims        — <schema>.claims(consumer, event_id, token, lease_until, done_at, took_over);
//                     claim() is ONE statement: it checks the marker and runs
//                     INSERT ... ON CONFLICT DO UPDATE ... WHERE <lease passed> RETURNING token.
//                     complete() marks the claim done and inserts the marker in one statement; the
//                     done claim stays (until purge) so that a claim racing with the complete
//                     finds it instead of inserting a fresh claim beside the new marker;
//   * transactions  — run_transactional() runs the handler inside the transaction that inserts
//                     the marker (a "transactional inbox"): PostgresTransaction exposes the
//                     connection; the handler's writes commit with the marker or not at all. The
//                     same transaction writes a done claim, so a concurrent exclusive-mode claim
//                     on the same event waits for it instead of running beside it.
// Tokens come from a sequence, so they grow per key forever and are unique across keys.
// Every instant (ts, lease deadlines) comes from options.clock and is sent as a parameter.
//
// Schema: created or migrated at construction under an advisory lock, its version kept in
// <schema>.schema_version (see docs/postgres.md). A database whose tables are newer than this
// idem is refused.
//
// Errors: bad keys → InvalidKey (also for text that is not valid UTF-8: PostgreSQL text is
// UTF-8); bad options → ConfigError; server and connection failures → PostgresError
// (postgres_error.hpp) with retryable()/in_doubt() set — an unreachable server fails fast and
// retryable; a COMMIT whose outcome is unknown is in_doubt(). Nothing is ever marked that the
// caller did not ask to mark.
//
// Thread-safety: one recorder may be shared by any number of threads; each call leases a pooled
// connection for its duration. Any number of processes may use the same schema at once.
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

#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_options.hpp"
#include "idem/postgres/postgres_transaction.hpp"
#include "idem/recorder.hpp"

namespace idem::postgres {

class PostgresIdempotencyRecorder final : public IdempotencyRecorder {
 public:
  // The version of the recorder's tables this idem writes.
  static constexpr int kSchemaVersion = 1;

  // Opens a pool for `options` and creates/migrates the tables (unless
  // options.create_schema is false: then they must exist). Throws ConfigError for bad options,
  // PostgresError when the server cannot be used.
  explicit PostgresIdempotencyRecorder(PostgresOptions options);
  // Shares `pool` (and its options) with other recorders or stores.
  explicit PostgresIdempotencyRecorder(std::shared_ptr<ConnectionPool> pool);
  ~PostgresIdempotencyRecorder() override;

  PostgresIdempotencyRecorder(const PostgresIdempotencyRecorder&) = delete;
  PostgresIdempotencyRecorder& operator=(const PostgresIdempotencyRecorder&) = delete;

  const std::shared_ptr<ConnectionPool>& pool() const noexcept;

 private:
  // The protocol (the public calls of the base class check the arguments, then call these).
  RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = true};
  }
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override;
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  // One prepared statement per 1,000 ids on one pooled connection:
  // SELECT event_id ... WHERE consumer = $1 AND event_id = ANY ($2::text[]).
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override;
  // One prepared INSERT ... SELECT DISTINCT ... FROM unnest($2::text[]) ON CONFLICT DO NOTHING
  // per 1,000 ids (each its own autocommit transaction: one round trip, one WAL flush).
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
  // `fn` receives an idem::postgres::PostgresTransaction. When another owner holds a live
  // exclusive-mode claim on the same (consumer, event_id), nothing runs and AlreadyInProgress is
  // thrown; a dead claim is replaced (its old owner is fenced off) when the transaction commits.
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(Transaction&)>& fn) override;
  // Deletes markers whose ts is older than now - older_than (older_than must be >= 0), and
  // claims done or whose lease ended before that instant. Returns how many markers went.
  // Deletes markers in transactions of at most 1,000 rows, walking the primary key, then the
  // old claims in one statement; `progress` is called between chunks.
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const PurgeProgress& progress) override;
  // Reads only (no locks taken). consumer_counts() is sorted by the bytes of the names, not by
  // the database's collation; done claims count as markers, never as in progress.
  std::vector<ConsumerCounts> do_consumer_counts() override;
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override;
  MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::postgres
