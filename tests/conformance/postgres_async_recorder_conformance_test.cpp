// AsyncPostgresRecorder on a real server (IDEM_TEST_POSTGRES_URL), each test in a schema of its
// own that is dropped afterwards; once with one connection (every statement of every coroutine
// pipelined on it), once with four.
//
// The async recorder suite (idem/testing/async_recorder_conformance.hpp): the pool's connections
// run on an io_context of its own thread, so every call also checks that the caller resumes on
// its own executor. The blocking recorder suite (idem/testing/recorder_conformance.hpp) through
// BlockingOverAsyncRecorder: the pool on the adapter's executor, its time from the suite's
// ManualClock, and the operator calls answered by a PostgresIdempotencyRecorder on the same
// schema.
#include <memory>
#include <utility>

#include "../postgres_test_support.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "postgres_async_factories.hpp"
#include "recorder_traits.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

template <int PoolSize>
struct AsyncPostgresFactory
    : idem::test::AsyncRecorderTraits<true>,
      idem::test::pg::AsyncFactory<idem::postgres::AsyncPostgresRecorder, PoolSize> {};

template <int PoolSize>
struct BlockingOverAsyncPostgresFactory
    : idem::test::RecorderTraits<true, 100>,
      idem::test::pg::BlockingOverAsyncFactory<
          idem::testing::BlockingOverAsyncRecorder, idem::postgres::AsyncPostgresRecorder,
          idem::postgres::PostgresIdempotencyRecorder, PoolSize> {};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncPostgresOneConnection, AsyncPostgresFactory<1>);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncPostgresFourConnections, AsyncPostgresFactory<4>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncPostgresOneConnection,
                                 BlockingOverAsyncPostgresFactory<1>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncPostgresFourConnections,
                                 BlockingOverAsyncPostgresFactory<4>);
