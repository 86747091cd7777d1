// Test support for the PostgreSQL async backend's tests: running coroutines to completion on an
// io_context, and a cancellation signal wired to a spawned call.
#pragma once

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <future>
#include <utility>

#include "idem/async/task.hpp"

namespace idem::test::pg_async {

// Runs `task` on `io` until it and everything it started are done.
template <class T>
T run(asio::io_context& io, idem::async::Task<T> task) {
  auto future = asio::co_spawn(io, std::move(task), asio::use_future);
  io.restart();
  io.run();
  return future.get();
}

}  // namespace idem::test::pg_async
