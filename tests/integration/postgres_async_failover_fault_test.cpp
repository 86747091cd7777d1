// Failover, for both faces ("async" in the file name links the coroutine face too): a primary
// with a streaming standby of the test's own (PrivatePostgresPair), clients on the multi-host URL
// "postgresql://idem@P1,P2/idem_test?target_session_attrs=read-write".
// Threads (blocking face) and coroutines (async face) mark, claim and complete in a loop; the
// primary is killed mid-load (pg_ctl stop -m immediate) and the standby promoted. Asserted:
//   - every call ends, within its deadline, with its result or a classified StoreError
//     (retryable or in doubt); none hangs, nothing else is thrown;
//   - the same recorders, never reopened, work again on the promoted server;
//   - with synchronous replication, every mark and completion acknowledged anywhere in the run is
//     on the promoted server; with asynchronous replication the number lost is reported only;
//   - a client whose URL names the standby alone gets store_read_only (SQLSTATE 25006),
//     retryable, and its connection is dropped, so the next one is a new session.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <iostream>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../postgres_test_support.hpp"
#include "coroutine_clients.hpp"
#include "idem/error.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "idem/postgres/postgres_error.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "postgres_private_pair.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;
namespace pg = idem::test::pg;
using Clock = std::chrono::steady_clock;

// A call's bound: connect_timeout + acquire_timeout + statement_timeout below, with room for a
// slow sanitizer build. A call that takes longer counts as hung.
constexpr auto kCallDeadline = 30s;

idem::postgres::PostgresOptions options_for(const std::string& url, bool create_schema) {
  idem::postgres::PostgresOptions options;
  options.url = url;
  options.schema = "idem_failover";
  options.pool_size = 4;
  options.connect_timeout = 2s;
  options.acquire_timeout = 5s;
  options.statement_timeout = 10s;
  options.create_schema = create_schema;
  return options;
}

// What the clients saw, from every thread and coroutine.
struct Tally {
  std::atomic<long> calls{0};
  std::atomic<long> ok{0};
  std::atomic<long> retryable{0};  // failed, retryable and not in doubt
  std::atomic<long> in_doubt{0};
  std::atomic<long> slowest_ms{0};
  std::mutex mutex;
  std::vector<std::string> unclassified;  // not a StoreError, or neither retryable nor in doubt
  std::set<std::string> acked_marks;      // mark_processed returned
  std::set<std::string> acked_completions;

  void ended(Clock::time_point began) {
    const long ms = static_cast<long>(
        std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - began).count());
    long seen = slowest_ms.load();
    while (ms > seen && !slowest_ms.compare_exchange_weak(seen, ms)) {
    }
  }
  void failed(const std::exception& e) {
    const auto* store = dynamic_cast<const idem::StoreError*>(&e);
    if (store != nullptr && store->in_doubt()) {
      ++in_doubt;
    } else if (store != nullptr && store->retryable()) {
      ++retryable;
    } else {
      std::lock_guard lock(mutex);
      unclassified.push_back(e.what());
    }
  }
  void acked(std::set<std::string>& ids, const std::string& id) {
    std::lock_guard lock(mutex);
    ids.insert(id);
  }
};

// Runs `fn` as one counted call; false when it threw.
template <class Fn>
bool blocking_call(Tally& tally, Fn&& fn) {
  ++tally.calls;
  const auto began = Clock::now();
  try {
    fn();
    tally.ended(began);
    ++tally.ok;
    return true;
  } catch (const std::exception& e) {
    tally.ended(began);
    tally.failed(e);
    return false;
  }
}

// Runs `task` on `io` (run by no other thread) until it ends; rethrows what it threw.
void run_on(asio::io_context& io, Task<void> task) {
  bool done = false;
  std::exception_ptr error;
  asio::co_spawn(io, std::move(task), [&](std::exception_ptr e) {
    error = e;
    done = true;
  });
  io.restart();
  while (!done && io.run_one() > 0) {
  }
  if (!done) throw std::runtime_error("the async call ended without an outcome");
  if (error) std::rethrow_exception(error);
}

// How many of `ids` have a marker of `consumer` on the server at `url`.
long long present(const std::string& url, const std::string& consumer,
                  const std::set<std::string>& ids) {
  std::string array = "{";
  for (const std::string& id : ids)
    array += (array.size() > 1 ? "," : "") + id;
  array += "}";
  auto conn = pg::connect(url);
  const std::string sql = "SELECT count(*) FROM idem_failover.processed_log WHERE consumer = '" +
                          consumer + "' AND event_id = ANY('" + array + "')";
  std::unique_ptr<PGresult, pg::ResultCloser> result(PQexec(conn.get(), sql.c_str()));
  if (PQresultStatus(result.get()) != PGRES_TUPLES_OK) {
    throw std::runtime_error(sql + ": " + PQresultErrorMessage(result.get()));
  }
  return std::stoll(PQgetvalue(result.get(), 0, 0));
}

// The blocking and async recorders on the standby alone, before the failover: writes are refused
// as store_read_only, retryable, not in doubt, and the connection is not kept.
template <class Write>
void expect_refused_write(Write&& write) {
  try {
    write();
    ADD_FAILURE() << "a write on the standby succeeded";
  } catch (const idem::postgres::PostgresError& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::store_read_only) << e.what();
    EXPECT_EQ(e.sqlstate(), "25006") << e.what();
    EXPECT_TRUE(e.retryable()) << e.what();
    EXPECT_FALSE(e.in_doubt()) << e.what();
  }
}

void run_failover(bool synchronous) {
  IDEM_REQUIRE_POSTGRES_BINARIES();
  pg::PrivatePostgresPair pair(synchronous);
  ASSERT_NO_THROW(pair.start());

  // The tables, made on the primary; the standby has them by replication.
  idem::postgres::PostgresIdempotencyRecorder recorder(options_for(pair.multi_host_url(), true));
  asio::io_context io;
  auto async_pool = std::make_shared<idem::postgres::AsyncConnectionPool>(
      io.get_executor(), options_for(pair.multi_host_url(), true));
  idem::postgres::AsyncPostgresRecorder async_recorder(async_pool);

  // A client of the standby alone (no target_session_attrs). With asynchronous replication the
  // standby may not have replayed the tables yet: opening it (which checks them) is retried.
  std::unique_ptr<idem::postgres::PostgresIdempotencyRecorder> standby_recorder;
  for (int attempt = 0; !standby_recorder; ++attempt) {
    try {
      standby_recorder = std::make_unique<idem::postgres::PostgresIdempotencyRecorder>(
          options_for(pair.standby_url(), false));
    } catch (const idem::StoreError&) {
      if (attempt >= 300) throw;  // 30 s
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  idem::postgres::PostgresIdempotencyRecorder& on_standby = *standby_recorder;
  asio::io_context standby_io;
  auto standby_async_pool = std::make_shared<idem::postgres::AsyncConnectionPool>(
      standby_io.get_executor(), options_for(pair.standby_url(), false));
  idem::postgres::AsyncPostgresRecorder standby_async(standby_async_pool);
  const auto dropped_before = on_standby.pool()->stats().dropped;
  expect_refused_write([&] { on_standby.mark_processed("mark", "on-standby-b"); });
  EXPECT_GT(on_standby.pool()->stats().dropped, dropped_before)
      << "a connection to a read-only server went back to the pool";
  expect_refused_write(
      [&] { run_on(standby_io, standby_async.mark_processed("mark", "on-standby-a")); });
  const auto async_connects_before = standby_async_pool->stats().connects;

  Tally tally;
  std::atomic<bool> stopping{false};
  constexpr int kThreads = 3;
  constexpr int kCoroutines = 8;
  std::atomic<int> running{kThreads + kCoroutines};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int n = 0; !stopping.load(); ++n) {
        const std::string id = "b" + std::to_string(t) + "-" + std::to_string(n);
        bool any_failed = false;
        if (blocking_call(tally, [&] { recorder.mark_processed("mark", id); })) {
          tally.acked(tally.acked_marks, id);
        } else {
          any_failed = true;
        }
        idem::Claim claim;
        bool done = false;
        if (blocking_call(tally, [&] { claim = recorder.claim("work", id, 60s); })) {
          if (claim.status == idem::Claim::Status::acquired) {
            if (blocking_call(tally, [&] { done = recorder.complete("work", id, claim.token); })) {
              if (done) tally.acked(tally.acked_completions, id);
            } else {
              any_failed = true;
            }
          }
        } else {
          any_failed = true;
        }
        // While no server takes writes every call fails at once: do not spin on refusals.
        if (any_failed) std::this_thread::sleep_for(5ms);
      }
      --running;
    });
  }
  idem::test::spawn_client_loops(
      io, kCoroutines, stopping, running, [&](int c, int n) -> Task<bool> {
        const std::string id = "a" + std::to_string(c) + "-" + std::to_string(n);
        auto began = Clock::now();
        ++tally.calls;
        try {
          co_await async_recorder.mark_processed("mark", id);
          tally.ended(began);
          ++tally.ok;
          tally.acked(tally.acked_marks, id);
          began = Clock::now();
          ++tally.calls;
          const idem::Claim claim = co_await async_recorder.claim("work", id, 60s);
          tally.ended(began);
          ++tally.ok;
          if (claim.status == idem::Claim::Status::acquired) {
            began = Clock::now();
            ++tally.calls;
            const bool done = co_await async_recorder.complete("work", id, claim.token);
            tally.ended(began);
            ++tally.ok;
            if (done) tally.acked(tally.acked_completions, id);
          }
          co_return false;
        } catch (const std::exception& e) {
          tally.ended(began);
          tally.failed(e);
        }
        co_return true;
      });
  std::thread loop([&] { io.run(); });

  ASSERT_TRUE(pg::eventually([&] { return tally.ok.load() >= 300; }));
  pair.kill_primary();
  const long failures_at_kill = tally.retryable.load() + tally.in_doubt.load();
  // Every client notices: its calls fail (classified) until a server takes writes again.
  const bool noticed = pg::eventually(
      [&] { return tally.retryable.load() + tally.in_doubt.load() >= failures_at_kill + 20; });
  pair.promote();
  const long ok_at_promotion = tally.ok.load();
  const bool resumed = pg::eventually([&] { return tally.ok.load() >= ok_at_promotion + 300; });
  stopping = true;
  for (std::thread& thread : threads)
    thread.join();
  loop.join();  // every coroutine ended: none hangs

  EXPECT_TRUE(noticed);
  EXPECT_TRUE(resumed) << "the clients did not reach the promoted server by themselves";
  EXPECT_EQ(running.load(), 0);
  EXPECT_LT(tally.slowest_ms.load(),
            std::chrono::duration_cast<std::chrono::milliseconds>(kCallDeadline).count());
  EXPECT_TRUE(tally.unclassified.empty()) << tally.unclassified.front();

  // The standby's own clients, not reopened, write on it now that it is the primary; the async
  // one through a new session (the refused one was closed).
  EXPECT_NO_THROW(on_standby.mark_processed("mark", "on-standby-b"));
  EXPECT_NO_THROW(run_on(standby_io, standby_async.mark_processed("mark", "on-standby-a")));
  EXPECT_GT(standby_async_pool->stats().connects, async_connects_before);

  const auto marks = static_cast<long long>(tally.acked_marks.size());
  const auto completions = static_cast<long long>(tally.acked_completions.size());
  const long long lost_marks = marks - present(pair.standby_url(), "mark", tally.acked_marks);
  const long long lost_completions =
      completions - present(pair.standby_url(), "work", tally.acked_completions);
  std::cout << (synchronous ? "synchronous" : "asynchronous")
            << " replication: " << tally.calls.load() << " calls, " << tally.ok.load()
            << " succeeded, " << tally.retryable.load() << " failed retryable, "
            << tally.in_doubt.load() << " in doubt, slowest " << tally.slowest_ms.load()
            << " ms; acknowledged " << marks << " marks and " << completions
            << " completions, lost " << lost_marks << " marks and " << lost_completions
            << " completions on the promoted server\n";
  if (synchronous) {
    EXPECT_EQ(lost_marks, 0);
    EXPECT_EQ(lost_completions, 0);
  }
}

TEST(PostgresFailover, SynchronousReplicationKeepsEveryAcknowledgedWrite) {
  run_failover(/*synchronous=*/true);
}

TEST(PostgresFailover, AsynchronousReplicationReportsWhatItLost) {
  run_failover(/*synchronous=*/false);
}

}  // namespace
