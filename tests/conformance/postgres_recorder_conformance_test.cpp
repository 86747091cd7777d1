// The recorder conformance suite (idem/testing/recorder_conformance.hpp) against
// PostgresIdempotencyRecorder on a real server (IDEM_TEST_POSTGRES_URL), each test in a schema
// of its own that is dropped afterwards.
#include <memory>

#include "../postgres_test_support.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

struct PostgresRecorderFactory : idem::test::RecorderTraits<true, 100> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    if (!idem::test::pg::server_url()) return nullptr;
    idem::postgres::PostgresOptions options = schema.options();
    options.clock = std::move(clock);
    return std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options);
  }

  idem::test::pg::TempSchema schema;  // dropped after the recorder
};

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(Postgres, PostgresRecorderFactory);
