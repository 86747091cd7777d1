// The coroutine face's PostgreSQL backend: AsyncPostgresRecorder (idem::async::AsyncRecorder)
// and AsyncPostgresStore (idem::async::AsyncStore) over a pool of non-blocking libpq connections
// in pipeline mode, driven by an Asio executor (target idem::postgres_async).
//
// Same database, same tables, same SQL as PostgresIdempotencyRecorder / PostgresIdempotencyStore
// (the statements are shared, not copied): blocking and coroutine users, in one process or
// many, work on the same markers, claims and records and see each other's writes at once.
//
// The pool (AsyncConnectionPool) opens up to options.pool_size connections on demand. Statements
// of any number of coroutines are pipelined on them: each statement is sent as its own
// Bind/Execute + Sync (it commits on its own, and a failure touches no other statement), many of
// them per write to the socket, results read in order. A transaction (run_transactional) holds
// one connection for itself until it commits or rolls back; other coroutines use the others (or
// wait up to acquire_timeout when every connection is held by a transaction: store_busy).
//
// Cancellation through the awaiting coroutine's slot (Asio's cancellation types): a statement
// that was not sent yet is withdrawn (asio::error::operation_aborted), whatever the type. One
// already sent stays in the pipeline — its result is read and dropped, so the connection stays
// in step — and the caller gets operation_aborted for a read; for a write or a COMMIT a terminal
// or partial cancellation ends the call at once with a PostgresError with in_doubt() (retryable
// for idem's writes, which are keyed and fenced; not for a COMMIT), while a total one (no side
// effects allowed) cannot be honoured any more and the call ends with its real outcome. There is
// no PQcancel: on a pipeline it would cancel whichever statement runs at that moment, possibly
// another caller's; statement_timeout bounds how long such a statement can run.
//
// Failures are classified as in the blocking backend (postgres_error.hpp): a lost connection
// fails the statements that were sent (writes and COMMIT in doubt) and the next statement
// reconnects; an unreachable server fails fast with a retryable PostgresError (after at most
// connect_timeout). No call hangs: every one ends with its result or an error.
//
// Construction is blocking: it validates the options (ConfigError) and creates or migrates the
// tables through one blocking connection, exactly as the blocking classes do (PostgresError when
// the server cannot be used). Construct before running the event loop, or off it.
//
// Lifetime: destroy the recorder, store and pool before their executor's execution context; a
// pool being destroyed fails what is still pending with operation_aborted.
//
// Thread-safety: every call may be made from any number of coroutines on any executors at once;
// each resumes on its own executor. The connections run on strands of the pool's executor.
#pragma once

#include <asio/any_io_executor.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "idem/async/recorder.hpp"
#include "idem/async/store.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_options.hpp"

namespace idem::postgres {

namespace detail {
class AsyncPool;
struct PoolAccess;
}  // namespace detail

// Counters of one async pool, for tests and diagnostics.
struct AsyncPoolStats {
  std::size_t connections = 0;  // connection slots in use (at most pool_size)
  std::size_t exclusive = 0;    // held by a transaction now
  std::uint64_t connects = 0;   // sessions opened successfully, reconnects included
};

class AsyncConnectionPool {
 public:
  using executor_type = asio::any_io_executor;

  // Validates `options` like ConnectionPool (ConfigError). Does not connect. The connections'
  // I/O runs on strands of `executor`.
  AsyncConnectionPool(asio::any_io_executor executor, PostgresOptions options);
  ~AsyncConnectionPool();

  AsyncConnectionPool(const AsyncConnectionPool&) = delete;
  AsyncConnectionPool& operator=(const AsyncConnectionPool&) = delete;

  // The executor it was made with.
  executor_type get_executor() const noexcept;
  const PostgresOptions& options() const noexcept;
  // "user@host:port/dbname", never the password; for messages.
  const std::string& target() const noexcept;
  AsyncPoolStats stats() const;

  // The blocking pool the tables are created through.
  const std::shared_ptr<ConnectionPool>& blocking_pool() const noexcept { return blocking_; }

 private:
  friend struct detail::PoolAccess;
  detail::AsyncPool& core() const noexcept { return *core_; }

  std::shared_ptr<ConnectionPool> blocking_;
  std::shared_ptr<detail::AsyncPool> core_;
};

// Markers, claims and the transactional inbox (see PostgresIdempotencyRecorder for the tables and
// their semantics, which are the same).
class AsyncPostgresRecorder final : public async::AsyncRecorder {
 public:
  static constexpr int kSchemaVersion = 1;

  // Opens a pool on `executor` for `options` and creates/migrates the tables (blocking, once).
  AsyncPostgresRecorder(asio::any_io_executor executor, PostgresOptions options);
  // Shares `pool` with other recorders and stores.
  explicit AsyncPostgresRecorder(std::shared_ptr<AsyncConnectionPool> pool);
  ~AsyncPostgresRecorder() override;

  AsyncPostgresRecorder(const AsyncPostgresRecorder&) = delete;
  AsyncPostgresRecorder& operator=(const AsyncPostgresRecorder&) = delete;

  using executor_type = asio::any_io_executor;
  // The executor its connections run on (the pool's).
  executor_type get_executor() const noexcept { return pool()->get_executor(); }
  const std::shared_ptr<AsyncConnectionPool>& pool() const noexcept;

 private:
  async::Task<bool> do_is_processed(std::string_view consumer, std::string_view event_id) override;
  async::Task<void> do_mark_processed(std::string_view consumer,
                                      std::string_view event_id) override;
  async::Task<std::vector<bool>> do_is_processed_many(
      std::string_view consumer, std::span<const std::string> event_ids) override;
  async::Task<void> do_mark_processed_many(std::string_view consumer,
                                           std::span<const std::string> event_ids) override;
  async::RecorderCapabilities do_capabilities() const noexcept override { return {true, true}; }
  async::Task<Claim> do_claim(std::string_view consumer, std::string_view event_id,
                              Millis lease) override;
  async::Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                                std::uint64_t token) override;
  async::Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                               std::uint64_t token) override;
  async::Task<bool> do_renew(std::string_view consumer, std::string_view event_id,
                             std::uint64_t token, Millis lease) override;
  // The AsyncSqlTransaction runs statements with `$1` parameters (text format, types inferred by
  // the server) on the connection held for the transaction. When another owner holds a live
  // exclusive-mode claim on the event, nothing runs and AlreadyInProgress is thrown. The handler
  // must not COMMIT or ROLLBACK itself.
  async::Task<bool> do_run_transactional(std::string_view consumer, std::string_view event_id,
                                         TransactionalFn fn) override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

// Idempotency records (see PostgresIdempotencyStore: same table, same statements, tokens from the
// same sequence; complete() and release() notify blocking waiters as the blocking store does).
// Its own waiters (resilient()'s InProgressPolicy::wait) claim again with backoff: no listener.
class AsyncPostgresStore final : public async::AsyncStore {
 public:
  static constexpr int kSchemaVersion = 1;

  AsyncPostgresStore(asio::any_io_executor executor, PostgresOptions options);
  explicit AsyncPostgresStore(std::shared_ptr<AsyncConnectionPool> pool);
  ~AsyncPostgresStore() override;

  AsyncPostgresStore(const AsyncPostgresStore&) = delete;
  AsyncPostgresStore& operator=(const AsyncPostgresStore&) = delete;

  using executor_type = asio::any_io_executor;
  // The executor its connections run on (the pool's).
  executor_type get_executor() const noexcept { return pool()->get_executor(); }
  const std::shared_ptr<AsyncConnectionPool>& pool() const noexcept;

 private:
  bool do_needs_bytes() const noexcept override { return true; }
  async::Task<ClaimOutcome> do_claim(std::string_view key,
                                     std::optional<std::string_view> fingerprint,
                                     Millis lease) override;
  async::Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                                const ExecutionReport& report, Millis ttl) override;
  async::Task<bool> do_release(std::string_view key, std::uint64_t token) override;
  async::Task<bool> do_renew(std::string_view key, std::uint64_t token, Millis lease) override;
  async::Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) override;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::postgres
