// open_recorder / open_store on a real PostgreSQL server (IDEM_TEST_POSTGRES_URL): idem's query
// parameters reach PostgresOptions and are taken out of the URL, libpq's own parameters pass
// through to libpq, and the opened objects work (markers, claims, the transactional inbox,
// store records).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/postgres/postgres_transaction.hpp"
#include "idem/report.hpp"
#include "idem/testing/manual_clock.hpp"
#include "open_cases.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

using namespace std::chrono_literals;
using idem::test::pg::TempSchema;

std::string url_with(const std::string& query) {
  const std::optional<std::string> server = idem::test::pg::server_url();
  if (!server) return query;  // the environment skips or fails the test first
  const bool has_query = std::find(server->begin(), server->end(), '?') != server->end();
  return *server + (has_query ? "&" : "?") + query;
}

TEST(PostgresOpen, RecorderGetsEveryParameterAndWorks) {
  TempSchema schema;
  auto clock = std::make_shared<idem::testing::ManualClock>();
  const std::string url =
      url_with("schema=" + schema.name() +
               "&pool_size=3&connect_timeout=3&acquire_timeout=2s&statement_timeout=10s"
               "&processed_log_table=plog&claims_table=cl&records_table=recs"
               "&notify_channel=open_test_channel&wait_strategy=poll"
               "&wait_recheck_interval=500ms&create_schema=true"
               "&application_name=idem_open_test");
  std::string upper = url;
  upper.replace(0, 10, "PostgreSQL");  // the scheme in any case
  auto recorder = idem::open_recorder(upper, {.clock = clock});
  auto* pg = dynamic_cast<idem::postgres::PostgresIdempotencyRecorder*>(recorder.get());
  ASSERT_NE(pg, nullptr);
  const auto& options = pg->pool()->options();
  EXPECT_EQ(options.schema, schema.name());
  EXPECT_EQ(options.pool_size, 3u);
  EXPECT_EQ(options.connect_timeout, 3s);
  EXPECT_EQ(options.acquire_timeout, 2s);
  EXPECT_EQ(options.statement_timeout, 10s);
  EXPECT_EQ(options.processed_log_table, "plog");
  EXPECT_EQ(options.claims_table, "cl");
  EXPECT_EQ(options.records_table, "recs");
  EXPECT_EQ(options.notify_channel, "open_test_channel");
  EXPECT_EQ(options.wait_strategy, idem::postgres::WaitStrategy::poll);
  EXPECT_EQ(options.wait_recheck_interval, 500ms);
  EXPECT_TRUE(options.create_schema);
  EXPECT_EQ(options.clock, clock);
  // idem's parameters are gone from the URL libpq gets; libpq's stay.
  EXPECT_EQ(options.url.find("schema="), std::string::npos) << options.url;
  EXPECT_NE(options.url.find("application_name=idem_open_test"), std::string::npos);
  EXPECT_EQ(options.url.rfind("postgresql://", 0), 0u) << options.url;

  recorder->mark_processed("c", "e1");
  EXPECT_TRUE(recorder->is_processed("c", "e1"));
  EXPECT_EQ(idem::test::pg::query_int("SELECT COUNT(*) FROM " + schema.table("plog")), 1);

  idem::test::expect_opened_recorder_claims(*recorder);

  // The transactional inbox, on a connection that carries libpq's application_name.
  ASSERT_TRUE(recorder->supports_transactions());
  std::optional<std::string> application;
  EXPECT_TRUE(recorder->run_transactional("c", "e3", [&](idem::Transaction& tx) {
    application = dynamic_cast<idem::postgres::PostgresTransaction&>(tx).query_text(
        "SELECT current_setting('application_name')");
  }));
  EXPECT_EQ(application, std::optional<std::string>("idem_open_test"));
  EXPECT_TRUE(recorder->is_processed("c", "e3"));
}

TEST(PostgresOpen, StoreClaimsAndCompletes) {
  TempSchema schema;
  const std::string url = url_with("schema=" + schema.name());
  auto store = idem::open_store(url);
  ASSERT_NE(dynamic_cast<idem::postgres::PostgresIdempotencyStore*>(store.get()), nullptr);
  // postgres:// is the same scheme.
  std::string short_scheme = url;
  short_scheme.replace(0, std::string("postgresql").size(), "postgres");
  idem::test::expect_opened_store_claims_and_replays(
      *store, [&] { return idem::open_store(short_scheme); });
}

TEST(PostgresOpen, MissingTablesWithoutCreateSchemaFailWhenOpened) {
  TempSchema schema;
  try {
    (void)idem::open_recorder(url_with("schema=" + schema.name() + "&create_schema=false"));
    ADD_FAILURE() << "a schema without tables was accepted";
  } catch (const idem::ConfigError& e) {
    ADD_FAILURE() << "not a URL problem: " << e.what();
  } catch (const idem::StoreError&) {
  }
}

}  // namespace
