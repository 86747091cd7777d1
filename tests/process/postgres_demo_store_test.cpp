// `idem demo --store postgresql://...` on the test server (IDEM_TEST_POSTGRES_URL): every mode
// passes its check — transactional with the ledger row written through the PostgresTransaction
// — in a schema of the run's own that is dropped afterwards, so the URL's schema is never
// touched; a schema that already holds data is refused unless --allow-nonempty-store, and left
// as it was either way.
#include <gtest/gtest.h>

#include <string>

#include "../postgres_test_support.hpp"
#include "demo_cli.hpp"
#include "idem/open.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

using idem::test::has;
using idem::test::run_demo;

// The schema the run worked in, from the recorder URL it printed ("...schema=idem_demo_<hex>").
std::string demo_schema(const idem::test::CliRun& run) {
  const std::size_t at = run.output.find("schema=idem_demo_");
  if (at == std::string::npos) return {};
  return run.output.substr(at + 7, 18);  // "idem_demo_" + 8 hex digits
}

long long schemas_named(const std::string& name) {
  return idem::test::pg::query_int(
      "SELECT COUNT(*) FROM information_schema.schemata WHERE schema_name = '" + name + "'");
}

TEST(PostgresDemoStore, EveryModeTwiceInASchemaOfItsOwn) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;  // the user's: the demo must leave it alone
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  for (const char* mode : {"transactional", "exclusive", "check_then_mark"}) {
    for (int run = 0; run < 2; ++run) {
      const auto result = run_demo(url, mode);
      SCOPED_TRACE(mode);
      idem::test::expect_demo_ok(result, "400", mode);
      const std::string own = demo_schema(result);
      ASSERT_FALSE(own.empty()) << result.output;
      EXPECT_EQ(schemas_named(own), 0) << "the demo left its schema " << own;
    }
  }
  EXPECT_EQ(schemas_named(schema.name()), 0) << "the demo made the URL's schema";
}

TEST(PostgresDemoStore, TwoHopsThroughTheOutbox) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  const auto result = idem::test::run_two_hop_demo("300", url);
  idem::test::expect_two_hop_demo_ok(result, 300);
  EXPECT_EQ(schemas_named(demo_schema(result)), 0) << result.output;
}

TEST(PostgresDemoStore, ASchemaWithDataIsRefusedUnlessAllowedAndLeftAsItWas) {
  IDEM_REQUIRE_CLI();
  idem::test::pg::TempSchema schema;
  const std::string url = idem::test::pg::server_url().value_or("") + "?schema=" + schema.name();
  idem::open_recorder(url)->mark_processed("payments", "evt-precious");
  const auto refused = run_demo(url, "transactional", "50");
  idem::test::expect_stopped_before_start(refused, 2, {"already holds data", "'payments'"});
  const auto allowed = idem::test::run_cli(
      {"demo", "--hops", "2", "--events", "100", "--store", url, "--allow-nonempty-store"});
  idem::test::expect_two_hop_demo_ok(allowed, 100);
  EXPECT_EQ(schemas_named(demo_schema(allowed)), 0) << allowed.output;
  const auto counts = idem::open_recorder(url)->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].consumer, "payments");
  EXPECT_EQ(counts[0].processed, 1u);
}

}  // namespace
