// Redis over TLS on the coroutine face (AsyncConnection, AsyncRedisRecorder, AsyncRedisStore),
// against the listeners redis_tls_env.hpp names: calls over mutual TLS from concurrent
// coroutines on one pipelined connection, a reconnect after CLIENT KILL, an idle connection kept
// across TLS 1.3 session tickets, and every refusal of redis_tls_test.cpp classified the same way.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "idem/error.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"
#include "redis_async_connection_cases.hpp"
#include "redis_async_names.hpp"
#include "redis_tls_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::tls;
using namespace idem::test::redis_async_names;

class RedisTlsAsync : public RedisTls {
 protected:
  asio::io_context io_;
};

TEST_F(RedisTlsAsync, AsyncRecorderAndStoreWorkOverTlsUnderConcurrentCoroutines) {
  AsyncRedisStore store(io_.get_executor(), tls_options());
  const ClaimOutcome claimed = run(io_, store.claim("k", std::string_view("fp"), 10s));
  ASSERT_EQ(claimed.status, ClaimOutcome::Status::acquired);
  StoredValue value;
  value.bytes = "async-tls";
  EXPECT_TRUE(run(io_, store.complete("k", claimed.token, value, ExecutionReport{}, 60s)));
  const auto found = run(io_, store.lookup("k"));
  ASSERT_TRUE(found.has_value());
  EXPECT_EQ(found->value.bytes, value.bytes);

  AsyncRedisRecorder recorder(io_.get_executor(), tls_options());
  constexpr int kCalls = 400;
  std::atomic<int> done{0}, acquired{0};
  for (int i = 0; i < kCalls; ++i) {
    asio::co_spawn(
        io_,
        [&, i]() -> Task<void> {
          const Claim claim = co_await recorder.claim("c", "e" + std::to_string(i % 200), 30s);
          if (claim.status == Claim::Status::acquired) ++acquired;
          ++done;
        },
        asio::detached);
  }
  io_.restart();
  for (int round = 0; round < 300 && done.load() < kCalls; ++round)
    io_.run_for(100ms);
  EXPECT_EQ(done.load(), kCalls);
  EXPECT_EQ(acquired.load(), 200) << "each id acquired exactly once";
  EXPECT_EQ(recorder.pool()->stats().connects, 1u);
  EXPECT_LT(recorder.pool()->stats().writes, recorder.pool()->stats().commands);
  // Written by coroutines over TLS, read by a blocking plaintext recorder.
  run(io_, recorder.mark_processed("c", "from-async"));
  EXPECT_TRUE(RedisIdempotencyRecorder(keys_.options()).is_processed("c", "from-async"));
}

TEST_F(RedisTlsAsync, AsyncConnectionKeepsTlsAcrossAKillAndIdleTime) {
  AsyncConnection connection(io_.get_executor(), tls_options());
  const RedisReply id = run(io_, connection.command({"CLIENT", "ID"}, CommandKind::read));
  ASSERT_EQ(id.type, RedisReply::Type::integer);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(run(io_, connection.command({"PING"}, CommandKind::read)).str, "PONG");
  EXPECT_EQ(connection.stats().connects, 1u) << "an idle TLS connection was dropped";

  idem::test::expect_idle_kill_replaced(io_, connection, keys_, id.integer);
  const RedisReply again = run(io_, connection.command({"CLIENT", "ID"}, CommandKind::read));
  EXPECT_NE(again.integer, id.integer);
}

TEST_F(RedisTlsAsync, EveryRefusalIsANonRetryableTlsErrorNamingItsCause) {
  ASSERT_NE(port_of("IDEM_TEST_REDIS_TLS_EXPIRED_PORT"), 0);
  expect_every_refusal(
      tls_options(), "async",
      [&](const RedisOptions& options) {
        AsyncRedisRecorder recorder(io_.get_executor(), options);
        (void)run(io_, recorder.is_processed("c", "e"));
      },
      [&](const RedisOptions& options) {
        AsyncRedisStore store(io_.get_executor(), options);
        (void)run(io_, store.claim("k", std::nullopt, 10s));
      });
  EXPECT_EQ(keys_.key_count(), 0u) << "a refused connection wrote something";
}

TEST_F(RedisTlsAsync, FilesThatCannotBeUsedAreConfigErrorsWhenThePoolIsMade) {
  RedisOptions options = tls_options();
  options.tls->ca_file = "/nonexistent/ca.pem";
  try {
    AsyncRedisRecorder recorder(io_.get_executor(), options);
    ADD_FAILURE() << "a missing CA file was accepted";
  } catch (const idem::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot read ca_file"), std::string::npos) << e.what();
  }
}

}  // namespace
