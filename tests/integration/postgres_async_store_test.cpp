// AsyncPostgresStore on a real server: the store protocol, concurrent claims on one thread,
// cancellation, and blocking/async interoperation on one key.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "../async_test_support.hpp"
#include "../free_port.hpp"
#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "postgres_async_fixture.hpp"
#include "postgres_names.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace idem::test::postgres_names;
using idem::async::Task;
using idem::postgres::AsyncPostgresStore;
using idem::test::run;
namespace pg = idem::test::pg;

StoredValue bytes(std::string value) {
  StoredValue stored;
  stored.bytes = std::move(value);
  return stored;
}

class AsyncStoreTest : public pg::AsyncPostgresTest<AsyncPostgresStore> {
 protected:
  std::unique_ptr<AsyncPostgresStore>& store_ = backend_;
};

TEST_F(AsyncStoreTest, ClaimCompleteLookup) {
  auto& s = *store_;
  EXPECT_TRUE(s.needs_bytes());
  EXPECT_EQ(run(io_, s.lookup("k1")), std::nullopt);
  const ClaimOutcome first = run(io_, s.claim("k1", std::string_view("fp"), 30s));
  ASSERT_EQ(first.status, ClaimOutcome::Status::acquired);
  const ClaimOutcome busy = run(io_, s.claim("k1", std::string_view("fp"), 30s));
  EXPECT_EQ(busy.status, ClaimOutcome::Status::in_progress);
  EXPECT_EQ(run(io_, s.claim("k1", std::string_view("other"), 30s)).status,
            ClaimOutcome::Status::mismatch);
  EXPECT_TRUE(run(io_, s.renew("k1", first.token, 60s)));
  EXPECT_FALSE(run(io_, s.complete("k1", first.token + 1, bytes("x"), ExecutionReport{}, 60s)));
  ExecutionReport report;
  report.operation = "charge";
  EXPECT_TRUE(run(io_, s.complete("k1", first.token, bytes("result"), report, 60s)));
  const auto record = run(io_, s.lookup("k1"));
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, IdempotencyRecord::State::completed);
  EXPECT_EQ(record->value.bytes, std::optional<std::string>("result"));
  ASSERT_TRUE(record->report);
  EXPECT_EQ(record->report->operation, "charge");
  const ClaimOutcome replay = run(io_, s.claim("k1", std::string_view("fp"), 30s));
  EXPECT_EQ(replay.status, ClaimOutcome::Status::completed);

  const ClaimOutcome other = run(io_, s.claim("k2", std::nullopt, 30s));
  ASSERT_EQ(other.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(run(io_, s.release("k2", other.token)));
  EXPECT_FALSE(run(io_, s.release("k2", other.token)));
  EXPECT_EQ(run(io_, s.lookup("k2")), std::nullopt);
  // ttl 0: nothing kept.
  const ClaimOutcome third = run(io_, s.claim("k3", std::nullopt, 30s));
  EXPECT_TRUE(run(io_, s.complete("k3", third.token, bytes("v"), ExecutionReport{}, 0ms)));
  EXPECT_EQ(run(io_, s.lookup("k3")), std::nullopt);

  EXPECT_THROW(run(io_, s.complete("k4", 1, StoredValue{}, ExecutionReport{}, 1s)),
               idem::InvalidArgument);
  EXPECT_THROW(run(io_, s.claim("", std::nullopt, 1s)), idem::InvalidKey);
}

// Many coroutines claim one key at once: exactly one acquires it; the rest see it in progress
// or, once it completed, completed.
TEST_F(AsyncStoreTest, ConcurrentClaimsOnOneThread) {
  auto& s = *store_;
  std::atomic<int> acquired{0};
  std::atomic<int> others{0};
  for (int i = 0; i < 200; ++i) {
    asio::co_spawn(
        io_,
        [&]() -> Task<void> {
          const ClaimOutcome outcome = co_await s.claim("shared", std::nullopt, 60s);
          if (outcome.status == ClaimOutcome::Status::acquired) {
            ++acquired;
            // Named, not a temporary: built by GCC 12, a class temporary in this co_await
            // expression was gone before complete() read it (to_json() looped on freed memory).
            const ExecutionReport report;
            co_await s.complete("shared", outcome.token, bytes("v"), report, 60s);
          } else if (outcome.status == ClaimOutcome::Status::in_progress ||
                     outcome.status == ClaimOutcome::Status::completed) {
            ++others;
          }
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  io_.run();
  EXPECT_EQ(acquired.load(), 1);
  EXPECT_EQ(others.load(), 199);
}

// Blocking and async stores on one database meet on one key.
TEST_F(AsyncStoreTest, InteroperatesWithTheBlockingStore) {
  auto& s = *store_;
  idem::postgres::PostgresIdempotencyStore blocking(schema_.options());
  const ClaimOutcome mine = run(io_, s.claim("op", std::nullopt, 60s));
  ASSERT_EQ(mine.status, ClaimOutcome::Status::acquired);
  EXPECT_EQ(blocking.claim("op", std::nullopt, 60s).status, ClaimOutcome::Status::in_progress);
  EXPECT_TRUE(run(io_, s.complete("op", mine.token, bytes("42"), ExecutionReport{}, 60s)));
  const auto seen = blocking.lookup("op");
  ASSERT_TRUE(seen);
  EXPECT_EQ(seen->value.bytes, std::optional<std::string>("42"));

  const ClaimOutcome theirs = blocking.claim("op2", std::nullopt, 60s);
  ASSERT_EQ(theirs.status, ClaimOutcome::Status::acquired);
  EXPECT_EQ(run(io_, s.claim("op2", std::nullopt, 60s)).status, ClaimOutcome::Status::in_progress);
  ASSERT_TRUE(blocking.complete("op2", theirs.token, bytes("7"), ExecutionReport{}, 60s));
  const ClaimOutcome replay = run(io_, s.claim("op2", std::nullopt, 60s));
  ASSERT_EQ(replay.status, ClaimOutcome::Status::completed);
  EXPECT_EQ(replay.record->value.bytes, std::optional<std::string>("7"));
}

// A blocking waiter (in another process, as far as PostgreSQL can tell) is woken by the async
// face's complete and release: the same statements notify when its listener waits on the key.
// It re-checks only once an hour, so returning at all means it was notified.
TEST_F(AsyncStoreTest, WakesABlockingWaiterOnCompleteAndRelease) {
  auto& s = *store_;
  auto options = schema_.options();
  options.wait_recheck_interval = std::chrono::hours(1);
  idem::postgres::PostgresIdempotencyStore blocking(options);
  ASSERT_TRUE(blocking.listen());
  const auto wait_for = [&](const std::string& key, std::optional<IdempotencyRecord>& seen) {
    const std::size_t before = blocking.stats().blocked_waiters;
    std::thread waiting(
        [&, key] { seen = blocking.wait(key, std::chrono::steady_clock::now() + 1h, {}); });
    EXPECT_TRUE(pg::eventually([&] { return blocking.stats().blocked_waiters > before; }));
    return waiting;
  };

  const ClaimOutcome done = run(io_, s.claim("done", std::nullopt, 60s));
  std::optional<IdempotencyRecord> completed;
  std::thread waiting = wait_for("done", completed);
  EXPECT_TRUE(run(io_, s.complete("done", done.token, bytes("42"), ExecutionReport{}, 60s)));
  waiting.join();
  ASSERT_TRUE(completed);
  EXPECT_EQ(completed->value.bytes, std::optional<std::string>("42"));

  const ClaimOutcome gone = run(io_, s.claim("gone", std::nullopt, 60s));
  std::optional<IdempotencyRecord> released = IdempotencyRecord{};
  waiting = wait_for("gone", released);
  EXPECT_TRUE(run(io_, s.release("gone", gone.token)));
  waiting.join();
  EXPECT_FALSE(released);
  EXPECT_EQ(blocking.stats().wakeups_by_notification, 2u);
  EXPECT_EQ(blocking.stats().rechecks, 0u);
}

// The coroutine face names a failed connect as the blocking face does: nothing listening is
// connection_refused, a web server where PostgreSQL should be wrong_protocol (not retryable: it
// fails the same way every time), a host name that does not resolve host_not_found.
TEST(AsyncStoreConnect, EachFailureHasItsOwnCode) {
  struct Case {
    std::string url;
    idem::ErrorCode code;
    std::string says;
  };
  const idem::test::HttpListener web;
  const std::vector<Case> cases{
      {"postgresql://app@127.0.0.1:" + std::to_string(idem::test::unused_loopback_port()) + "/db",
       idem::ErrorCode::connection_refused, "Connection refused"},
      {"postgresql://app@127.0.0.1:" + std::to_string(web.port()) + "/db",
       idem::ErrorCode::wrong_protocol, "is this a PostgreSQL port?"},
      {"postgresql://app@nohost.invalid/db", idem::ErrorCode::host_not_found, "nohost.invalid"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.url);
    asio::io_context io;
    idem::postgres::PostgresOptions options;
    options.url = c.url;
    options.create_schema = false;
    try {
      AsyncPostgresStore store(io.get_executor(), options);
      (void)run(io, store.lookup("k"));
      ADD_FAILURE() << "the call succeeded";
    } catch (const idem::Error& e) {
      EXPECT_EQ(e.code(), c.code) << e.what();
      EXPECT_NE(std::string(e.what()).find(c.says), std::string::npos) << e.what();
      EXPECT_FALSE(e.in_doubt()) << e.what();
      if (c.code == idem::ErrorCode::connection_refused) {
        EXPECT_TRUE(e.retryable()) << e.what();
      }
      if (c.code == idem::ErrorCode::wrong_protocol) {
        EXPECT_FALSE(e.retryable()) << e.what();
      }
    }
    io.restart();
    io.run();
  }
}

}  // namespace
