// Redis out of memory: with maxmemory reached and maxmemory-policy noeviction,
// the server refuses writes with -OOM. Every recorder and store write must then fail with a
// classified, retryable RedisError (failure reply, not in doubt: the server ran nothing), nothing
// may be reported processed or completed that was not, reads keep working, and the same objects
// write again once memory is available.
//
// "Memory is full" is set with CONFIG SET maxmemory 1 (one byte, below what any server uses): the
// server is then over its limit exactly as a filled one is, without the test having to fill it.
// The test runs its own private redis-server (private_redis.hpp), so the shared server's
// configuration is never touched, and it is killed with the test even when an assertion fails.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "../integration/store_fault_cases.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "private_redis.hpp"

namespace {

using namespace std::chrono_literals;
using idem::redis::RedisError;

using idem::test::PrivateRedis;

class RedisOom : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_START_PRIVATE_REDIS(server_);
    pool_ = std::make_shared<idem::redis::ConnectionPool>(options());
  }

  idem::redis::RedisOptions options() const {
    auto options = idem::redis::RedisOptions::from_url(server_.url());
    options.key_prefix = "oom:";
    options.connect_timeout = 2s;
    options.command_timeout = 5s;
    return options;
  }

  // CONFIG SET maxmemory on the private server; 0 lifts the limit.
  void set_maxmemory(const std::string& bytes) {
    auto connection = pool_->lease();
    const auto reply = connection->command({"CONFIG", "SET", "maxmemory", bytes});
    ASSERT_FALSE(reply.is_error()) << reply.str;
  }

  PrivateRedis server_{{"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction"}};
  std::shared_ptr<idem::redis::ConnectionPool> pool_;
};

// Runs `fn`, which must throw the classified OOM refusal.
template <class Fn>
void expect_oom(Fn&& fn) {
  try {
    fn();
    ADD_FAILURE() << "the write was accepted over maxmemory";
  } catch (const RedisError& e) {
    EXPECT_EQ(e.failure(), idem::redis::RedisFailure::reply) << e.what();
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt()) << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::store_error) << e.what();
    EXPECT_NE(std::string(e.what()).find("OOM"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a RedisError: " << e.what();
  }
}

TEST_F(RedisOom, RecorderWritesAreRefusedRetryablyAndResumeWhenMemoryIsFreed) {
  auto recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options());
  recorder->mark_processed("billing", "before");
  const idem::Claim held = recorder->claim("billing", "held", 30s);
  ASSERT_EQ(held.status, idem::Claim::Status::acquired);

  set_maxmemory("1");
  expect_oom([&] { recorder->mark_processed("billing", "e1"); });
  expect_oom([&] { (void)recorder->claim("billing", "e2", 30s); });
  // Completing a held claim may go through: its script deletes the claim first, and Redis lets a
  // script that has already written finish rather than leave it half done. Either way what the
  // call reports is what happened.
  bool completed_during_oom = false;
  try {
    completed_during_oom = recorder->complete("billing", "held", held.token);
    EXPECT_TRUE(completed_during_oom);
  } catch (const RedisError& e) {
    EXPECT_TRUE(e.retryable() && !e.in_doubt()) << e.what();
  }
  EXPECT_EQ(recorder->is_processed("billing", "held"), completed_during_oom);
  // Reads still work, and show nothing that was refused.
  EXPECT_TRUE(recorder->is_processed("billing", "before"));
  EXPECT_FALSE(recorder->is_processed("billing", "e1"));
  EXPECT_FALSE(recorder->is_processed("billing", "e2"));

  // A handler delivery during the fault: fails, marks nothing; redelivered later it runs.
  int runs = 0;
  idem::HandlerOptions handler_options;
  handler_options.mode = idem::HandlerMode::exclusive;
  auto handler = idem::make_idempotent_handler(
      "handler", recorder, [&](const std::string&) { ++runs; }, handler_options);
  const idem::Event event = idem::Event::make("order.created", "{}");
  idem::CollectingBusProxy bus;
  EXPECT_THROW((*handler)(event, bus), idem::StoreError);
  EXPECT_EQ(runs, 0);  // the claim itself was refused: the handler never started
  EXPECT_FALSE(recorder->is_processed("handler", event.id));

  set_maxmemory("0");
  recorder->mark_processed("billing", "e1");
  EXPECT_TRUE(recorder->is_processed("billing", "e1"));
  if (!completed_during_oom) {
    EXPECT_TRUE(recorder->complete("billing", "held", held.token));
  }
  EXPECT_TRUE(recorder->is_processed("billing", "held"));
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
  EXPECT_EQ(runs, 1);
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
}

TEST_F(RedisOom, StoreWritesAreRefusedRetryablyAndResumeWhenMemoryIsFreed) {
  idem::redis::RedisIdempotencyStore store(options());
  // Reads still work while memory is full.
  idem::test::expect_store_writes_refused_then_resumed(
      store, {.begin = [&] { set_maxmemory("1"); },
              .end = [&] { set_maxmemory("0"); },
              .expect_refused = [&](const std::function<void()>& call) { expect_oom(call); },
              .reads_during_fault = true});
}

}  // namespace
