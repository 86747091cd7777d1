// Shared by the tests of the Redis stores' wait() (redis_wait_test.cpp: the blocking store,
// redis_async_wait_test.cpp: the coroutine store): the cases both faces must pass, each given the
// owner (a blocking store standing for another process) and a way to start a wait on the store
// under test.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <future>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "idem/idempotency_store.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_nodes_env.hpp"
#include "redis_test_env.hpp"

namespace idem::test::redis_wait {

using Waited = std::optional<IdempotencyRecord>;

// Starts a wait for `key` on the store under test that gives up after `limit` or when `stop` is
// requested.
using StartWait = std::function<std::future<Waited>(
    const std::string& key, std::chrono::seconds limit, std::stop_token stop)>;

inline StoredValue bytes(std::string text) {
  StoredValue value;
  value.bytes = std::move(text);
  return value;
}

// The channel on which complete(), release() and remove() announce the end of `key`'s claim.
inline std::string done_channel(const RedisTestPrefix& keys, const std::string& key) {
  return keys.prefix() + "s:{" + key + "}:done";
}

// Subscribers of `key`'s channel on the test server.
inline long long waiting_on(const RedisTestPrefix& keys, const std::string& key) {
  return redis_nodes::subscribers(keys.options().port, done_channel(keys, key), false);
}

// The owner's completion wakes the waiter, which subscribed first and lets go after.
// `while_subscribed` and `once_woken` add a face's own checks at those two points.
inline void expect_completion_wakes(redis::RedisIdempotencyStore& owner,
                                    const RedisTestPrefix& keys, const StartWait& wait,
                                    const std::function<void()>& while_subscribed = {},
                                    const std::function<void()>& once_woken = {}) {
  using namespace std::chrono_literals;
  const auto claim = owner.claim("payment-1", std::nullopt, 60s);
  ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);
  auto waited = wait("payment-1", 30s, {});
  ASSERT_TRUE(redis_nodes::poll_until([&] { return waiting_on(keys, "payment-1") == 1; }))
      << "the waiter did not subscribe to the record's channel";
  if (while_subscribed) while_subscribed();
  ASSERT_TRUE(owner.complete("payment-1", claim.token, bytes("paid"), {}, 60s));
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << "the completion did not wake it";
  const auto record = waited.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::completed);
  EXPECT_EQ(record->value.bytes, "paid");
  if (once_woken) once_woken();
  EXPECT_TRUE(redis_nodes::poll_until([&] { return waiting_on(keys, "payment-1") == 0; }))
      << "the waiter kept its subscription";
}

// A release and a remove wake the waiter too, with nothing to return.
inline void expect_release_and_remove_wake(redis::RedisIdempotencyStore& owner,
                                           const RedisTestPrefix& keys, const StartWait& wait) {
  using namespace std::chrono_literals;
  for (const bool remove : {false, true}) {
    const std::string key = remove ? "removed" : "released";
    const auto claim = owner.claim(key, std::nullopt, 60s);
    auto waited = wait(key, 30s, {});
    ASSERT_TRUE(redis_nodes::poll_until([&] { return waiting_on(keys, key) == 1; }));
    ASSERT_TRUE(remove ? owner.remove(key, claim.token) : owner.release(key, claim.token));
    ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << key;
    EXPECT_FALSE(waited.get().has_value()) << key << ": the record is gone";
  }
}

// An owner that dies publishes nothing: the waiter looks again when the lease ends.
inline void expect_silent_owner_noticed(redis::RedisIdempotencyStore& owner,
                                        const StartWait& wait) {
  using namespace std::chrono_literals;
  const auto claim = owner.claim("abandoned", std::nullopt, 300ms);
  ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);
  auto waited = wait("abandoned", 30s, {});
  ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << "the lease's end went unnoticed";
  const auto record = waited.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::in_progress);
  EXPECT_LE(record->lease_until, std::chrono::system_clock::now());  // the lease has ended
}

// A stopped waiter returns what it saw (the record in progress) and lets go of its subscription.
inline void expect_stopped_waiter_returns(redis::RedisIdempotencyStore& owner,
                                          const RedisTestPrefix& keys, const StartWait& wait) {
  using namespace std::chrono_literals;
  (void)owner.claim("held", std::nullopt, 60s);
  std::stop_source stop;
  auto stopped = wait("held", 30s, stop.get_token());
  ASSERT_TRUE(redis_nodes::poll_until([&] { return waiting_on(keys, "held") == 1; }));
  stop.request_stop();
  ASSERT_EQ(stopped.wait_for(10s), std::future_status::ready) << "stop did not end the wait";
  const auto record = stopped.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::in_progress);
  ASSERT_TRUE(redis_nodes::poll_until([&] { return waiting_on(keys, "held") == 0; }));
}

// Options for the test cluster (IDEM_TEST_REDIS_CLUSTER_URL) under `keys`' prefix; nullopt when
// there is none.
inline std::optional<redis::RedisOptions> cluster_options(const RedisTestPrefix& keys) {
  const std::string url = env("IDEM_TEST_REDIS_CLUSTER_URL");
  if (url.empty()) return std::nullopt;
  auto options = redis::RedisOptions::from_url(url);
  options.key_prefix = keys.prefix();
  return options;
}

// On a cluster (`owner` and the waiter on it) the channel lives on the node of the record's slot
// (SSUBSCRIBE / SPUBLISH): the waiter subscribes there, is woken, and lets go.
inline void expect_cluster_waiter_on_the_records_node(redis::RedisIdempotencyStore& owner,
                                                      const RedisTestPrefix& keys,
                                                      const StartWait& wait) {
  using namespace std::chrono_literals;
  std::vector<int> primaries = redis_nodes::ports_of("IDEM_TEST_REDIS_CLUSTER_PORTS");
  if (primaries.size() > 3) primaries.resize(3);
  const auto total = [&](const std::string& key) {
    long long sum = 0;
    for (int p : primaries)
      sum += redis_nodes::subscribers(p, done_channel(keys, key), true);
    return sum;
  };
  for (const std::string key : {"order-1", "order-2", "order-3", "order-4"}) {
    const auto claim = owner.claim(key, std::nullopt, 60s);
    auto waited = wait(key, 30s, {});
    ASSERT_TRUE(redis_nodes::poll_until([&] { return total(key) == 1; })) << key;
    ASSERT_TRUE(owner.complete(key, claim.token, bytes(key), {}, 60s));
    ASSERT_EQ(waited.wait_for(10s), std::future_status::ready) << key;
    const auto record = waited.get();
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->value.bytes, key);
    EXPECT_TRUE(redis_nodes::poll_until([&] { return total(key) == 0; })) << key;
  }
}

}  // namespace idem::test::redis_wait
