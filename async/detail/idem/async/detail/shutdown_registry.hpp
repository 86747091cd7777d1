// ShutdownRegistry<T>: the live connections of one Asio execution context, made to drop their
// pending operations when that context shuts down. Internal to idem's async backends; not
// installed.
//
// Asio calls a service's shutdown() when its execution context is destroyed (or shut down),
// after the context's threads stopped and before it destroys the handlers still queued on it.
// A connection's pending operations hold their completion handlers, and a handler may own the
// connection (a coroutine frame holding the connection, its pool or a lease on it): a cycle
// that a context stopped mid-operation would otherwise keep, with the connection's socket or
// session, forever. At shutdown every registered connection's abandon() destroys those handlers
// without completing them, as Asio does with its own pending operations.
//
// T has weak_from_this() (it or a class derived from it derives from
// std::enable_shared_from_this) and `void abandon() noexcept`; it calls add(this) when made and
// remove(this) in its destructor (a T not yet owned by a shared_ptr, or already going, is
// skipped). The one user is the pipelined-connection engine (pipeline.hpp). Thread-safe.
#pragma once

#include <asio/execution/context.hpp>
#include <asio/execution_context.hpp>
#include <asio/query.hpp>

#include <memory>
#include <mutex>
#include <unordered_set>
#include <utility>
#include <vector>

namespace idem::async::detail {

template <class T>
class ShutdownRegistry final : public asio::execution_context::service {
 public:
  static inline asio::execution_context::id id;  // NOLINT: Asio's service identification

  explicit ShutdownRegistry(asio::execution_context& context) : service(context) {}

  // The registry of the execution context an executor belongs to.
  template <class Executor>
  static ShutdownRegistry& of(const Executor& executor) {
    return asio::use_service<ShutdownRegistry>(asio::query(executor, asio::execution::context));
  }

  void add(T* connection) {
    std::lock_guard lock(mutex_);
    connections_.insert(connection);
  }
  void remove(T* connection) noexcept {
    std::lock_guard lock(mutex_);
    connections_.erase(connection);
  }

 private:
  void shutdown() override {
    std::vector<std::shared_ptr<T>> live;
    {
      std::lock_guard lock(mutex_);
      for (T* connection : connections_) {
        // Empty for a connection whose destructor is waiting for the mutex.
        if (auto owner = connection->weak_from_this().lock()) live.push_back(std::move(owner));
      }
    }
    // Outside the lock: dropping a handler may destroy another connection (or this one, once
    // `live` goes), whose destructor calls remove().
    for (const auto& connection : live)
      connection->abandon();
  }

  std::mutex mutex_;
  std::unordered_set<T*> connections_;
};

}  // namespace idem::async::detail
