// The store conformance suite (idem/testing/store_conformance.hpp) against
// PostgresIdempotencyStore on a real server (IDEM_TEST_POSTGRES_URL), each test in a schema of
// its own that is dropped afterwards — once with LISTEN/NOTIFY waits, once polling.
#include <memory>

#include "../postgres_test_support.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/testing/store_conformance.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

template <idem::postgres::WaitStrategy Strategy>
struct PostgresStoreFactory {
  static constexpr int kRaceKeys = 20;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    if (!idem::test::pg::server_url()) return nullptr;
    idem::postgres::PostgresOptions options = schema.options();
    options.clock = std::move(clock);
    options.wait_strategy = Strategy;
    return std::make_shared<idem::postgres::PostgresIdempotencyStore>(options);
  }

  idem::test::pg::TempSchema schema;  // dropped after the store
};

using NotifyFactory = PostgresStoreFactory<idem::postgres::WaitStrategy::notify>;
using PollFactory = PostgresStoreFactory<idem::postgres::WaitStrategy::poll>;

}  // namespace

INSTANTIATE_STORE_CONFORMANCE(PostgresNotify, NotifyFactory);
INSTANTIATE_STORE_CONFORMANCE(PostgresPoll, PollFactory);
