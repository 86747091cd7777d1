// AsyncSqliteRecorder, on a file in a fresh temporary directory, on ":memory:", and with one pool
// thread: the async recorder suite (idem/testing/async_recorder_conformance.hpp), and the
// blocking recorder suite (idem/testing/recorder_conformance.hpp) through
// BlockingOverAsyncRecorder, its operator calls answered by the SqliteIdempotencyRecorder the
// async recorder serves (blocking()).
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>

#include <asio/io_context.hpp>

#include "../temp_dir.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/async_recorder.hpp"
#include "idem/testing/async_crash_points.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

namespace {

struct AsyncSqliteFileFactory : idem::test::AsyncRecorderTraits<true> {
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        (dir.path() / "recorder.db").string());
  }
  idem::test::TempDir dir;
};

struct AsyncSqliteMemoryFactory : idem::test::AsyncRecorderTraits<true> {
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(":memory:");
  }
};

struct AsyncSqliteOneThreadFactory : idem::test::AsyncRecorderTraits<true> {
  static constexpr int kCoroutines = 32;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        (dir.path() / "recorder.db").string(), idem::sqlite::SqliteOptions{},
        idem::sqlite::AsyncSqliteOptions{.threads = 1});
  }
  idem::test::TempDir dir;
};

// Through AsyncCrashingRecorder (an idem::async::RecorderWrapper) with a plan that never fires:
// run_transactional's callback goes through the decorator's own coroutine.
struct AsyncSqliteCrashingNoneFactory : idem::test::AsyncRecorderTraits<true> {
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::testing::AsyncCrashingRecorder>(
        std::make_shared<idem::sqlite::AsyncSqliteRecorder>((dir.path() / "recorder.db").string()),
        idem::testing::CrashPlan{});
  }
  idem::test::TempDir dir;
};

// A file in the factory's directory or ":memory:"; Threads 0: the default pool.
template <bool InMemory, int Threads>
struct BlockingOverAsyncSqliteFactory : idem::test::RecorderTraits<true> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    idem::sqlite::AsyncSqliteOptions async_options;
    if (Threads > 0) async_options.threads = Threads;
    auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        InMemory ? std::string(":memory:") : (dir.path() / "recorder.db").string(), options,
        async_options);
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(recorder,
                                                                      recorder->blocking());
  }
  idem::test::TempDir dir;
};

// The blocking suite's handlers write nothing: here a blocking handler's statements reach the
// async transaction through BlockingOverAsyncTransaction, commit with the marker, and roll back
// with it when the handler throws or a statement fails.
TEST(BlockingOverAsyncTransaction, StatementsCommitWithTheMarkerOrRollBack) {
  idem::test::TempDir dir;
  auto async =
      std::make_shared<idem::sqlite::AsyncSqliteRecorder>((dir.path() / "recorder.db").string());
  idem::testing::BlockingOverAsyncRecorder recorder(async, async->blocking());
  using Tx = idem::testing::BlockingOverAsyncTransaction;
  ASSERT_TRUE(recorder.run_transactional("setup", "create", [](idem::Transaction& t) {
    static_cast<Tx&>(t).exec("CREATE TABLE t (k TEXT PRIMARY KEY, v BIGINT NOT NULL)");
  }));
  EXPECT_TRUE(recorder.run_transactional("billing", "e1", [](idem::Transaction& t) {
    auto& tx = static_cast<Tx&>(t);
    EXPECT_EQ(tx.consumer(), "billing");
    EXPECT_EQ(tx.event_id(), "e1");
    const idem::SqlParam row[] = {std::string_view("e1"), std::int64_t{42}};
    tx.exec("INSERT INTO t (k, v) VALUES ($1, $2)", row);
    const idem::SqlParam key[] = {std::string_view("e1")};
    EXPECT_EQ(tx.query_int64("SELECT v FROM t WHERE k = $1", key), 42);
    EXPECT_EQ(tx.query_text("SELECT k FROM t WHERE k = $1", key), std::optional<std::string>("e1"));
    const idem::SqlParam missing[] = {std::string_view("absent")};
    EXPECT_EQ(tx.query_text("SELECT k FROM t WHERE k = $1", missing), std::nullopt);
  }));
  struct HandlerFailed : std::runtime_error {
    HandlerFailed() : std::runtime_error("handler failed") {}
  };
  EXPECT_THROW(static_cast<void>(recorder.run_transactional(
                   "billing", "e2",
                   [](idem::Transaction& t) {
                     const idem::SqlParam row[] = {std::string_view("e2"), std::int64_t{2}};
                     static_cast<Tx&>(t).exec(
                         "INSERT INTO t (k, v) "
                         "VALUES ($1, $2)",
                         row);
                     throw HandlerFailed();
                   })),
               HandlerFailed);
  EXPECT_THROW(static_cast<void>(recorder.run_transactional(
                   "billing", "e3",
                   [](idem::Transaction& t) { static_cast<Tx&>(t).exec("THIS IS NOT SQL"); })),
               idem::StoreError);
  EXPECT_TRUE(recorder.is_processed("billing", "e1"));
  EXPECT_FALSE(recorder.is_processed("billing", "e2")) << "a failed handler was marked";
  EXPECT_FALSE(recorder.is_processed("billing", "e3")) << "a failed statement was marked";
  std::int64_t rows = -1;
  ASSERT_TRUE(recorder.run_transactional("setup", "count", [&rows](idem::Transaction& t) {
    rows = static_cast<Tx&>(t).query_int64("SELECT COUNT(*) FROM t");
  }));
  EXPECT_EQ(rows, 1) << "a failed handler's write was committed";
  // A duplicate neither runs its handler nor writes.
  bool ran = false;
  EXPECT_FALSE(
      recorder.run_transactional("billing", "e1", [&ran](idem::Transaction&) { ran = true; }));
  EXPECT_FALSE(ran);
}

// A crash thrown inside the transaction (after the marker insert, or after the handler's work,
// before COMMIT) rolls the handler's write back with the marker; one thrown after the commit
// leaves both.
TEST(AsyncCrashingRecorderOnSqlite, ACrashBeforeTheCommitRollsBackAndOneAfterItDoesNot) {
  using idem::testing::CrashPoint;
  using idem::testing::async_detail::run;
  idem::test::TempDir dir;
  asio::io_context io;
  auto inner =
      std::make_shared<idem::sqlite::AsyncSqliteRecorder>((dir.path() / "recorder.db").string());
  idem::async::AsyncRecorder::TransactionalFn create =
      [](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    co_await tx.exec("CREATE TABLE t (k TEXT PRIMARY KEY)");
  };
  ASSERT_TRUE(run(io, inner->run_transactional("setup", "create", create)));
  idem::async::AsyncRecorder::TransactionalFn write =
      [](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    const idem::SqlParam row[] = {tx.event_id()};
    co_await tx.exec("INSERT INTO t (k) VALUES ($1)", row);
  };
  auto rows = [&](std::string_view id) {
    std::int64_t n = -1;
    idem::async::AsyncRecorder::TransactionalFn count =
        [&n, id](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
      const idem::SqlParam key[] = {id};
      n = co_await tx.query_int64("SELECT COUNT(*) FROM t WHERE k = $1", key);
    };
    EXPECT_TRUE(run(io, inner->run_transactional("setup", idem::new_event_id(), count)));
    return n;
  };
  const struct {
    CrashPoint point;
    const char* event_id;
    bool committed;
  } cases[] = {{CrashPoint::after_claim, "e1", false},
               {CrashPoint::before_complete, "e2", false},
               {CrashPoint::during_complete, "e3", true}};
  for (const auto& c : cases) {
    SCOPED_TRACE(idem::testing::to_string(c.point));
    idem::testing::AsyncCrashingRecorder recorder(
        inner, {.point = c.point, .action = idem::testing::CrashAction::throw_});
    EXPECT_THROW(run(io, recorder.run_transactional("billing", c.event_id, write)),
                 idem::testing::InjectedCrash);
    EXPECT_EQ(recorder.fired(), 1u);
    EXPECT_EQ(run(io, inner->is_processed("billing", c.event_id)), c.committed);
    EXPECT_EQ(rows(c.event_id), c.committed ? 1 : 0);
  }
}

using BlockingOverAsyncSqliteFileFactory = BlockingOverAsyncSqliteFactory<false, 0>;
using BlockingOverAsyncSqliteMemoryFactory = BlockingOverAsyncSqliteFactory<true, 0>;
using BlockingOverAsyncSqliteOneThreadFactory = BlockingOverAsyncSqliteFactory<false, 1>;

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteFile, AsyncSqliteFileFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteMemory, AsyncSqliteMemoryFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteOneThread, AsyncSqliteOneThreadFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteCrashingNone, AsyncSqliteCrashingNoneFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteFile, BlockingOverAsyncSqliteFileFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteMemory,
                                 BlockingOverAsyncSqliteMemoryFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteOneThread,
                                 BlockingOverAsyncSqliteOneThreadFactory);
