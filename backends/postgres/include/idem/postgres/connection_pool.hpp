// ConnectionPool: a bounded, thread-safe pool of libpq connections with an RAII lease.
//
// Connections are opened on demand, up to PostgresOptions::pool_size, and kept for reuse. A
// caller takes one with acquire() and gives it back by destroying the Lease. A connection is
// checked before it is handed out (pending input is read without blocking: a server that closed
// it — restarted, or terminated the session — is noticed there) and replaced by a fresh one when
// it is broken, so a server restart costs only the calls that were in flight. A connection that
// failed while leased is dropped when it comes back; after a lost connection every idle one is
// dropped too (they are most likely dead as well) and reopened on demand.
//
// Each connection has statement_timeout set once when it is opened, and caches the statements
// idem prepares on it (prepared once per connection, by name).
//
// acquire() waits up to acquire_timeout for a free connection, then throws a retryable
// PostgresError (code store_busy). When the server cannot be reached it fails at once (or after
// connect_timeout) with a retryable PostgresError. Bad options throw ConfigError from the
// constructor, which does not connect.
//
// Thread-safety: every member may be called from any number of threads. A Lease belongs to the
// thread that took it.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "idem/postgres/postgres_options.hpp"

struct pg_conn;
using PGconn = pg_conn;

namespace idem::postgres {

namespace detail {
class Connection;
struct PoolAccess;  // idem's own access to the pooled connections (src/pool_access.hpp)
}  // namespace detail

// Counters of one pool, for tests and diagnostics.
struct PoolStats {
  std::size_t open = 0;                // connections open now (idle + leased)
  std::size_t idle = 0;                // connections waiting in the pool
  std::uint64_t connects = 0;          // connections opened successfully since construction
  std::uint64_t connect_failures = 0;  // attempts that failed
  std::uint64_t dropped = 0;           // connections closed because they broke (or went stale)
};

class ConnectionPool {
 public:
  // Validates `options` (ConfigError: empty or malformed url, pool_size 0, non-positive
  // connect_timeout, negative timeouts, bad identifiers). Does not connect.
  explicit ConnectionPool(PostgresOptions options);
  ~ConnectionPool();

  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  // A leased connection; returns it to the pool (or drops it when broken) when destroyed.
  class Lease {
   public:
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&&) = delete;
    Lease(const Lease&) = delete;
    Lease& operator=(const Lease&) = delete;
    ~Lease();

    // The libpq connection. Leave it idle (no open transaction, no pending result) when the
    // lease ends, or mark_broken().
    PGconn* get() const noexcept;
    // Closes the connection instead of returning it to the pool.
    void mark_broken() noexcept { broken_ = true; }

   private:
    friend class ConnectionPool;
    friend struct detail::PoolAccess;
    detail::Connection& connection() const noexcept { return *connection_; }
    Lease(ConnectionPool& pool, std::unique_ptr<detail::Connection> connection) noexcept;

    ConnectionPool* pool_;
    std::unique_ptr<detail::Connection> connection_;
    bool broken_ = false;
  };

  // A healthy connection, opened when none is idle and fewer than pool_size are open.
  Lease acquire();

  // Closes every idle connection (leased ones are closed when they come back broken).
  void drop_idle() noexcept;

  PoolStats stats() const;
  const PostgresOptions& options() const noexcept;
  // "user@host:port/dbname", never the password; for messages.
  const std::string& target() const noexcept;

 private:
  friend struct detail::PoolAccess;
  // Opens one connection outside the pool (not counted against pool_size), configured like the
  // pooled ones: for the store's and the outbox's listeners, which hold theirs for a long time.
  std::unique_ptr<detail::Connection> open_dedicated();
  void give_back(std::unique_ptr<detail::Connection> connection, bool broken) noexcept;

  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::postgres
