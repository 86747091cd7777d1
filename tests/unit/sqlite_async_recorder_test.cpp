// AsyncSqliteRecorder: SQLite never runs on the event loop's thread, marks are durable when the
// call completes (and shared with blocking users), concurrency, cancellation of a queued mark
// versus one already in the writer, the transactional and exclusive async handlers, and
// AsyncSqliteStore.
#include "../async_test_support.hpp"
#include "idem/sqlite/async_recorder.hpp"

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../temp_dir.hpp"
#include "idem/async/handler.hpp"
#include "idem/clock.hpp"
#include "idem/handler.hpp"
#include "idem/sqlite/async_store.hpp"

namespace {

using idem::async::Task;
using idem::sqlite::AsyncSqliteOptions;
using idem::sqlite::AsyncSqliteRecorder;
using idem::sqlite::SqliteIdempotencyRecorder;
using idem::sqlite::SqliteOptions;
using namespace std::chrono_literals;

// The system clock, remembering which threads asked it the time (SQLite's marker timestamps and
// lease deadlines are read on the thread that writes them).
class ThreadRecordingClock final : public idem::Clock {
 public:
  idem::WallTime wall_now() const override {
    record();
    return idem::system_clock()->wall_now();
  }
  idem::SteadyTime steady_now() const override {
    record();
    return idem::system_clock()->steady_now();
  }
  bool sleep_for(std::chrono::nanoseconds d, std::stop_token stop) override {
    return idem::system_clock()->sleep_for(d, stop);
  }
  void forget() {
    std::lock_guard lock(mutex_);
    threads_.clear();
  }
  std::set<std::thread::id> threads() const {
    std::lock_guard lock(mutex_);
    return threads_;
  }

 private:
  void record() const {
    std::lock_guard lock(mutex_);
    threads_.insert(std::this_thread::get_id());
  }
  mutable std::mutex mutex_;
  mutable std::set<std::thread::id> threads_;
};

using idem::test::run;

TEST(AsyncSqliteRecorder, NeverTouchesSqliteOnTheLoopThread) {
  idem::test::TempDir dir;
  auto clock = std::make_shared<ThreadRecordingClock>();
  SqliteOptions options;
  options.clock = clock;
  AsyncSqliteRecorder recorder(dir.file("r.db"), options);
  clock->forget();  // opening the file is blocking, on the constructing thread (documented)
  asio::io_context io;
  const auto loop = std::this_thread::get_id();
  const std::string id = idem::new_event_id();
  const std::string tx_id = idem::new_event_id();
  auto body = [](AsyncSqliteRecorder& r, const std::string& event_id, const std::string& tx_event,
                 std::thread::id loop_thread) -> Task<void> {
    co_await r.mark_processed("billing", event_id);
    EXPECT_EQ(std::this_thread::get_id(), loop_thread);
    EXPECT_TRUE(co_await r.is_processed("billing", event_id));
    auto claim = co_await r.claim("shipping", event_id, std::chrono::milliseconds(60000));
    EXPECT_EQ(claim.status, idem::Claim::Status::acquired);
    EXPECT_TRUE(co_await r.renew("shipping", event_id, claim.token, std::chrono::seconds(60)));
    EXPECT_TRUE(co_await r.complete("shipping", event_id, claim.token));
    idem::async::AsyncRecorder::TransactionalFn fn =
        [loop_thread](idem::async::AsyncSqlTransaction& tx) -> Task<void> {
      EXPECT_EQ(std::this_thread::get_id(), loop_thread) << "the callback runs on the loop";
      EXPECT_EQ(co_await tx.query_int64("SELECT 41 + 1"), 42);
      EXPECT_EQ(std::this_thread::get_id(), loop_thread);
    };
    EXPECT_TRUE(co_await r.run_transactional("billing", tx_event, std::move(fn)));
    EXPECT_EQ(std::this_thread::get_id(), loop_thread);
  };
  run(io, body(recorder, id, tx_id, loop));
  const auto threads = clock->threads();
  EXPECT_FALSE(threads.empty());
  EXPECT_EQ(threads.count(loop), 0u) << "SQLite wrote on the event loop's thread";
}

TEST(AsyncSqliteRecorder, MarksAreDurableAndSharedWithBlockingUsers) {
  idem::test::TempDir dir;
  const std::string path = dir.file("r.db");
  const std::string id = idem::new_event_id();
  const std::string blocking_id = idem::new_event_id();
  {
    auto blocking = std::make_shared<SqliteIdempotencyRecorder>(path);
    AsyncSqliteRecorder recorder(blocking);
    asio::io_context io;
    run(io, recorder.mark_processed("billing", id));
    EXPECT_TRUE(blocking->is_processed("billing", id)) << "completed before it was committed";
    blocking->mark_processed("billing", blocking_id);
    EXPECT_TRUE(run(io, recorder.is_processed("billing", blocking_id)));
  }
  SqliteIdempotencyRecorder reopened(path);
  EXPECT_TRUE(reopened.is_processed("billing", id));
}

TEST(AsyncSqliteRecorder, ManyCoroutinesShareGroupCommits) {
  idem::test::TempDir dir;
  AsyncSqliteRecorder recorder(dir.file("r.db"), SqliteOptions{}, AsyncSqliteOptions{.threads = 4});
  asio::io_context io(2);
  std::vector<std::string> ids;
  for (int i = 0; i < 300; ++i)
    ids.push_back(idem::new_event_id());
  std::atomic<int> errors{0};
  for (const auto& id : ids) {
    asio::co_spawn(io, recorder.mark_processed("billing", id), [&](std::exception_ptr e) {
      if (e) errors.fetch_add(1);
    });
  }
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(recorder.blocking()->is_processed_many("billing", ids),
            std::vector<bool>(ids.size(), true));
  const auto stats = recorder.blocking()->stats();
  EXPECT_EQ(stats.marks, ids.size());
  EXPECT_LE(stats.mark_commits, stats.marks);
}

TEST(AsyncSqliteRecorder, CancelWithdrawsAQueuedMarkButNotOneInTheWriter) {
  idem::test::TempDir dir;
  auto blocking = std::make_shared<SqliteIdempotencyRecorder>(dir.file("r.db"));
  AsyncSqliteRecorder recorder(blocking, AsyncSqliteOptions{.threads = 1});
  asio::io_context io;

  // A blocking transaction holds the write lock until we let it go.
  std::promise<void> entered;
  std::promise<void> let_go;
  std::thread holder([&] {
    (void)blocking->run_transactional("holder", idem::new_event_id(), [&](idem::Transaction&) {
      entered.set_value();
      let_go.get_future().wait();
    });
  });
  entered.get_future().wait();

  const std::string in_writer = idem::new_event_id();
  const std::string queued = idem::new_event_id();
  asio::cancellation_signal cancel_first;
  asio::cancellation_signal cancel_second;
  auto first = asio::co_spawn(io, recorder.mark_processed("billing", in_writer),
                              asio::bind_cancellation_slot(cancel_first.slot(), asio::use_future));
  io.poll();
  // The pool's one thread has taken the first mark: it waits in the group-commit queue.
  for (int i = 0; i < 5000 && blocking->stats().queued_marks == 0; ++i)
    std::this_thread::sleep_for(1ms);
  ASSERT_EQ(blocking->stats().queued_marks, 1u);
  auto second =
      asio::co_spawn(io, recorder.mark_processed("billing", queued),
                     asio::bind_cancellation_slot(cancel_second.slot(), asio::use_future));
  io.poll();
  cancel_first.emit(asio::cancellation_type::terminal);
  cancel_second.emit(asio::cancellation_type::terminal);
  io.poll();
  // The queued one is withdrawn at once, while the writer is still blocked.
  ASSERT_EQ(second.wait_for(0s), std::future_status::ready);
  try {
    second.get();
    FAIL() << "the queued mark was not withdrawn";
  } catch (const std::system_error& e) {
    EXPECT_EQ(e.code(), asio::error::operation_aborted);
  }
  let_go.set_value();
  holder.join();
  io.restart();
  io.run();
  EXPECT_NO_THROW(first.get()) << "a mark already in the writer completes";
  EXPECT_TRUE(blocking->is_processed("billing", in_writer));
  EXPECT_FALSE(blocking->is_processed("billing", queued));
}

TEST(AsyncSqliteRecorder, BadOptions) {
  EXPECT_THROW(AsyncSqliteRecorder(":memory:", SqliteOptions{}, AsyncSqliteOptions{.threads = 0}),
               idem::ConfigError);
  EXPECT_THROW(AsyncSqliteRecorder(std::shared_ptr<SqliteIdempotencyRecorder>{}),
               idem::InvalidArgument);
}

// ---- the transactional async handler -----------------------------------------------------

TEST(AsyncSqliteRecorder, TransactionalHandlerCommitsBusinessRowsWithTheMarker) {
  idem::test::TempDir dir;
  auto recorder = std::make_shared<AsyncSqliteRecorder>(dir.file("r.db"));
  (void)recorder->blocking()->run_transactional("setup", "schema", [](idem::Transaction& tx) {
    dynamic_cast<idem::SqlTransaction&>(tx).exec(
        "CREATE TABLE ledger (order_id TEXT PRIMARY KEY, cents INTEGER NOT NULL)");
  });
  std::atomic<int> fail_first{1};
  auto handler = idem::async::make_async_idempotent_handler(
      "billing", recorder,
      [&](const std::string& payload, idem::BusProxy& bus, const idem::Event& event) -> Task<void> {
        auto* tx = idem::async::transaction_of(bus);
        if (tx == nullptr) throw std::logic_error("no transaction");
        const idem::SqlParam params[] = {std::string_view(event.id), std::int64_t{1250}};
        co_await tx->exec("INSERT INTO ledger (order_id, cents) VALUES ($1, $2)", params);
        idem::Event follow;
        follow.id = idem::new_event_id();
        follow.type = "order.billed";
        follow.payload = payload;
        bus.publish(std::move(follow));
        if (fail_first.fetch_sub(1) > 0) throw std::runtime_error("declined after the insert");
      },
      idem::HandlerOptions{.mode = idem::HandlerMode::transactional});
  asio::io_context io;
  idem::CollectingBusProxy bus("billing");
  idem::Event e;
  e.id = idem::new_event_id();
  e.type = "order.placed";
  e.payload = "{}";
  EXPECT_THROW(run(io, handler->handle_event(e, bus)), std::runtime_error);
  EXPECT_TRUE(bus.published().empty()) << "a rolled-back handler leaked its follow-up";
  auto rows = [&] {
    std::int64_t n = -1;
    (void)recorder->blocking()->run_transactional(
        "count", idem::new_event_id(), [&](idem::Transaction& tx) {
          n = *dynamic_cast<idem::SqlTransaction&>(tx).query_int64("SELECT COUNT(*) FROM ledger");
        });
    return n;
  };
  EXPECT_EQ(rows(), 0);
  EXPECT_FALSE(recorder->blocking()->is_processed("billing", e.id));
  EXPECT_EQ(run(io, handler->handle_event(e, bus)), idem::HandleResult::processed);
  EXPECT_EQ(run(io, handler->handle_event(e, bus)), idem::HandleResult::duplicate);
  EXPECT_EQ(rows(), 1);
  EXPECT_EQ(bus.published().size(), 1u);
  EXPECT_TRUE(recorder->blocking()->is_processed("billing", e.id));
}

TEST(AsyncSqliteRecorder, ExclusiveHandlerOverSqlite) {
  idem::test::TempDir dir;
  auto recorder = std::make_shared<AsyncSqliteRecorder>(dir.file("r.db"));
  std::atomic<int> runs{0};
  auto handler = idem::async::make_async_idempotent_handler("billing", recorder,
                                                            [&](const std::string&) -> Task<void> {
                                                              runs.fetch_add(1);
                                                              co_return;
                                                            });
  asio::io_context io(2);
  std::vector<idem::Event> events;
  for (int i = 0; i < 50; ++i) {
    idem::Event e;
    e.id = idem::new_event_id();
    e.type = "t";
    events.push_back(e);
  }
  idem::CollectingBusProxy bus("billing");
  std::atomic<int> ok{0};
  for (int copy = 0; copy < 2; ++copy) {
    for (const auto& e : events) {
      asio::co_spawn(io, handler->handle_event(e, bus),
                     [&](std::exception_ptr err, idem::HandleResult) {
                       if (!err) ok.fetch_add(1);
                     });
    }
  }
  std::thread other([&] { io.run(); });
  io.run();
  other.join();
  EXPECT_EQ(runs.load(), 50) << "an event ran twice";
  EXPECT_GE(ok.load(), 50);
  for (const auto& e : events)
    EXPECT_TRUE(recorder->blocking()->is_processed("billing", e.id));
}

}  // namespace

namespace {

TEST(AsyncSqliteStore, ClaimCompleteLookupOffTheLoop) {
  idem::test::TempDir dir;
  idem::sqlite::AsyncSqliteStore store(dir.file("s.db"));
  EXPECT_TRUE(store.needs_bytes());
  EXPECT_EQ(store.blocking_store(), store.blocking());
  asio::io_context io;
  const std::string key = idem::new_event_id();
  auto first = run(io, store.claim(key, std::nullopt, std::chrono::milliseconds(60000)));
  ASSERT_EQ(first.status, idem::ClaimOutcome::Status::acquired);
  auto second = run(io, store.claim(key, std::nullopt, std::chrono::milliseconds(60000)));
  EXPECT_EQ(second.status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_TRUE(run(io, store.release(key, first.token)));
  auto third = run(io, store.claim(key, std::nullopt, std::chrono::milliseconds(60000)));
  ASSERT_EQ(third.status, idem::ClaimOutcome::Status::acquired);
  idem::StoredValue value;
  value.bytes = "42";
  const idem::ExecutionReport report{};
  EXPECT_TRUE(run(io, store.complete(key, third.token, value, report, std::chrono::minutes(5))));
  auto record = run(io, store.lookup(key));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(record->value.bytes, std::optional<std::string>("42"));
  EXPECT_FALSE(run(io, store.renew(key, first.token, std::chrono::milliseconds(1000))));
}

}  // namespace
