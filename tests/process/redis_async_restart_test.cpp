// idem::redis_async when its server dies and comes back in the middle of pipelined calls: every
// caller gets its result or a classified RedisError (connect / io; in doubt only for writes whose
// reply was lost), none hangs, and once the server is back new calls reconnect and succeed.
// Uses a private redis-server (private_redis.hpp), killed with SIGKILL and started again on the
// same port.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <string>
#include <thread>

#include "idem/error.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"
#include "private_redis.hpp"

namespace {

using idem::Claim;
using idem::async::Task;
using idem::redis::RedisError;
using idem::redis::RedisFailure;
using namespace std::chrono_literals;

TEST(RedisAsyncRestart, EveryPipelinedCallerGetsAResultOrAClassifiedError) {
  idem::test::PrivateRedis server({"--save", "", "--appendonly", "no"});
  IDEM_START_PRIVATE_REDIS(server);
  auto options = idem::redis::RedisOptions::from_url(server.url());
  options.key_prefix = "restart:";
  options.connect_timeout = 500ms;
  options.command_timeout = 2s;

  asio::io_context io;
  idem::redis::AsyncRedisRecorder recorder(io.get_executor(), options);

  constexpr int kCallers = 100;
  constexpr int kMaxCallsEach = 1'000'000;  // bounded; they stop once the server is back
  std::atomic<int> finished{0}, results{0}, connect_errors{0}, io_errors{0}, in_doubt{0},
      unexpected{0};
  std::atomic<bool> stop{false};
  for (int c = 0; c < kCallers; ++c) {
    asio::co_spawn(
        io,
        [&, c]() -> Task<void> {
          asio::steady_timer pause(io);
          for (int i = 0; i < kMaxCallsEach && !stop; ++i) {
            const std::string id = std::to_string(c) + ":" + std::to_string(i);
            bool failed = false;
            try {
              if (i % 2 == 0) {
                (void)co_await recorder.claim("consumer", id, 30s);
              } else {
                (void)co_await recorder.is_processed("consumer", id);
              }
              ++results;
            } catch (const RedisError& e) {
              if (e.failure() == RedisFailure::connect) {
                ++connect_errors;
                EXPECT_TRUE(e.retryable()) << e.what();
              } else if (e.failure() == RedisFailure::io) {
                ++io_errors;
                if (e.in_doubt()) {
                  ++in_doubt;
                  EXPECT_EQ(i % 2, 0) << "only a claim (a write) can be in doubt: " << e.what();
                  EXPECT_FALSE(e.retryable()) << e.what();
                } else {
                  EXPECT_TRUE(e.retryable()) << e.what();
                }
              } else {
                ++unexpected;
                ADD_FAILURE() << e.what();
              }
              failed = true;
            } catch (const std::exception& e) {
              ++unexpected;
              ADD_FAILURE() << e.what();
            }
            if (failed) {  // do not spin while the server is down
              pause.expires_after(20ms);
              co_await pause.async_wait(asio::use_awaitable);
            }
          }
          ++finished;
        },
        asio::detached);
  }

  std::thread chaos([&] {
    std::this_thread::sleep_for(300ms);
    server.kill();
    std::this_thread::sleep_for(300ms);
    EXPECT_TRUE(server.start());
    std::this_thread::sleep_for(1500ms);  // callers reconnect and run again
    stop = true;
  });
  io.run_for(60s);
  chaos.join();
  EXPECT_EQ(finished.load(), kCallers) << "a caller hung";
  EXPECT_EQ(unexpected.load(), 0);
  EXPECT_GT(results.load(), 0);
  EXPECT_GT(connect_errors.load() + io_errors.load(), 0) << "the restart was not noticed";
  ::testing::Test::RecordProperty("results", results.load());
  ::testing::Test::RecordProperty("connect_errors", connect_errors.load());
  ::testing::Test::RecordProperty("io_errors", io_errors.load());
  ::testing::Test::RecordProperty("in_doubt", in_doubt.load());

  // Back up: a new call reconnects (after the backoff) and succeeds.
  bool ok = false;
  asio::co_spawn(
      io,
      [&]() -> Task<void> {
        asio::steady_timer pause(io);
        for (int attempt = 0; attempt < 50 && !ok; ++attempt) {
          try {
            co_await recorder.mark_processed("consumer", "after");
            ok = co_await recorder.is_processed("consumer", "after");
          } catch (const RedisError&) {
          }
          if (!ok) {
            pause.expires_after(100ms);
            co_await pause.async_wait(asio::use_awaitable);
          }
        }
      },
      asio::detached);
  io.restart();
  io.run_for(30s);
  EXPECT_TRUE(ok);
  EXPECT_GE(recorder.pool()->stats().connects, 2u);
}

}  // namespace
