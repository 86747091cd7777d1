// The async recorder cases (tests/async_recorder_cases.hpp) against AsyncRedisRecorder on the test
// server (IDEM_TEST_REDIS_URL), each test under a key prefix of its own that is deleted
// afterwards. The recorder's socket I/O runs on an io_context of its own thread, so every call
// also checks that the caller resumes on its own executor; once with the default single
// pipelined connection, once with two connections and marker TTLs (long enough never to fire).
#include <chrono>
#include <memory>

#include "../async_recorder_cases.hpp"
#include "../async_test_support.hpp"
#include "../integration/redis_test_env.hpp"
#include "idem/redis/async_redis_recorder.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

constexpr idem::async::RecorderCapabilities kClaims{.claims = true, .transactions = false};

struct AsyncRedisFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kClaims;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(), keys.options());
  }
  // Destroyed in reverse: the prefix's keys are deleted after the I/O thread has stopped.
  idem::test::RedisTestPrefix keys{"async-recorder"};
  idem::test::IoThread io;
};

struct AsyncRedisTwoConnectionsFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kClaims;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    auto options = keys.options();
    options.async_connections = 2;
    options.marker_ttl = std::chrono::hours(24 * 365 * 10);
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(), options);
  }
  idem::test::RedisTestPrefix keys{"async-recorder-ttl"};
  idem::test::IoThread io;
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CASES(AsyncRedis, AsyncRedisFactory);
INSTANTIATE_ASYNC_RECORDER_CASES(AsyncRedisTwoConnections, AsyncRedisTwoConnectionsFactory);
