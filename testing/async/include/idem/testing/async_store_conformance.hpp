// The AsyncStore conformance suite: what every async idempotency store must do that the
// blocking suite cannot see, as GoogleTest tests.
//
// An async store is checked twice. The blocking store suite (store_conformance.hpp) runs against
// it through idem::testing::BlockingOverAsyncStore (blocking_over_async.hpp): every transition
// of the record state machine, fencing tokens, lease takeover and TTL expiry exactly at their
// boundaries (on a ManualClock), fingerprints, values and reports, wait(), 8-thread races, key
// validation and idem::resilient over the store. This suite adds what only the coroutine face
// has, and what the backend does on its own clock:
// * every call resuming on the awaiting coroutine's thread (checked on every call run() makes);
// * claim_without_report, which the blocking protocol has not;
// * the async face's own argument checks (InvalidKey, InvalidArgument before the backend is
//   reached: the adapter's blocking face checks first, so they never reach it through it);
// * the backend on the system clock (no injected clock: the Redis and PostgreSQL stores then take
//   their time from the system or the server, and Redis waits on pub/sub): a short real TTL
//   expiring, a renewed short lease outliving itself, a lapsed lease taken over, wait()
//   returning once the holder completes or goes silent; short leases and TTLs polled in bounded
//   loops, asserting nothing about how long anything took;
// * claims racing as coroutines on a 2-thread io_context (one owner; with other arguments, the
//   losers get the winner's claim, which mismatches);
// * cancellation of a claim (aborted: nothing held; otherwise done or in doubt);
// * idem::async::resilient over the store: a key reused with other arguments is refused (after
//   a result, and while another process holds the claim), coroutine callers of one key join one
//   execution, a cancelled joiner detaches alone, and a caller waiting for a key another owner
//   holds stops waiting when cancelled.
//
// How to use it — a factory type and one macro, in a test file linked with idem::testing_async,
// GoogleTest and gtest_main:
//
//   #include "idem/testing/async_store_conformance.hpp"
//
//   struct MyAsyncStoreFactory {
//     // Called once per test. make() may be static or not.
//     std::shared_ptr<idem::async::AsyncStore> make();
//     // Optional: the short lease / TTL the expiry tests let lapse (default 50 ms), and how many
//     // coroutines the race tests start (default 32).
//     // static constexpr idem::Millis kShortLease{50};
//     // static constexpr int kCoroutines = 32;
//   };
//   INSTANTIATE_ASYNC_STORE_CONFORMANCE(MyBackend, MyAsyncStoreFactory);
//
// The factory is default-constructed once per test and destroyed after the store, so it can own
// a temporary database, a key prefix, a schema or the I/O thread of the store. That thread is the
// factory's member `idem::testing::IoThread io;`: the fixture stops it before it destroys its
// io_contexts and the store (async_support.hpp). Tests live in the global test suite
// IdemAsyncStoreConformance; keys are fresh per test, so stores may be shared between tests.
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
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <type_traits>
#include <typeindex>
#include <utility>
#include <vector>

#include "idem/async/resilient.hpp"
#include "idem/async/store.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/fingerprint.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/key.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/report.hpp"
#include "idem/testing/async_support.hpp"
#include "idem/testing/keys.hpp"

namespace idem::testing::async_store_conformance_detail {

// How many coroutines the race cases start: the factory's kCoroutines, else 32.
template <class Factory>
constexpr int coroutines() {
  return idem::testing::async_detail::coroutines<Factory>(32);
}

// How a cancelled call ended (async_support.hpp).
using Outcome = idem::testing::async_detail::Outcome;

// A report with fields away from their defaults, including text a serialiser must escape.
inline idem::ExecutionReport sample_report() {
  idem::ExecutionReport report;
  report.operation = "create_payment";
  report.status = idem::OperationStatus::succeeded;
  report.started_at = idem::WallTime(std::chrono::seconds(1893456000));
  report.duration = std::chrono::nanoseconds(123456789);
  idem::AttemptRecord attempt;
  attempt.number = 1;
  attempt.source = "primary";
  attempt.status = idem::AttemptStatus::succeeded;
  attempt.duration = std::chrono::nanoseconds(42);
  attempt.error_message = "quoted \"text\"\nand caf\xc3\xa9";
  report.attempts = {attempt};
  report.metadata = {{"idempotency_key", "pay:\"1\""}, {"empty", ""}};
  return report;
}

}  // namespace idem::testing::async_store_conformance_detail

template <class Factory>
class IdemAsyncStoreConformance
    : public idem::testing::async_detail::ConformanceFixture<Factory, idem::async::AsyncStore> {
 protected:
  using Status = idem::ClaimOutcome::Status;
  using State = idem::IdempotencyRecord::State;
  static constexpr idem::Millis kLease{60'000};
  static constexpr idem::Millis kTtl{600'000};

  IdemAsyncStoreConformance()
      : idem::testing::async_detail::ConformanceFixture<Factory, idem::async::AsyncStore>("store") {
  }

  // Stops the backend's I/O thread (if the factory has one) before report_ goes: a call may still
  // read it there. The base stops it again (a no-op) before the io_contexts and the store go.
  ~IdemAsyncStoreConformance() override {
    idem::testing::async_detail::stop_io_thread(this->factory_);
  }

  // A key of this test's own (stores may be shared between tests of one server).
  static std::string fresh_key(const std::string& name = "order") {
    return name + "-" + idem::new_event_id();
  }

  // A value as the coordinator hands it to the store: the typed object always, the bytes too
  // when the store needs bytes.
  idem::StoredValue value(const std::string& text) const {
    idem::StoredValue v;
    v.object = std::make_shared<const std::string>(text);
    v.type = std::type_index(typeid(std::string));
    if (store_->needs_bytes()) v.bytes = text;
    return v;
  }

  void expect_value(const idem::StoredValue& v, const std::string& text) const {
    if (store_->needs_bytes()) {
      ASSERT_TRUE(v.bytes.has_value()) << "a store that needs bytes must return the bytes";
      EXPECT_EQ(*v.bytes, text);
    } else {
      ASSERT_NE(v.object, nullptr) << "an in-process store must return the typed object";
      EXPECT_EQ(*std::static_pointer_cast<const std::string>(v.object), text);
    }
  }

  // Claims `key` (which must be free) and returns the token.
  std::uint64_t acquire(const std::string& key,
                        std::optional<std::string_view> fingerprint = std::nullopt,
                        idem::Millis lease = kLease) {
    const idem::ClaimOutcome outcome = this->run(store_->claim(key, fingerprint, lease));
    EXPECT_EQ(outcome.status, Status::acquired) << "claim of '" << key << "'";
    EXPECT_GT(outcome.token, 0u);
    return outcome.token;
  }

  // complete() with named arguments (no temporaries in the co_await expression).
  bool complete(const std::string& key, std::uint64_t token, const std::string& text,
                idem::Millis ttl = kTtl) {
    report_ = idem::testing::async_store_conformance_detail::sample_report();
    return this->run(store_->complete(key, token, value(text), report_, ttl));
  }

  std::optional<idem::IdempotencyRecord> lookup(const std::string& key) {
    return this->run(store_->lookup(key));
  }

  // Claims `key` every lapsing/2 (bounded) until the lease or result that held it has lapsed:
  // a live record answers in_progress, completed or (another fingerprint) mismatch meanwhile.
  idem::ClaimOutcome claim_after_lapse(const std::string& key, idem::Millis lapsing,
                                       std::optional<std::string_view> fingerprint = std::nullopt) {
    auto poll = [](idem::async::AsyncStore& store, const std::string& k,
                   std::optional<std::string_view> fp, idem::Millis lease,
                   idem::Millis step) -> idem::async::Task<idem::ClaimOutcome> {
      asio::steady_timer timer(co_await asio::this_coro::executor);
      for (int i = 0; i < 400; ++i) {
        auto outcome = co_await store.claim(k, fp, lease);
        if (outcome.status == idem::ClaimOutcome::Status::acquired) co_return outcome;
        timer.expires_after(step);
        co_await timer.async_wait(asio::use_awaitable);
      }
      throw std::runtime_error("the lapsed lease or result never let the key go");
    };
    return this->run(poll(*store_, key, fingerprint, kLease, lapsing / 2 + idem::Millis(1)));
  }

  // The store the factory made (async_support.hpp: the fixture's teardown order).
  std::shared_ptr<idem::async::AsyncStore>& store_ = this->subject_;
  idem::ExecutionReport report_;
};

TYPED_TEST_SUITE_P(IdemAsyncStoreConformance);

// ---- claim_without_report (not in the blocking protocol) -------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, ClaimWithoutReportAnswersAsClaimDoes) {
  const std::string key = this->fresh_key();
  const auto first = this->run(this->store_->claim_without_report(key, "fp-a", this->kLease));
  ASSERT_EQ(first.status, idem::ClaimOutcome::Status::acquired);
  const auto running = this->run(this->store_->claim_without_report(key, "fp-a", this->kLease));
  EXPECT_EQ(running.status, idem::ClaimOutcome::Status::in_progress);
  ASSERT_TRUE(this->complete(key, first.token, "receipt-8"));
  const auto replay = this->run(this->store_->claim_without_report(key, "fp-a", this->kLease));
  ASSERT_EQ(replay.status, idem::ClaimOutcome::Status::completed);
  ASSERT_TRUE(replay.record.has_value());
  EXPECT_EQ(replay.record->token, first.token);
  this->expect_value(replay.record->value, "receipt-8");
  EXPECT_EQ(replay.record->expires_at, this->lookup(key)->expires_at);
  // The report may be left out; when a store reads it anyway, it is the stored one.
  if (replay.record->report) {
    EXPECT_EQ(replay.record->report->operation,
              idem::testing::async_store_conformance_detail::sample_report().operation);
  }
  EXPECT_EQ(this->run(this->store_->claim_without_report(key, "fp-b", this->kLease)).status,
            idem::ClaimOutcome::Status::mismatch);
}

// ---- on the backend's own clock: a short real TTL and lease ----------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, ShortTtlExpiresAndTheKeyIsClaimedAgain) {
  const std::string key = this->fresh_key();
  const auto ttl = idem::testing::async_detail::short_lease<TypeParam>();
  const std::uint64_t token = this->acquire(key, "fp-a");
  ASSERT_TRUE(this->complete(key, token, "x", ttl));
  // Poll (bounded) until the result has expired: a claim then acquires, even with another
  // fingerprint, as if the key had never been used.
  const auto outcome = this->claim_after_lapse(key, ttl, "fp-b");
  ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(outcome.token, token);
}

TYPED_TEST_P(IdemAsyncStoreConformance, RenewKeepsAShortLeaseAlive) {
  const std::string key = this->fresh_key();
  const auto lease = idem::testing::async_detail::short_lease<TypeParam>();
  const std::uint64_t token = this->acquire(key, std::nullopt, lease);
  const auto before = this->lookup(key);
  ASSERT_TRUE(this->run(this->store_->renew(key, token, this->kLease)));
  const auto after = this->lookup(key);
  ASSERT_TRUE(after.has_value());
  EXPECT_GT(after->lease_until, before->lease_until) << "renew extends the lease from now";
  // Long after the short lease would have ended, the renewed claim still holds the key.
  this->run(idem::testing::async_detail::nap(lease * 3));
  const auto outcome = this->run(this->store_->claim(key, std::nullopt, this->kLease));
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_TRUE(this->complete(key, token, "done"));
}

TYPED_TEST_P(IdemAsyncStoreConformance, LapsedLeaseIsTakenOverAndTheOldOwnerIsFenced) {
  const std::string key = this->fresh_key();
  const auto lease = idem::testing::async_detail::short_lease<TypeParam>();
  const std::uint64_t old_token = this->acquire(key, "fp-a", lease);
  const auto outcome = this->claim_after_lapse(key, lease, "fp-a");
  ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(outcome.took_over);
  EXPECT_GT(outcome.token, old_token);
  // The old owner has lost its lease: every call with its token is refused.
  EXPECT_FALSE(this->run(this->store_->renew(key, old_token, this->kLease)));
  EXPECT_FALSE(this->complete(key, old_token, "stale"));
  EXPECT_FALSE(this->run(this->store_->release(key, old_token)));
  const auto record = this->lookup(key);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->token, outcome.token) << "the stale owner changed the new claim";
  ASSERT_TRUE(this->complete(key, outcome.token, "fresh"));
  this->expect_value(this->lookup(key)->value, "fresh");
}

// ---- bad input (the non-virtual checks) -----------------------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, InvalidKeysAndBadArgumentsAreRejected) {
  for (const std::string& key : idem::testing::invalid_keys()) {
    SCOPED_TRACE("key of " + std::to_string(key.size()) + " bytes");
    EXPECT_THROW(this->run(this->store_->claim(key, std::nullopt, this->kLease)), idem::InvalidKey);
    EXPECT_THROW(this->complete(key, 1, "x"), idem::InvalidKey);
    EXPECT_THROW(this->run(this->store_->release(key, 1)), idem::InvalidKey);
    EXPECT_THROW(this->run(this->store_->renew(key, 1, this->kLease)), idem::InvalidKey);
    EXPECT_THROW(this->run(this->store_->lookup(key)), idem::InvalidKey);
  }
  const std::string key = this->fresh_key();
  EXPECT_THROW(this->run(this->store_->claim(key, std::nullopt, idem::Millis(0))),
               idem::InvalidArgument);
  EXPECT_THROW(this->run(this->store_->claim(key, std::nullopt, idem::Millis(-5))),
               idem::InvalidArgument);
  EXPECT_FALSE(this->lookup(key).has_value()) << "a rejected claim stored something";
  const std::uint64_t token = this->acquire(key);
  EXPECT_THROW(this->run(this->store_->renew(key, token, idem::Millis(0))), idem::InvalidArgument);
  EXPECT_THROW(this->complete(key, token, "x", idem::Millis(-1)), idem::InvalidArgument);
  EXPECT_EQ(this->lookup(key)->state, idem::IdempotencyRecord::State::in_progress)
      << "a rejected call changes nothing";
}

// ---- concurrency ----------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, RaceClaimsOnTwoThreadsOneOwner) {
  const int n = idem::testing::async_store_conformance_detail::coroutines<TypeParam>();
  for (int round = 0; round < 3; ++round) {
    const std::string key = this->fresh_key();
    asio::io_context& io = this->threads_io_;
    std::atomic<int> acquired{0};
    std::atomic<int> in_progress{0};
    std::atomic<int> errors{0};
    for (int i = 0; i < n; ++i) {
      asio::co_spawn(io, this->store_->claim(key, std::nullopt, this->kLease),
                     [&](std::exception_ptr e, idem::ClaimOutcome c) {
                       if (e) {
                         errors.fetch_add(1);
                       } else if (c.status == idem::ClaimOutcome::Status::acquired) {
                         acquired.fetch_add(1);
                       } else if (c.status == idem::ClaimOutcome::Status::in_progress) {
                         in_progress.fetch_add(1);
                       }
                     });
    }
    idem::testing::async_detail::run_on_two_threads(io);
    EXPECT_EQ(errors.load(), 0);
    EXPECT_EQ(acquired.load(), 1) << "exactly one coroutine may own the key";
    EXPECT_EQ(in_progress.load(), n - 1);
  }
}

TYPED_TEST_P(IdemAsyncStoreConformance, RaceClaimsWithOtherArgumentsAllMismatch) {
  // Coroutines on two threads claim one key, each with a fingerprint of its own: one acquires;
  // every other claim fails and is answered with the winner's claim, which mismatches.
  const int n = idem::testing::async_store_conformance_detail::coroutines<TypeParam>();
  for (int round = 0; round < 3; ++round) {
    const std::string key = this->fresh_key();
    asio::io_context& io = this->threads_io_;
    std::mutex mutex;
    std::vector<std::pair<int, idem::ClaimOutcome>> outcomes;
    std::atomic<int> errors{0};
    std::vector<std::string> fingerprints;
    for (int i = 0; i < n; ++i)
      fingerprints.push_back("fp-" + std::to_string(i));
    for (int i = 0; i < n; ++i) {
      asio::co_spawn(io, this->store_->claim(key, fingerprints[i], this->kLease),
                     [&, i](std::exception_ptr e, idem::ClaimOutcome c) {
                       if (e) {
                         errors.fetch_add(1);
                         return;
                       }
                       std::lock_guard lock(mutex);
                       outcomes.emplace_back(i, std::move(c));
                     });
    }
    idem::testing::async_detail::run_on_two_threads(io);
    EXPECT_EQ(errors.load(), 0);
    int winner = -1;
    std::uint64_t token = 0;
    for (const auto& [i, c] : outcomes) {
      if (c.status == idem::ClaimOutcome::Status::acquired) {
        EXPECT_EQ(winner, -1) << "two owners";
        winner = i;
        token = c.token;
      }
    }
    ASSERT_NE(winner, -1);
    for (const auto& [i, c] : outcomes) {
      if (i == winner) continue;
      EXPECT_EQ(c.status, idem::ClaimOutcome::Status::mismatch) << "coroutine " << i;
      ASSERT_TRUE(c.record.has_value());
      EXPECT_EQ(c.record->fingerprint, fingerprints[winner]);
      EXPECT_EQ(c.record->token, token);
    }
  }
}

// ---- wait -----------------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, WaitReturnsOnceTheHolderLetsGo) {
  using Clock = std::chrono::steady_clock;
  const auto far = Clock::now() + std::chrono::seconds(60);
  EXPECT_FALSE(this->run(this->store_->wait(this->fresh_key("absent"), far)).has_value());
  const std::string done = this->fresh_key("done");
  ASSERT_TRUE(this->complete(done, this->acquire(done), "v"));
  auto record = this->run(this->store_->wait(done, far));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, TestFixture::State::completed);
  // A live claim: at its deadline the wait returns what it saw.
  const std::string held = this->fresh_key("held");
  const std::uint64_t token = this->acquire(held);
  record = this->run(this->store_->wait(held, Clock::now()));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, TestFixture::State::in_progress);
  EXPECT_EQ(record->token, token);
  // The holder completes while the waiter waits: the waiter returns the result.
  auto finish = [](idem::async::AsyncStore& store, std::string key, std::uint64_t t,
                   idem::StoredValue v) -> idem::async::Task<bool> {
    co_await idem::testing::async_detail::nap(std::chrono::milliseconds(50));
    const idem::ExecutionReport report;
    co_return co_await store.complete(key, t, std::move(v), report, std::chrono::minutes(10));
  };
  auto completed = asio::co_spawn(this->io_, finish(*this->store_, held, token, this->value("r")),
                                  asio::use_future);
  record = this->run(this->store_->wait(held, far));
  EXPECT_TRUE(completed.get());
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, TestFixture::State::completed);
  this->expect_value(record->value, "r");
  // A holder that goes silent: the wait returns when its lease ends.
  const std::string silent = this->fresh_key("silent");
  this->acquire(silent, std::nullopt, idem::testing::async_detail::short_lease<TypeParam>());
  record = this->run(this->store_->wait(silent, far));
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, TestFixture::State::in_progress);
  EXPECT_THROW((void)this->run(this->store_->wait("", far)), idem::InvalidKey);
}

// ---- cancellation ---------------------------------------------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, CancelledClaimIsAbortedOrHeld) {
  using idem::testing::async_store_conformance_detail::Outcome;
  for (int steps = 0; steps < 6; ++steps) {
    const std::string key = this->fresh_key();
    const auto outcome =
        this->run_cancelled(this->store_->claim(key, std::nullopt, this->kLease), steps);
    if (outcome == Outcome::aborted) {
      EXPECT_FALSE(this->lookup(key).has_value())
          << "an aborted claim left a record (steps " << steps << ")";
    } else if (outcome == Outcome::completed) {
      EXPECT_TRUE(this->lookup(key).has_value()) << "steps " << steps;
    }
    // The store stays usable either way.
    const auto token =
        this->run(this->store_->claim(this->fresh_key(), std::nullopt, this->kLease));
    EXPECT_EQ(token.status, idem::ClaimOutcome::Status::acquired);
  }
}

// ---- idem::async::resilient over the store --------------------------------------------------

TYPED_TEST_P(IdemAsyncStoreConformance, ResilientCallersJoinOneExecutionAndReplay) {
  using idem::testing::async_detail::status_of;
  std::atomic<int> calls{0};
  auto charge = idem::async::resilient(
      [&calls](std::string order) -> idem::async::Task<std::string> {
        calls.fetch_add(1);
        co_await idem::testing::async_detail::nap(std::chrono::milliseconds(30));
        co_return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = this->store_});
  const std::string order = this->fresh_key();
  std::vector<std::future<idem::OperationResult<std::string>>> results;
  for (int i = 0; i < 8; ++i)
    results.push_back(asio::co_spawn(this->io_, charge(order), asio::use_future));
  this->io_.restart();
  this->io_.run();
  int executed = 0;
  for (auto& result : results) {
    auto r = result.get();
    EXPECT_EQ(r.value, "receipt-" + order);
    if (status_of(r.report) == "executed") ++executed;
  }
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(executed, 1);
  // The result is in the store: a later call replays it.
  const auto replay = this->run(charge(order));
  EXPECT_EQ(replay.value, "receipt-" + order);
  EXPECT_EQ(status_of(replay.report), "replayed");
  EXPECT_EQ(calls.load(), 1);
  const auto stored = this->lookup(idem::scoped_idempotency_key("charge", order));
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(stored->state, idem::IdempotencyRecord::State::completed);
}

TYPED_TEST_P(IdemAsyncStoreConformance, CancelledJoinerDetachesAlone) {
  using idem::testing::async_detail::status_of;
  std::atomic<int> calls{0};
  auto charge = idem::async::resilient(
      [&calls](std::string order) -> idem::async::Task<std::string> {
        calls.fetch_add(1);
        co_await idem::testing::async_detail::nap(std::chrono::milliseconds(100));
        co_return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = this->store_});
  const std::string order = this->fresh_key();
  auto owner = asio::co_spawn(this->io_, charge(order), asio::use_future);
  asio::cancellation_signal cancel;
  auto quitter = asio::co_spawn(this->io_, charge(order),
                                asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  auto patient = asio::co_spawn(this->io_, charge(order), asio::use_future);
  asio::steady_timer later(this->io_, std::chrono::milliseconds(20));
  later.async_wait([&](asio::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  this->io_.restart();
  this->io_.run();
  EXPECT_THROW(quitter.get(), idem::Cancelled);
  EXPECT_EQ(status_of(owner.get().report), "executed");
  auto joined = patient.get();
  EXPECT_EQ(joined.value, "receipt-" + order);
  EXPECT_EQ(calls.load(), 1);
}

TYPED_TEST_P(IdemAsyncStoreConformance, CancelledWaiterForAnotherOwnerStopsWaiting) {
  // Another process holds the key (a claim in the store, no owner here): the caller waits for
  // it on timers, and its cancellation ends the wait without executing.
  const std::string order = this->fresh_key();
  const std::string stored = idem::scoped_idempotency_key("charge", order);
  const std::uint64_t other = this->acquire(stored);
  std::atomic<int> calls{0};
  auto charge = idem::async::resilient(
      [&calls](std::string o) -> idem::async::Task<std::string> {
        calls.fetch_add(1);
        co_return "receipt-" + o;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& o) { return o; },
       .idempotency_store = this->store_,
       .idempotency_max_wait = idem::Millis(60'000)});
  asio::cancellation_signal cancel;
  auto waiter = asio::co_spawn(this->io_, charge(order),
                               asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  asio::steady_timer later(this->io_, std::chrono::milliseconds(30));
  later.async_wait([&](asio::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  this->io_.restart();
  this->io_.run();
  // Cancelled during a timer wait: Cancelled. Cancelled while a re-claim was in flight on a
  // remote store: that claim's in-doubt StoreError (task.hpp: never reported as nothing happened);
  // in a store call that had done nothing: operation_aborted.
  try {
    (void)waiter.get();
    ADD_FAILURE() << "the cancelled waiter returned";
  } catch (const idem::Cancelled&) {
  } catch (const idem::StoreError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
  } catch (const asio::system_error& e) {
    // Cancelled in a store call that had done nothing (not yet sent, or a read): aborted.
    EXPECT_EQ(e.code(), asio::error::operation_aborted) << e.what();
  }
  EXPECT_EQ(calls.load(), 0);
  const auto record = this->lookup(stored);
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->token, other) << "the waiter touched the other owner's claim";
  // When the other owner lets go, the next call executes.
  EXPECT_TRUE(this->run(this->store_->release(stored, other)));
  const auto r = this->run(charge(order));
  EXPECT_EQ(r.value, "receipt-" + order);
  EXPECT_EQ(calls.load(), 1);
}

TYPED_TEST_P(IdemAsyncStoreConformance, ResilientRefusesAKeyReusedWithOtherArguments) {
  // idem::async::resilient fingerprints its arguments by default: its key with other arguments
  // is refused after a result is stored and while another process holds the claim for other
  // arguments; `false` opts out.
  std::atomic<int> calls{0};
  auto fn = [&calls](std::string order, int cents) -> idem::async::Task<std::string> {
    calls.fetch_add(1);
    co_return order + ":" + std::to_string(cents);
  };
  auto key = [](const std::string& order, int) { return order; };
  auto charge = idem::async::resilient(
      fn, {.name = "charge_reuse", .idempotency_key = key, .idempotency_store = this->store_});
  const std::string order = this->fresh_key();
  EXPECT_EQ(this->run(charge(order, 1)).value, order + ":1");
  try {
    this->run(charge(order, 2));
    ADD_FAILURE() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    EXPECT_EQ(e.key(), order);
    EXPECT_EQ(e.operation(), "charge_reuse");
    EXPECT_NE(std::string(e.what()).find("operation 'charge_reuse': idempotency key '" + order +
                                         "' was first used with different arguments"),
              std::string::npos)
        << e.what();
  }
  const std::string held_order = this->fresh_key();
  const std::string held = idem::scoped_idempotency_key("charge_reuse", held_order);
  this->acquire(held, idem::fingerprint(held_order, 1));
  try {
    this->run(charge(held_order, 2));
    ADD_FAILURE() << "expected KeyReuseError";
  } catch (const idem::KeyReuseError& e) {
    EXPECT_NE(std::string(e.what()).find("is in progress with different arguments"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(calls.load(), 1);
  auto lax = idem::async::resilient(fn, {.name = "charge_reuse",
                                         .idempotency_key = key,
                                         .idempotency_store = this->store_,
                                         .idempotency_fingerprint = false});
  EXPECT_EQ(this->run(lax(order, 3)).value, order + ":1");
  EXPECT_EQ(calls.load(), 1);
}

REGISTER_TYPED_TEST_SUITE_P(IdemAsyncStoreConformance, ClaimWithoutReportAnswersAsClaimDoes,
                            ShortTtlExpiresAndTheKeyIsClaimedAgain, RenewKeepsAShortLeaseAlive,
                            LapsedLeaseIsTakenOverAndTheOldOwnerIsFenced,
                            InvalidKeysAndBadArgumentsAreRejected, RaceClaimsOnTwoThreadsOneOwner,
                            RaceClaimsWithOtherArgumentsAllMismatch, WaitReturnsOnceTheHolderLetsGo,
                            CancelledClaimIsAbortedOrHeld,
                            ResilientCallersJoinOneExecutionAndReplay, CancelledJoinerDetachesAlone,
                            CancelledWaiterForAnotherOwnerStopsWaiting,
                            ResilientRefusesAKeyReusedWithOtherArguments);

// One instantiation per backend configuration: INSTANTIATE_ASYNC_STORE_CONFORMANCE(Prefix,
// Factory).
#define INSTANTIATE_ASYNC_STORE_CONFORMANCE(Prefix, Factory) \
  INSTANTIATE_TYPED_TEST_SUITE_P(Prefix, IdemAsyncStoreConformance, ::testing::Types<Factory>)
