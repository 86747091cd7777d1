// The async recorder cases (tests/async_recorder_cases.hpp) against AsyncPostgresRecorder on a
// real server (IDEM_TEST_POSTGRES_URL), each test in a schema of its own that is dropped
// afterwards. The pool's connections run on an io_context of its own thread, so every call also
// checks that the caller resumes on its own executor; once with one connection (every statement
// of every coroutine pipelined on it), once with four.
#include <memory>

#include "../async_recorder_cases.hpp"
#include "../async_test_support.hpp"
#include "../postgres_test_support.hpp"
#include "idem/postgres/async_postgres.hpp"

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
  idem::test::IoThread io;
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CASES(AsyncPostgresOneConnection, AsyncPostgresFactory<1>);
INSTANTIATE_ASYNC_RECORDER_CASES(AsyncPostgresFourConnections, AsyncPostgresFactory<4>);
