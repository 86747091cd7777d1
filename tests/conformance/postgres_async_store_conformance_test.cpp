// The async store cases (tests/async_store_cases.hpp) against AsyncPostgresStore on a real
// server (IDEM_TEST_POSTGRES_URL), each test in a schema of its own that is dropped afterwards.
// The pool's connections run on an io_context of its own thread, so every call also checks that
// the caller resumes on its own executor; once with one connection, once with four.
#include <memory>

#include "../async_store_cases.hpp"
#include "../async_test_support.hpp"
#include "../postgres_test_support.hpp"
#include "idem/postgres/async_postgres.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

template <int PoolSize>
struct AsyncPostgresStoreFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    if (!idem::test::pg::server_url()) return nullptr;
    auto options = schema.options();
    options.pool_size = PoolSize;
    return std::make_shared<idem::postgres::AsyncPostgresStore>(io.executor(), options);
  }
  idem::test::pg::TempSchema schema;  // dropped after the I/O thread has stopped
  idem::test::IoThread io;
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CASES(AsyncPostgresStoreOneConnection, AsyncPostgresStoreFactory<1>);
INSTANTIATE_ASYNC_STORE_CASES(AsyncPostgresStoreFourConnections, AsyncPostgresStoreFactory<4>);
