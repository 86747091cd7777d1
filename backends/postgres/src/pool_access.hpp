// Internal: idem's own way into the pools' connections. ConnectionPool::Lease::connection(),
// ConnectionPool::open_dedicated() and AsyncConnectionPool::core() are private, so that no
// public signature names a `detail` type; the backend's sources reach them through this friend.
//
// Thread-safety: as the members it forwards to.
#pragma once

#include <memory>

#include "connection.hpp"
#include "idem/postgres/connection_pool.hpp"

namespace idem::postgres::detail {

class AsyncPool;

struct PoolAccess {
  // The lease's connection wrapper (prepared statements, run()).
  static Connection& connection(const ConnectionPool::Lease& lease) noexcept {
    return lease.connection();
  }
  // A connection outside the pool, configured like the pooled ones: for a listener.
  static std::unique_ptr<Connection> open_dedicated(ConnectionPool& pool) {
    return pool.open_dedicated();
  }
  // The coroutine face's pool machinery. A template, so that this header needs neither Asio nor
  // async_postgres.hpp: only the coroutine face's sources instantiate it.
  template <class AsyncConnectionPool>
  static AsyncPool& core(const AsyncConnectionPool& pool) noexcept {
    return pool.core();
  }
};

}  // namespace idem::postgres::detail
