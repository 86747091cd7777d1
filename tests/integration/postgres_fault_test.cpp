// PostgreSQL stopped in the middle of a run, then started again.
//
// The test server comes from scripts/servers.sh, which exports how to control it
// (IDEM_TEST_PG_CTL_CMD, IDEM_TEST_SERVERS_DIR, IDEM_TEST_POSTGRES_PORT). While a consumer
// thread keeps handling events, the server is stopped (pg_ctl stop -m fast, as the postgres
// user): every call then fails with a retryable StoreError instead of hanging, nothing is
// reported processed that was not, and once the server is started again the pool reconnects,
// the store's listener LISTENs again, and work resumes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "postgres_server_control.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace std::chrono_literals;
using idem::postgres::PostgresError;
namespace pg = idem::test::pg;

using idem::test::pg::ServerControl;

class PostgresFault : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_POSTGRES_CONTROL();
    idem::postgres::PostgresOptions options = schema_.options();
    options.connect_timeout = 2s;
    recorder_ = std::make_shared<idem::postgres::PostgresIdempotencyRecorder>(options);
    options.wait_recheck_interval = 1h;
    store_ = std::make_shared<idem::postgres::PostgresIdempotencyStore>(options);
    ASSERT_TRUE(store_->listen());
  }

  pg::TempSchema schema_;  // first: dropped last, with the server running again
  ServerControl server_;
  std::shared_ptr<idem::postgres::PostgresIdempotencyRecorder> recorder_;
  std::shared_ptr<idem::postgres::PostgresIdempotencyStore> store_;
};

// Every call on a stopped server ends in a retryable StoreError.
template <class Call>
void expect_retryable_store_error(const char* what, Call call) {
  try {
    call();
    ADD_FAILURE() << what << " succeeded with the server stopped";
  } catch (const idem::StoreError& e) {
    EXPECT_TRUE(e.retryable()) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << " threw something other than a StoreError: " << e.what();
  }
}

TEST_F(PostgresFault, StoppedServerFailsFastAndWorkResumesAfterRestart) {
  // A consumer keeps handling fresh events in exclusive mode, noting what its handler ran and
  // what was acknowledged (processed) to the transport.
  std::mutex mutex;
  std::set<std::string> ran;
  std::set<std::string> acknowledged;
  std::atomic<long> failures{0};
  std::atomic<long> successes{0};
  std::atomic<bool> done{false};
  idem::HandlerOptions handler_options;
  handler_options.mode = idem::HandlerMode::exclusive;
  auto handler = idem::make_idempotent_handler<std::string>(
      "fault-consumer", recorder_,
      [&](const std::string&, idem::BusProxy&, const idem::Event& event) {
        std::lock_guard lock(mutex);
        ran.insert(event.id);
      },
      handler_options);
  std::thread consumer([&] {
    idem::CollectingBusProxy bus("fault-consumer");
    while (!done.load()) {
      idem::Event event;
      event.id = idem::new_event_id();
      event.type = "test.event";
      try {
        if ((*handler)(event, bus) == idem::HandleResult::processed) {
          std::lock_guard lock(mutex);
          acknowledged.insert(event.id);
        }
        ++successes;
      } catch (const idem::Error& e) {
        if (!e.retryable()) ADD_FAILURE() << "not retryable: " << e.what();
        ++failures;
      }
    }
  });
  ASSERT_TRUE(pg::eventually([&] { return successes.load() >= 20; }));

  server_.stop();
  ASSERT_TRUE(pg::eventually([&] { return failures.load() >= 5; }))
      << "the consumer kept succeeding with the server stopped";
  expect_retryable_store_error("mark_processed", [&] { recorder_->mark_processed("c", "e"); });
  expect_retryable_store_error("is_processed",
                               [&] { static_cast<void>(recorder_->is_processed("c", "e")); });
  expect_retryable_store_error("claim",
                               [&] { static_cast<void>(recorder_->claim("c", "e", 10s)); });
  expect_retryable_store_error("run_transactional", [&] {
    static_cast<void>(recorder_->run_transactional("c", "e", [](idem::Transaction&) {
      ADD_FAILURE() << "a handler ran with the server stopped";
    }));
  });
  expect_retryable_store_error("store claim",
                               [&] { static_cast<void>(store_->claim("k", std::nullopt, 10s)); });
  expect_retryable_store_error("store lookup", [&] { static_cast<void>(store_->lookup("k")); });
  EXPECT_TRUE(pg::eventually([&] { return !store_->stats().listening; }));
  const long successes_while_down = successes.load();

  server_.start();
  // The pool reconnects on its own; the consumer's next deliveries go through again.
  ASSERT_TRUE(pg::eventually([&] { return successes.load() >= successes_while_down + 20; }));
  done.store(true);
  consumer.join();

  recorder_->mark_processed("c", "after-restart");
  EXPECT_TRUE(recorder_->is_processed("c", "after-restart"));
  {
    std::lock_guard lock(mutex);
    for (const std::string& id : acknowledged) {
      ASSERT_TRUE(recorder_->is_processed("fault-consumer", id))
          << "acknowledged but not marked: " << id;
    }
    // Nothing is marked that the handler did not run.
    EXPECT_LE(pg::query_int("SELECT count(*) FROM " + schema_.table("processed_log") +
                            " WHERE consumer = 'fault-consumer'"),
              static_cast<long long>(ran.size()));
    EXPECT_GE(pg::query_int("SELECT count(*) FROM " + schema_.table("processed_log") +
                            " WHERE consumer = 'fault-consumer'"),
              static_cast<long long>(acknowledged.size()));
  }
  std::printf("acknowledged=%zu ran=%zu failures=%ld\n", acknowledged.size(), ran.size(),
              failures.load());

  // The store's listener is back, and NOTIFY wakes waiters again.
  ASSERT_TRUE(pg::eventually([&] {
    const auto stats = store_->stats();
    return stats.listening && stats.listener_connects >= 2;
  }));
  const auto claim = store_->claim("after-restart", std::nullopt, 1h);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiter(
      [&] { seen = store_->wait("after-restart", std::chrono::steady_clock::now() + 1h, {}); });
  ASSERT_TRUE(pg::eventually([&] { return store_->stats().blocked_waiters == 1; }));
  idem::StoredValue value;
  value.bytes = "v";
  ASSERT_TRUE(store_->complete("after-restart", claim.token, value, idem::ExecutionReport{}, 1h));
  waiter.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, idem::IdempotencyRecord::State::completed);
  EXPECT_GE(store_->stats().wakeups_by_notification, 1u);
}

}  // namespace
