#include "async_pool.hpp"

#include <algorithm>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <utility>

#include "idem/error.hpp"

namespace idem::postgres::detail {

AsyncPool::AsyncPool(asio::any_io_executor executor, const PostgresOptions& options,
                     std::string target)
    : executor_(std::move(executor)), options_(options), target_(std::move(target)) {}

AsyncPool::~AsyncPool() {
  std::lock_guard lock(mutex_);
  for (auto& connection : connections_)
    connection->shut_down();
}

std::shared_ptr<AsyncConnection> AsyncPool::try_pick(bool exclusive) {
  std::shared_ptr<AsyncConnection> best;
  for (const auto& connection : connections_) {
    if (connection->exclusive) continue;
    if (!best || connection->load() < best->load()) best = connection;
  }
  const bool room = connections_.size() < options_.pool_size;
  if ((!best || best->load() > 0) && room) {
    best = std::make_shared<AsyncConnection>(executor_, options_, target_);
    connections_.push_back(best);
  }
  if (best && exclusive) best->exclusive = true;
  return best;
}

async::Task<std::shared_ptr<AsyncConnection>> AsyncPool::acquire(bool exclusive,
                                                                 std::string_view call) {
  const auto deadline = std::chrono::steady_clock::now() + options_.acquire_timeout;
  const auto executor = co_await asio::this_coro::executor;
  // Every connection is held by a transaction: look again after a short pause (1 ms doubling
  // up to 20 ms). Transactions are short; a timer of the waiter's own, never touched from
  // another thread, keeps this free of cross-thread wake-ups.
  auto pause = std::chrono::milliseconds(1);
  asio::steady_timer timer(executor);
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (auto picked = try_pick(exclusive)) co_return picked;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) {
      throw make_client_error(ErrorCode::store_busy, call, target_,
                              "every connection of the pool (pool_size " +
                                  std::to_string(options_.pool_size) +
                                  ") stayed held by a transaction for acquire_timeout (" +
                                  std::to_string(options_.acquire_timeout.count()) + " ms)",
                              /*retryable=*/true);
    }
    timer.expires_after(std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    co_await timer.async_wait(asio::use_awaitable);  // cancellation: operation_aborted
    pause = std::min(pause * 2, std::chrono::milliseconds(20));
  }
}

async::Task<std::shared_ptr<AsyncConnection>> AsyncPool::shared(std::string_view call) {
  {
    std::lock_guard lock(mutex_);
    if (auto picked = try_pick(false)) co_return picked;
  }
  co_return co_await acquire(false, call);
}

async::Task<AsyncPool::Exclusive> AsyncPool::exclusive(std::string_view call) {
  std::shared_ptr<AsyncConnection> connection = co_await acquire(true, call);
  co_return Exclusive(shared_from_this(), std::move(connection));
}

AsyncPool::Exclusive::~Exclusive() {
  if (connection_) pool_->give_back(connection_, broken_);
}

void AsyncPool::give_back(const std::shared_ptr<AsyncConnection>& connection,
                          bool broken) noexcept {
  if (broken) connection->reset();
  std::lock_guard lock(mutex_);
  connection->exclusive = false;
}

AsyncPoolStats AsyncPool::stats() const {
  std::lock_guard lock(mutex_);
  AsyncPoolStats stats;
  stats.connections = connections_.size();
  for (const auto& connection : connections_) {
    if (connection->exclusive) ++stats.exclusive;
    stats.connects += connection->connects();
  }
  return stats;
}

}  // namespace idem::postgres::detail
