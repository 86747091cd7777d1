// Redis goes away in the middle of a run and comes back: calls fail fast with a retryable
// StoreError, nothing is reported processed that was not, and the pools reconnect by themselves.
//
// These tests stop a server, so they start a private redis-server (same flags as
// scripts/servers.sh, on a free port of its own, so tests sharing the suite's server are not
// disturbed) with an append-only file fsync'ed on every write: what a client was told happened
// survives the crash, so the test can check it after the restart. The server runs in the
// foreground with its log on a pipe; "Ready to accept connections" is the signal it is up.
//   * recorder: 3 threads deliver 3,000 events through exclusive-mode IdempotentHandlers; once
//     300 are processed the server is SIGKILLed; the threads keep delivering (every failure is
//     a redelivery) until the server is restarted on the same port, then finish.
//   * store:    results completed before a SHUTDOWN NOSAVE (sent over a second connection) are
//     replayed after the restart; during the outage resilient() fails retryably and runs nothing.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../integration/redis_test_env.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/resilient.hpp"
#include "private_redis.hpp"

namespace {

using namespace std::chrono_literals;

using idem::test::PrivateRedis;

// Persistence as scripts/servers.sh has it, with an append-only file fsync'ed on every write.
const std::vector<std::string> kDurableFlags{"--save",        "",      "--appendonly", "yes",
                                             "--appendfsync", "always"};

class RedisFault : public ::testing::Test {
 protected:
  void SetUp() override { IDEM_START_PRIVATE_REDIS(server_); }

  idem::redis::RedisOptions options() const {
    auto options = idem::redis::RedisOptions::from_url(server_.url());
    options.key_prefix = "fault:";
    options.connect_timeout = 500ms;
    options.command_timeout = 2s;
    options.pool_size = 4;
    return options;
  }

  PrivateRedis server_{kDurableFlags};
};

// Every failure a caller sees must tell it what to do: retry (retryable) or find out first
// (in doubt). Returns a description of anything else.
std::string classify(const std::exception_ptr& error, bool& in_doubt, bool& connect) {
  try {
    std::rethrow_exception(error);
  } catch (const idem::redis::RedisError& e) {
    in_doubt = e.in_doubt();
    connect = e.failure() == idem::redis::RedisFailure::connect;
    if (!e.retryable() && !e.in_doubt()) return std::string("not retryable: ") + e.what();
  } catch (const idem::Error& e) {  // AlreadyInProgress, LeaseLost
    in_doubt = e.in_doubt();
    if (!e.retryable()) return std::string("not retryable: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("unexpected exception: ") + e.what();
  }
  return {};
}

TEST_F(RedisFault, RecorderFailsFastDuringAnOutageAndResumesAfterRestart) {
  constexpr int kThreads = 3;
  constexpr int kEvents = 3000;
  constexpr int kKillAfter = 300;
  // Deliveries pause once this many events are done until the kill happened, so the outage
  // always falls in the middle of the run.
  constexpr int kHoldAt = 2000;

  auto recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(options());
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<std::string> queue;
  std::vector<std::string> events;
  for (int i = 0; i < kEvents; ++i) {
    events.push_back(idem::new_event_id());
    queue.push_back(events.back());
  }
  std::map<std::string, int> runs;  // side effects per event
  std::set<std::string> reported;   // HandleResult::processed
  // Events whose handler ran in a delivery that then failed (the completion was lost or in
  // doubt): exclusive mode may run them again after the lease — its documented window.
  std::set<std::string> unacknowledged;
  std::vector<std::string> bad_errors;  // failures that were neither retryable nor in doubt
  int processed = 0;
  int in_flight = 0;
  int failures_after_kill = 0;
  int connect_failures = 0;
  bool killed = false;

  auto deliver = [&] {
    idem::HandlerOptions handler_options;
    handler_options.mode = idem::HandlerMode::exclusive;
    handler_options.lease = 300ms;  // a claim lost with the outage is taken over soon after
    bool ran = false;               // the handler ran in this thread's current delivery
    auto handler = idem::make_idempotent_handler<std::string>(
        "fault", recorder,
        [&](const std::string&, idem::BusProxy&, const idem::Event& event) {
          std::lock_guard lock(mutex);
          ++runs[event.id];
          ran = true;
        },
        handler_options);
    idem::CollectingBusProxy bus("fault");
    for (;;) {
      std::string id;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] {
          return (queue.empty() && in_flight == 0) ||
                 (!queue.empty() && (processed < kHoldAt || killed));
        });
        if (queue.empty()) return;
        id = queue.front();
        queue.pop_front();
        ++in_flight;
      }
      idem::Event event;
      event.id = id;
      event.type = "fault.test";
      std::exception_ptr error;
      ran = false;
      idem::HandleResult result = idem::HandleResult::duplicate;
      try {
        result = (*handler)(event, bus);
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard lock(mutex);
        --in_flight;
        if (!error) {
          if (result == idem::HandleResult::processed) {
            reported.insert(id);
            ++processed;
          }
        } else {
          bool in_doubt = false;
          bool connect = false;
          const std::string bad = classify(error, in_doubt, connect);
          if (!bad.empty()) bad_errors.push_back(bad);
          if (in_doubt || ran) unacknowledged.insert(id);
          if (connect) ++connect_failures;
          if (killed) ++failures_after_kill;
          queue.push_back(id);  // not acknowledged: delivered again
        }
      }
      changed.notify_all();
      if (error) std::this_thread::sleep_for(2ms);  // the broker's redelivery delay
    }
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back(deliver);
  {
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return processed >= kKillAfter; });
  }
  server_.kill();
  {
    std::lock_guard lock(mutex);
    killed = true;
  }
  changed.notify_all();
  {
    // The threads meet the outage (each failure is immediate: nothing listens).
    std::unique_lock lock(mutex);
    changed.wait(lock, [&] { return failures_after_kill >= 30; });
  }
  // Direct calls fail fast too, retryable, and mark nothing.
  try {
    (void)recorder->is_processed("fault", events.back());
    ADD_FAILURE() << "is_processed succeeded with the server down";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_EQ(e.failure(), idem::redis::RedisFailure::connect) << e.what();
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt());
  }
  EXPECT_THROW(recorder->mark_processed("fault", "during-outage"), idem::StoreError);
  const auto stats_down = recorder->pool()->stats();
  EXPECT_GT(stats_down.connect_failures, 0u);

  ASSERT_TRUE(server_.start()) << "the server did not come back";
  for (auto& thread : threads)
    thread.join();

  EXPECT_TRUE(bad_errors.empty()) << bad_errors.size() << " failures were neither retryable nor "
                                  << "in doubt, e.g. " << bad_errors.front();
  EXPECT_GT(connect_failures, 0) << "the outage was never seen as a refused connection";
  EXPECT_FALSE(recorder->is_processed("fault", "during-outage"));
  // Nothing reported processed that was not: every reported event is marked (the append-only
  // file kept what the server acknowledged).
  for (const auto& id : reported)
    EXPECT_TRUE(recorder->is_processed("fault", id)) << id;
  // Work resumed: every event ran and is marked; side effects ran once, except for events whose
  // handler ran in a delivery that then failed (the completion never reached the server, or its
  // reply was lost) — exclusive mode's documented at-least-once window across a crash.
  int again = 0;
  for (const auto& id : events) {
    EXPECT_TRUE(recorder->is_processed("fault", id)) << id;
    const int n = runs[id];
    EXPECT_GE(n, 1) << id;
    if (n > 1) {
      ++again;
      EXPECT_TRUE(unacknowledged.count(id) != 0)
          << id << " ran " << n << " times, but every delivery that ran it was acknowledged";
    }
  }
  const auto stats = recorder->pool()->stats();
  EXPECT_GT(stats.connects, stats_down.connects) << "the pool reconnected after the restart";
  std::printf(
      "processed=%d reported=%zu unacknowledged=%zu ran-again=%d connect-failures=%d pool: "
      "connects=%llu dropped=%llu connect_failures=%llu\n",
      processed, reported.size(), unacknowledged.size(), again, connect_failures,
      static_cast<unsigned long long>(stats.connects),
      static_cast<unsigned long long>(stats.dropped),
      static_cast<unsigned long long>(stats.connect_failures));
}

TEST_F(RedisFault, StoreReplaysAfterARestartAndRunsNothingDuringTheOutage) {
  auto store = std::make_shared<idem::redis::RedisIdempotencyStore>(options());
  std::atomic<int> runs{0};
  using Signature = std::string(const std::string&);
  idem::ResilientOptions<Signature> resilient_options;
  resilient_options.name = "create_order";
  resilient_options.idempotency_key = [](const std::string& id) { return "order:" + id; };
  resilient_options.idempotency_store = store;
  auto create = idem::resilient<Signature>(
      [&](const std::string& id) {
        ++runs;
        return "receipt-" + id;
      },
      resilient_options);
  EXPECT_EQ(create("1").value, "receipt-1");
  EXPECT_EQ(create("2").value, "receipt-2");
  EXPECT_EQ(runs.load(), 2);

  idem::redis::ConnectionPool admin(options());
  {  // A server refusing writes for now (-OOM at maxmemory) is a retryable refusal.
    auto connection = admin.lease();
    ASSERT_EQ(connection->command({"CONFIG", "SET", "maxmemory", "1"}).str, "OK");
    try {
      (void)store->claim("order:oom", std::nullopt, 10s);
      ADD_FAILURE() << "a claim was accepted above maxmemory";
    } catch (const idem::redis::RedisError& e) {
      EXPECT_EQ(e.failure(), idem::redis::RedisFailure::reply);
      EXPECT_TRUE(e.retryable()) << e.what();
      EXPECT_FALSE(e.in_doubt());
      EXPECT_NE(std::string(e.what()).find("OOM"), std::string::npos) << e.what();
    }
    ASSERT_EQ(connection->command({"CONFIG", "SET", "maxmemory", "0"}).str, "OK");
  }

  {  // SHUTDOWN NOSAVE from a second connection: the server exits, the reply never comes.
    auto connection = admin.lease();
    EXPECT_THROW((void)connection->command({"SHUTDOWN", "NOSAVE"}), idem::redis::RedisError);
  }
  server_.wait_exit();

  for (const char* id : {"1", "3"}) {
    try {
      (void)create(id);
      ADD_FAILURE() << "a call succeeded with the server down";
    } catch (const idem::Error& e) {
      EXPECT_TRUE(e.retryable()) << e.what();
      EXPECT_FALSE(e.in_doubt()) << e.what();
    }
  }
  EXPECT_EQ(runs.load(), 2) << "nothing may run while the store cannot record it";
  try {
    (void)store->claim("order:4", std::nullopt, 10s);
    ADD_FAILURE() << "claim succeeded with the server down";
  } catch (const idem::redis::RedisError& e) {
    EXPECT_EQ(e.failure(), idem::redis::RedisFailure::connect);
    EXPECT_TRUE(e.retryable());
  }

  ASSERT_TRUE(server_.start());
  const auto replayed = create("1");
  EXPECT_EQ(replayed.value, "receipt-1");
  EXPECT_EQ(replayed.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(create("3").report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(runs.load(), 3);
}

}  // namespace
