// ConnectionPool and RedisConnection against the test server: RAII leases and reuse, exhaustion
// and wait_timeout, a connection killed by the server is dropped and replaced, timeouts and lost
// replies classified (retryable / in doubt), error replies, AUTH and SELECT refusals, pipelines.
#include <gtest/gtest.h>

#include <condition_variable>
#include <latch>
#include <mutex>
#include <string>
#include <thread>

#include "idem/error.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "redis_names.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_names;

class RedisPool : public ::testing::Test {
 protected:
  idem::redis::RedisOptions options() const { return keys_.options(); }

  // Kills the server side of the connection whose CLIENT ID is `id`, from another connection.
  void kill_client(long long id) const {
    const RedisReply reply = keys_.command({"CLIENT", "KILL", "ID", std::to_string(id)});
    ASSERT_EQ(reply.type, RedisReply::Type::integer) << reply.str;
    ASSERT_EQ(reply.integer, 1);
  }

  idem::test::RedisTestPrefix keys_{"pool"};
};

long long client_id(idem::redis::RedisConnection& connection) {
  const RedisReply reply = connection.command({"CLIENT", "ID"}, CommandKind::read);
  EXPECT_EQ(reply.type, RedisReply::Type::integer);
  return reply.integer;
}

TEST_F(RedisPool, LeasesAreReturnedAndReused) {
  ConnectionPool pool(options());
  long long first = 0;
  {
    auto lease = pool.lease();
    first = client_id(*lease);
    EXPECT_EQ(pool.stats().open, 1u);
    EXPECT_EQ(pool.stats().idle, 0u);
  }
  EXPECT_EQ(pool.stats().idle, 1u) << "the lease's destructor returns the connection";
  for (int i = 0; i < 10; ++i) {
    auto lease = pool.lease();
    EXPECT_EQ(client_id(*lease), first) << "an idle connection is reused";
  }
  const auto stats = pool.stats();
  EXPECT_EQ(stats.connects, 1u);
  EXPECT_EQ(stats.dropped, 0u);

  // Two at once need two connections; moving a lease moves the connection.
  auto a = pool.lease();
  auto b = pool.lease();
  EXPECT_NE(client_id(*a), client_id(*b));
  auto c = std::move(a);
  EXPECT_EQ(pool.stats().open, 2u);
  EXPECT_EQ(pool.stats().idle, 0u);
}

TEST_F(RedisPool, ExhaustedPoolFailsAfterWaitTimeout) {
  auto opts = options();
  opts.pool_size = 1;
  opts.wait_timeout = 0ms;
  ConnectionPool pool(opts);
  auto held = pool.lease();
  try {
    auto second = pool.lease();
    FAIL() << "a second lease of a one-connection pool succeeded";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::pool_exhausted);
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt());
    EXPECT_NE(std::string(e.what()).find("pool_size"), std::string::npos) << e.what();
  }
}

TEST_F(RedisPool, AWaitingLeaseGetsTheReturnedConnection) {
  auto opts = options();
  opts.pool_size = 1;
  opts.wait_timeout = 60s;  // far beyond the handover below
  ConnectionPool pool(opts);
  auto held = std::make_unique<idem::redis::ConnectionLease>(pool.lease());
  const long long id = client_id(**held);
  std::latch waiting(1);
  long long seen = 0;
  std::thread waiter([&] {
    waiting.count_down();
    auto lease = pool.lease();  // blocks until `held` is returned
    seen = client_id(*lease);
  });
  waiting.wait();
  held.reset();  // return it (whether or not the waiter is already blocked)
  waiter.join();
  EXPECT_EQ(seen, id);
  EXPECT_EQ(pool.stats().connects, 1u);
}

TEST_F(RedisPool, AConnectionKilledWhileIdleIsReplaced) {
  ConnectionPool pool(options());
  long long id = 0;
  {
    auto lease = pool.lease();
    id = client_id(*lease);
  }
  kill_client(id);
  // The dead idle connection is noticed when leased and replaced by a fresh one.
  auto lease = pool.lease();
  EXPECT_NE(client_id(*lease), id);
  EXPECT_EQ(pool.stats().dropped, 1u);
  EXPECT_EQ(pool.stats().connects, 2u);
}

TEST_F(RedisPool, AConnectionKilledMidUseFailsRetryableAndIsDropped) {
  ConnectionPool pool(options());
  {
    auto lease = pool.lease();
    kill_client(client_id(*lease));
    try {
      (void)lease->command({"GET", keys_.prefix() + "x"}, CommandKind::read, "get");
      FAIL() << "a command on a killed connection succeeded";
    } catch (const RedisError& e) {
      EXPECT_EQ(e.failure(), RedisFailure::io);
      EXPECT_TRUE(e.retryable());
      EXPECT_FALSE(e.in_doubt()) << "a read changes nothing";
    }
    EXPECT_TRUE(lease->broken());
  }
  EXPECT_EQ(pool.stats().open, 0u) << "a broken connection is not returned to the pool";
  EXPECT_EQ(pool.stats().dropped, 1u);
  auto lease = pool.lease();
  EXPECT_EQ(lease->command({"PING"}).str, "PONG");
}

TEST_F(RedisPool, TimeoutsAreRetryableAndInDoubtForWrites) {
  auto opts = options();
  opts.command_timeout = 50ms;  // BLPOP on an empty list never answers, so any value times out
  ConnectionPool pool(opts);
  const std::string list = keys_.prefix() + "never";
  struct Case {
    CommandKind kind;
    bool in_doubt;
    bool retryable;
  };
  for (const Case& c : {Case{CommandKind::read, false, true}, Case{CommandKind::write, true, false},
                        Case{CommandKind::idempotent_write, true, true}}) {
    auto lease = pool.lease();
    try {
      (void)lease->command({"BLPOP", list, "0"}, c.kind, "blpop");
      FAIL() << "BLPOP on an empty list answered";
    } catch (const RedisError& e) {
      EXPECT_EQ(e.failure(), RedisFailure::io);
      EXPECT_TRUE(e.timed_out()) << e.what();
      EXPECT_EQ(e.in_doubt(), c.in_doubt) << e.what();
      EXPECT_EQ(e.retryable(), c.retryable) << e.what();
      EXPECT_NE(std::string(e.what()).find("blpop"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(lease->broken()) << "a timed-out connection may still get the late reply";
  }
  EXPECT_EQ(pool.stats().dropped, 3u);
}

TEST_F(RedisPool, ErrorRepliesAreValuesAndKeepTheConnection) {
  ConnectionPool pool(options());
  auto lease = pool.lease();
  const RedisReply reply = lease->command({"NOSUCHCOMMAND", "x"});
  EXPECT_TRUE(reply.is_error());
  EXPECT_NE(reply.str.find("unknown command"), std::string::npos) << reply.str;
  EXPECT_FALSE(lease->broken());
  EXPECT_EQ(lease->command({"PING"}).str, "PONG");
}

TEST_F(RedisPool, PipelinesAnswerInOrderAndAreBinarySafe) {
  ConnectionPool pool(options());
  auto lease = pool.lease();
  const std::string key = keys_.prefix() + "bin";
  const std::string value("a\0b\r\n$3\r\n", 10);
  lease->append({"SET", key, value});
  lease->append({"GET", key});
  lease->append({"INCR", key});  // an error reply in the middle of the batch
  lease->append({"STRLEN", key});
  EXPECT_EQ(lease->pending(), 4u);
  const auto replies = lease->read_replies(CommandKind::write, "pipeline");
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0].str, "OK");
  EXPECT_EQ(replies[1].type, RedisReply::Type::string);
  EXPECT_EQ(replies[1].str, value);
  EXPECT_TRUE(replies[2].is_error());
  EXPECT_EQ(replies[3].integer, 10);
  EXPECT_EQ(lease->pending(), 0u);
}

TEST_F(RedisPool, AnAbandonedPipelineIsNotReturnedToThePool) {
  ConnectionPool pool(options());
  {
    auto lease = pool.lease();
    lease->append({"PING"});  // queued, never read
  }
  EXPECT_EQ(pool.stats().idle, 0u);
  EXPECT_EQ(pool.stats().dropped, 1u);
}

TEST_F(RedisPool, ACommandCannotJumpQueuedPipelineCommands) {
  ConnectionPool pool(options());
  auto lease = pool.lease();
  lease->append({"ECHO", "first"});
  EXPECT_THROW((void)lease->command({"ECHO", "second"}), idem::InvalidArgument);
  const auto replies = lease->read_replies(CommandKind::read);
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].str, "first");
  EXPECT_EQ(lease->command({"ECHO", "third"}).str, "third");
}

TEST_F(RedisPool, RefusedAuthAndSelectAreNotRetryable) {
  auto opts = options();
  opts.password = "not-the-password";  // the test server has none
  ConnectionPool with_password(opts);
  try {
    auto lease = with_password.lease();
    FAIL() << "AUTH was accepted";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::auth);
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed);
    EXPECT_FALSE(e.retryable());
    EXPECT_EQ(std::string(e.what()).find("not-the-password"), std::string::npos)
        << "the password leaked into the message: " << e.what();
  }
  opts = options();
  opts.db = 100000;
  ConnectionPool bad_db(opts);
  try {
    auto lease = bad_db.lease();
    FAIL() << "SELECT 100000 was accepted";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), RedisFailure::auth);
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("SELECT 100000"), std::string::npos) << e.what();
  }
  EXPECT_EQ(bad_db.stats().open, 0u);
}

TEST_F(RedisPool, SelectsTheDatabaseOfTheOptions) {
  auto opts = options();
  opts.db = 5;
  ConnectionPool pool(opts);
  auto lease = pool.lease();
  const RedisReply info = lease->command({"CLIENT", "INFO"}, CommandKind::read);
  EXPECT_NE(info.str.find(" db=5 "), std::string::npos) << info.str;
}

TEST_F(RedisPool, ManyThreadsShareASmallPool) {
  auto opts = options();
  opts.pool_size = 3;
  opts.wait_timeout = 60s;
  ConnectionPool pool(opts);
  const std::string counter = keys_.prefix() + "counter";
  constexpr int kThreads = 8;
  constexpr int kIncrements = 200;
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      for (int i = 0; i < kIncrements; ++i) {
        auto lease = pool.lease();
        (void)lease->command({"INCR", counter});
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(keys_.command({"GET", counter}).str, std::to_string(kThreads * kIncrements));
  EXPECT_LE(pool.stats().connects, 3u);
}

}  // namespace
