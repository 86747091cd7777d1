// `idem demo --store postgresql://...` on the test server (IDEM_TEST_POSTGRES_URL): every mode
// passes its exactly-once check — transactional with the ledger row written through the
// PostgresTransaction — and two runs against one database stay independent.
#include <gtest/gtest.h>

#include <string>

#include "../postgres_test_support.hpp"
#include "demo_cli.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

using idem::test::has;
using idem::test::run_demo;

TEST(PostgresDemoStore, EveryModeTwiceOnOneDatabase) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;  // dropped afterwards
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  for (const char* mode : {"transactional", "exclusive", "check_then_mark"}) {
    for (int run = 0; run < 2; ++run) {
      const auto result = run_demo(url, mode);
      SCOPED_TRACE(mode);
      idem::test::expect_demo_ok(result, "400");
    }
  }
  // Two transactional runs left 2 x 400 ledger rows, each run's under its own consumer.
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(*) FROM " + schema.table("demo_ledger")), 800);
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(DISTINCT consumer) FROM " +
                                      schema.table("demo_ledger")),
            2);
}

TEST(PostgresDemoStore, TwoHopsThroughTheOutbox) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  const auto result = idem::test::run_two_hop_demo("300", url);
  idem::test::expect_two_hop_demo_ok(result, 300);
  // Billing's and shipping's ledger rows, each hop's under its own consumer; the outbox empty.
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(*) FROM " + schema.table("demo_ledger")), 600);
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(DISTINCT consumer) FROM " +
                                      schema.table("demo_ledger")),
            2);
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(*) FROM " + schema.table("idem_outbox")), 0);
}

TEST(PostgresDemoStore, TwoHopsRefuseAnOutboxWithWaitingRows) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  ASSERT_EQ(idem::test::run_two_hop_demo("50", url).exit_code, 0);  // makes the outbox table
  // A row somebody else's handler committed: the demo's relay would publish it.
  idem::test::pg::query(
      "INSERT INTO " + schema.table("idem_outbox") +
      "(consumer, source_event_id, event_id, event_type, payload, headers, event_ts) "
      "VALUES ('orders', 'a', 'b', 'order.created', '\\x', '{}', now())");
  const auto refused = idem::test::run_two_hop_demo("50", url);
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_TRUE(has(refused, "already holds 1 waiting rows")) << refused.output;
  EXPECT_FALSE(has(refused, "producer:")) << refused.output;
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(*) FROM " + schema.table("idem_outbox")), 1);
}

}  // namespace
