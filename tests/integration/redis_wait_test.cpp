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
#include <stop_token>
#include <string>

#include "idem/redis/redis_store.hpp"
#include "redis_test_env.hpp"
#include "redis_wait_cases.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;
using idem::redis::RedisIdempotencyStore;
namespace wait_cases = idem::test::redis_wait;

class RedisWait : public ::testing::Test {
 protected:
  // Each wait runs in a thread of its own.
  wait_cases::StartWait waits_of(RedisIdempotencyStore& store) {
    return [&store](const std::string& key, std::chrono::seconds limit, std::stop_token stop) {
      return std::async(std::launch::async, [&store, key, limit, stop] {
        return store.wait(key, std::chrono::steady_clock::now() + limit, stop);
      });
    };
  }

  idem::test::RedisTestPrefix keys{"wait"};
};

TEST_F(RedisWait, AWaiterIsWokenByTheCompletionInAnotherProcess) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  wait_cases::expect_completion_wakes(owner, keys, waits_of(waiter));
}

TEST_F(RedisWait, AReleaseOrARemoveWakesItToo) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  wait_cases::expect_release_and_remove_wake(owner, keys, waits_of(waiter));
}

// An owner that dies publishes nothing: the waiter looks again when the lease ends.
TEST_F(RedisWait, ASilentOwnerIsNoticedWhenItsLeaseEnds) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  wait_cases::expect_silent_owner_noticed(owner, waits_of(waiter));
}

TEST_F(RedisWait, AStoppedWaiterReturnsWhatItSaw) {
  RedisIdempotencyStore owner(keys.options());
  RedisIdempotencyStore waiter(keys.options());
  wait_cases::expect_stopped_waiter_returns(owner, keys, waits_of(waiter));
}

// On a cluster the channel lives on the node of the record's slot (SSUBSCRIBE / SPUBLISH).
TEST_F(RedisWait, OnAClusterTheWaiterSubscribesOnTheRecordsNode) {
  const auto options = wait_cases::cluster_options(keys);
  if (!options) GTEST_SKIP() << "no IDEM_TEST_REDIS_CLUSTER_URL";
  RedisIdempotencyStore owner(*options);
  RedisIdempotencyStore waiter(*options);
  wait_cases::expect_cluster_waiter_on_the_records_node(owner, keys, waits_of(waiter));
}

}  // namespace
