// Internal: the machinery of AsyncConnectionPool (async_postgres.hpp): which connection a
// statement or a transaction gets. Not installed.
//
// Thread-safety: every member may be called from any thread (one mutex).
#pragma once

#include <asio/steady_timer.hpp>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "async_connection.hpp"
#include "idem/async/task.hpp"
#include "idem/postgres/async_postgres.hpp"

namespace idem::postgres::detail {

class AsyncPool : public std::enable_shared_from_this<AsyncPool> {
 public:
  AsyncPool(asio::any_io_executor executor, const PostgresOptions& options, std::string target);
  ~AsyncPool();

  // A connection to pipeline one statement on: the least loaded one not held by a transaction,
  // a new one while fewer than pool_size exist and all are busy. Waits (up to acquire_timeout,
  // then store_busy) only when every connection is held by a transaction.
  async::Task<std::shared_ptr<AsyncConnection>> shared(std::string_view call);

  // A connection held for one transaction until the Exclusive goes.
  class Exclusive {
   public:
    Exclusive(std::shared_ptr<AsyncPool> pool, std::shared_ptr<AsyncConnection> connection) noexcept
        : pool_(std::move(pool)), connection_(std::move(connection)) {}
    Exclusive(Exclusive&& other) noexcept
        : pool_(std::move(other.pool_)),
          connection_(std::move(other.connection_)),
          broken_(other.broken_) {}
    Exclusive& operator=(Exclusive&&) = delete;
    ~Exclusive();
    AsyncConnection& connection() const noexcept { return *connection_; }
    const std::shared_ptr<AsyncConnection>& shared() const noexcept { return connection_; }
    // The session is in an unknown state: it is closed (after what is in its pipeline).
    void mark_broken() noexcept { broken_ = true; }

   private:
    std::shared_ptr<AsyncPool> pool_;
    std::shared_ptr<AsyncConnection> connection_;
    bool broken_ = false;
  };
  async::Task<Exclusive> exclusive(std::string_view call);

  const asio::any_io_executor& executor() const noexcept { return executor_; }
  AsyncPoolStats stats() const;

 private:
  std::shared_ptr<AsyncConnection> try_pick(bool exclusive);
  async::Task<std::shared_ptr<AsyncConnection>> acquire(bool exclusive, std::string_view call);
  void give_back(const std::shared_ptr<AsyncConnection>& connection, bool broken) noexcept;

  asio::any_io_executor executor_;
  const PostgresOptions options_;
  std::string target_;
  mutable std::mutex mutex_;
  std::vector<std::shared_ptr<AsyncConnection>> connections_;
};

}  // namespace idem::postgres::detail
