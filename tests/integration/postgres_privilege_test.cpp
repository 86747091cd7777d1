// idem on PostgreSQL under the least rights of docs/security.md: the schema is created once by
// its owner, then a role with USAGE on the schema, SELECT on schema_version, SELECT/INSERT/
// UPDATE/DELETE on idem's tables and USAGE on its sequences — no superuser, no CREATE — runs
// every recorder and store call with create_schema=false. Asking that role to create tables,
// to use another schema, or to touch a table outside its grants fails with a classified,
// non-retryable PostgresError (SQLSTATE 42501), never a crash.
// Needs IDEM_TEST_POSTGRES_URL (scripts/servers.sh: a superuser, trust auth on 127.0.0.1).
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/report.hpp"
#include "postgres_names.hpp"
#include "privilege_calls.hpp"

IDEM_POSTGRES_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::postgres_names;
using idem::test::pg::query;

class PostgresPrivilege : public ::testing::Test {
 protected:
  void SetUp() override {
    role_ = "idem_app_" + std::to_string(::getpid());
    // The owner (here the superuser) creates the schema once.
    PostgresOptions owner;
    owner.url = *idem::test::pg::server_url();
    owner.schema = schema_.name();
    { PostgresIdempotencyRecorder recorder(owner); }
    { PostgresIdempotencyStore store(owner); }
    const std::string s = "\"" + schema_.name() + "\"";
    // The run-time role, exactly as docs/security.md grants it.
    query("DROP ROLE IF EXISTS " + role_);
    query("CREATE ROLE " + role_ + " LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE");
    query("GRANT USAGE ON SCHEMA " + s + " TO " + role_);
    query("GRANT SELECT ON " + s + ".schema_version TO " + role_);
    query("GRANT SELECT, INSERT, UPDATE, DELETE ON " + s + ".processed_log, " + s + ".claims, " +
          s + ".records TO " + role_);
    query("GRANT USAGE ON ALL SEQUENCES IN SCHEMA " + s + " TO " + role_);
  }
  void TearDown() override {
    try {
      query("DROP OWNED BY " + role_);
      query("DROP ROLE IF EXISTS " + role_);
    } catch (...) {
    }
  }

  PostgresOptions as_app(const std::string& schema) const {
    std::string url = *idem::test::pg::server_url();
    const auto at = url.find('@');
    const auto scheme = url.find("://");
    url = url.substr(0, scheme + 3) + role_ + url.substr(at);
    PostgresOptions options;
    options.url = url;
    options.schema = schema;
    options.create_schema = false;
    options.pool_size = 2;
    return options;
  }

  static void expect_refused(const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "42501") << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::store_open_failed) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt()) << e.what();
  }

  idem::test::pg::TempSchema schema_;
  std::string role_;
};

TEST_F(PostgresPrivilege, TheRoleIsNotPrivileged) {
  EXPECT_EQ(query("SELECT rolsuper::text || rolcreatedb::text || rolcreaterole::text FROM "
                  "pg_roles WHERE rolname = '" +
                  role_ + "'"),
            "falsefalsefalse");
  EXPECT_EQ(query("SELECT has_database_privilege('" + role_ +
                  "', current_database(), "
                  "'CREATE')::text"),
            "false");
  EXPECT_EQ(query("SELECT has_schema_privilege('" + role_ + "', '" + schema_.name() +
                  "', 'CREATE')::text"),
            "false");
}

TEST_F(PostgresPrivilege, EveryCallWorksUnderTheDocumentedGrants) {
  PostgresIdempotencyRecorder recorder(as_app(schema_.name()));
  idem::test::every_recorder_call_works(recorder);
  bool ran = false;
  EXPECT_TRUE(recorder.run_transactional("c", "e5", [&](idem::Transaction&) { ran = true; }));
  EXPECT_TRUE(ran);
  PostgresIdempotencyStore store(as_app(schema_.name()));
  idem::test::every_store_call_works(store);
}

TEST_F(PostgresPrivilege, CreatingTablesAtRunTimeIsRefused) {
  PostgresOptions options = as_app(schema_.name());
  options.create_schema = true;  // CREATE SCHEMA IF NOT EXISTS needs CREATE on the database
  try {
    PostgresIdempotencyRecorder recorder(options);
    FAIL() << "the run-time role ran the schema set-up";
  } catch (const PostgresError& e) {
    expect_refused(e);
  }
}

TEST_F(PostgresPrivilege, AnotherSchemaIsRefused) {
  const std::string other = schema_.name() + "_other";
  query("CREATE SCHEMA \"" + other + "\"");
  {
    PostgresOptions owner;
    owner.url = *idem::test::pg::server_url();
    owner.schema = other;
    PostgresIdempotencyRecorder recorder(owner);
  }
  try {
    PostgresIdempotencyRecorder recorder(as_app(other));
    FAIL() << "the role read a schema it has no USAGE on";
  } catch (const PostgresError& e) {
    expect_refused(e);
  }
  query("DROP SCHEMA \"" + other + "\" CASCADE");
}

TEST_F(PostgresPrivilege, SqlOutsideTheGrantsInATransactionIsRefused) {
  PostgresIdempotencyRecorder recorder(as_app(schema_.name()));
  try {
    (void)recorder.run_transactional("c", "drop", [&](idem::Transaction& tx) {
      auto& sql = dynamic_cast<idem::SqlTransaction&>(tx);
      sql.exec("DROP TABLE \"" + schema_.name() + "\".records");
    });
    FAIL() << "the role dropped a table";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "42501") << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
  }
  EXPECT_FALSE(recorder.is_processed("c", "drop"));  // rolled back with the business statement
}

}  // namespace
