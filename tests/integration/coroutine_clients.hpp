// Shared by the fault tests that keep coroutine clients calling a server while it goes away and
// comes back (postgres_async_restart_fault_test.cpp, postgres_async_failover_fault_test.cpp).
#pragma once

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>

#include "idem/async/task.hpp"

namespace idem::test {

// Spawns `count` coroutines on `io`. Coroutine c runs `iteration(c, n)` for n = 0, 1, ... until
// `stopping`; an iteration returns true when one of its calls failed, and the coroutine then
// pauses 5 ms (while the server is down every call fails at once: no spinning on refusals). Each
// coroutine decrements `running` when it ends; an exception that escapes one is rethrown from
// io.run().
inline void spawn_client_loops(asio::io_context& io, int count, const std::atomic<bool>& stopping,
                               std::atomic<int>& running,
                               std::function<async::Task<bool>(int c, int n)> iteration) {
  for (int c = 0; c < count; ++c) {
    asio::co_spawn(
        io,
        [&stopping, &running, iteration, c]() -> async::Task<void> {
          asio::steady_timer pause(co_await asio::this_coro::executor);
          for (int n = 0; !stopping.load(); ++n) {
            if (co_await iteration(c, n)) {
              pause.expires_after(std::chrono::milliseconds(5));
              co_await pause.async_wait(asio::use_awaitable);
            }
          }
          --running;
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
}

}  // namespace idem::test
