// Scaffolding shared by the coroutine face's tests: running a coroutine to its end on an
// io_context, and an io_context of its own running on a background thread (the I/O executor of
// an async backend whose callers run elsewhere).
//
// Thread safety: run() drives `io` on the calling thread, so no other thread may run that
// io_context at the same time. IoThread's executor may be used from any thread.
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <exception>
#include <optional>
#include <thread>
#include <type_traits>
#include <utility>

#include "idem/async/task.hpp"

namespace idem::test {

// Runs `task` on `io` until it and everything it started are done, and returns its result (or
// rethrows its exception). The outcome is taken on the io_context's thread (asio::use_future
// would complete on Asio's system executor threads).
template <class T>
T run(asio::io_context& io, idem::async::Task<T> task) {
  std::exception_ptr error;
  if constexpr (std::is_void_v<T>) {
    asio::co_spawn(io, std::move(task), [&](std::exception_ptr e) { error = e; });
    io.restart();
    io.run();
    if (error) std::rethrow_exception(error);
  } else {
    std::optional<T> value;
    asio::co_spawn(io, std::move(task), [&](std::exception_ptr e, T v) {
      error = e;
      if (!e) value.emplace(std::move(v));
    });
    io.restart();
    io.run();
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
}

// An io_context run by a thread of its own until destruction. The destructor lets the work
// still queued (a backend's shut-down) finish before it joins the thread, so destroy whatever
// uses the executor first.
class IoThread {
 public:
  IoThread() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  IoThread(const IoThread&) = delete;
  IoThread& operator=(const IoThread&) = delete;
  ~IoThread() {
    work_.reset();
    thread_.join();
  }

  asio::io_context::executor_type executor() noexcept { return io_.get_executor(); }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

}  // namespace idem::test
