// The recorder conformance suite (idem/testing/recorder_conformance.hpp) against
// RedisIdempotencyRecorder on the test server (IDEM_TEST_REDIS_URL), each test under a key
// prefix of its own that is deleted afterwards; once with plain markers, once with marker TTLs
// (long enough never to fire during a test) and a small pool, so leases are contended.
#include <memory>

#include "../integration/redis_test_env.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

struct RedisRecorderFactory : idem::test::RecorderTraits<false, 100> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(keys.options(std::move(clock)));
  }

  idem::test::RedisTestPrefix keys{"recorder"};
};

struct RedisRecorderWithTtlFactory : idem::test::RecorderTraits<false, 100> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    auto options = keys.options(std::move(clock));
    options.marker_ttl = std::chrono::hours(24 * 365 * 10);
    options.pool_size = 2;  // eight racing threads share two connections
    options.wait_timeout = std::chrono::seconds(30);
    return std::make_shared<idem::redis::RedisIdempotencyRecorder>(options);
  }

  idem::test::RedisTestPrefix keys{"recorder-ttl"};
};

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(Redis, RedisRecorderFactory);
INSTANTIATE_RECORDER_CONFORMANCE(RedisMarkerTtl, RedisRecorderWithTtlFactory);
