// The AsyncRecorder conformance suite: what every async recorder must do that the blocking
// suite cannot see, as GoogleTest tests.
//
// An async recorder is checked twice. The blocking recorder suite (recorder_conformance.hpp)
// runs against it through idem::testing::BlockingOverAsyncRecorder (blocking_over_async.hpp):
// check / mark and batches, consumer isolation, claims, fencing, lease takeover and renewal
// (exactly at their boundaries, on a ManualClock), purge and the operator views, 8-thread races
// and run-once transactions. This suite adds what only the coroutine face has: every call
// resuming on the awaiting coroutine's thread, the async face's own argument checks (the
// adapter's blocking face checks first, so they never reach the backend through it), many
// coroutines on one io_context and on a 2-thread io_context, cancellation (an aborted call wrote
// nothing; a call that went through is visible; an in-doubt one says so), a lease taken over
// after it lapsed in real time (the backend on its own clock), run_transactional's SQL through
// AsyncSqlTransaction (committed with the marker, rolled back on a throw or a bad statement),
// and NotSupported for a capability the recorder lacks.
//
// How to use it — a factory type and one macro, in a test file linked with idem::testing_async,
// GoogleTest and gtest_main:
//
//   #include "idem/testing/async_recorder_conformance.hpp"
//
//   struct MyAsyncFactory {
//     // What the recorder must report from capabilities().
//     static constexpr idem::async::RecorderCapabilities kCapabilities{.claims = true,
//                                                                     .transactions = false};
//     // Called once per test. make() may be static or not.
//     std::shared_ptr<idem::async::AsyncRecorder> make();
//     // Optional: the lease the takeover test lets lapse (default 50 ms), and how many
//     // coroutines the race tests start (default 64).
//     // static constexpr idem::Millis kShortLease{50};
//     // static constexpr int kCoroutines = 64;
//   };
//   INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(MyBackend, MyAsyncFactory);
//
// The factory is default-constructed once per test and destroyed after the recorder, so it can
// own a temporary database or a server connection string. A backend whose I/O runs on a thread
// of its own gets it from the factory's member `idem::testing::IoThread io;`: the fixture stops
// that thread before it destroys its io_contexts and the recorder (async_support.hpp).
// Instantiate the macro once per configuration with different prefixes. Tests live in the
// global test suite IdemAsyncRecorderConformance. The transactional cases create (and drop)
// their own table, named idem_async_cases_<random>, with portable SQL ($1 parameters, TEXT and
// BIGINT columns), so they run unchanged on SQLite and PostgreSQL.
//
// Capabilities: claim and run_transactional cases are skipped with GTEST_SKIP, naming the
// capability, when the factory declares the recorder lacks it; ReportsDeclaredCapabilities
// checks the recorder reports exactly what the factory declares.
//
// Thread safety: the Race* cases run coroutines on a 2-thread io_context; run the suite under
// ThreadSanitizer to check a backend's locking.
#pragma once

#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <vector>

#include "idem/async/recorder.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/key.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/keys.hpp"

namespace idem::testing::async_recorder_conformance_detail {

// How many coroutines the race cases start: the factory's kCoroutines, else 64.
template <class Factory>
constexpr int coroutines() {
  return idem::testing::async_detail::coroutines<Factory>(64);
}

// How a cancelled call ended (async_support.hpp).
using Outcome = idem::testing::async_detail::Outcome;

}  // namespace idem::testing::async_recorder_conformance_detail

template <class Factory>
class IdemAsyncRecorderConformance
    : public idem::testing::async_detail::ConformanceFixture<Factory, idem::async::AsyncRecorder> {
 protected:
  IdemAsyncRecorderConformance()
      : idem::testing::async_detail::ConformanceFixture<Factory, idem::async::AsyncRecorder>(
            "recorder") {}

  // The recorder the factory made (async_support.hpp: the fixture's teardown order).
  std::shared_ptr<idem::async::AsyncRecorder>& recorder_ = this->subject_;
};

#define IDEM_ASYNC_CONFORMANCE_REQUIRE_CLAIMS()                                            \
  do {                                                                                     \
    if (!TypeParam::kCapabilities.claims)                                                  \
      GTEST_SKIP() << "capability: the recorder does not support claims (exclusive mode)"; \
  } while (false)

#define IDEM_ASYNC_CONFORMANCE_REQUIRE_TRANSACTIONS()                                \
  do {                                                                               \
    if (!TypeParam::kCapabilities.transactions)                                      \
      GTEST_SKIP() << "capability: the recorder does not support run_transactional " \
                      "(transactional mode)";                                        \
  } while (false)

TYPED_TEST_SUITE_P(IdemAsyncRecorderConformance);

TYPED_TEST_P(IdemAsyncRecorderConformance, ReportsDeclaredCapabilities) {
  const auto caps = this->recorder_->capabilities();
  EXPECT_EQ(caps.claims, TypeParam::kCapabilities.claims);
  EXPECT_EQ(caps.transactions, TypeParam::kCapabilities.transactions);
}

// ---- every call on the caller's executor --------------------------------------------------

// Each call once, through run(): the awaiting coroutine must resume on its own thread (the
// io_context's only runner), whatever thread the backend did its work on. What the calls answer
// is the blocking suite's (through BlockingOverAsyncRecorder); the answers here only show the
// calls did their work.
TYPED_TEST_P(IdemAsyncRecorderConformance, EveryCallResumesOnTheCallersThread) {
  auto& r = *this->recorder_;
  const std::string id = idem::new_event_id();
  EXPECT_FALSE(this->run(r.is_processed("billing", id)));
  this->run(r.mark_processed("billing", id));
  EXPECT_TRUE(this->run(r.is_processed("billing", id)));
  std::vector<std::string> ids{idem::new_event_id(), id};
  EXPECT_EQ(this->run(r.is_processed_many("billing", ids)), (std::vector<bool>{false, true}));
  this->run(r.mark_processed_many("billing", ids));
  EXPECT_EQ(this->run(r.is_processed_many("billing", ids)), (std::vector<bool>{true, true}));
  if (!TypeParam::kCapabilities.claims) return;
  const std::string claimed = idem::new_event_id();
  const auto first = this->run(r.claim("billing", claimed, std::chrono::minutes(1)));
  ASSERT_EQ(first.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(this->run(r.renew("billing", claimed, first.token, std::chrono::minutes(1))));
  EXPECT_TRUE(this->run(r.release("billing", claimed, first.token)));
  const auto second = this->run(r.claim("billing", claimed, std::chrono::minutes(1)));
  ASSERT_EQ(second.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(this->run(r.complete("billing", claimed, second.token)));
  EXPECT_TRUE(this->run(r.is_processed("billing", claimed)));
}

// ---- check / mark -------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncRecorderConformance, InvalidKeysThrowAndMarkNothing) {
  auto& r = *this->recorder_;
  const std::string good = idem::new_event_id();
  for (const auto& bad : idem::testing::invalid_keys()) {
    EXPECT_THROW(this->run(r.is_processed(bad, good)), idem::InvalidKey);
    EXPECT_THROW(this->run(r.mark_processed("billing", bad)), idem::InvalidKey);
    EXPECT_THROW(this->run(r.mark_processed(bad, good)), idem::InvalidKey);
    std::vector<std::string> batch{good, bad};
    EXPECT_THROW(this->run(r.mark_processed_many("billing", batch)), idem::InvalidKey);
  }
  EXPECT_FALSE(this->run(r.is_processed("billing", good))) << "a rejected batch marked an id";
}

TYPED_TEST_P(IdemAsyncRecorderConformance, ManyCoroutinesOnOneLoop) {
  auto& r = *this->recorder_;
  const int n = idem::testing::async_recorder_conformance_detail::coroutines<TypeParam>();
  const std::vector<std::string> ids = idem::testing::fresh_event_ids(n);
  std::atomic<int> errors{0};
  for (int i = 0; i < n; ++i) {
    // Every id marked twice, by two coroutines in flight at once.
    for (int copy = 0; copy < 2; ++copy) {
      asio::co_spawn(this->io_, r.mark_processed("billing", ids[static_cast<std::size_t>(i)]),
                     [&](std::exception_ptr e) {
                       if (e) errors.fetch_add(1);
                     });
    }
  }
  this->io_.restart();
  this->io_.run();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(this->run(r.is_processed_many("billing", ids)), std::vector<bool>(ids.size(), true));
}

TYPED_TEST_P(IdemAsyncRecorderConformance, RaceMarksOnTwoThreads) {
  auto& r = *this->recorder_;
  const int n = idem::testing::async_recorder_conformance_detail::coroutines<TypeParam>();
  const std::vector<std::string> ids = idem::testing::fresh_event_ids(n);
  asio::io_context& io = this->threads_io_;
  std::atomic<int> errors{0};
  for (int i = 0; i < n; ++i) {
    // Captureless: a coroutine lambda's captures die with the lambda, its parameters do not.
    auto task = [](idem::async::AsyncRecorder& rec,
                   const std::string& id) -> idem::async::Task<void> {
      co_await rec.mark_processed("billing", id);
      const bool processed = co_await rec.is_processed("billing", id);
      if (!processed) throw std::logic_error("not processed");
    };
    asio::co_spawn(io, task(r, ids[static_cast<std::size_t>(i)]), [&](std::exception_ptr e) {
      if (e) errors.fetch_add(1);
    });
  }
  idem::testing::async_detail::run_on_two_threads(io);
  EXPECT_EQ(errors.load(), 0);
}

// ---- cancellation -------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncRecorderConformance, CancelledMarkIsAbortedOrDone) {
  using idem::testing::async_recorder_conformance_detail::Outcome;
  auto& r = *this->recorder_;
  for (int steps = 0; steps < 6; ++steps) {
    const std::string id = idem::new_event_id();
    const auto outcome = this->run_cancelled(r.mark_processed("billing", id), steps);
    const bool processed = this->run(r.is_processed("billing", id));
    if (outcome == Outcome::completed) {
      EXPECT_TRUE(processed) << "steps " << steps;
    } else if (outcome == Outcome::aborted) {
      EXPECT_FALSE(processed) << "an aborted mark wrote its marker (steps " << steps << ")";
    }
    // The recorder stays usable either way.
    this->run(r.mark_processed("billing", id));
    EXPECT_TRUE(this->run(r.is_processed("billing", id)));
  }
}

TYPED_TEST_P(IdemAsyncRecorderConformance, CancelledClaimLeavesNoLiveClaim) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_CLAIMS();
  using idem::testing::async_recorder_conformance_detail::Outcome;
  auto& r = *this->recorder_;
  for (int steps = 0; steps < 6; ++steps) {
    const std::string id = idem::new_event_id();
    const auto outcome =
        this->run_cancelled(r.claim("billing", id, std::chrono::minutes(10)), steps);
    if (outcome != Outcome::aborted) continue;  // completed or in doubt: a claim may exist
    const auto again = this->run(r.claim("billing", id, std::chrono::minutes(10)));
    EXPECT_EQ(again.status, idem::Claim::Status::acquired)
        << "an aborted claim left a live claim (steps " << steps << ")";
  }
}

// ---- claims -------------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncRecorderConformance, LapsedLeaseIsTakenOver) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_CLAIMS();
  auto& r = *this->recorder_;
  const std::string id = idem::new_event_id();
  const auto lease = idem::testing::async_detail::short_lease<TypeParam>();
  const auto first = this->run(r.claim("billing", id, lease));
  ASSERT_EQ(first.status, idem::Claim::Status::acquired);
  // Poll (bounded) until the lease has lapsed and another claim takes over.
  auto poll = [&]() -> idem::async::Task<idem::Claim> {
    asio::steady_timer timer(co_await asio::this_coro::executor);
    for (int i = 0; i < 400; ++i) {
      auto c = co_await r.claim("billing", id, std::chrono::minutes(1));
      if (c.status == idem::Claim::Status::acquired) co_return c;
      if (c.status != idem::Claim::Status::in_progress) throw std::logic_error("unexpected");
      timer.expires_after(lease / 2 + std::chrono::milliseconds(1));
      co_await timer.async_wait(asio::use_awaitable);
    }
    throw std::runtime_error("the lapsed lease was never taken over");
  };
  const auto second = this->run(poll());
  EXPECT_TRUE(second.took_over);
  EXPECT_GT(second.token, first.token);
  EXPECT_FALSE(this->run(r.complete("billing", id, first.token))) << "the old owner is fenced";
  EXPECT_FALSE(this->run(r.is_processed("billing", id)));
  EXPECT_TRUE(this->run(r.complete("billing", id, second.token)));
  EXPECT_TRUE(this->run(r.is_processed("billing", id)));
}

TYPED_TEST_P(IdemAsyncRecorderConformance, RaceClaimsOnTwoThreadsOneWinner) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_CLAIMS();
  auto& r = *this->recorder_;
  const int n = idem::testing::async_recorder_conformance_detail::coroutines<TypeParam>();
  for (int round = 0; round < 4; ++round) {
    const std::string id = idem::new_event_id();
    asio::io_context& io = this->threads_io_;
    std::atomic<int> acquired{0};
    std::atomic<int> in_progress{0};
    std::atomic<int> errors{0};
    for (int i = 0; i < n; ++i) {
      asio::co_spawn(io, r.claim("billing", id, std::chrono::minutes(1)),
                     [&](std::exception_ptr e, idem::Claim c) {
                       if (e) {
                         errors.fetch_add(1);
                       } else if (c.status == idem::Claim::Status::acquired) {
                         acquired.fetch_add(1);
                       } else if (c.status == idem::Claim::Status::in_progress) {
                         in_progress.fetch_add(1);
                       }
                     });
    }
    idem::testing::async_detail::run_on_two_threads(io);
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(acquired.load(), 1) << "exactly one coroutine may own the claim";
    EXPECT_EQ(in_progress.load(), n - 1);
  }
}

TYPED_TEST_P(IdemAsyncRecorderConformance, ClaimsNotSupportedThrow) {
  if (TypeParam::kCapabilities.claims) GTEST_SKIP() << "the recorder supports claims";
  EXPECT_THROW(this->run(this->recorder_->claim("billing", "e1", std::chrono::seconds(1))),
               idem::NotSupported);
}

// ---- transactions -------------------------------------------------------------------------

namespace idem::testing::async_recorder_conformance_detail {

// A table of its own for one test, created and dropped through run_transactional.
class ScratchTable {
 public:
  explicit ScratchTable(idem::async::AsyncRecorder& r)
      : recorder_(r), name_("idem_async_cases_" + idem::new_event_id().substr(0, 16)) {}
  const std::string& name() const { return name_; }
  // (No temporaries inside a co_await expression: g++ 12 may destroy them twice.)
  idem::async::Task<void> create() {
    const std::string sql = "CREATE TABLE " + name_ + " (k TEXT PRIMARY KEY, v BIGINT NOT NULL)";
    co_await exec(sql);
  }
  idem::async::Task<void> drop() {
    const std::string sql = "DROP TABLE " + name_;
    co_await exec(sql);
  }
  // The number of rows, read in a transaction of its own.
  idem::async::Task<std::int64_t> count() {
    const std::string sql = "SELECT COUNT(*) FROM " + name_;
    const std::string id = idem::new_event_id();
    std::int64_t n = -1;
    idem::async::AsyncRecorder::TransactionalFn fn =
        [&sql, &n](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
      n = co_await tx.query_int64(sql);
    };
    co_await recorder_.run_transactional("idem-cases-setup", id, std::move(fn));
    co_return n;
  }

 private:
  idem::async::Task<void> exec(const std::string& sql) {
    const std::string id = idem::new_event_id();
    idem::async::AsyncRecorder::TransactionalFn fn =
        [&sql](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
      co_await tx.exec(sql);
    };
    co_await recorder_.run_transactional("idem-cases-setup", id, std::move(fn));
  }

 public:
 private:
  idem::async::AsyncRecorder& recorder_;
  std::string name_;
};

}  // namespace idem::testing::async_recorder_conformance_detail

TYPED_TEST_P(IdemAsyncRecorderConformance, RunTransactionalCommitsWritesWithTheMarker) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_TRANSACTIONS();
  auto& r = *this->recorder_;
  idem::testing::async_recorder_conformance_detail::ScratchTable table(r);
  this->run(table.create());
  const std::string id = idem::new_event_id();
  const std::string insert = "INSERT INTO " + table.name() + " (k, v) VALUES ($1, $2)";
  const std::string select_v = "SELECT v FROM " + table.name() + " WHERE k = $1";
  const std::string select_k = "SELECT k FROM " + table.name() + " WHERE k = $1";
  const std::string update = "UPDATE " + table.name() + " SET v = v + 1 WHERE k = $1";
  int runs = 0;
  auto fn = [&](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    ++runs;
    EXPECT_EQ(tx.consumer(), "billing");
    EXPECT_EQ(tx.event_id(), id);
    const idem::SqlParam params[] = {std::string_view(id), std::int64_t{42}};
    EXPECT_EQ(co_await tx.exec(insert, params), 1) << "exec completes with the rows it changed";
    const idem::SqlParam key[] = {std::string_view(id)};
    EXPECT_EQ(co_await tx.query_int64(select_v, key), 42);
    EXPECT_EQ(co_await tx.query_text(select_k, key), std::optional<std::string>(id));
    const idem::SqlParam missing[] = {std::string_view("absent")};
    EXPECT_EQ(co_await tx.query_text(select_k, missing), std::nullopt);
    EXPECT_EQ(co_await tx.exec(update, key), 1);
    EXPECT_EQ(co_await tx.exec(update, missing), 0);
    EXPECT_EQ(co_await tx.query_int64(select_v, key), 43);
  };
  EXPECT_TRUE(this->run(r.run_transactional("billing", id, fn)));
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(this->run(r.is_processed("billing", id)));
  EXPECT_EQ(this->run(table.count()), 1);
  // The duplicate neither runs nor writes.
  EXPECT_FALSE(this->run(r.run_transactional("billing", id, fn)));
  EXPECT_EQ(runs, 1);
  // A marker from mark_processed counts too.
  const std::string marked = idem::new_event_id();
  this->run(r.mark_processed("billing", marked));
  EXPECT_FALSE(this->run(r.run_transactional("billing", marked, fn)));
  EXPECT_EQ(runs, 1);
  this->run(table.drop());
}

TYPED_TEST_P(IdemAsyncRecorderConformance, RunTransactionalThrowRollsBack) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_TRANSACTIONS();
  struct HandlerFailed : std::runtime_error {
    HandlerFailed() : std::runtime_error("handler failed") {}
  };
  auto& r = *this->recorder_;
  idem::testing::async_recorder_conformance_detail::ScratchTable table(r);
  this->run(table.create());
  const std::string id = idem::new_event_id();
  const std::string insert = "INSERT INTO " + table.name() + " (k, v) VALUES ($1, $2)";
  int runs = 0;
  auto failing = [&](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    ++runs;
    const idem::SqlParam params[] = {std::string_view(id), std::int64_t{1}};
    co_await tx.exec(insert, params);
    throw HandlerFailed();
  };
  EXPECT_THROW(this->run(r.run_transactional("billing", id, failing)), HandlerFailed);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(this->run(r.is_processed("billing", id))) << "a failed handler was marked";
  EXPECT_EQ(this->run(table.count()), 0) << "a failed handler's write was committed";
  // A bad statement fails the call and rolls back too.
  auto bad_sql = [&](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    co_await tx.exec("THIS IS NOT SQL");
  };
  EXPECT_THROW(this->run(r.run_transactional("billing", id, bad_sql)), idem::StoreError);
  EXPECT_FALSE(this->run(r.is_processed("billing", id)));
  // The redelivery runs again and commits.
  auto ok = [&](idem::async::AsyncSqlTransaction& tx) -> idem::async::Task<void> {
    ++runs;
    const idem::SqlParam params[] = {std::string_view(id), std::int64_t{2}};
    co_await tx.exec(insert, params);
  };
  EXPECT_TRUE(this->run(r.run_transactional("billing", id, ok)));
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(this->run(r.is_processed("billing", id)));
  EXPECT_EQ(this->run(table.count()), 1);
  this->run(table.drop());
}

TYPED_TEST_P(IdemAsyncRecorderConformance, RaceRunTransactionalOncePerId) {
  IDEM_ASYNC_CONFORMANCE_REQUIRE_TRANSACTIONS();
  auto& r = *this->recorder_;
  const int n =
      std::min(idem::testing::async_recorder_conformance_detail::coroutines<TypeParam>(), 16);
  const std::string id = idem::new_event_id();
  asio::io_context& io = this->threads_io_;
  std::atomic<int> runs{0};
  std::atomic<int> committed{0};
  std::atomic<int> duplicates{0};
  std::atomic<int> errors{0};
  for (int i = 0; i < n; ++i) {
    auto task = [](idem::async::AsyncRecorder& rec, const std::string& event_id,
                   std::atomic<int>& ran_fn, std::atomic<int>& commits,
                   std::atomic<int>& dups) -> idem::async::Task<void> {
      idem::async::AsyncRecorder::TransactionalFn fn =
          [&ran_fn](idem::async::AsyncSqlTransaction&) -> idem::async::Task<void> {
        ran_fn.fetch_add(1);
        co_return;
      };
      const bool ran = co_await rec.run_transactional("billing", event_id, std::move(fn));
      (ran ? commits : dups).fetch_add(1);
    };
    asio::co_spawn(io, task(r, id, runs, committed, duplicates), [&](std::exception_ptr e) {
      if (!e) return;
      // A backend may refuse a conflicting transaction with a retryable StoreError.
      try {
        std::rethrow_exception(e);
      } catch (const idem::StoreError& err) {
        if (!err.retryable()) errors.fetch_add(1);
      } catch (...) {
        errors.fetch_add(1);
      }
    });
  }
  idem::testing::async_detail::run_on_two_threads(io);
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(committed.load(), 1) << "exactly one transaction may commit the marker";
  EXPECT_LE(runs.load(), n);
  EXPECT_TRUE(this->run(r.is_processed("billing", id)));
}

TYPED_TEST_P(IdemAsyncRecorderConformance, TransactionsNotSupportedThrow) {
  if (TypeParam::kCapabilities.transactions) GTEST_SKIP() << "the recorder supports transactions";
  auto fn = [](idem::async::AsyncSqlTransaction&) -> idem::async::Task<void> { co_return; };
  EXPECT_THROW(this->run(this->recorder_->run_transactional("billing", "e1", fn)),
               idem::NotSupported);
}

REGISTER_TYPED_TEST_SUITE_P(IdemAsyncRecorderConformance, ReportsDeclaredCapabilities,
                            EveryCallResumesOnTheCallersThread, InvalidKeysThrowAndMarkNothing,
                            ManyCoroutinesOnOneLoop, RaceMarksOnTwoThreads,
                            CancelledMarkIsAbortedOrDone, CancelledClaimLeavesNoLiveClaim,
                            LapsedLeaseIsTakenOver, RaceClaimsOnTwoThreadsOneWinner,
                            ClaimsNotSupportedThrow, RunTransactionalCommitsWritesWithTheMarker,
                            RunTransactionalThrowRollsBack, RaceRunTransactionalOncePerId,
                            TransactionsNotSupportedThrow);

// One instantiation per backend configuration: INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(Prefix,
// Factory).
#define INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(Prefix, Factory) \
  INSTANTIATE_TYPED_TEST_SUITE_P(Prefix, IdemAsyncRecorderConformance, ::testing::Types<Factory>)
