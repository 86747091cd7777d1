// The outbox conformance suite (idem/testing/outbox_conformance.hpp) against PostgresOutbox on a
// real server (IDEM_TEST_POSTGRES_URL), each test in a schema of its own that is dropped
// afterwards.
#include <memory>

#include "../postgres_test_support.hpp"
#include "idem/postgres/postgres_outbox.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/testing/outbox_conformance.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

struct PostgresOutboxFactory {
  idem::testing::OutboxUnderTest make() {
    if (!idem::test::pg::server_url()) return {};
    return {std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(schema.options()),
            std::make_shared<idem::postgres::PostgresOutbox>(schema.options())};
  }
  // Its own connection pool, as another process would have.
  std::shared_ptr<idem::Outbox> another() {
    return std::make_shared<idem::postgres::PostgresOutbox>(schema.options());
  }

  idem::test::pg::TempSchema schema;  // dropped after the outboxes
};

}  // namespace

INSTANTIATE_OUTBOX_CONFORMANCE(Postgres, PostgresOutboxFactory);
