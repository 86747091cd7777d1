// The names idem's tests of the Redis coroutine face use: those of redis_names.hpp and the
// coroutine face's, brought in with `using namespace idem::test::redis_async_names;`.
#pragma once

#include "../async_test_support.hpp"
#include "idem/async/task.hpp"
#include "idem/redis/async_connection.hpp"
#include "idem/redis/async_redis_recorder.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "redis_names.hpp"

namespace idem::test::redis_async_names {

using namespace idem::test::redis_names;
using idem::async::Task;
using idem::redis::AsyncConnection;
using idem::redis::AsyncConnectionPool;
using idem::redis::AsyncRedisRecorder;
using idem::redis::AsyncRedisStore;
using idem::test::run;  // bounded: a hang fails the test instead of blocking it

}  // namespace idem::test::redis_async_names
