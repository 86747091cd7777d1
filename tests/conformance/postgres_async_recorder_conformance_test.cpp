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

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

constexpr idem::async::RecorderCapabilities kAll{.claims = true, .transactions = true};

template <int PoolSize>
struct AsyncPostgresFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kAll;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    if (!idem::test::pg::server_url()) return nullptr;
    auto options = schema.options();
    options.pool_size = PoolSize;
    return std::make_shared<idem::postgres::AsyncPostgresRecorder>(io.executor(), options);
  }
  idem::test::pg::TempSchema schema;  // dropped after the I/O thread has stopped
  idem::testing::IoThread io;
};

template <int PoolSize>
struct BlockingOverAsyncPostgresFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = true;
  static constexpr int kConcurrentIds = 100;
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    if (!idem::test::pg::server_url()) return nullptr;
    auto options = schema.options();
    options.clock = std::move(clock);
    options.pool_size = PoolSize;
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(
        [options](asio::any_io_executor executor) {
          return std::make_shared<idem::postgres::AsyncPostgresRecorder>(std::move(executor),
                                                                         options);
        },
        std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options));
  }
  idem::test::pg::TempSchema schema;  // dropped after the recorder (and the adapter's thread)
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncPostgresOneConnection, AsyncPostgresFactory<1>);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncPostgresFourConnections, AsyncPostgresFactory<4>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncPostgresOneConnection,
                                 BlockingOverAsyncPostgresFactory<1>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncPostgresFourConnections,
                                 BlockingOverAsyncPostgresFactory<4>);
