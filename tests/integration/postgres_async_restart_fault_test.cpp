// PostgreSQL stopped and started again under the async recorder and store while dozens of calls
// are in flight on one event loop: every call ends with its result or a classified StoreError
// (none hangs, nothing else is thrown), nothing is reported processed that was not, and once
// the server is back the pool reconnects and work resumes.
//
// The server comes from scripts/servers.sh (IDEM_TEST_PG_CTL_CMD, IDEM_TEST_SERVERS_DIR,
// IDEM_TEST_POSTGRES_PORT).
#include <gtest/gtest.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../postgres_test_support.hpp"
#include "coroutine_clients.hpp"
#include "idem/error.hpp"
#include "idem/postgres/async_postgres.hpp"
#include "postgres_server_control.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace std::chrono_literals;
using idem::async::Task;
namespace pg = idem::test::pg;

using idem::test::pg::ServerControl;

TEST(AsyncPostgresRestart, InFlightCallsEndClassifiedAndWorkResumes) {
  IDEM_REQUIRE_POSTGRES_CONTROL();
  pg::TempSchema schema;  // first: dropped last, with the server running again
  ServerControl server;
  asio::io_context io;
  auto options = schema.options();
  options.connect_timeout = 2s;
  options.pool_size = 4;
  auto pool = std::make_shared<idem::postgres::AsyncConnectionPool>(io.get_executor(), options);
  idem::postgres::AsyncPostgresRecorder recorder(pool);
  idem::postgres::AsyncPostgresStore store(pool);

  std::atomic<bool> stopping{false};
  std::atomic<long> successes{0};
  std::atomic<long> store_errors{0};
  std::atomic<long> other_errors{0};
  std::mutex mutex;
  std::set<std::string> marked;    // mark_processed returned
  std::vector<std::string> wrong;  // reported processed but never marked, or similar
  std::vector<std::string> unclassified;
  constexpr int kCoroutines = 50;
  std::atomic<int> running{kCoroutines};

  idem::test::spawn_client_loops(
      io, kCoroutines, stopping, running, [&](int c, int i) -> Task<bool> {
        const std::string id = "c" + std::to_string(c) + "-" + std::to_string(i);
        try {
          if (co_await recorder.is_processed("restart", id)) {
            std::lock_guard lock(mutex);
            wrong.push_back(id + " processed before it was marked");
          }
          co_await recorder.mark_processed("restart", id);
          {
            std::lock_guard lock(mutex);
            marked.insert(id);
          }
          const auto outcome = co_await store.claim(id, std::nullopt, 60s);
          if (outcome.status == idem::ClaimOutcome::Status::acquired) {
            (void)co_await store.release(id, outcome.token);
          }
          ++successes;
          co_return false;
        } catch (const idem::StoreError& e) {
          ++store_errors;
          if (!e.retryable() && !e.in_doubt()) {
            std::lock_guard lock(mutex);
            unclassified.push_back(e.what());
          }
        } catch (const std::exception& e) {
          ++other_errors;
          std::lock_guard lock(mutex);
          unclassified.push_back(e.what());
        }
        co_return true;  // the server is down
      });
  std::thread loop([&] { io.run(); });

  ASSERT_TRUE(pg::eventually([&] { return successes.load() >= 200; }));
  server.stop();
  const long errors_before = store_errors.load();
  ASSERT_TRUE(pg::eventually([&] { return store_errors.load() > errors_before + 50; }));
  server.start();
  const long after_restart = successes.load();
  const bool resumed = pg::eventually([&] { return successes.load() >= after_restart + 500; });
  stopping = true;
  loop.join();  // every coroutine ended: none hangs
  std::cout << successes.load() << " iterations succeeded, " << store_errors.load()
            << " calls ended with a StoreError while the server was down\n";
  EXPECT_TRUE(resumed);
  EXPECT_EQ(running.load(), 0);
  EXPECT_EQ(other_errors.load(), 0);
  EXPECT_TRUE(unclassified.empty()) << unclassified.front();
  EXPECT_TRUE(wrong.empty()) << wrong.front();
  // Every marker a caller was told is written is in the table.
  std::string ids = "{";
  for (const std::string& id : marked)
    ids += (ids.size() > 1 ? "," : "") + id;
  ids += "}";
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + schema.table("processed_log") +
                          " WHERE consumer = 'restart' AND event_id = ANY('" + ids + "')"),
            static_cast<long long>(marked.size()));
  EXPECT_GE(pool->stats().connects, 2u);
}

}  // namespace
