// PostgresIdempotencyRecorder beyond the conformance suite, on a real server
// (IDEM_TEST_POSTGRES_URL): the schema and its version table, time from the injected clock, the
// transactional inbox (the handler's writes commit with the marker or not at all, misuse is
// reported), exclusive and transactional mode on one event, statement timeouts, bad input, purge.
#include <gtest/gtest.h>

#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../postgres_test_support.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/postgres/connection_pool.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/testing/manual_clock.hpp"
#include "postgres_names.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using namespace idem::test::postgres_names;
namespace pg = idem::test::pg;

class PostgresRecorderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    clock_ = std::make_shared<idem::testing::ManualClock>();
    recorder_ = make();
    pg::query("CREATE TABLE " + schema_.table("shipments") +
              " (order_id text PRIMARY KEY, address text NOT NULL)");
  }

  PostgresOptions options() const {
    PostgresOptions options = schema_.options();
    options.clock = clock_;
    return options;
  }
  std::shared_ptr<PostgresIdempotencyRecorder> make() const {
    return std::make_shared<PostgresIdempotencyRecorder>(options());
  }
  long long count(const std::string& table, const std::string& where = "true") const {
    return pg::query_int("SELECT count(*) FROM " + schema_.table(table) + " WHERE " + where);
  }

  pg::TempSchema schema_;  // first: dropped last
  std::shared_ptr<idem::testing::ManualClock> clock_;
  std::shared_ptr<PostgresIdempotencyRecorder> recorder_;
};

// ---- schema ---------------------------------------------------------------------------------

TEST_F(PostgresRecorderTest, CreatesItsTablesAndRecordsTheirVersion) {
  EXPECT_EQ(pg::query("SELECT version FROM " + schema_.table("schema_version") +
                      " WHERE component = 'recorder:processed_log,claims'"),
            "1");
  EXPECT_EQ(pg::query("SELECT data_type FROM information_schema.columns WHERE table_schema = '" +
                      schema_.name() + "' AND table_name = 'processed_log' AND column_name = 'ts'"),
            "timestamp with time zone");
  EXPECT_EQ(pg::query("SELECT string_agg(a.attname, ',' ORDER BY k.ord) FROM pg_index i "
                      "CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, ord) "
                      "JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum "
                      "WHERE i.indisprimary AND i.indrelid = '" +
                      schema_.table("processed_log") + "'::regclass"),
            "consumer,event_id");
  // Opening again (another process starting) changes nothing.
  recorder_->mark_processed("billing", "e-1");
  auto again = make();
  EXPECT_TRUE(again->is_processed("billing", "e-1"));
  EXPECT_EQ(count("schema_version"), 1);
}

TEST_F(PostgresRecorderTest, ProcessesStartingTogetherCreateTheSchemaOnce) {
  pg::TempSchema fresh;
  constexpr int kThreads = 6;
  std::latch start(kThreads);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      start.arrive_and_wait();
      try {
        PostgresIdempotencyRecorder recorder(fresh.options());
        recorder.mark_processed("c", "e");
      } catch (const std::exception& e) {
        ADD_FAILURE() << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(pg::query_int("SELECT count(*) FROM " + fresh.table("processed_log")), 1);
}

TEST_F(PostgresRecorderTest, ANewerSchemaIsRefused) {
  pg::query("UPDATE " + schema_.table("schema_version") + " SET version = 7");
  try {
    make();
    FAIL() << "opened tables of a newer version";
  } catch (const idem::StoreError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("version 7"), std::string::npos) << message;
    EXPECT_NE(message.find("upgrade idem"), std::string::npos) << message;
    EXPECT_FALSE(e.retryable());
  }
}

TEST_F(PostgresRecorderTest, WithoutCreateSchemaTheTablesMustExist) {
  pg::TempSchema empty;
  PostgresOptions options = empty.options();
  options.create_schema = false;
  try {
    PostgresIdempotencyRecorder recorder(options);
    FAIL() << "opened a schema without tables";
  } catch (const idem::StoreError& e) {
    EXPECT_NE(std::string(e.what()).find("create_schema is false"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pg::query("SELECT count(*) FROM pg_namespace WHERE nspname = '" + empty.name() + "'"),
            "0")
      << "nothing was created";
  PostgresOptions existing = this->options();
  existing.create_schema = false;
  PostgresIdempotencyRecorder recorder(existing);
  recorder.mark_processed("c", "e");
  EXPECT_TRUE(recorder.is_processed("c", "e"));
}

// ---- time -----------------------------------------------------------------------------------

TEST_F(PostgresRecorderTest, MarkerTimestampsComeFromTheInjectedClock) {
  clock_->set_wall(idem::WallTime(std::chrono::seconds(1'900'000'000)) +
                   std::chrono::microseconds(123456));
  recorder_->mark_processed("billing", "e-1");
  EXPECT_EQ(pg::query("SELECT extract(epoch FROM ts)::text FROM " + schema_.table("processed_log")),
            "1900000000.123456");
  const auto claim = recorder_->claim("billing", "e-2", std::chrono::seconds(30));
  EXPECT_EQ(pg::query("SELECT extract(epoch FROM lease_until)::text FROM " +
                      schema_.table("claims") + " WHERE event_id = 'e-2'"),
            "1900000030.123456");
  ASSERT_TRUE(recorder_->complete("billing", "e-2", claim.token));
  EXPECT_EQ(pg::query("SELECT extract(epoch FROM ts)::text FROM " + schema_.table("processed_log") +
                      " WHERE event_id = 'e-2'"),
            "1900000000.123456");
}

// ---- transactional inbox --------------------------------------------------------------------

TEST_F(PostgresRecorderTest, HandlerWritesCommitWithTheMarker) {
  const std::string shipments = schema_.table("shipments");
  EXPECT_TRUE(recorder_->run_transactional("orders", "e-1", [&](idem::Transaction& tx) {
    auto& pg_tx = dynamic_cast<PostgresTransaction&>(tx);
    EXPECT_EQ(pg_tx.consumer(), "orders");
    EXPECT_EQ(pg_tx.event_id(), "e-1");
    EXPECT_EQ(pg_tx.exec("INSERT INTO " + shipments + " VALUES ($1, $2)", {"o-1", "Main St 1"}), 1);
    // The handler sees its own writes and the marker inside the transaction.
    EXPECT_EQ(pg_tx.query_int64("SELECT count(*) FROM " + shipments), 1);
    EXPECT_EQ(
        pg_tx.query_text("SELECT address FROM " + shipments + " WHERE order_id = $1", {"o-1"}),
        std::optional<std::string>("Main St 1"));
    EXPECT_EQ(
        pg_tx.query_text("SELECT address FROM " + shipments + " WHERE order_id = $1", {"none"}),
        std::nullopt);
    EXPECT_EQ(PQtransactionStatus(pg_tx.connection()), PQTRANS_INTRANS);
  }));
  EXPECT_EQ(count("shipments"), 1);
  EXPECT_TRUE(recorder_->is_processed("orders", "e-1"));
  // The duplicate runs nothing.
  bool ran = false;
  EXPECT_FALSE(
      recorder_->run_transactional("orders", "e-1", [&](idem::Transaction&) { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST_F(PostgresRecorderTest, AThrowingHandlerLeavesNeitherMarkerNorWrites) {
  const std::string shipments = schema_.table("shipments");
  EXPECT_THROW(static_cast<void>(recorder_->run_transactional(
                   "orders", "e-1",
                   [&](idem::Transaction& tx) {
                     dynamic_cast<PostgresTransaction&>(tx).exec(
                         "INSERT INTO " + shipments + " VALUES ($1, $2)", {"o-1", "Main St 1"});
                     throw std::runtime_error("payment declined");
                   })),
               std::runtime_error);
  EXPECT_EQ(count("shipments"), 0);
  EXPECT_FALSE(recorder_->is_processed("orders", "e-1"));
  EXPECT_EQ(count("claims"), 0) << "the fence went with the rollback";
  EXPECT_EQ(recorder_->pool()->stats().open, recorder_->pool()->stats().idle)
      << "the connection went back to the pool";
}

TEST_F(PostgresRecorderTest, AFailingStatementIsAPostgresErrorAndRollsBack) {
  const std::string shipments = schema_.table("shipments");
  pg::query("INSERT INTO " + shipments + " VALUES ('o-1', 'taken')");
  try {
    static_cast<void>(recorder_->run_transactional("orders", "e-1", [&](idem::Transaction& tx) {
      dynamic_cast<PostgresTransaction&>(tx).exec("INSERT INTO " + shipments + " VALUES ($1, $2)",
                                                  {"o-1", "again"});
    }));
    FAIL() << "a unique violation went unnoticed";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "23505");
    EXPECT_FALSE(e.retryable());
    EXPECT_FALSE(e.in_doubt());
  }
  EXPECT_FALSE(recorder_->is_processed("orders", "e-1"));
}

TEST_F(PostgresRecorderTest, AHandlerThatSwallowsAFailedStatementIsRolledBack) {
  const std::string shipments = schema_.table("shipments");
  bool caught = false;
  try {
    static_cast<void>(recorder_->run_transactional("orders", "e-1", [&](idem::Transaction& tx) {
      auto& pg_tx = dynamic_cast<PostgresTransaction&>(tx);
      try {
        pg_tx.exec("INSERT INTO no_such_table VALUES (1)");
      } catch (const PostgresError&) {
        caught = true;  // and carries on, which PostgreSQL does not allow
      }
    }));
    FAIL() << "the aborted transaction was committed";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "25P02") << e.what();
    EXPECT_FALSE(e.in_doubt());
  }
  EXPECT_TRUE(caught);
  EXPECT_FALSE(recorder_->is_processed("orders", "e-1"));
}

TEST_F(PostgresRecorderTest, AHandlerThatEndsTheTransactionIsInDoubt) {
  try {
    static_cast<void>(recorder_->run_transactional("orders", "e-1", [&](idem::Transaction& tx) {
      dynamic_cast<PostgresTransaction&>(tx).exec("COMMIT");
    }));
    FAIL() << "a handler's COMMIT went unnoticed";
  } catch (const PostgresError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_FALSE(e.retryable());
  }
  // Here the early COMMIT did commit the marker: exactly why the outcome was reported in doubt.
  EXPECT_TRUE(recorder_->is_processed("orders", "e-1"));
}

TEST_F(PostgresRecorderTest, HandlerParametersCoverEveryType) {
  pg::query("CREATE TABLE " + schema_.table("kinds") +
            " (n bigint, f double precision, b boolean, t text, raw bytea, nothing text)");
  const std::string raw("\x00\x01\xff", 3);
  ASSERT_TRUE(recorder_->run_transactional("c", "e", [&](idem::Transaction& tx) {
    dynamic_cast<PostgresTransaction&>(tx).exec(
        "INSERT INTO " + schema_.table("kinds") + " VALUES ($1, $2, $3, $4, $5, $6)",
        {std::int64_t{-42}, 2.5, true, "caf\xc3\xa9 'q'", PgParam::bytea(raw), nullptr});
  }));
  EXPECT_EQ(pg::query("SELECT n::text || ' ' || f::text || ' ' || b::text || ' ' || t || ' ' || "
                      "encode(raw, 'hex') || ' ' || (nothing IS NULL)::text FROM " +
                      schema_.table("kinds")),
            "-42 2.5 true caf\xc3\xa9 'q' 0001ff true");
  EXPECT_THROW(static_cast<void>(recorder_->run_transactional(
                   "c", "e2",
                   [&](idem::Transaction& tx) {
                     dynamic_cast<PostgresTransaction&>(tx).exec("SELECT $1::text",
                                                                 {std::string_view("a\0b", 3)});
                   })),
               idem::InvalidArgument);
  EXPECT_FALSE(recorder_->is_processed("c", "e2"));
}

// ---- exclusive and transactional mode on one event ------------------------------------------

TEST_F(PostgresRecorderTest, ALiveClaimKeepsTheTransactionalModeOut) {
  const auto claim = recorder_->claim("orders", "e-1", std::chrono::seconds(30));
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  bool ran = false;
  EXPECT_THROW(static_cast<void>(recorder_->run_transactional(
                   "orders", "e-1", [&](idem::Transaction&) { ran = true; })),
               idem::AlreadyInProgress);
  EXPECT_FALSE(ran);
  EXPECT_FALSE(recorder_->is_processed("orders", "e-1"));
  ASSERT_TRUE(recorder_->complete("orders", "e-1", claim.token));
  EXPECT_FALSE(
      recorder_->run_transactional("orders", "e-1", [&](idem::Transaction&) { ran = true; }));
  EXPECT_FALSE(ran);
}

TEST_F(PostgresRecorderTest, TheTransactionalModeFencesADeadClaim) {
  const auto dead = recorder_->claim("orders", "e-1", std::chrono::seconds(30));
  clock_->advance(std::chrono::seconds(31));
  EXPECT_TRUE(recorder_->run_transactional("orders", "e-1", [](idem::Transaction&) {}));
  EXPECT_FALSE(recorder_->complete("orders", "e-1", dead.token)) << "the dead owner is fenced off";
  EXPECT_FALSE(recorder_->release("orders", "e-1", dead.token));
  EXPECT_EQ(recorder_->claim("orders", "e-1", std::chrono::seconds(30)).status,
            idem::Claim::Status::processed);
}

TEST_F(PostgresRecorderTest, ARunningTransactionalHandlerHoldsOffAClaim) {
  // The claim waits for the transaction's fence row and then sees the event processed.
  std::latch inside(1);
  std::latch claimed(1);
  std::optional<idem::Claim> claim;
  std::thread claimer([&] {
    inside.wait();
    claim = recorder_->claim("orders", "e-1", std::chrono::seconds(30));
    claimed.count_down();
  });
  EXPECT_TRUE(recorder_->run_transactional("orders", "e-1", [&](idem::Transaction&) {
    inside.count_down();
    // The claimer is now blocked on our row (or has not reached it yet); either way it cannot
    // acquire while we run. Commit and let it see the result.
  }));
  claimed.wait();
  claimer.join();
  ASSERT_TRUE(claim.has_value());
  EXPECT_EQ(claim->status, idem::Claim::Status::processed);
}

// ---- statement timeout ----------------------------------------------------------------------

TEST_F(PostgresRecorderTest, AStatementTimeoutIsAClassifiedRetryableError) {
  PostgresOptions options = this->options();
  options.statement_timeout = std::chrono::milliseconds(200);
  PostgresIdempotencyRecorder recorder(options);
  // Another session inserts the same marker and keeps its transaction open: the recorder's
  // INSERT ... ON CONFLICT must wait for it, until statement_timeout cancels the wait.
  auto blocker = pg::connect(pg::server_url().value());
  PQclear(PQexec(blocker.get(), "BEGIN"));
  PQclear(PQexec(blocker.get(), ("INSERT INTO " + schema_.table("processed_log") +
                                 " VALUES ('billing', 'e-1', now())")
                                    .c_str()));
  try {
    recorder.mark_processed("billing", "e-1");
    FAIL() << "the blocked insert returned";
  } catch (const PostgresError& e) {
    EXPECT_EQ(e.sqlstate(), "57014") << e.what();
    EXPECT_EQ(e.code(), idem::ErrorCode::timeout);
    EXPECT_TRUE(e.retryable());
    EXPECT_FALSE(e.in_doubt()) << "the server cancelled it: nothing was written";
    EXPECT_NE(std::string(e.what()).find("mark_processed"), std::string::npos) << e.what();
  }
  PQclear(PQexec(blocker.get(), "ROLLBACK"));
  recorder.mark_processed("billing", "e-1");  // the connection is fine afterwards
  EXPECT_TRUE(recorder.is_processed("billing", "e-1"));
}

// ---- input ----------------------------------------------------------------------------------

TEST_F(PostgresRecorderTest, KeysMustBeUtf8) {
  EXPECT_THROW(recorder_->mark_processed("billing", "bad\xff"), idem::InvalidKey);
  EXPECT_THROW(static_cast<void>(recorder_->is_processed("bad\xc3", "e")), idem::InvalidKey);
  EXPECT_THROW(
      static_cast<void>(recorder_->claim("billing", "\xed\xa0\x80", std::chrono::seconds(1))),
      idem::InvalidKey);  // a UTF-16 surrogate
  EXPECT_THROW(recorder_->mark_processed("billing", "\xc0\xaf"), idem::InvalidKey);  // overlong
  try {
    recorder_->mark_processed("billing", "bad\xff");
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("UTF-8"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("event id"), std::string::npos) << e.what();
  }
  EXPECT_EQ(count("processed_log"), 0);
}

TEST_F(PostgresRecorderTest, BadArgumentsAreRejected) {
  EXPECT_THROW(static_cast<void>(recorder_->claim("c", "e", std::chrono::milliseconds(0))),
               idem::InvalidArgument);
  EXPECT_THROW(recorder_->purge(std::chrono::seconds(-1)), idem::InvalidArgument);
  EXPECT_FALSE(recorder_->complete("c", "e", ~std::uint64_t{0})) << "never issued";
  EXPECT_THROW(PostgresIdempotencyRecorder(std::shared_ptr<idem::postgres::ConnectionPool>()),
               idem::InvalidArgument);
}

// ---- planning -------------------------------------------------------------------------------

// Index entries the statements run on `pool`'s connections have read from the markers' primary
// key so far (pg_stat_user_indexes.idx_tup_read). A backend reports its statistics lazily, so each
// reading forces a flush first (PostgreSQL 15+); with a pool of one, what it reads is the
// recorder's own statements.
long long index_entries_read(idem::postgres::ConnectionPool& pool, const std::string& index) {
  const auto lease = pool.acquire();
  const auto run = [&](const std::string& sql) {
    std::unique_ptr<PGresult, pg::ResultCloser> result(PQexec(lease.get(), sql.c_str()));
    EXPECT_EQ(PQresultStatus(result.get()), PGRES_TUPLES_OK) << PQerrorMessage(lease.get());
    return PQntuples(result.get()) > 0 ? std::stoll(PQgetvalue(result.get(), 0, 0)) : -1;
  };
  run("SELECT 0 FROM pg_stat_force_next_flush()");  // this transaction's end flushes them
  run("SELECT 0 FROM pg_stat_clear_snapshot()");
  return run("SELECT idx_tup_read FROM pg_stat_user_indexes WHERE indexrelid = '" + index +
             "'::regclass");
}

std::vector<std::string> new_ids(std::size_t n) {
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < n; ++i)
    ids.push_back(idem::new_event_id());
  return ids;
}

// Gives `consumer` 20,000 markers (20 batches of 1,000), then checks 100 ids, half of them
// marked: the answers must be right, and the check must have read about as many index entries as
// it has ids, not the consumer's 20,000 markers.
void expect_a_check_to_probe_only_its_ids(PostgresIdempotencyRecorder& recorder,
                                          idem::postgres::ConnectionPool& pool,
                                          const std::string& index, const std::string& consumer) {
  std::vector<std::string> marked;
  for (int round = 0; round < 20; ++round) {
    const auto ids = new_ids(1000);
    recorder.mark_processed_many(consumer, ids);
    marked.insert(marked.end(), ids.begin(), ids.end());
  }
  const long long before = index_entries_read(pool, index);
  std::vector<std::string> probe(marked.end() - 50, marked.end());
  const auto unknown = new_ids(50);
  probe.insert(probe.end(), unknown.begin(), unknown.end());
  const auto answer = recorder.is_processed_many(consumer, probe);
  for (std::size_t i = 0; i < probe.size(); ++i)
    EXPECT_EQ(answer[i], i < 50) << i;
  const long long read = index_entries_read(pool, index) - before;
  EXPECT_GE(read, 50) << "the statistics were not flushed";
  EXPECT_LT(read, 1000) << "the check read the consumer's markers instead of probing 100 ids";
}

// The batch check once its plan is cached. Prepared statements get the server's generic plan
// after five runs; for `consumer = $1 AND event_id = ANY ($2)` the one chosen while the table was
// tiny read every marker of the consumer for each batch however large the table grew (a fresh
// table's first 30,000 events through RabbitMQ ran at 4,000/s instead of 24,000/s; DESIGN-NOTES
// §29). The LATERAL probe's plan is the same at any size: 8 checks on a tiny table, then 20,000
// markers later, one 100-id check reads ~100 index entries.
TEST_F(PostgresRecorderTest, TheBatchCheckKeepsProbingOnceItsPlanIsCached) {
  PostgresOptions one = options();
  one.pool_size = 1;
  auto pool = std::make_shared<idem::postgres::ConnectionPool>(one);
  PostgresIdempotencyRecorder recorder(pool);
  for (int round = 0; round < 8; ++round) {
    const auto ids = new_ids(2);
    EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>({false, false}));
    recorder.mark_processed_many("billing", ids);
    EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>({true, true}));
  }
  expect_a_check_to_probe_only_its_ids(recorder, *pool, schema_.table("processed_log_pkey"),
                                       "billing");
}

// A consumer the statistics do not know yet (new, or the table not analyzed since it grew) is
// still checked by primary-key probes: `consumer = $1 AND event_id = ANY ($2)` was planned as a
// scan of the consumer's every marker with the ids as a filter, even when planned for the run, so
// each batch check read all of them (DESIGN-NOTES §31).
TEST_F(PostgresRecorderTest, ABatchCheckProbesTheIdsEvenForAConsumerTheStatisticsDoNotKnow) {
  PostgresOptions one = options();
  one.pool_size = 1;
  auto pool = std::make_shared<idem::postgres::ConnectionPool>(one);
  PostgresIdempotencyRecorder recorder(pool);
  recorder.mark_processed_many("veteran", new_ids(2000));
  pg::query("ANALYZE " + schema_.table("processed_log"));  // "newcomer" has no markers yet
  expect_a_check_to_probe_only_its_ids(recorder, *pool, schema_.table("processed_log_pkey"),
                                       "newcomer");
}

// ---- retention ------------------------------------------------------------------------------

TEST_F(PostgresRecorderTest, PurgeRemovesOldMarkersAndTheirDoneClaims) {
  const auto claim = recorder_->claim("c", "done", std::chrono::seconds(10));
  ASSERT_TRUE(recorder_->complete("c", "done", claim.token));
  static_cast<void>(recorder_->claim("c", "abandoned", std::chrono::seconds(10)));
  static_cast<void>(recorder_->claim("c", "running", std::chrono::hours(10)));
  ASSERT_TRUE(recorder_->run_transactional("c", "inbox", [](idem::Transaction&) {}));
  EXPECT_EQ(count("claims"), 4);
  clock_->advance(std::chrono::hours(2));
  EXPECT_EQ(recorder_->purge(std::chrono::hours(1)), 2u) << "the two markers";
  EXPECT_EQ(count("claims"), 1) << "only the live claim stays";
  EXPECT_EQ(recorder_->claim("c", "running", std::chrono::seconds(1)).status,
            idem::Claim::Status::in_progress);
  EXPECT_EQ(recorder_->claim("c", "done", std::chrono::seconds(1)).status,
            idem::Claim::Status::acquired)
      << "a purged event is new again";
}

// ---- a shared pool and the handler ----------------------------------------------------------

TEST_F(PostgresRecorderTest, RecordersShareAPool) {
  auto pool = recorder_->pool();
  PostgresIdempotencyRecorder other(pool);
  other.mark_processed("c", "e");
  EXPECT_TRUE(recorder_->is_processed("c", "e"));
  EXPECT_LE(pool->stats().open, pool->options().pool_size);
}

TEST_F(PostgresRecorderTest, TransactionalHandlerThroughIdempotentHandler) {
  const std::string shipments = schema_.table("shipments");
  idem::HandlerOptions options;
  options.mode = idem::HandlerMode::transactional;
  auto handler = idem::make_idempotent_handler<std::string>(
      "orders", recorder_,
      [&](const std::string& address, idem::BusProxy& bus, const idem::Event& event) {
        auto* tx = dynamic_cast<PostgresTransaction*>(bus.transaction());
        ASSERT_NE(tx, nullptr);
        tx->exec("INSERT INTO " + shipments + " VALUES ($1, $2)", {event.id, address});
      },
      options);
  idem::CollectingBusProxy bus("orders");
  idem::Event event;
  event.id = idem::new_event_id();
  event.type = "order.paid";
  event.payload = "Main St 1";
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
  EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
  EXPECT_EQ(count("shipments"), 1);
}

}  // namespace
