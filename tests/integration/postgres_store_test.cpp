// PostgresIdempotencyStore beyond the conformance suite, on a real server
// (IDEM_TEST_POSTGRES_URL): waiters on another connection are woken by NOTIFY (checked through
// the store's counters, never by timing), the listener reconnects, corrupt rows give clear
// errors, resilient() across two stores (= two processes), statement timeouts, bad input.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/idempotency.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/manual_clock.hpp"
#include "postgres_names.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace idem::test::postgres_names;
using State = idem::IdempotencyRecord::State;
namespace pg = idem::test::pg;

idem::StoredValue bytes(const std::string& text) {
  idem::StoredValue value;
  value.bytes = text;
  return value;
}

class PostgresStoreTest : public ::testing::Test {
 protected:
  // Two stores on the same table with their own pools and listeners: two processes, as far as
  // PostgreSQL can tell. The waiter re-checks only once an hour, so a waiter that returns within
  // the test was woken by a notification.
  void SetUp() override {
    owner_ = std::make_shared<PostgresIdempotencyStore>(schema_.options());
    PostgresOptions options = schema_.options();
    options.wait_recheck_interval = std::chrono::hours(1);
    options.application_name = waiter_app();
    waiter_ = std::make_shared<PostgresIdempotencyStore>(options);
    ASSERT_TRUE(waiter_->listen());
  }

  std::string records() const { return schema_.table("records"); }
  std::string waiter_app() const { return "idem-waiter-" + schema_.name(); }

  // Starts wait() on the waiter store in a thread and returns once it is blocked.
  std::thread start_waiting(const std::string& key, std::optional<idem::IdempotencyRecord>& seen,
                            std::stop_token stop = {}) {
    const std::size_t before = waiter_->stats().blocked_waiters;
    std::thread thread([this, key, &seen, stop] {
      seen = waiter_->wait(key, std::chrono::steady_clock::now() + 1h, stop);
    });
    EXPECT_TRUE(pg::eventually([&] { return waiter_->stats().blocked_waiters > before; }));
    return thread;
  }

  pg::TempSchema schema_;  // first: dropped last
  std::shared_ptr<PostgresIdempotencyStore> owner_;
  std::shared_ptr<PostgresIdempotencyStore> waiter_;
};

// ---- LISTEN / NOTIFY ------------------------------------------------------------------------

// A LISTEN of the test's own on a store's channel, to see which notifications are sent.
class ChannelListener {
 public:
  explicit ChannelListener(const std::string& channel)
      : conn_(pg::connect(pg::server_url().value())) {
    PQclear(PQexec(conn_.get(), ("LISTEN \"" + channel + "\"").c_str()));
  }

  // The payload of the next notification; nullopt when none came within `timeout`.
  std::optional<std::string> next(std::chrono::milliseconds timeout) {
    const auto until = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      if (PQconsumeInput(conn_.get()) == 0) return std::nullopt;
      if (PGnotify* notify = PQnotifies(conn_.get())) {
        std::string payload = notify->extra;
        PQfreemem(notify);
        return payload;
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd fd{PQsocket(conn_.get()), POLLIN, 0};
      (void)::poll(&fd, 1, static_cast<int>(left.count()));
    }
  }

 private:
  std::unique_ptr<PGconn, pg::ConnCloser> conn_;
};

// The interest locks (advisory locks in idem's class) the sessions named `application`
// hold, or wait for when `granted` is false.
long long interest_locks(const std::string& application, bool granted = true) {
  return pg::query_int(
      "SELECT count(*) FROM pg_locks AS l JOIN pg_stat_activity AS a USING (pid) WHERE "
      "l.locktype = 'advisory' AND l.objsubid = 2 AND l.classid = " +
      std::to_string(0x6964656d) + " AND l.granted = " + (granted ? "true" : "false") +
      " AND a.application_name = '" + application + "'");
}

TEST_F(PostgresStoreTest, CompleteWakesAWaiterOnAnotherConnectionByNotification) {
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("order-1", seen);
  ASSERT_TRUE(
      owner_->complete("order-1", claim.token, bytes("receipt"), idem::ExecutionReport{}, 1h));
  waiting.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, State::completed);
  EXPECT_EQ(seen->value.bytes, std::optional<std::string>("receipt"));
  const auto stats = waiter_->stats();
  EXPECT_EQ(stats.wakeups_by_notification, 1u);
  EXPECT_EQ(stats.rechecks, 0u) << "the hourly safety net cannot have fired";
  EXPECT_GE(stats.notifications_received, 1u);
  EXPECT_EQ(stats.waits, 1u);
  EXPECT_EQ(stats.blocked_waiters, 0u);
}

TEST_F(PostgresStoreTest, ReleaseWakesAWaiterToo) {
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen = idem::IdempotencyRecord{};
  std::thread waiting = start_waiting("order-1", seen);
  ASSERT_TRUE(owner_->release("order-1", claim.token));
  waiting.join();
  EXPECT_FALSE(seen.has_value()) << "released: the key is free";
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
  EXPECT_EQ(waiter_->stats().rechecks, 0u);
}

TEST_F(PostgresStoreTest, KeysThatNeedEscapingArriveIntact) {
  const std::string key = "it's \"caf\xc3\xa9\"; DROP TABLE x; -- \\ %_*";
  const auto claim = owner_->claim(key, std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting(key, seen);
  ASSERT_TRUE(owner_->complete(key, claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->key, key);
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
}

TEST_F(PostgresStoreTest, ANotificationForAnotherKeyDoesNotWakeTheWaiter) {
  const auto mine = owner_->claim("mine", std::nullopt, 1h);
  const auto other = owner_->claim("other", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("mine", seen);
  // Someone waits for "other" too (another listener), or its complete would notify nobody.
  ASSERT_TRUE(owner_->listen());
  std::thread other_waiting(
      [&] { (void)owner_->wait("other", std::chrono::steady_clock::now() + 1h, {}); });
  ASSERT_TRUE(pg::eventually([&] { return owner_->stats().blocked_waiters == 1; }));
  ASSERT_TRUE(owner_->complete("other", other.token, bytes("v"), idem::ExecutionReport{}, 1h));
  other_waiting.join();
  ASSERT_TRUE(pg::eventually([&] { return waiter_->stats().notifications_received >= 1; }));
  EXPECT_EQ(waiter_->stats().blocked_waiters, 1u) << "still waiting for its own key";
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 0u);
  ASSERT_TRUE(owner_->complete("mine", mine.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
  EXPECT_EQ(waiter_->stats().rechecks, 0u);
}

TEST_F(PostgresStoreTest, OnlyAKeyWithAWaiterIsNotified) {
  ChannelListener channel(schema_.name() + "_records");
  // Nobody waits: neither complete nor release nor a zero-ttl complete notifies.
  const auto completed = owner_->claim("completed", std::nullopt, 1h);
  ASSERT_TRUE(
      owner_->complete("completed", completed.token, bytes("v"), idem::ExecutionReport{}, 1h));
  const auto released = owner_->claim("released", std::nullopt, 1h);
  ASSERT_TRUE(owner_->release("released", released.token));
  const auto dropped = owner_->claim("dropped", std::nullopt, 1h);
  ASSERT_TRUE(owner_->complete("dropped", dropped.token, bytes("v"), idem::ExecutionReport{}, 0ms));
  // A key with a waiter is notified; notifications arrive in commit order, so the first one
  // the channel sees is this one.
  const auto waited = owner_->claim("waited", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("waited", seen);
  EXPECT_EQ(interest_locks(waiter_app()), 1);
  ASSERT_TRUE(owner_->complete("waited", waited.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  EXPECT_EQ(channel.next(std::chrono::minutes(1)), std::optional<std::string>("waited"));
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
  // The waiter left: its lock goes, and the key is not notified any more.
  ASSERT_TRUE(pg::eventually([&] { return interest_locks(waiter_app()) == 0; }));
  const auto again = owner_->claim("waited-again", std::nullopt, 1h);
  ASSERT_TRUE(owner_->release("waited-again", again.token));
  const auto last = owner_->claim("last", std::nullopt, 1h);
  waiting = start_waiting("last", seen);
  ASSERT_TRUE(owner_->release("last", last.token));
  waiting.join();
  EXPECT_EQ(channel.next(std::chrono::minutes(1)), std::optional<std::string>("last"));
  EXPECT_FALSE(seen.has_value());
}

TEST_F(PostgresStoreTest, AWaiterThatComesWhileACompleteCommitsGetsTheResult) {
  // A deferred trigger holds the complete's transaction open at COMMIT, after its statement
  // found no waiter (and so took the key's interest lock itself), until the test opens a gate.
  const std::string schema = "\"" + schema_.name() + "\"";
  pg::query("CREATE FUNCTION " + schema +
            ".gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "PERFORM pg_advisory_xact_lock(hashtext(TG_TABLE_SCHEMA)); RETURN NULL; END $$");
  pg::query("CREATE CONSTRAINT TRIGGER gate AFTER UPDATE ON " + records() +
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION " + schema + ".gate()");
  auto gate = pg::connect(pg::server_url().value());
  PQclear(
      PQexec(gate.get(), ("SELECT pg_advisory_lock(hashtext('" + schema_.name() + "'))").c_str()));
  const std::string blocked_by_gate = "SELECT count(*) FROM pg_stat_activity WHERE " +
                                      std::to_string(PQbackendPID(gate.get())) +
                                      " = ANY (pg_blocking_pids(pid))";

  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::atomic<bool> completed{false};
  std::thread completing([&] {
    completed = owner_->complete("order-1", claim.token, bytes("v"), idem::ExecutionReport{}, 1h);
  });
  ASSERT_TRUE(pg::eventually([&] { return pg::query_int(blocked_by_gate) == 1; }));

  std::atomic<bool> returned{false};
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting([&] {
    seen = waiter_->wait("order-1", std::chrono::steady_clock::now() + 1h, {});
    returned = true;
  });
  // The waiter's listener asks for the key's interest lock, and waits for the complete's.
  ASSERT_TRUE(pg::eventually([&] { return interest_locks(waiter_app(), false) == 1; }));
  EXPECT_FALSE(returned.load());
  EXPECT_FALSE(completed.load());

  PQclear(PQexec(gate.get(),
                 ("SELECT pg_advisory_unlock(hashtext('" + schema_.name() + "'))").c_str()));
  completing.join();
  waiting.join();
  EXPECT_TRUE(completed.load());
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, State::completed) << "read after the complete's commit";
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 0u) << "no notification was needed";
  EXPECT_EQ(waiter_->stats().rechecks, 0u);
}

TEST_F(PostgresStoreTest, ManyWaitersOnOneKeyAreAllWoken) {
  const auto claim = owner_->claim("hot", std::nullopt, 1h);
  constexpr int kWaiters = 4;
  std::vector<std::optional<idem::IdempotencyRecord>> seen(kWaiters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      seen[static_cast<std::size_t>(i)] =
          waiter_->wait("hot", std::chrono::steady_clock::now() + 1h, {});
    });
  }
  ASSERT_TRUE(pg::eventually([&] { return waiter_->stats().blocked_waiters == kWaiters; }));
  ASSERT_TRUE(owner_->complete("hot", claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
  for (auto& thread : threads)
    thread.join();
  for (const auto& record : seen) {
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->state, State::completed);
  }
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, static_cast<std::uint64_t>(kWaiters));
}

TEST_F(PostgresStoreTest, AStopRequestEndsABlockedWait) {
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::stop_source stop;
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("order-1", seen, stop.get_token());
  stop.request_stop();
  waiting.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, State::in_progress);
  EXPECT_EQ(seen->token, claim.token);
}

TEST_F(PostgresStoreTest, TheListenerReconnectsWhenItsSessionIsTerminated) {
  EXPECT_EQ(waiter_->stats().listener_connects, 1u);
  const std::string app = "idem-waiter-" + schema_.name();
  ASSERT_EQ(pg::query("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE "
                      "application_name = '" +
                      app + "' AND query LIKE 'LISTEN%'"),
            "1");
  ASSERT_TRUE(pg::eventually([&] {
    const auto stats = waiter_->stats();
    return stats.listener_connects == 2 && stats.listening;
  }));
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("order-1", seen);
  ASSERT_TRUE(owner_->complete("order-1", claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
}

TEST_F(PostgresStoreTest, ThePollStrategyHasNoListener) {
  PostgresOptions options = schema_.options();
  options.wait_strategy = idem::postgres::WaitStrategy::poll;
  PostgresIdempotencyStore polling(options);
  EXPECT_FALSE(polling.listen());
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting(
      [&] { seen = polling.wait("order-1", std::chrono::steady_clock::now() + 1h, {}); });
  ASSERT_TRUE(owner_->complete("order-1", claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->state, State::completed);
  EXPECT_FALSE(polling.stats().listening);
  EXPECT_EQ(polling.stats().listener_connects, 0u);
}

TEST_F(PostgresStoreTest, StoresInOtherSchemasDoNotWakeEachOther) {
  pg::TempSchema elsewhere;
  PostgresIdempotencyStore other(elsewhere.options());
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  const auto foreign = other.claim("order-1", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen;
  std::thread waiting = start_waiting("order-1", seen);
  ASSERT_TRUE(other.complete("order-1", foreign.token, bytes("v"), idem::ExecutionReport{}, 1h));
  ASSERT_TRUE(owner_->complete("order-1", claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
  waiting.join();
  EXPECT_EQ(waiter_->stats().notifications_received, 1u)
      << "a different schema notifies a different channel";
}

// ---- corrupt rows ---------------------------------------------------------------------------

class PostgresStoreCorruption : public PostgresStoreTest {
 protected:
  // Completes `key` and then breaks one column with `set`.
  void corrupt(const std::string& key, const std::string& set) {
    const auto claim = owner_->claim(key, std::nullopt, 1h);
    ASSERT_TRUE(owner_->complete(key, claim.token, bytes("v"), idem::ExecutionReport{}, 1h));
    pg::query("UPDATE " + records() + " SET " + set + " WHERE key = '" + key + "'");
  }

  void expect_corrupt(const std::string& key, const std::string& needle) {
    for (int call = 0; call < 2; ++call) {
      try {
        if (call == 0) {
          static_cast<void>(owner_->lookup(key));
        } else {
          static_cast<void>(owner_->claim(key, std::nullopt, 1h));
        }
        ADD_FAILURE() << "a corrupt record was accepted (" << needle << ")";
      } catch (const idem::StoreError& e) {
        const std::string message = e.what();
        EXPECT_EQ(e.code(), idem::ErrorCode::store_corrupt_record) << message;
        EXPECT_NE(message.find(key), std::string::npos) << message;
        EXPECT_NE(message.find(schema_.name() + ".records"), std::string::npos) << message;
        EXPECT_NE(message.find(needle), std::string::npos) << message;
      }
    }
  }
};

TEST_F(PostgresStoreCorruption, AnUnknownStateIsReported) {
  corrupt("k", "state = 'exploded'");
  expect_corrupt("k", "unknown state 'exploded'");
}

TEST_F(PostgresStoreCorruption, MissingColumnsAreReported) {
  corrupt("no-expiry", "expires_at = NULL");
  expect_corrupt("no-expiry", "expires_at");
  corrupt("no-value", "value = NULL");
  expect_corrupt("no-value", "without a value");
  corrupt("no-report", "report = NULL");
  expect_corrupt("no-report", "report");
  corrupt("no-lease", "state = 'in_progress', lease_until = NULL");
  expect_corrupt("no-lease", "lease_until");
  corrupt("bad-token", "token = -5");
  expect_corrupt("bad-token", "token");
}

TEST_F(PostgresStoreCorruption, AReportThatIsNotJsonIsReported) {
  corrupt("k", "report = '{\"operation\": 12'");
  expect_corrupt("k", "report does not decode");
  corrupt("k2", "report = '[1, 2]'");
  expect_corrupt("k2", "report does not decode");
}

TEST_F(PostgresStoreCorruption, AnUndecodableValueIsTheCodecsDecodeError) {
  int runs = 0;
  auto call = idem::resilient(
      [&](const std::string&) {
        ++runs;
        return 42;
      },
      {.name = "answer",
       .idempotency_key = [](const std::string& id) { return "answer:" + id; },
       .idempotency_store = owner_});
  EXPECT_EQ(call("a").value, 42);
  pg::query("UPDATE " + records() + " SET value = 'forty-two'::bytea");
  try {
    call("a");
    FAIL() << "replayed an undecodable value";
  } catch (const idem::DecodeError& e) {
    EXPECT_NE(std::string(e.what()).find("forty-two"), std::string::npos) << e.what();
  } catch (const idem::OperationError& e) {
    FAIL() << "expected DecodeError, got OperationError: " << e.what();
  }
  EXPECT_EQ(runs, 1);
}

// ---- resilient() across processes -----------------------------------------------------------

TEST_F(PostgresStoreTest, AnotherProcessReplaysTheResultAndTheOriginalReport) {
  std::atomic<int> runs{0};
  const auto make = [&](std::shared_ptr<PostgresIdempotencyStore> store) {
    return idem::resilient(
        [&](const std::string& id, int amount) {
          ++runs;
          return "receipt:" + id + ":" + std::to_string(amount);
        },
        {.name = "create_payment",
         .idempotency_key = [](const std::string& id, int) { return "pay:" + id; },
         .idempotency_store = std::move(store),
         .idempotency_fingerprint = true});
  };
  auto here = make(owner_);
  auto there = make(waiter_);
  const auto first = here("r-1", 2499);
  const auto second = there("r-1", 2499);
  EXPECT_EQ(first.value, "receipt:r-1:2499");
  EXPECT_EQ(second.value, first.value);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(first.report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(second.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(second.report.started_at, first.report.started_at) << "the original report";
  EXPECT_EQ(second.report.operation, "create_payment");
  EXPECT_THROW(there("r-1", 1), idem::KeyReuseError) << "same key, other arguments";
}

TEST_F(PostgresStoreTest, AWaiterInAnotherProcessIsWokenWhenTheOwnerFinishes) {
  std::latch release_owner(1);
  std::atomic<int> runs{0};
  const auto make = [&](std::shared_ptr<PostgresIdempotencyStore> store) {
    return idem::resilient(
        [&](const std::string& id) {
          if (++runs == 1) release_owner.wait();
          return "done:" + id;
        },
        {.name = "job",
         .idempotency_key = [](const std::string& id) { return "job:" + id; },
         .idempotency_store = std::move(store),
         .idempotency_in_progress = idem::InProgressPolicy::wait,
         .idempotency_max_wait = std::chrono::milliseconds(std::chrono::hours(1))});
  };
  auto owner_call = make(owner_);
  auto waiter_call = make(waiter_);
  std::optional<idem::OperationResult<std::string>> owned;
  std::thread owner([&] { owned = owner_call("j-1"); });
  ASSERT_TRUE(pg::eventually(
      [&] { return owner_->lookup(idem::scoped_idempotency_key("job", "job:j-1")).has_value(); }));
  std::optional<idem::OperationResult<std::string>> waited;
  std::thread waiter([&] { waited = waiter_call("j-1"); });
  ASSERT_TRUE(pg::eventually([&] { return waiter_->stats().blocked_waiters == 1; }));
  release_owner.count_down();
  owner.join();
  waiter.join();
  ASSERT_TRUE(owned && waited);
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(waited->value, "done:j-1");
  EXPECT_EQ(waited->report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(waiter_->stats().wakeups_by_notification, 1u);
  EXPECT_EQ(waiter_->stats().rechecks, 0u);
}

// ---- statement timeout, schema, input -------------------------------------------------------

TEST_F(PostgresStoreTest, AStatementTimeoutIsAClassifiedRetryableError) {
  PostgresOptions options = schema_.options();
  options.statement_timeout = std::chrono::milliseconds(200);
  PostgresIdempotencyStore store(options);
  const auto claim = store.claim("order-1", std::nullopt, 1h);
  auto blocker = pg::connect(pg::server_url().value());
  PQclear(PQexec(blocker.get(), "BEGIN"));
  PQclear(PQexec(blocker.get(),
                 ("SELECT 1 FROM " + records() + " WHERE key = 'order-1' FOR UPDATE").c_str()));
  try {
    static_cast<void>(store.renew("order-1", claim.token, 1h));
    FAIL() << "renewed a row another transaction has locked";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "57014") << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::timeout);
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt());
    EXPECT_NE(std::string(e.what()).find("renew"), std::string::npos) << e.what();
  }
  PQclear(PQexec(blocker.get(), "ROLLBACK"));
  EXPECT_TRUE(store.renew("order-1", claim.token, 1h));
}

TEST_F(PostgresStoreTest, TheTableIsVersionedAndANewerVersionIsRefused) {
  EXPECT_EQ(pg::query("SELECT version FROM " + schema_.table("schema_version") +
                      " WHERE component = 'store:records'"),
            "1");
  pg::query("UPDATE " + schema_.table("schema_version") + " SET version = 2");
  EXPECT_THROW(PostgresIdempotencyStore(schema_.options()), idem::StoreError);
}

TEST_F(PostgresStoreTest, TokensComeFromOneSequence) {
  const auto a = owner_->claim("a", std::nullopt, 1h);
  const auto b = waiter_->claim("b", std::nullopt, 1h);
  const auto c = owner_->claim("c", std::nullopt, 1h);
  EXPECT_LT(a.token, b.token);
  EXPECT_LT(b.token, c.token) << "unique and growing across keys and stores";
}

TEST_F(PostgresStoreTest, ZeroTtlDropsTheRecordAndWakesWaiters) {
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  std::optional<idem::IdempotencyRecord> seen = idem::IdempotencyRecord{};
  std::thread waiting = start_waiting("order-1", seen);
  ASSERT_TRUE(owner_->complete("order-1", claim.token, bytes("v"), idem::ExecutionReport{}, 0ms));
  waiting.join();
  EXPECT_FALSE(seen.has_value());
  EXPECT_EQ(owner_->entry_count(), 0u);
}

TEST_F(PostgresStoreTest, BadInputIsRejected) {
  const auto claim = owner_->claim("order-1", std::nullopt, 1h);
  EXPECT_THROW(static_cast<void>(owner_->complete("order-1", claim.token, idem::StoredValue{},
                                                  idem::ExecutionReport{}, 1h)),
               idem::InvalidArgument)
      << "a value without bytes";
  EXPECT_THROW(static_cast<void>(owner_->claim("order-2", std::string_view("fp\0x", 4), 1h)),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(owner_->claim("order-2", std::string_view("fp\xff"), 1h)),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(owner_->claim("bad\xff", std::nullopt, 1h)), idem::InvalidKey);
  EXPECT_THROW(static_cast<void>(owner_->wait("bad\xff", std::chrono::steady_clock::now(), {})),
               idem::InvalidKey);
  EXPECT_FALSE(
      owner_->complete("order-1", ~std::uint64_t{0}, bytes("v"), idem::ExecutionReport{}, 1h));
  EXPECT_EQ(owner_->entry_count(), 1u);
  EXPECT_THROW(PostgresIdempotencyStore(std::shared_ptr<idem::postgres::ConnectionPool>()),
               idem::InvalidArgument);
}

}  // namespace
