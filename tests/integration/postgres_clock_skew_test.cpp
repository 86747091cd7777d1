// Clock skew between processes sharing one PostgreSQL database: two recorder/store objects on
// the same schema, each with its own ManualClock (tests/integration/clock_skew_cases.hpp).
//
// Every instant idem stores or compares is computed from the CLIENT's options.clock and sent as
// a parameter; the server's now() is never used for leases, expiries or purges. The suite's
// clocks start in 2030, years away from the server's clock, so any use of now() would break it.
#include <memory>

#include "../postgres_test_support.hpp"
#include "clock_skew_cases.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

class PostgresSkewBackend final : public idem::test::SkewBackend {
 public:
  std::shared_ptr<idem::IdempotencyRecorder> recorder(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options(clock));
  }
  std::shared_ptr<idem::IdempotencyStore> store(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::postgres::PostgresIdempotencyStore>(options(clock));
  }

 private:
  idem::postgres::PostgresOptions options(std::shared_ptr<idem::Clock> clock) const {
    idem::postgres::PostgresOptions options = schema_.options();
    options.clock = std::move(clock);
    options.pool_size = 1;  // many objects per test: keep the server's connection count low
    return options;
  }
  idem::test::pg::TempSchema schema_;
};

}  // namespace

using idem::test::ClockSkewTest;

INSTANTIATE_TEST_SUITE_P(Postgres, ClockSkewTest,
                         ::testing::Values(idem::test::SkewBackendFactory([] {
                           return std::make_unique<PostgresSkewBackend>();
                         })));
