// Shared by the tests of idem::redis::AsyncConnection over plaintext (redis_async_test.cpp) and
// over TLS (redis_tls_async_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <chrono>
#include <string>
#include <thread>

#include "../async_test_support.hpp"
#include "idem/redis/async_connection.hpp"
#include "redis_test_env.hpp"

namespace idem::test {

// Kills the server side of `connection` (whose CLIENT ID is `id`) while nothing is in flight: the
// dead socket is noticed before the next write, and that call reconnects and succeeds.
inline void expect_idle_kill_replaced(asio::io_context& io, redis::AsyncConnection& connection,
                                      const RedisTestPrefix& keys, long long id) {
  keys.command({"CLIENT", "KILL", "ID", std::to_string(id)});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const redis::RedisReply reply =
      run(io, connection.command({"SET", keys.prefix() + "y", "1"}, redis::CommandKind::write));
  EXPECT_EQ(reply.str, "OK");
  EXPECT_EQ(connection.stats().connects, 2u);
}

}  // namespace idem::test
