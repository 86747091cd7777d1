// The names idem's Redis tests use, brought in with `using namespace idem::test::redis_names;`
// instead of a list of using-declarations in every file; redis_async_names adds the coroutine
// face's (include redis_async_names.hpp for those).
#pragma once

#include <chrono>

#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/report.hpp"

namespace idem::test::redis_names {

using idem::Claim;
using idem::ClaimOutcome;
using idem::ExecutionReport;
using idem::IdempotencyRecord;
using idem::StoredValue;
using idem::redis::CommandKind;
using idem::redis::ConnectionPool;
using idem::redis::RedisError;
using idem::redis::RedisFailure;
using idem::redis::RedisIdempotencyRecorder;
using idem::redis::RedisIdempotencyStore;
using idem::redis::RedisOptions;
using idem::redis::RedisReply;
using namespace std::chrono_literals;

// ManualClock's default start (2030-01-01) in ms: the times records carry in tests on one.
inline constexpr long long kClockStartMs = 1893456000000;

}  // namespace idem::test::redis_names
