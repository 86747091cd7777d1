// AsyncRedisRecorder on the test server (IDEM_TEST_REDIS_URL), each test under a key prefix of its
// own that is deleted afterwards; once with the default single pipelined connection, once with two
// connections and marker TTLs (long enough never to fire).
//
// The async recorder suite (idem/testing/async_recorder_conformance.hpp): the recorder's socket
// I/O runs on an io_context of its own thread, so every call also checks that the caller resumes
// on its own executor. The blocking recorder suite (idem/testing/recorder_conformance.hpp)
// through BlockingOverAsyncRecorder: the recorder's I/O on the adapter's executor, its time from
// the suite's ManualClock, and the operator calls answered by a RedisIdempotencyRecorder on the
// same prefix.
#include <chrono>
#include <memory>
#include <utility>

#include "../integration/redis_test_env.hpp"
#include "blocking_over_async_backend.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

struct AsyncRedisFactory : idem::test::AsyncRecorderTraits<false> {
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(), keys.options());
  }
  // Destroyed in reverse: the prefix's keys are deleted after the I/O thread has stopped.
  idem::test::RedisTestPrefix keys{"async-recorder"};
  idem::testing::IoThread io;
};

struct AsyncRedisTwoConnectionsFactory : idem::test::AsyncRecorderTraits<false> {
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    auto options = keys.options();
    options.async_connections = 2;
    options.marker_ttl = std::chrono::hours(24 * 365 * 10);
    return std::make_shared<idem::redis::AsyncRedisRecorder>(io.executor(), options);
  }
  idem::test::RedisTestPrefix keys{"async-recorder-ttl"};
  idem::testing::IoThread io;
};

// Two connections and marker TTLs when `Ttl`.
template <bool Ttl>
struct BlockingOverAsyncRedisFactory : idem::test::RecorderTraits<false, 100> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    auto options = keys.options(std::move(clock));
    if (Ttl) {
      options.async_connections = 2;
      options.marker_ttl = std::chrono::hours(24 * 365 * 10);
    }
    return idem::test::blocking_over_async<idem::testing::BlockingOverAsyncRecorder,
                                           idem::redis::AsyncRedisRecorder,
                                           idem::redis::RedisIdempotencyRecorder>(options);
  }
  // Deleted after the recorder (and the adapter's I/O thread) have gone.
  idem::test::RedisTestPrefix keys{Ttl ? "bova-recorder-ttl" : "bova-recorder"};
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncRedis, AsyncRedisFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncRedisTwoConnections, AsyncRedisTwoConnectionsFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncRedis, BlockingOverAsyncRedisFactory<false>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncRedisTwoConnections,
                                 BlockingOverAsyncRedisFactory<true>);
