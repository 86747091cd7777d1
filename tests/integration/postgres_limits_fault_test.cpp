// PostgreSQL resource limits: the server's connection limit is reached, and a
// statement waits on a lock past statement_timeout. Each gives a classified, retryable
// PostgresError (store_busy for SQLSTATE 53300, timeout for 57014); nothing is reported
// processed or completed that was not; the same recorder/store works once the limit is lifted or
// the lock released.
//
// The connection limit is a role of the test's own with CONNECTION LIMIT 1 (superusers, which
// the test server's user may be, are exempt from limits), dropped again by RAII. A *_fault_test:
// it runs alone (RUN_SERIAL), though it only touches its own role and schema.
#include <gtest/gtest.h>
#include <unistd.h>

#include <memory>
#include <optional>
#include <string>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/postgres/postgres_transaction.hpp"
#include "store_fault_cases.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace std::chrono_literals;
using idem::ErrorCode;
using idem::postgres::PostgresError;
namespace pg = idem::test::pg;

// Runs `fn`, which must throw a PostgresError; returns it.
template <class Fn>
PostgresError expect_pg_error(Fn&& fn) {
  try {
    fn();
  } catch (const PostgresError& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a PostgresError: " << e.what();
    return PostgresError(ErrorCode::store_error, "other", "", false, false);
  }
  ADD_FAILURE() << "expected a PostgresError";
  return PostgresError(ErrorCode::store_error, "none", "", false, false);
}

// The server URL with another user name (the test server trusts local connections).
std::string url_as(const std::string& url, const std::string& user) {
  const auto scheme_end = url.find("://");
  const auto at = url.find('@');
  if (scheme_end == std::string::npos || at == std::string::npos || at < scheme_end) {
    throw std::runtime_error("test needs a postgresql://user@host:port/db URL, got another form");
  }
  return url.substr(0, scheme_end + 3) + user + url.substr(at);
}

// A LOGIN role with CONNECTION LIMIT 1 that may create schemas; dropped with what it owns.
class LimitedRole {
 public:
  LimitedRole() {
    name_ = "idem_limited_" + std::to_string(::getpid());
    pg::query("DROP ROLE IF EXISTS " + name_);
    pg::query("CREATE ROLE " + name_ + " LOGIN NOSUPERUSER CONNECTION LIMIT 1");
    pg::query("GRANT CREATE ON DATABASE \"" + pg::query("SELECT current_database()") + "\" TO " +
              name_);
  }
  LimitedRole(const LimitedRole&) = delete;
  LimitedRole& operator=(const LimitedRole&) = delete;
  ~LimitedRole() {
    try {
      pg::query("REVOKE CREATE ON DATABASE \"" + pg::query("SELECT current_database()") +
                "\" FROM " + name_);
      pg::query("DROP OWNED BY " + name_ + " CASCADE");
      pg::query("DROP ROLE IF EXISTS " + name_);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "could not drop role " << name_ << ": " << e.what();
    }
  }
  void set_limit(int limit) {
    pg::query("ALTER ROLE " + name_ + " CONNECTION LIMIT " + std::to_string(limit));
  }
  const std::string& name() const { return name_; }

 private:
  std::string name_;
};

TEST(PostgresLimits, ConnectionLimitReachedIsRetryableBusyAndTheOpenConnectionKeepsWorking) {
  LimitedRole role;
  pg::TempSchema schema;
  idem::postgres::PostgresOptions options = schema.options();
  options.url = url_as(options.url, role.name());
  options.pool_size = 2;
  options.connect_timeout = 10s;
  options.acquire_timeout = 10s;
  idem::postgres::PostgresIdempotencyRecorder recorder(options);
  recorder.mark_processed("billing", "before");

  // Inside a transactional handler the recorder holds its one allowed connection; the second
  // connection the pool opens for another call is refused by the server.
  bool ran = false;
  const bool committed = recorder.run_transactional("billing", "outer", [&](idem::Transaction&) {
    ran = true;
    const PostgresError e = expect_pg_error([&] { recorder.mark_processed("billing", "inner"); });
    EXPECT_EQ(e.sqlstate(), "53300") << e.what();
    EXPECT_EQ(e.code(), ErrorCode::store_busy) << e.what();
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt()) << e.what();
    EXPECT_EQ(std::string(e.what()).find("password"), std::string::npos) << e.what();
  });
  EXPECT_TRUE(ran);
  EXPECT_TRUE(committed);  // the first connection kept working: the transaction committed
  EXPECT_TRUE(recorder.is_processed("billing", "outer"));
  EXPECT_FALSE(recorder.is_processed("billing", "inner"));

  // The limit is lifted: the same recorder opens its second connection.
  role.set_limit(2);
  const bool second = recorder.run_transactional("billing", "outer2", [&](idem::Transaction&) {
    recorder.mark_processed("billing", "inner");
  });
  EXPECT_TRUE(second);
  EXPECT_TRUE(recorder.is_processed("billing", "inner"));
  EXPECT_TRUE(recorder.is_processed("billing", "outer2"));
}

// A raw session of the test's own holding an ACCESS EXCLUSIVE lock until release() (or its
// destruction, which ends the session and so the transaction).
class TableLock {
 public:
  explicit TableLock(const std::string& table) : conn_(pg::connect(pg::server_url().value())) {
    exec("BEGIN");
    exec("LOCK TABLE " + table + " IN ACCESS EXCLUSIVE MODE");
  }
  void release() { exec("ROLLBACK"); }

 private:
  void exec(const std::string& sql) {
    std::unique_ptr<PGresult, pg::ResultCloser> result(PQexec(conn_.get(), sql.c_str()));
    if (PQresultStatus(result.get()) != PGRES_COMMAND_OK) {
      throw std::runtime_error(sql + ": " + PQresultErrorMessage(result.get()));
    }
  }
  std::unique_ptr<PGconn, pg::ConnCloser> conn_;
};

void expect_statement_timeout(const PostgresError& e) {
  EXPECT_EQ(e.sqlstate(), "57014") << e.what();
  EXPECT_EQ(e.code(), ErrorCode::timeout) << e.what();
  EXPECT_TRUE(e.retryable()) << e.what();
  EXPECT_FALSE(e.in_doubt()) << e.what();
}

TEST(PostgresLimits, RecorderStatementTimeoutOnALockedTableMarksNothingAndRecovers) {
  pg::TempSchema schema;
  idem::postgres::PostgresOptions options = schema.options();
  options.statement_timeout = 300ms;  // how long a statement may wait; nothing here is timed
  auto recorder_ptr = std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options);
  auto& recorder = *recorder_ptr;
  recorder.mark_processed("billing", "before");
  int runs = 0;
  idem::HandlerOptions handler_options;
  handler_options.mode = idem::HandlerMode::check_then_mark;
  auto handler = idem::make_idempotent_handler(
      "handler", recorder_ptr, [&](const std::string&) { ++runs; }, handler_options);
  const idem::Event event = idem::Event::make("order.created", "{}");
  idem::CollectingBusProxy bus;
  {
    TableLock lock(schema.table("processed_log"));
    // A delivery during the lock: its first read times out, so nothing runs or is marked.
    EXPECT_THROW((*handler)(event, bus), PostgresError);
    EXPECT_EQ(runs, 0);
    expect_statement_timeout(expect_pg_error([&] { recorder.mark_processed("billing", "e1"); }));
    expect_statement_timeout(expect_pg_error([&] { (void)recorder.claim("billing", "e2", 30s); }));
    // Readers wait on ACCESS EXCLUSIVE too: also a classified timeout, not a hang.
    expect_statement_timeout(
        expect_pg_error([&] { (void)recorder.is_processed("billing", "e1"); }));
    lock.release();
  }
  EXPECT_TRUE(recorder.is_processed("billing", "before"));
  EXPECT_FALSE(recorder.is_processed("billing", "e1"));
  EXPECT_FALSE(recorder.inspect("billing", "e2").claim.has_value());
  recorder.mark_processed("billing", "e1");
  EXPECT_TRUE(recorder.is_processed("billing", "e1"));
  const idem::Claim claim = recorder.claim("billing", "e2", 30s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(recorder.complete("billing", "e2", claim.token));
  // Redelivered after the lock: it runs once and is marked.
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
  EXPECT_EQ(runs, 1);
}

TEST(PostgresLimits, StoreStatementTimeoutOnALockedTableCompletesNothingAndRecovers) {
  pg::TempSchema schema;
  idem::postgres::PostgresOptions options = schema.options();
  options.statement_timeout = 300ms;
  idem::postgres::PostgresIdempotencyStore store(options);
  std::optional<TableLock> lock;
  idem::test::expect_store_writes_refused_then_resumed(
      store, {.begin = [&] { lock.emplace(schema.table("records")); },
              .end =
                  [&] {
                    lock->release();
                    lock.reset();
                  },
              .expect_refused =
                  [&](const std::function<void()>& call) {
                    expect_statement_timeout(expect_pg_error(call));
                  }});
}

}  // namespace
