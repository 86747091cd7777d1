// AsyncPostgresStore on a real server (IDEM_TEST_POSTGRES_URL), each test in a schema of its own
// that is dropped afterwards; once with one connection, once with four.
//
// The async store suite (idem/testing/async_store_conformance.hpp): the pool's connections run
// on an io_context of its own thread, so every call also checks that the caller resumes on its
// own executor. The blocking store suite (idem/testing/store_conformance.hpp) through
// BlockingOverAsyncStore: the pool on the adapter's executor, its time from the suite's
// ManualClock, and the operator calls answered by a PostgresIdempotencyStore on the same schema.
#include <memory>
#include <utility>

#include "../postgres_test_support.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/store_conformance.hpp"
#include "postgres_async_factories.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

template <int PoolSize>
using AsyncPostgresStoreFactory =
    idem::test::pg::AsyncFactory<idem::postgres::AsyncPostgresStore, PoolSize>;

template <int PoolSize>
struct BlockingOverAsyncPostgresStoreFactory
    : idem::test::pg::BlockingOverAsyncFactory<idem::testing::BlockingOverAsyncStore,
                                               idem::postgres::AsyncPostgresStore,
                                               idem::postgres::PostgresIdempotencyStore, PoolSize> {
  static constexpr int kRaceKeys = 20;
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncPostgresStoreOneConnection, AsyncPostgresStoreFactory<1>);
INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncPostgresStoreFourConnections,
                                    AsyncPostgresStoreFactory<4>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncPostgresStoreOneConnection,
                              BlockingOverAsyncPostgresStoreFactory<1>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncPostgresStoreFourConnections,
                              BlockingOverAsyncPostgresStoreFactory<4>);
