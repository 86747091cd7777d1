// kill -9 in the middle of an AsyncIdempotentHandler on AsyncSqliteRecorder: a forked child runs
// the handler on its own io_context, tells the parent (through a pipe) that `handle` is running,
// and is SIGKILLed there. The restarted consumer (the parent, on the same database file) sees the
// event as unprocessed and the redelivery's side effect happens once:
//   * transactional: the handler's write was in the killed transaction, which SQLite rolls back;
//     the redelivery runs at once, commits its write with the marker, and a further redelivery
//     is a duplicate;
//   * exclusive: the killed owner's claim stays until its lease lapses (AlreadyInProgress
//     meanwhile), then the redelivery takes over and runs; the side effect (a line appended to a
//     file after the point of the kill) is written once.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "../async_test_support.hpp"
#include "../temp_dir.hpp"
#include "idem/async/handler.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/sqlite/async_recorder.hpp"
#include "worker/child_process.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;
using idem::test::ForkedChild;
using idem::test::nap;

constexpr const char* kConsumer = "billing";

// The handler both the killed child and the restarted consumer run. `reached` >= 0: write a
// byte there once `handle` has done its in-transaction write (transactional) or before its side
// effect (exclusive), then wait forever, to be killed.
std::shared_ptr<idem::async::AsyncEventHandler> make_handler(
    std::shared_ptr<idem::async::AsyncRecorder> recorder, idem::HandlerMode mode,
    std::string effects_file, int reached) {
  return idem::async::make_async_idempotent_handler<std::string>(
      kConsumer, std::move(recorder),
      [mode, effects_file, reached](const std::string& payload, idem::BusProxy& bus) -> Task<void> {
        if (mode == idem::HandlerMode::transactional) {
          auto* tx = idem::async::transaction_of(bus);
          if (tx == nullptr) throw std::logic_error("no transaction");
          co_await tx->exec("CREATE TABLE IF NOT EXISTS effects (payload TEXT NOT NULL)");
          const idem::SqlParam params[] = {std::string_view(payload)};
          co_await tx->exec("INSERT INTO effects (payload) VALUES ($1)", params);
        }
        if (reached >= 0) {
          const char byte = 'r';
          if (::write(reached, &byte, 1) != 1) std::_Exit(3);
          for (;;)
            co_await nap(1h);  // killed here
        }
        if (mode == idem::HandlerMode::exclusive) {
          std::ofstream out(effects_file, std::ios::app);
          out << payload << "\n";
        }
      },
      idem::HandlerOptions{.mode = mode, .lease = 300ms});
}

// Forks a child that runs the handler on `db` for `event` and SIGKILLs it once `handle` is
// running. False (with a failure) when the child never got there.
bool kill_mid_handler(const std::string& db, idem::HandlerMode mode, const std::string& effects,
                      const idem::Event& event) {
  ForkedChild child([&](int ready_fd) {
    asio::io_context io;
    auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(db);
    auto handler = make_handler(recorder, mode, effects, ready_fd);
    idem::CollectingBusProxy proxy(kConsumer);
    (void)idem::test::run(io, handler->handle_event(event, proxy));
    return std::string("handle returned: it should have been killed first");
  });
  const bool got_there = child.wait_for_report(std::chrono::seconds(60));
  child.kill(SIGKILL);
  const ForkedChild::End end = child.wait();
  EXPECT_TRUE(got_there) << "the child never reached the handler: " << end.problem();
  EXPECT_TRUE(end.killed_by(SIGKILL)) << end.problem();
  return got_there;
}

int lines_in(const std::string& file) {
  std::ifstream in(file);
  int n = 0;
  std::string line;
  while (std::getline(in, line))
    ++n;
  return n;
}

TEST(SqliteAsyncCrash, TransactionalKilledMidHandlerRollsBackAndRunsOnceOnRestart) {
  idem::test::TempDir dir;
  const std::string db = (dir.path() / "events.db").string();
  const idem::Event event = idem::Event::make("order.placed", "o-1");
  ASSERT_TRUE(kill_mid_handler(db, idem::HandlerMode::transactional, "", event));

  asio::io_context io;
  auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(db);
  EXPECT_FALSE(idem::test::run(io, recorder->is_processed(kConsumer, event.id)))
      << "the killed transaction's marker survived";
  auto handler = make_handler(recorder, idem::HandlerMode::transactional, "", -1);
  idem::CollectingBusProxy proxy(kConsumer);
  EXPECT_EQ(idem::test::run(io, handler->handle_event(event, proxy)),
            idem::HandleResult::processed);
  EXPECT_EQ(idem::test::run(io, handler->handle_event(event, proxy)),
            idem::HandleResult::duplicate);
  // The effects table holds the redelivery's row only.
  std::int64_t rows = -1;
  idem::async::AsyncRecorder::TransactionalFn count =
      [&rows](idem::async::AsyncSqlTransaction& tx) -> Task<void> {
    rows = co_await tx.query_int64("SELECT COUNT(*) FROM effects");
  };
  const std::string probe = idem::new_event_id();
  (void)idem::test::run(io, recorder->run_transactional("probe", probe, count));
  EXPECT_EQ(rows, 1) << "the killed transaction's write was committed";
}

TEST(SqliteAsyncCrash, ExclusiveKilledMidHandlerIsTakenOverAfterTheLeaseAndRunsOnce) {
  idem::test::TempDir dir;
  const std::string db = (dir.path() / "events.db").string();
  const std::string effects = (dir.path() / "effects.txt").string();
  const idem::Event event = idem::Event::make("order.placed", "o-2");
  ASSERT_TRUE(kill_mid_handler(db, idem::HandlerMode::exclusive, effects, event));

  asio::io_context io;
  auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(db);
  EXPECT_FALSE(idem::test::run(io, recorder->is_processed(kConsumer, event.id)));
  auto handler = make_handler(recorder, idem::HandlerMode::exclusive, effects, -1);
  idem::CollectingBusProxy proxy(kConsumer);
  // Redeliver (bounded) until the dead owner's lease has lapsed and the claim is taken over.
  std::optional<idem::HandleResult> result;
  for (int i = 0; i < 400 && !result; ++i) {
    try {
      result = idem::test::run(io, handler->handle_event(event, proxy));
    } catch (const idem::AlreadyInProgress&) {
      idem::test::run(io, nap(50ms));
    }
  }
  ASSERT_TRUE(result.has_value()) << "the dead owner's claim was never taken over";
  EXPECT_EQ(*result, idem::HandleResult::processed);
  EXPECT_EQ(idem::test::run(io, handler->handle_event(event, proxy)),
            idem::HandleResult::duplicate);
  EXPECT_TRUE(idem::test::run(io, recorder->is_processed(kConsumer, event.id)));
  EXPECT_EQ(lines_in(effects), 1) << "the side effect happened more or less than once";
}

}  // namespace
