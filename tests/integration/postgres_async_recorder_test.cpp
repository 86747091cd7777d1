// AsyncPostgresRecorder on a real server: the recorder protocol, many coroutines on one thread,
// the transactional inbox, cancellation at every step, and blocking/async interoperation.
#include <gtest/gtest.h>
#include <unistd.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/system_error.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../async_test_support.hpp"
#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "postgres_async_fixture.hpp"
#include "postgres_names.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace idem::test::postgres_names;
using idem::async::AsyncSqlTransaction;
using idem::async::Task;
using idem::postgres::AsyncPostgresRecorder;
using idem::test::run;
namespace pg = idem::test::pg;

class AsyncRecorderTest : public pg::AsyncPostgresTest<AsyncPostgresRecorder> {
 protected:
  // How a call cancelled after some steps of the event loop ended.
  struct CancelledCall {
    bool finished = false;     // it ended (with its result or an error)
    bool on_its_own = false;   // it finished within the steps: nothing was cancelled
    std::exception_ptr error;  // what it ended with (none: its result)
  };

  // Starts the coroutine `call` makes, runs `steps` handlers of io_, cancels it (terminal) unless
  // it has finished, and runs everything to its end (a dropped statement's result is read too).
  template <class Call>
  CancelledCall cancel_after(int steps, Call call) {
    asio::cancellation_signal signal;
    CancelledCall ended;
    asio::co_spawn(io_, std::move(call),
                   asio::bind_cancellation_slot(signal.slot(), [&](std::exception_ptr e) {
                     ended.error = e;
                     ended.finished = true;
                   }));
    io_.restart();
    for (int i = 0; i < steps && !ended.finished; ++i)
      io_.run_one();
    if (ended.finished) {
      ended.on_its_own = true;
    } else {
      signal.emit(asio::cancellation_type::terminal);
    }
    io_.run();
    return ended;
  }

  std::unique_ptr<AsyncPostgresRecorder>& recorder_ = backend_;
};

TEST_F(AsyncRecorderTest, CheckMarkAndBatches) {
  auto& r = *recorder_;
  EXPECT_FALSE(run(io_, r.is_processed("billing", "e1")));
  run(io_, r.mark_processed("billing", "e1"));
  run(io_, r.mark_processed("billing", "e1"));  // a repeat is harmless
  EXPECT_TRUE(run(io_, r.is_processed("billing", "e1")));
  EXPECT_FALSE(run(io_, r.is_processed("shipping", "e1")));

  std::vector<std::string> ids{"a", "b", "a", "c"};
  run(io_, r.mark_processed_many("billing", std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(run(io_, r.is_processed_many("billing", ids)),
            (std::vector<bool>{true, false, true, true}));
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + schema_.table("processed_log")), 3);

  EXPECT_THROW(run(io_, r.is_processed("billing", "\xff")), idem::InvalidKey);
  EXPECT_TRUE(r.capabilities().claims);
  EXPECT_TRUE(r.capabilities().transactions);
}

TEST_F(AsyncRecorderTest, ClaimsAreFenced) {
  auto& r = *recorder_;
  const Claim first = run(io_, r.claim("billing", "e1", 30s));
  ASSERT_EQ(first.status, Claim::Status::acquired);
  const Claim busy = run(io_, r.claim("billing", "e1", 30s));
  EXPECT_EQ(busy.status, Claim::Status::in_progress);
  EXPECT_TRUE(run(io_, r.renew("billing", "e1", first.token, 60s)));
  EXPECT_FALSE(run(io_, r.complete("billing", "e1", first.token + 1)));
  EXPECT_TRUE(run(io_, r.release("billing", "e1", first.token)));
  const Claim second = run(io_, r.claim("billing", "e1", 30s));
  ASSERT_EQ(second.status, Claim::Status::acquired);
  EXPECT_GT(second.token, first.token);
  EXPECT_FALSE(run(io_, r.complete("billing", "e1", first.token)));  // stale owner
  EXPECT_TRUE(run(io_, r.complete("billing", "e1", second.token)));
  EXPECT_TRUE(run(io_, r.is_processed("billing", "e1")));
  EXPECT_EQ(run(io_, r.claim("billing", "e1", 30s)).status, Claim::Status::processed);
}

// Hundreds of coroutines on one thread share the pool's few connections.
TEST_F(AsyncRecorderTest, ManyCoroutinesOnOneThread) {
  auto& r = *recorder_;
  constexpr int kCoroutines = 300;
  std::atomic<int> done{0};
  std::atomic<int> wrong{0};
  std::atomic<int> acquired{0};
  for (int i = 0; i < kCoroutines; ++i) {
    asio::co_spawn(
        io_,
        [&, i]() -> Task<void> {
          const std::string id = "e" + std::to_string(i);
          if (co_await r.is_processed("load", id)) ++wrong;
          co_await r.mark_processed("load", id);
          if (!co_await r.is_processed("load", id)) ++wrong;
          // Every coroutine races for one shared event: exactly one acquires it.
          const Claim claim = co_await r.claim("load", "shared", 60s);
          if (claim.status == Claim::Status::acquired) ++acquired;
          ++done;
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  io_.run();
  EXPECT_EQ(done.load(), kCoroutines);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(acquired.load(), 1);
  EXPECT_LE(r.pool()->stats().connections, 4u);
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + schema_.table("processed_log") +
                          " WHERE consumer = 'load'"),
            kCoroutines);
}

// Several threads run one io_context: the connections' strands keep each PGconn on one thread
// at a time (run under TSan).
TEST_F(AsyncRecorderTest, ManyThreadsOnOneContext) {
  auto& r = *recorder_;
  std::atomic<int> done{0};
  for (int i = 0; i < 100; ++i) {
    asio::co_spawn(
        io_,
        [&, i]() -> Task<void> {
          const std::string id = "t" + std::to_string(i);
          co_await r.mark_processed("threads", id);
          if (co_await r.is_processed("threads", id)) ++done;
        },
        asio::detached);
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 3; ++t)
    threads.emplace_back([&] { io_.run(); });
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(done.load(), 100);
}

TEST_F(AsyncRecorderTest, TransactionalInboxCommitsWithTheMarker) {
  auto& r = *recorder_;
  pg::query("CREATE TABLE " + schema_.table("orders") + " (id text PRIMARY KEY, total bigint)");
  const std::string orders = schema_.table("orders");
  int calls = 0;
  const auto handler = [&](AsyncSqlTransaction& tx) -> Task<void> {
    ++calls;
    EXPECT_EQ(tx.consumer(), "billing");
    const idem::SqlParam params[] = {tx.event_id(), 42};
    co_await tx.exec("INSERT INTO " + orders + " (id, total) VALUES ($1, $2)", params);
    const idem::SqlParam key[] = {tx.event_id()};
    EXPECT_EQ(co_await tx.query_int64("SELECT total FROM " + orders + " WHERE id = $1", key), 42);
    EXPECT_EQ(co_await tx.query_text("SELECT id FROM " + orders + " WHERE id = 'none'"),
              std::nullopt);
  };
  EXPECT_TRUE(run(io_, r.run_transactional("billing", "o1", handler)));
  EXPECT_FALSE(run(io_, r.run_transactional("billing", "o1", handler)));  // already processed
  EXPECT_EQ(calls, 1);
  EXPECT_TRUE(run(io_, r.is_processed("billing", "o1")));
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + orders), 1);
}

TEST_F(AsyncRecorderTest, TransactionalInboxRollsBackOnFailure) {
  auto& r = *recorder_;
  pg::query("CREATE TABLE " + schema_.table("orders") + " (id text PRIMARY KEY)");
  const std::string orders = schema_.table("orders");
  const auto failing = [&](AsyncSqlTransaction& tx) -> Task<void> {
    const idem::SqlParam params[] = {tx.event_id()};
    co_await tx.exec("INSERT INTO " + orders + " (id) VALUES ($1)", params);
    throw std::runtime_error("handler failed");
  };
  EXPECT_THROW(run(io_, r.run_transactional("billing", "o1", failing)), std::runtime_error);
  // A statement that fails, swallowed by the handler: nothing commits, the error says why.
  const auto swallowing = [&](AsyncSqlTransaction& tx) -> Task<void> {
    try {
      co_await tx.exec("INSERT INTO no_such_table VALUES (1)");
    } catch (const idem::StoreError&) {
    }
  };
  EXPECT_THROW(run(io_, r.run_transactional("billing", "o2", swallowing)), idem::StoreError);
  EXPECT_FALSE(run(io_, r.is_processed("billing", "o1")));
  EXPECT_FALSE(run(io_, r.is_processed("billing", "o2")));
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + orders), 0);
  // The connections are fine afterwards.
  const auto ok = [&](AsyncSqlTransaction& tx) -> Task<void> {
    const idem::SqlParam params[] = {tx.event_id()};
    co_await tx.exec("INSERT INTO " + orders + " (id) VALUES ($1)", params);
  };
  EXPECT_TRUE(run(io_, r.run_transactional("billing", "o1", ok)));
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + orders), 1);
}

// The blocking recorder's rules, from the same steps (steps.hpp): a swallowed failure is 25P02,
// not in doubt; a handler that ends idem's transaction itself is in doubt, and its session is
// not reused.
TEST_F(AsyncRecorderTest, TransactionalInboxReportsASwallowedFailureAsTheBlockingOneDoes) {
  auto& r = *recorder_;
  const auto swallowing = [&](AsyncSqlTransaction& tx) -> Task<void> {
    try {
      co_await tx.exec("INSERT INTO no_such_table VALUES (1)");
    } catch (const idem::StoreError&) {
    }
  };
  try {
    run(io_, r.run_transactional("billing", "o1", swallowing));
    FAIL() << "the aborted transaction was committed";
  } catch (const idem::postgres::PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "25P02") << e.what();
    EXPECT_FALSE(e.in_doubt());
  }
  EXPECT_FALSE(run(io_, r.is_processed("billing", "o1")));
}

TEST_F(AsyncRecorderTest, TransactionalInboxHandlerThatEndsTheTransactionIsInDoubt) {
  auto& r = *recorder_;
  for (const char* end : {"COMMIT", "ROLLBACK"}) {
    const std::string event = std::string("o-") + end;
    const auto ending = [&](AsyncSqlTransaction& tx) -> Task<void> { co_await tx.exec(end); };
    try {
      run(io_, r.run_transactional("billing", event, ending));
      FAIL() << "a handler's " << end << " went unnoticed";
    } catch (const idem::postgres::PostgresError& e) {
      EXPECT_TRUE(e.in_doubt()) << e.what();
      EXPECT_FALSE(e.retryable());
    }
    // The early COMMIT did commit the marker, the ROLLBACK did not: why it was in doubt.
    EXPECT_EQ(run(io_, r.is_processed("billing", event)), std::string(end) == "COMMIT");
  }
  // The pool is fine afterwards.
  const auto ok = [&](AsyncSqlTransaction&) -> Task<void> { co_return; };
  EXPECT_TRUE(run(io_, r.run_transactional("billing", "o-after", ok)));
}

TEST_F(AsyncRecorderTest, TransactionalInboxRespectsALiveClaim) {
  auto& r = *recorder_;
  const Claim claim = run(io_, r.claim("billing", "o1", 60s));
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  int calls = 0;
  const auto handler = [&](AsyncSqlTransaction&) -> Task<void> {
    ++calls;
    co_return;
  };
  EXPECT_THROW(run(io_, r.run_transactional("billing", "o1", handler)), idem::AlreadyInProgress);
  EXPECT_EQ(calls, 0);
  EXPECT_TRUE(run(io_, r.complete("billing", "o1", claim.token)));
  EXPECT_FALSE(run(io_, r.run_transactional("billing", "o1", handler)));
}

// Concurrent transactions and plain statements share a pool smaller than the number of
// transactions: transactions wait for a connection, nothing interleaves inside one.
TEST_F(AsyncRecorderTest, ConcurrentTransactionsAndStatements) {
  auto& r = *recorder_;
  pg::query("CREATE TABLE " + schema_.table("orders") + " (id text PRIMARY KEY)");
  const std::string orders = schema_.table("orders");
  std::atomic<int> committed{0};
  for (int i = 0; i < 40; ++i) {
    asio::co_spawn(
        io_,
        [&, i]() -> Task<void> {
          const std::string id = "o" + std::to_string(i % 20);  // each id twice
          const bool ran = co_await r.run_transactional(
              "billing", id, [&](AsyncSqlTransaction& tx) -> Task<void> {
                const idem::SqlParam params[] = {tx.event_id()};
                co_await tx.exec("INSERT INTO " + orders + " (id) VALUES ($1)", params);
              });
          if (ran) ++committed;
          co_await r.mark_processed("plain", id);
        },
        [](std::exception_ptr e) {
          if (e) std::rethrow_exception(e);
        });
  }
  io_.run();
  EXPECT_EQ(committed.load(), 20);
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + orders), 20);
}

// Cancelled after k steps of the event loop, for every k until the call completes on its own:
// each call ends with its result, operation_aborted, or (a write) an in-doubt StoreError, and
// the recorder works normally afterwards.
TEST_F(AsyncRecorderTest, CancellationAtEveryStep) {
  auto& r = *recorder_;
  run(io_, r.mark_processed("cancel", "warm"));  // a connection exists
  int aborted = 0;
  int in_doubt = 0;
  for (const bool write : {false, true}) {
    bool completed_on_its_own = false;
    for (int steps = 0; steps < 200 && !completed_on_its_own; ++steps) {
      const std::string id = std::string(write ? "w" : "r") + std::to_string(steps);
      const auto [finished, on_its_own, error] = cancel_after(steps, [&]() -> Task<void> {
        if (write) {
          co_await r.mark_processed("cancel", id);
        } else {
          (void)co_await r.is_processed("cancel", id);
        }
      });
      ASSERT_TRUE(finished) << "steps " << steps;
      completed_on_its_own = on_its_own;
      if (error) {
        try {
          std::rethrow_exception(error);
        } catch (const asio::system_error& e) {
          EXPECT_EQ(e.code(), asio::error::operation_aborted);
          ++aborted;
        } catch (const idem::StoreError& e) {
          EXPECT_TRUE(write) << "a read reported " << e.what();
          EXPECT_TRUE(e.in_doubt()) << e.what();
          ++in_doubt;
        }
      }
      // In step: the next statements on the same connections answer correctly.
      run(io_, r.mark_processed("cancel", "after" + id));
      EXPECT_TRUE(run(io_, r.is_processed("cancel", "after" + id)));
      if (!error) {
        EXPECT_EQ(run(io_, r.is_processed("cancel", id)), write);
      }
    }
    EXPECT_TRUE(completed_on_its_own);
  }
  EXPECT_GT(aborted, 0);   // withdrawn before sending, or a read dropped after
  EXPECT_GT(in_doubt, 0);  // a write cancelled after it was sent
}

// A transaction cancelled at every step rolls back (or, cancelled at COMMIT, is in doubt).
TEST_F(AsyncRecorderTest, CancelledTransactionRollsBack) {
  auto& r = *recorder_;
  pg::query("CREATE TABLE " + schema_.table("orders") + " (id text PRIMARY KEY)");
  const std::string orders = schema_.table("orders");
  bool completed_on_its_own = false;
  for (int steps = 0; steps < 400 && !completed_on_its_own; ++steps) {
    const std::string id = "o" + std::to_string(steps);
    const auto [finished, on_its_own, error] = cancel_after(steps, [&]() -> Task<void> {
      (void)co_await r.run_transactional("billing", id, [&](AsyncSqlTransaction& tx) -> Task<void> {
        const idem::SqlParam params[] = {tx.event_id()};
        co_await tx.exec("INSERT INTO " + orders + " (id) VALUES ($1)", params);
      });
    });
    ASSERT_TRUE(finished);
    completed_on_its_own = on_its_own;
    const bool marked = run(io_, r.is_processed("billing", id));
    const long long rows =
        pg::query_int("SELECT count(*) FROM " + orders + " WHERE id = '" + id + "'");
    EXPECT_EQ(marked, rows == 1) << "the marker and the handler's row commit together";
    bool in_doubt = false;
    if (error) {
      try {
        std::rethrow_exception(error);
      } catch (const asio::system_error& e) {
        EXPECT_EQ(e.code(), asio::error::operation_aborted);
      } catch (const idem::StoreError& e) {
        in_doubt = e.in_doubt();
        EXPECT_TRUE(in_doubt) << e.what();
      }
    }
    if (!error) {
      EXPECT_TRUE(marked);
    } else if (!in_doubt) {
      EXPECT_FALSE(marked);
    }
  }
  EXPECT_TRUE(completed_on_its_own);
  EXPECT_EQ(r.pool()->stats().exclusive, 0u);
}

// Blocking and async recorders on one database see each other's markers and claims.
TEST_F(AsyncRecorderTest, InteroperatesWithTheBlockingRecorder) {
  auto& r = *recorder_;
  idem::postgres::PostgresIdempotencyRecorder blocking(schema_.options());
  blocking.mark_processed("billing", "b1");
  EXPECT_TRUE(run(io_, r.is_processed("billing", "b1")));
  run(io_, r.mark_processed("billing", "a1"));
  EXPECT_TRUE(blocking.is_processed("billing", "a1"));

  const Claim mine = run(io_, r.claim("billing", "k", 60s));
  ASSERT_EQ(mine.status, Claim::Status::acquired);
  EXPECT_EQ(blocking.claim("billing", "k", 60s).status, Claim::Status::in_progress);
  EXPECT_TRUE(run(io_, r.complete("billing", "k", mine.token)));
  EXPECT_EQ(blocking.claim("billing", "k", 60s).status, Claim::Status::processed);

  const Claim theirs = blocking.claim("billing", "k2", 60s);
  ASSERT_EQ(theirs.status, Claim::Status::acquired);
  EXPECT_EQ(run(io_, r.claim("billing", "k2", 60s)).status, Claim::Status::in_progress);
  EXPECT_TRUE(blocking.release("billing", "k2", theirs.token));
  const Claim next = run(io_, r.claim("billing", "k2", 60s));
  ASSERT_EQ(next.status, Claim::Status::acquired);
  EXPECT_GT(next.token, theirs.token);  // one sequence for both faces
}

// Asio destroys what is pending on an execution context when the context goes. An io_context
// stopped and destroyed while a transaction's statement is in the pipeline must not keep the
// pool alive through the coroutine that waits on it: the connections close (the server sees the
// sessions end and rolls the transaction back) and nothing leaks (LeakSanitizer, in CI).
TEST(AsyncPostgresShutdown, DestroyingTheContextMidTransactionClosesTheSessions) {
  IDEM_REQUIRE_POSTGRES();
  pg::TempSchema schema;
  auto options = schema.options();
  options.pool_size = 2;
  options.application_name = "idem-context-shutdown-" + std::to_string(::getpid());
  const std::string sessions = "SELECT count(*) FROM pg_stat_activity WHERE application_name = '" +
                               options.application_name + "'";
  const std::string sleeping = sessions + " AND query LIKE 'SELECT pg_sleep%'";
  {
    asio::io_context io;
    auto recorder = std::make_unique<AsyncPostgresRecorder>(io.get_executor(), options);
    auto work = asio::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    // One coroutine waits in a transaction, another on a plain statement of the shared pool.
    asio::co_spawn(io,
                   recorder->run_transactional("billing", "e1",
                                               [](AsyncSqlTransaction& tx) -> Task<void> {
                                                 co_await tx.exec("SELECT pg_sleep(1)", {});
                                               }),
                   asio::detached);
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (pg::query_int(sleeping) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(5ms);
    ASSERT_EQ(pg::query_int(sleeping), 1) << "the handler's statement never reached the server";
    asio::co_spawn(io, recorder->is_processed("billing", "e2"), asio::detached);
    io.stop();
    runner.join();
    recorder.reset();
  }  // the io_context goes with the transaction's coroutine still waiting
  // The server notices a closed session when pg_sleep returns and it answers.
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (pg::query_int(sessions) != 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(pg::query_int(sessions), 0) << "a session of the destroyed context stayed open";
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + schema.table("processed_log")), 0);
}

TEST(AsyncPostgresOptions, BadOptionsAndUnreachableServer) {
  IDEM_REQUIRE_POSTGRES();
  asio::io_context io;
  idem::postgres::PostgresOptions bad;
  EXPECT_THROW(AsyncPostgresRecorder(io.get_executor(), bad), idem::ConfigError);
  bad.url = "mysql://x";
  EXPECT_THROW(AsyncPostgresRecorder(io.get_executor(), bad), idem::ConfigError);
}

}  // namespace
