// Test support for the PostgreSQL backend's tests: the server from the environment, a schema of
// its own per test (dropped by RAII), and plain SQL on a side connection.
//
// Tests find the server through IDEM_TEST_POSTGRES_URL (scripts/servers.sh sets it). When it is
// missing, every test of the binary is skipped, naming the variable — unless
// IDEM_REQUIRE_SERVERS=1 (the test command sets it), where a missing server fails the binary.
// Register that check once per test binary with IDEM_POSTGRES_TEST_ENVIRONMENT(), or per test
// with IDEM_REQUIRE_POSTGRES().
//
// Thread-safety: TempSchema and the SQL helpers may be used from any thread; each call opens its
// own connection.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

// Tests link libpq through the backend's client target; its include directory is on the path
// when that target is, and Debian also has the header under postgresql/.
#if __has_include(<libpq-fe.h>)
#include <libpq-fe.h>
#else
#include <postgresql/libpq-fe.h>
#endif

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>

#include "eventually.hpp"
#include "idem/postgres/postgres_options.hpp"
#include "server_env.hpp"

namespace idem::test::pg {

inline std::optional<std::string> server_url() {
  std::string url = env("IDEM_TEST_POSTGRES_URL");
  if (url.empty()) return std::nullopt;
  return url;
}

// The same check as IDEM_POSTGRES_TEST_ENVIRONMENT() inside one test body, for binaries that
// also have tests without a server.
#define IDEM_REQUIRE_POSTGRES()                                                       \
  do {                                                                                \
    if (!::idem::test::pg::server_url())                                              \
      IDEM_SERVER_MISSING("no PostgreSQL server: IDEM_TEST_POSTGRES_URL is not set"); \
  } while (false)

#define IDEM_POSTGRES_TEST_ENVIRONMENT()                                       \
  IDEM_SERVER_TEST_ENVIRONMENT(idem_pg_environment_, "IDEM_TEST_POSTGRES_URL", \
                               "PostgreSQL server", "postgresql://user@host:port/db")

struct ConnCloser {
  void operator()(PGconn* conn) const noexcept { PQfinish(conn); }
};
struct ResultCloser {
  void operator()(PGresult* result) const noexcept { PQclear(result); }
};

// A connection of the test's own (not idem's), to set up and inspect tables.
inline std::unique_ptr<PGconn, ConnCloser> connect(const std::string& url) {
  std::unique_ptr<PGconn, ConnCloser> conn(PQconnectdb(url.c_str()));
  if (PQstatus(conn.get()) != CONNECTION_OK) {
    throw std::runtime_error("test connection to PostgreSQL failed: " +
                             std::string(PQerrorMessage(conn.get())));
  }
  PQsetNoticeProcessor(
      conn.get(), [](void*, const char*) {}, nullptr);
  return conn;
}

// Runs `sql` (no parameters) and returns the first column of the first row ("" when none).
inline std::string query(const std::string& sql) {
  auto conn = connect(server_url().value());
  std::unique_ptr<PGresult, ResultCloser> result(PQexec(conn.get(), sql.c_str()));
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    throw std::runtime_error("test SQL failed: " + sql + ": " + PQresultErrorMessage(result.get()));
  }
  if (PQntuples(result.get()) == 0 || PQnfields(result.get()) == 0) return "";
  return PQgetvalue(result.get(), 0, 0);
}

inline long long query_int(const std::string& sql) {
  return std::stoll(query(sql));
}

using idem::test::eventually;  // pg::eventually, as the PostgreSQL tests call it

// A schema name no other test (in this or another process) uses, dropped with everything in it
// when the TempSchema goes. Without a server it does nothing (the environment skips the test).
class TempSchema {
 public:
  TempSchema() {
    static std::atomic<int> counter{0};
    std::random_device random;
    name_ = "idem_t" + std::to_string(::getpid()) + "_" + std::to_string(counter.fetch_add(1)) +
            "_" + std::to_string(random() % 100000);
  }
  TempSchema(const TempSchema&) = delete;
  TempSchema& operator=(const TempSchema&) = delete;
  ~TempSchema() {
    if (!server_url()) return;
    try {
      query("DROP SCHEMA IF EXISTS \"" + name_ + "\" CASCADE");
    } catch (const std::exception& e) {
      ADD_FAILURE() << "could not drop test schema " << name_ << ": " << e.what();
    }
  }

  const std::string& name() const { return name_; }
  // "<schema>.<table>", for the test's own SQL.
  std::string table(const std::string& table) const { return "\"" + name_ + "\"." + table; }

  // Options for this schema on the test server (url empty without a server).
  idem::postgres::PostgresOptions options() const {
    idem::postgres::PostgresOptions options;
    options.url = server_url().value_or("");
    options.schema = name_;
    return options;
  }

 private:
  std::string name_;
};

}  // namespace idem::test::pg
