// The PostgreSQL backend's plumbing: SQLSTATE classification, option and URL checks (no server
// needed), and the connection pool against a real server (IDEM_TEST_POSTGRES_URL): reuse, a
// bounded pool, stale connections replaced, statement_timeout, credential-free messages.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../free_port.hpp"
#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "postgres_names.hpp"

namespace {

using namespace idem::test::postgres_names;

// ---- classification -------------------------------------------------------------------------

TEST(PostgresErrorClassification, LockConflictsAndOverloadAreRetryableBusy) {
  for (const char* state : {"40001", "40P01", "55P03", "53300"}) {
    for (auto kind : {StatementKind::read, StatementKind::write, StatementKind::commit}) {
      SCOPED_TRACE(state);
      const auto c = classify_error(state, false, kind);
      EXPECT_EQ(c.code, ErrorCode::store_busy);
      EXPECT_TRUE(c.retryable);
      EXPECT_FALSE(c.in_doubt) << "the server reported the failure: nothing was committed";
    }
  }
}

TEST(PostgresErrorClassification, StatementTimeoutIsARetryableTimeout) {
  const auto c = classify_error("57014", false, StatementKind::write);
  EXPECT_EQ(c.code, ErrorCode::timeout);
  EXPECT_TRUE(c.retryable);
  EXPECT_FALSE(c.in_doubt);
}

TEST(PostgresErrorClassification, ALostConnectionIsInDoubtOnlyForWrites) {
  for (const char* state : {"", "08006", "08003", "08000", "57P01", "57P02", "57P03"}) {
    SCOPED_TRACE(std::string("sqlstate '") + state + "'");
    const bool lost = std::string(state).empty();
    auto read = classify_error(state, lost, StatementKind::read);
    EXPECT_TRUE(read.retryable);
    EXPECT_FALSE(read.in_doubt);
    auto write = classify_error(state, lost, StatementKind::write);
    EXPECT_TRUE(write.retryable) << "idem's own autocommit writes are keyed and fenced";
    EXPECT_TRUE(write.in_doubt);
    auto commit = classify_error(state, lost, StatementKind::commit);
    EXPECT_FALSE(commit.retryable) << "a transaction whose COMMIT is in doubt must not be re-run";
    EXPECT_TRUE(commit.in_doubt);
  }
  // Any SQLSTATE, once the connection is gone, is a connection failure.
  EXPECT_TRUE(classify_error("XX000", true, StatementKind::commit).in_doubt);
}

TEST(PostgresErrorClassification, EverythingElse) {
  struct Case {
    const char* state;
    ErrorCode code;
    bool retryable;
  };
  for (const Case& c :
       {Case{"23505", ErrorCode::store_error, false}, Case{"23503", ErrorCode::store_error, false},
        Case{"22021", ErrorCode::invalid_argument, false},
        Case{"28P01", ErrorCode::store_open_failed, false},
        Case{"3D000", ErrorCode::store_open_failed, false},
        Case{"42501", ErrorCode::store_open_failed, false},
        Case{"25006", ErrorCode::store_read_only, true},
        Case{"53100", ErrorCode::store_error, true}, Case{"53200", ErrorCode::store_error, true},
        Case{"42P01", ErrorCode::store_error, false},
        Case{"XX000", ErrorCode::store_error, false}}) {
    SCOPED_TRACE(c.state);
    const auto got = classify_error(c.state, false, StatementKind::commit);
    EXPECT_EQ(got.code, c.code);
    EXPECT_EQ(got.retryable, c.retryable);
    EXPECT_FALSE(got.in_doubt) << "a COMMIT the server refused did not commit";
  }
}

// ---- options and URLs (no server) -----------------------------------------------------------

PostgresOptions with_url(const std::string& url) {
  PostgresOptions options;
  options.url = url;
  return options;
}

std::string config_error(const PostgresOptions& options) {
  try {
    ConnectionPool pool(options);
  } catch (const idem::ConfigError& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected ConfigError, got " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected ConfigError for url '" << options.url << "'";
  return "";
}

TEST(PostgresOptionsCheck, BadUrlsAreConfigErrors) {
  EXPECT_NE(config_error(with_url("")).find("empty"), std::string::npos);
  EXPECT_NE(config_error(with_url("mysql://root@db/app")).find("mysql://"), std::string::npos);
  EXPECT_NE(config_error(with_url("redis://127.0.0.1:6379/0")).find("postgresql://"),
            std::string::npos);
  EXPECT_NE(config_error(with_url("postgresql://idem@127.0.0.1:notaport/db")).find("port"),
            std::string::npos);
  EXPECT_NE(config_error(with_url("postgresql://idem@127.0.0.1:70000/db")).find("65535"),
            std::string::npos);
  EXPECT_NE(config_error(with_url("postgresql://idem@127.0.0.1:0/db")).find("port"),
            std::string::npos);
  EXPECT_NE(config_error(with_url("host=127.0.0.1 port=abc")).find("port"), std::string::npos);
  config_error(with_url("this is not a connection string"));
  config_error(with_url("postgresql://idem@127.0.0.1:5432/db?nosuchoption=1"));
  config_error(with_url(std::string("postgresql://a\0b", 16)));
}

TEST(PostgresOptionsCheck, PasswordsNeverAppearInMessages) {
  const std::string message = config_error(with_url("postgresql://app:s3cr3t@db.example:nope/x"));
  EXPECT_EQ(message.find("s3cr3t"), std::string::npos) << message;
}

TEST(PostgresOptionsCheck, GoodUrlsAreAcceptedWithoutConnecting) {
  for (const char* url :
       {"postgresql://idem@127.0.0.1:1/db", "postgres://127.0.0.1/db", "postgresql:///db?host=/tmp",
        "host=127.0.0.1 port=1 dbname=db", "postgresql://a:b@h1:1,h2:2/db"}) {
    SCOPED_TRACE(url);
    EXPECT_NO_THROW(ConnectionPool pool(with_url(url)));
  }
  ConnectionPool pool(with_url("postgresql://app:s3cr3t@127.0.0.1:1/orders"));
  EXPECT_EQ(pool.target(), "app@127.0.0.1:1/orders");
}

TEST(PostgresOptionsCheck, BadOptionsAreConfigErrors) {
  const auto bad = [](auto change, const char* needle) {
    PostgresOptions options = with_url("postgresql://idem@127.0.0.1:1/db");
    change(options);
    const std::string message = config_error(options);
    EXPECT_NE(message.find(needle), std::string::npos) << message;
  };
  bad([](PostgresOptions& o) { o.pool_size = 0; }, "pool_size");
  bad([](PostgresOptions& o) { o.connect_timeout = std::chrono::milliseconds(0); },
      "connect_timeout");
  bad([](PostgresOptions& o) { o.acquire_timeout = std::chrono::milliseconds(-1); },
      "acquire_timeout");
  bad([](PostgresOptions& o) { o.statement_timeout = std::chrono::milliseconds(-1); },
      "statement_timeout");
  bad([](PostgresOptions& o) { o.wait_recheck_interval = std::chrono::milliseconds(0); },
      "wait_recheck_interval");
  bad([](PostgresOptions& o) { o.schema = ""; }, "schema");
  bad([](PostgresOptions& o) { o.schema = "1st"; }, "digit");
  bad([](PostgresOptions& o) { o.schema = "idem; DROP SCHEMA public"; }, "schema");
  bad([](PostgresOptions& o) { o.schema = std::string(64, 's'); }, "63");
  bad([](PostgresOptions& o) { o.processed_log_table = "processed-log"; }, "processed_log_table");
  bad([](PostgresOptions& o) { o.claims_table = "claims\""; }, "claims_table");
  bad([](PostgresOptions& o) { o.records_table = "caf\xc3\xa9"; }, "records_table");
  bad([](PostgresOptions& o) { o.notify_channel = "a b"; }, "notify_channel");
  // The default channel is "<schema>_<records_table>": too long together.
  bad(
      [](PostgresOptions& o) {
        o.schema = std::string(40, 's');
        o.records_table = std::string(40, 'r');
      },
      "notify_channel");
}

// ---- connecting without a server ------------------------------------------------------------

// A port nothing listens on: connection refused at once.
int closed_port() {
  return idem::test::unused_loopback_port();
}

TEST(PostgresPoolWithoutServer, AnUnreachableServerFailsFastAndRetryable) {
  ConnectionPool pool(
      with_url("postgresql://app:s3cr3t@127.0.0.1:" + std::to_string(closed_port()) + "/db"));
  try {
    auto lease = pool.acquire();
    FAIL() << "connected to a closed port";
  } catch (const PostgresError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt());
    EXPECT_EQ(e.sqlstate(), "");
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("app@127.0.0.1"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.stats().open, 0u) << "a failed connect does not hold a pool slot";
  EXPECT_EQ(pool.stats().connect_failures, 1u);
}

TEST(PostgresPoolWithoutServer, AServerThatNeverAnswersHitsConnectTimeout) {
  // Accepts TCP connections (the kernel completes them from the backlog) but never speaks.
  const idem::test::LoopbackListener silent(4);
  PostgresOptions options =
      with_url("postgresql://idem@127.0.0.1:" + std::to_string(silent.port()) + "/db");
  options.connect_timeout = std::chrono::milliseconds(100);
  ConnectionPool pool(options);
  try {
    auto lease = pool.acquire();
    ADD_FAILURE() << "connected to a silent server";
  } catch (const PostgresError& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("connect_timeout"), std::string::npos) << e.what();
  }
}

TEST(PostgresPoolWithoutServer, ARecorderOnAnUnreachableServerFailsAtConstruction) {
  EXPECT_THROW(idem::postgres::PostgresIdempotencyRecorder(with_url(
                   "postgresql://idem@127.0.0.1:" + std::to_string(closed_port()) + "/db")),
               PostgresError);
}

// ---- the pool against a server --------------------------------------------------------------

PostgresOptions server_options() {
  PostgresOptions options;
  options.url = idem::test::pg::server_url().value_or("");
  return options;
}

std::string show(ConnectionPool::Lease& lease, const char* setting) {
  PGresult* result = PQexec(lease.get(), (std::string("SHOW ") + setting).c_str());
  std::string value = PQntuples(result) == 1 ? PQgetvalue(result, 0, 0) : "";
  PQclear(result);
  return value;
}

TEST(PostgresPool, ConnectionsAreReusedAndConfigured) {
  IDEM_REQUIRE_POSTGRES();
  PostgresOptions options = server_options();
  options.statement_timeout = std::chrono::milliseconds(1500);
  ConnectionPool pool(options);
  int pid = 0;
  {
    auto lease = pool.acquire();
    pid = PQbackendPID(lease.get());
    EXPECT_EQ(show(lease, "statement_timeout"), "1500ms");
    EXPECT_EQ(show(lease, "client_encoding"), "UTF8");
    EXPECT_EQ(show(lease, "application_name"), "idem");
  }
  {
    auto lease = pool.acquire();
    EXPECT_EQ(PQbackendPID(lease.get()), pid) << "the idle connection is reused";
  }
  const auto stats = pool.stats();
  EXPECT_EQ(stats.connects, 1u);
  EXPECT_EQ(stats.open, 1u);
  EXPECT_EQ(stats.idle, 1u);
}

TEST(PostgresPool, ZeroStatementTimeoutMeansNoLimit) {
  IDEM_REQUIRE_POSTGRES();
  PostgresOptions options = server_options();
  options.statement_timeout = std::chrono::milliseconds(0);
  ConnectionPool pool(options);
  auto lease = pool.acquire();
  EXPECT_EQ(show(lease, "statement_timeout"), "0");
}

TEST(PostgresPool, AFullPoolRefusesAfterAcquireTimeout) {
  IDEM_REQUIRE_POSTGRES();
  PostgresOptions options = server_options();
  options.pool_size = 2;
  options.acquire_timeout = std::chrono::milliseconds(0);
  ConnectionPool pool(options);
  auto first = pool.acquire();
  auto second = pool.acquire();
  try {
    auto third = pool.acquire();
    FAIL() << "a third connection from a pool of 2";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.code(), ErrorCode::store_busy);
    EXPECT_TRUE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("pool_size"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.stats().open, 2u);
}

TEST(PostgresPool, AWaitingCallerGetsTheReturnedConnection) {
  IDEM_REQUIRE_POSTGRES();
  PostgresOptions options = server_options();
  options.pool_size = 1;
  options.acquire_timeout = std::chrono::seconds(60);
  ConnectionPool pool(options);
  std::optional<ConnectionPool::Lease> held(pool.acquire());
  int got_pid = 0;
  std::thread waiter([&] {
    auto lease = pool.acquire();  // blocks until `held` is returned
    got_pid = PQbackendPID(lease.get());
  });
  const int pid = PQbackendPID(held->get());
  held.reset();
  waiter.join();
  EXPECT_EQ(got_pid, pid);
  EXPECT_EQ(pool.stats().connects, 1u);
}

TEST(PostgresPool, AConnectionTheServerClosedIsReplacedBeforeUse) {
  IDEM_REQUIRE_POSTGRES();
  ConnectionPool pool(server_options());
  int pid = 0;
  {
    auto lease = pool.acquire();
    pid = PQbackendPID(lease.get());
  }
  const std::string id = std::to_string(pid);
  ASSERT_EQ(idem::test::pg::query("SELECT pg_terminate_backend(" + id + ")"), "t");
  ASSERT_TRUE(idem::test::pg::eventually([&] {
    return idem::test::pg::query_int("SELECT count(*) FROM pg_stat_activity WHERE pid = " + id) ==
           0;
  }));
  auto lease = pool.acquire();
  EXPECT_NE(PQbackendPID(lease.get()), pid);
  PGresult* result = PQexec(lease.get(), "SELECT 1");
  EXPECT_EQ(PQresultStatus(result), PGRES_TUPLES_OK);
  PQclear(result);
  EXPECT_EQ(pool.stats().dropped, 1u);
  EXPECT_EQ(pool.stats().connects, 2u);
}

TEST(PostgresPool, ABrokenLeaseIsClosedNotReused) {
  IDEM_REQUIRE_POSTGRES();
  ConnectionPool pool(server_options());
  {
    auto lease = pool.acquire();
    PQclear(PQexec(lease.get(), "BEGIN"));  // left inside a transaction: not reusable
  }
  EXPECT_EQ(pool.stats().open, 0u);
  EXPECT_EQ(pool.stats().dropped, 1u);
  {
    auto lease = pool.acquire();
    lease.mark_broken();
  }
  EXPECT_EQ(pool.stats().open, 0u);
  EXPECT_EQ(pool.stats().dropped, 2u);
}

TEST(PostgresPool, RefusedConnectionsAreNotRetryableAndCarryTheSqlstate) {
  IDEM_REQUIRE_POSTGRES();
  // Same server, a database that does not exist, and a password the message must not show.
  std::string url = idem::test::pg::server_url().value();
  url = url.substr(0, url.rfind('/')) + "/idem_no_such_database";
  const std::size_t at = url.find('@');
  ASSERT_NE(at, std::string::npos);
  url.insert(at, ":s3cr3t");
  ConnectionPool pool(with_url(url));
  try {
    auto lease = pool.acquire();
    FAIL() << "connected to a database that does not exist";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "3D000") << e.what();
    EXPECT_EQ(e.code(), ErrorCode::store_open_failed);
    EXPECT_FALSE(e.retryable());
    EXPECT_EQ(std::string(e.what()).find("s3cr3t"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("idem_no_such_database"), std::string::npos) << e.what();
  }
}

}  // namespace
