// RedisIdempotencyStore::wait() is woken by the owner's completion, not by polling: the waiter
// subscribes to the record's channel (SUBSCRIBE; SSUBSCRIBE on the node of the record's slot on a
// cluster) before it reads the record, and complete(), release() and remove() publish to it.
// Two stores on one server stand for two processes. What is asserted is behaviour: the waiter is
// subscribed while it waits (PUBSUB NUMSUB / SHARDNUMSUB), returns what ended the claim, lets go
// of its subscription, and still returns when the owner dies silently (its lease ends) or the
// caller stops it.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "idem/redis/redis_store.hpp"
#include "redis_nodes_env.hpp"
#include "redis_test_env.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;
using idem::IdempotencyRecord;
using idem::redis::RedisIdempotencyStore;
using idem::redis::RedisOptions;
using Clock = std::chrono::steady_clock;
using idem::test::redis_nodes::poll_until;
using idem::test::redis_nodes::ports_of;
using idem::test::redis_nodes::subscribers;

std::future<std::optional<IdempotencyRecord>> wait_in_thread(RedisIdempotencyStore& store,
                                                             const std::string& key,
                                                             std::chrono::seconds limit,
                                                             std::stop_token stop = {}) {
  return std::async(std::launch::async, [&store, key, limit, stop] {
    return store.wait(key, Clock::now() + limit, stop);
  });
}

idem::StoredValue bytes(std::string text) {
  idem::StoredValue value;
  value.bytes = std::move(text);
  return value;
}

class RedisWait : public ::testing::Test {
 protected:
  idem::test::RedisTestPrefix keys{"wait"};
  int port() const { return keys.options().port; }
  std::string channel(const std::string& key) const {
    return keys.prefix() + "s:{" + key + "}:done";
  }
};

TEST_F(RedisWait, AWaiterIsWokenByTheCompletionInAnotherProcess) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  const auto claim = owner.claim("payment-1", std::nullopt, 60s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  auto waited = wait_in_thread(waiter, "payment-1", 30s);
  ASSERT_TRUE(poll_until([&] { return subscribers(port(), channel("payment-1"), false) == 1; }))
      << "the waiter did not subscribe to the record's channel";
  ASSERT_TRUE(owner.complete("payment-1", claim.token, bytes("paid"), {}, 60s));
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << "the completion did not wake it";
  const auto record = waited.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::completed);
  EXPECT_EQ(record->value.bytes, "paid");
  EXPECT_TRUE(poll_until([&] { return subscribers(port(), channel("payment-1"), false) == 0; }))
      << "the waiter kept its subscription";
}

TEST_F(RedisWait, AReleaseOrARemoveWakesItToo) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  for (const bool remove : {false, true}) {
    const std::string key = remove ? "removed" : "released";
    const auto claim = owner.claim(key, std::nullopt, 60s);
    auto waited = wait_in_thread(waiter, key, 30s);
    ASSERT_TRUE(poll_until([&] { return subscribers(port(), channel(key), false) == 1; }));
    ASSERT_TRUE(remove ? owner.remove(key, claim.token) : owner.release(key, claim.token));
    ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << key;
    EXPECT_FALSE(waited.get().has_value()) << key << ": the record is gone";
  }
}

// An owner that dies publishes nothing: the waiter looks again when the lease ends.
TEST_F(RedisWait, ASilentOwnerIsNoticedWhenItsLeaseEnds) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  const auto claim = owner.claim("abandoned", std::nullopt, 300ms);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  const auto record = waiter.wait("abandoned", Clock::now() + 30s, {});
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::in_progress);
  EXPECT_LE(record->lease_until, std::chrono::system_clock::now());  // the lease has ended
}

TEST_F(RedisWait, AStoppedWaiterReturnsWhatItSaw) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  (void)owner.claim("held", std::nullopt, 60s);
  std::stop_source stop;
  auto waited = wait_in_thread(waiter, "held", 30s, stop.get_token());
  ASSERT_TRUE(poll_until([&] { return subscribers(port(), channel("held"), false) == 1; }));
  stop.request_stop();
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << "stop did not end the wait";
  const auto record = waited.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::in_progress);
}

// On a cluster the channel lives on the node of the record's slot (SSUBSCRIBE / SPUBLISH).
TEST_F(RedisWait, OnAClusterTheWaiterSubscribesOnTheRecordsNode) {
  const std::string url = idem::test::env("IDEM_TEST_REDIS_CLUSTER_URL");
  if (url.empty()) GTEST_SKIP() << "no IDEM_TEST_REDIS_CLUSTER_URL";
  auto options = RedisOptions::from_url(url);
  options.key_prefix = keys.prefix();
  RedisIdempotencyStore owner(options);
  RedisIdempotencyStore waiter(options);
  std::vector<int> primaries = ports_of("IDEM_TEST_REDIS_CLUSTER_PORTS");
  if (primaries.size() > 3) primaries.resize(3);
  for (const std::string key : {"order-1", "order-2", "order-3", "order-4"}) {
    const auto claim = owner.claim(key, std::nullopt, 60s);
    auto waited = wait_in_thread(waiter, key, 30s);
    ASSERT_TRUE(poll_until([&] {
      long long total = 0;
      for (int p : primaries)
        total += subscribers(p, channel(key), true);
      return total == 1;
    })) << key;
    ASSERT_TRUE(owner.complete(key, claim.token, bytes(key), {}, 60s));
    ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << key;
    const auto record = waited.get();
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->value.bytes, key);
  }
}

}  // namespace
