// The IdempotencyRecorder conformance suite: what every recorder must do, as GoogleTest tests.
//
// Every recorder idem ships passes this suite (memory, SQLite file and :memory:, ...), and users
// can run it against their own recorder. It checks the contract written in idem/recorder.hpp:
// check/mark (single and in batches), consumer isolation (fanout), key validation, claims with
// leases and fencing tokens, lease takeover and renewal, purge by age (with progress and
// count_purgeable, purgeable_markers), the operator views consumer_counts() and inspect(), races
// between threads, and the transactional inbox.
//
// How to use it — a factory type and one macro, in a test file linked with gtest_main:
//
//   #include "idem/testing/recorder_conformance.hpp"
//
//   struct MyRecorderFactory {
//     static constexpr bool kSupportsClaims = true;         // what the recorder must report
//     static constexpr bool kSupportsTransactions = false;  // from supports_*()
//     // Optional: how many distinct ids the race tests use (default 200).
//     // static constexpr int kConcurrentIds = 50;
//
//     // Called once per test with a fresh ManualClock. The recorder must take ALL its time
//     // from this clock (marker timestamps, lease deadlines) — the tests move time with
//     // clock->advance() to expire leases and age markers. make() may be static or not.
//     std::shared_ptr<idem::IdempotencyRecorder> make(
//         std::shared_ptr<idem::testing::ManualClock> clock);
//   };
//   INSTANTIATE_RECORDER_CONFORMANCE(MyRecorder, MyRecorderFactory);
//
// The factory is default-constructed once per test and destroyed after the recorder, so its
// constructor/destructor can create and remove a temporary database file. Instantiate the macro
// once per configuration with different prefixes (e.g. SqliteFile, SqliteMemory). Tests live in
// the global test suite IdemRecorderConformance, so the macro can be used in any namespace.
//
// Capabilities: tests of claims (exclusive mode) and run_transactional (transactional mode) are
// skipped with GTEST_SKIP, naming the capability, when the factory declares the recorder does
// not support them. A separate test checks that the recorder reports exactly what the factory
// declares, so a recorder cannot skip a test by forgetting to advertise a capability.
//
// Thread-safety: the race tests start 8 threads on one recorder; run the suite under
// ThreadSanitizer to check a recorder's locking.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/key.hpp"
#include "idem/recorder.hpp"
#include "idem/testing/keys.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::testing::detail {

template <class Factory>
constexpr int concurrent_ids() {
  if constexpr (requires { Factory::kConcurrentIds; }) {
    return Factory::kConcurrentIds;
  } else {
    return 200;
  }
}

// The race cases: 8 threads released at once each call `each(t, i)` (t: the thread, 0-7) for every
// index i below `ids`, even threads walking forward and odd ones backward so they meet mid-way.
// Returns how many calls threw.
template <class Each>
int race_over_ids(std::size_t ids, Each&& each) {
  constexpr int kThreads = 8;
  std::atomic<int> thrown{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (std::size_t n = 0; n < ids; ++n) {
        const std::size_t i = (t % 2 == 0) ? n : ids - 1 - n;
        try {
          each(t, i);
        } catch (...) {
          thrown.fetch_add(1);
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  return thrown.load();
}

inline std::string upper(std::string s) {
  for (char& c : s) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return s;
}

}  // namespace idem::testing::detail

template <class Factory>
class IdemRecorderConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    clock_ = std::make_shared<idem::testing::ManualClock>();
    recorder_ = factory_.make(clock_);
    ASSERT_NE(recorder_, nullptr) << "the factory returned no recorder";
  }

  // Every marker in the recorder, counted by purging them all (so call it last).
  std::size_t count_and_purge_all_markers() {
    clock_->advance(std::chrono::hours(24 * 365));
    return recorder_->purge(std::chrono::hours(1));
  }

  idem::WallTime now() const { return clock_->wall_now(); }

  Factory factory_;  // declared first: destroyed after the recorder (temp files, ...)
  std::shared_ptr<idem::testing::ManualClock> clock_;
  std::shared_ptr<idem::IdempotencyRecorder> recorder_;
};

#define IDEM_CONFORMANCE_REQUIRE_CLAIMS()                                                  \
  do {                                                                                     \
    if (!TypeParam::kSupportsClaims)                                                       \
      GTEST_SKIP() << "capability: the recorder does not support claims (exclusive mode)"; \
  } while (false)

#define IDEM_CONFORMANCE_REQUIRE_TRANSACTIONS()                                      \
  do {                                                                               \
    if (!TypeParam::kSupportsTransactions)                                           \
      GTEST_SKIP() << "capability: the recorder does not support run_transactional " \
                      "(transactional mode)";                                        \
  } while (false)

TYPED_TEST_SUITE_P(IdemRecorderConformance);

// ---- capabilities -------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, ReportsDeclaredCapabilities) {
  EXPECT_EQ(this->recorder_->supports_claims(), TypeParam::kSupportsClaims);
  EXPECT_EQ(this->recorder_->supports_transactions(), TypeParam::kSupportsTransactions);
}

// ---- check / mark -------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, UnprocessedEventIsNotProcessed) {
  EXPECT_FALSE(this->recorder_->is_processed("billing", idem::new_event_id()));
  EXPECT_FALSE(this->recorder_->is_processed("billing", "never-seen"));
}

TYPED_TEST_P(IdemRecorderConformance, MarkThenProcessed) {
  const std::string id = idem::new_event_id();
  this->recorder_->mark_processed("billing", id);
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
  EXPECT_FALSE(this->recorder_->is_processed("billing", idem::new_event_id()));
}

TYPED_TEST_P(IdemRecorderConformance, RepeatedMarksAreHarmless) {
  const std::string id = idem::new_event_id();
  for (int i = 0; i < 3; ++i) {
    EXPECT_NO_THROW(this->recorder_->mark_processed("billing", id));
    this->clock_->advance(std::chrono::seconds(1));
  }
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
  EXPECT_EQ(this->count_and_purge_all_markers(), 1u) << "a repeated mark must not add a marker";
}

TYPED_TEST_P(IdemRecorderConformance, ConsumersAreIsolated) {
  // Fanout: one event, several consumers, each with its own marker.
  const std::string id = idem::new_event_id();
  this->recorder_->mark_processed("billing", id);
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
  EXPECT_FALSE(this->recorder_->is_processed("shipping", id));
  EXPECT_FALSE(this->recorder_->is_processed("Billing", id)) << "consumer names are exact";
  this->recorder_->mark_processed("shipping", id);
  EXPECT_TRUE(this->recorder_->is_processed("shipping", id));
  EXPECT_EQ(this->count_and_purge_all_markers(), 2u);
}

TYPED_TEST_P(IdemRecorderConformance, DistinctKeysDoNotCollide) {
  // A backend that concatenates consumer and id, folds case or packs uuids must keep these
  // apart.
  this->recorder_->mark_processed("a", "bc");
  EXPECT_FALSE(this->recorder_->is_processed("ab", "c"));
  EXPECT_FALSE(this->recorder_->is_processed("a:b", "c"));

  this->recorder_->mark_processed("c", "event");
  EXPECT_FALSE(this->recorder_->is_processed("c", "EVENT"));
  EXPECT_FALSE(this->recorder_->is_processed("c", "even"));
  EXPECT_FALSE(this->recorder_->is_processed("c", "events"));

  const std::string uuid = idem::new_event_id();
  this->recorder_->mark_processed("c", uuid);
  EXPECT_TRUE(this->recorder_->is_processed("c", uuid));
  EXPECT_FALSE(this->recorder_->is_processed("c", idem::testing::detail::upper(uuid)));
  EXPECT_FALSE(this->recorder_->is_processed("c", uuid.substr(0, 31)));
  EXPECT_FALSE(this->recorder_->is_processed("c", uuid + "0"));

  // 32 hex characters that are not a version-4 uuid are ordinary keys too.
  const std::string hex32(32, '0');
  const std::string hex32_upper(32, 'F');
  this->recorder_->mark_processed("c", hex32);
  this->recorder_->mark_processed("c", hex32_upper);
  EXPECT_TRUE(this->recorder_->is_processed("c", hex32));
  EXPECT_TRUE(this->recorder_->is_processed("c", hex32_upper));
  EXPECT_FALSE(this->recorder_->is_processed("c", std::string(32, 'f')));
  EXPECT_EQ(this->count_and_purge_all_markers(), 5u);
}

TYPED_TEST_P(IdemRecorderConformance, UnusualValidKeysWork) {
  const auto keys = idem::testing::unusual_valid_keys();
  for (const auto& key : keys) {
    SCOPED_TRACE("key: " + key.substr(0, 40));
    EXPECT_FALSE(this->recorder_->is_processed("consumer", key));
    this->recorder_->mark_processed("consumer", key);
    EXPECT_TRUE(this->recorder_->is_processed("consumer", key));
    // The same text as a consumer name.
    EXPECT_FALSE(this->recorder_->is_processed(key, "event-1"));
    this->recorder_->mark_processed(key, "event-1");
    EXPECT_TRUE(this->recorder_->is_processed(key, "event-1"));
  }
  EXPECT_EQ(this->count_and_purge_all_markers(), 2 * keys.size());
}

TYPED_TEST_P(IdemRecorderConformance, InvalidKeysAreRejectedAndNothingMarked) {
  auto& recorder = *this->recorder_;
  const std::string good = idem::new_event_id();
  const auto lease = std::chrono::seconds(30);
  bool ran = false;
  const auto fn = [&](idem::Transaction&) { ran = true; };
  for (const auto& bad : idem::testing::invalid_keys()) {
    SCOPED_TRACE("bad key of " + std::to_string(bad.size()) + " bytes");
    EXPECT_THROW(static_cast<void>(recorder.is_processed(bad, good)), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(recorder.is_processed("consumer", bad)), idem::InvalidKey);
    EXPECT_THROW(recorder.mark_processed(bad, good), idem::InvalidKey);
    EXPECT_THROW(recorder.mark_processed("consumer", bad), idem::InvalidKey);
    if (TypeParam::kSupportsClaims) {
      EXPECT_THROW(static_cast<void>(recorder.claim(bad, good, lease)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.claim("consumer", bad, lease)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.complete(bad, good, 1)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.complete("consumer", bad, 1)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.release(bad, good, 1)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.release("consumer", bad, 1)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.renew(bad, good, 1, lease)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.renew("consumer", bad, 1, lease)), idem::InvalidKey);
    }
    if (TypeParam::kSupportsTransactions) {
      EXPECT_THROW(static_cast<void>(recorder.run_transactional(bad, good, fn)), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.run_transactional("consumer", bad, fn)),
                   idem::InvalidKey);
    }
  }
  EXPECT_FALSE(ran) << "run_transactional ran the handler for an invalid key";
  EXPECT_FALSE(recorder.is_processed("consumer", good));
  if (TypeParam::kSupportsClaims) {
    // No claim was left behind on the valid half of a bad pair.
    EXPECT_EQ(recorder.claim("consumer", good, lease).status, idem::Claim::Status::acquired);
  }
  EXPECT_EQ(this->count_and_purge_all_markers(), 0u);
}

TYPED_TEST_P(IdemRecorderConformance, InvalidKeyErrorNamesWhatWasWrong) {
  try {
    this->recorder_->mark_processed("", "event");
    FAIL() << "an empty consumer was accepted";
  } catch (const idem::InvalidKey& e) {
    EXPECT_EQ(e.code(), idem::ErrorCode::invalid_key);
    EXPECT_NE(std::string(e.what()).find("consumer"), std::string::npos) << e.what();
  }
  try {
    this->recorder_->mark_processed("billing", "");
    FAIL() << "an empty event id was accepted";
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("event id"), std::string::npos) << e.what();
  }
}

// ---- retention ----------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, PurgeRemovesOnlyOldMarkers) {
  using std::chrono::hours;
  const std::string old_id = idem::new_event_id();
  const std::string new_id = idem::new_event_id();
  this->recorder_->mark_processed("billing", old_id);
  this->recorder_->mark_processed("shipping", old_id);
  this->clock_->advance(hours(3));
  this->recorder_->mark_processed("billing", new_id);
  this->clock_->advance(hours(1));
  // old markers are 4h old, the new one 1h.
  EXPECT_EQ(this->recorder_->purge(hours(2)), 2u);
  EXPECT_FALSE(this->recorder_->is_processed("billing", old_id));
  EXPECT_FALSE(this->recorder_->is_processed("shipping", old_id));
  EXPECT_TRUE(this->recorder_->is_processed("billing", new_id));
  EXPECT_EQ(this->recorder_->purge(hours(2)), 0u) << "nothing else is old enough";
  EXPECT_TRUE(this->recorder_->is_processed("billing", new_id));
  // A purged event counts as unprocessed and can be marked again.
  this->recorder_->mark_processed("billing", old_id);
  EXPECT_TRUE(this->recorder_->is_processed("billing", old_id));
}

TYPED_TEST_P(IdemRecorderConformance, PurgeKeepsLiveClaims) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  using std::chrono::hours;
  const std::string id = idem::new_event_id();
  const auto claim = this->recorder_->claim("billing", id, hours(10));
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  this->clock_->advance(hours(3));
  EXPECT_EQ(this->recorder_->purge(hours(1)), 0u) << "a claim is not a marker";
  EXPECT_EQ(this->recorder_->claim("billing", id, hours(1)).status,
            idem::Claim::Status::in_progress);
  EXPECT_TRUE(this->recorder_->complete("billing", id, claim.token));
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
}

TYPED_TEST_P(IdemRecorderConformance, PurgeReportsProgressUpToItsTotal) {
  using std::chrono::hours;
  constexpr int kOld = 30;
  for (int i = 0; i < kOld; ++i)
    this->recorder_->mark_processed(i % 2 == 0 ? "billing" : "shipping",
                                    "old-" + std::to_string(i));
  this->clock_->advance(hours(3));
  this->recorder_->mark_processed("billing", "young");

  std::vector<std::size_t> calls;
  const idem::PurgeProgress record = [&](std::size_t done) { calls.push_back(done); };
  EXPECT_EQ(this->recorder_->count_purgeable(hours(4)), 0u);
  EXPECT_EQ(this->recorder_->purge(hours(4), record), 0u);
  EXPECT_TRUE(calls.empty()) << "nothing deleted, nothing reported";

  EXPECT_EQ(this->recorder_->count_purgeable(hours(2)), static_cast<std::size_t>(kOld))
      << "count_purgeable() is what purge() will delete";
  const idem::PurgeableMarkers split = this->recorder_->purgeable_markers(hours(2));
  EXPECT_EQ(split.old, static_cast<std::uint64_t>(kOld)) << "purgeable_markers() agrees";
  EXPECT_EQ(split.unreadable, 0u) << "every time idem wrote itself is readable";
  if (!split.consumers.empty()) {
    ASSERT_EQ(split.consumers.size(), 2u);
    EXPECT_EQ(split.consumers[0].consumer, "billing");
    EXPECT_EQ(split.consumers[0].old, static_cast<std::uint64_t>(kOld / 2));
    EXPECT_EQ(split.consumers[1].consumer, "shipping");
    EXPECT_EQ(split.consumers[1].old, static_cast<std::uint64_t>(kOld / 2));
  }
  EXPECT_THROW(static_cast<void>(this->recorder_->purgeable_markers(-hours(1))),
               idem::InvalidArgument);
  const std::size_t purged = this->recorder_->purge(hours(2), record);
  EXPECT_EQ(purged, static_cast<std::size_t>(kOld));
  ASSERT_FALSE(calls.empty()) << "a purge that deleted something reports it";
  for (std::size_t i = 1; i < calls.size(); ++i)
    EXPECT_LT(calls[i - 1], calls[i]) << "progress only grows (call " << i << ")";
  EXPECT_EQ(calls.back(), purged) << "the last report is the total";
  EXPECT_TRUE(this->recorder_->is_processed("billing", "young"));
  EXPECT_FALSE(this->recorder_->is_processed("billing", "old-0"));
  EXPECT_EQ(this->recorder_->count_purgeable(hours(2)), 0u);
  EXPECT_THROW(static_cast<void>(this->recorder_->count_purgeable(-hours(1))),
               idem::InvalidArgument);
  EXPECT_THROW(this->recorder_->purge(-hours(1), record), idem::InvalidArgument);

  // An empty callback is allowed, and a callback that throws stops the purge with its error.
  this->clock_->advance(hours(3));
  EXPECT_THROW(this->recorder_->purge(hours(1), [](std::size_t) { throw std::runtime_error("x"); }),
               std::runtime_error);
  EXPECT_FALSE(this->recorder_->is_processed("billing", "young"));
  EXPECT_EQ(this->recorder_->purge(hours(1), idem::PurgeProgress{}), 0u);
}

TYPED_TEST_P(IdemRecorderConformance, PurgeRacingWithMarksKeepsEveryNewMarker) {
  using std::chrono::hours;
  constexpr int kOld = 40;
  constexpr int kThreads = 4;
  constexpr int kPerThread = 25;
  for (int i = 0; i < kOld; ++i)
    this->recorder_->mark_processed("billing", "old-" + std::to_string(i));
  this->clock_->advance(hours(3));
  std::latch start(kThreads + 1);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kPerThread; ++i)
        this->recorder_->mark_processed("billing", "new-" + std::to_string(t * kPerThread + i));
    });
  }
  std::size_t reported = 0;
  start.arrive_and_wait();
  const std::size_t purged =
      this->recorder_->purge(hours(1), [&](std::size_t done) { reported = done; });
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(purged, static_cast<std::size_t>(kOld));
  EXPECT_EQ(reported, purged);
  for (int i = 0; i < kThreads * kPerThread; ++i)
    EXPECT_TRUE(this->recorder_->is_processed("billing", "new-" + std::to_string(i))) << i;
  const auto counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].processed, static_cast<std::uint64_t>(kThreads * kPerThread));
}

// ---- operator views -----------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, ConsumerCountsAreSortedPerConsumer) {
  EXPECT_TRUE(this->recorder_->consumer_counts().empty());
  for (int i = 0; i < 3; ++i)
    this->recorder_->mark_processed("shipping", "s-" + std::to_string(i));
  this->recorder_->mark_processed("billing", "b-0");
  this->recorder_->mark_processed("billing", "b-0");  // a repeated mark is one marker
  this->recorder_->mark_processed("it's", "q");       // a name SQL must quote
  const auto counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 3u);
  EXPECT_EQ(counts[0].consumer, "billing");
  EXPECT_EQ(counts[0].processed, 1u);
  EXPECT_EQ(counts[1].consumer, "it's");
  EXPECT_EQ(counts[1].processed, 1u);
  EXPECT_EQ(counts[2].consumer, "shipping");
  EXPECT_EQ(counts[2].processed, 3u);
  for (const auto& c : counts)
    EXPECT_EQ(c.in_progress, 0u) << c.consumer;
}

TYPED_TEST_P(IdemRecorderConformance, InspectShowsTheMarkerAndItsTime) {
  const idem::MarkerInspection nothing = this->recorder_->inspect("billing", "never-seen");
  EXPECT_FALSE(nothing.processed);
  EXPECT_FALSE(nothing.processed_at.has_value());
  EXPECT_FALSE(nothing.claim.has_value());

  const idem::WallTime marked = this->now();
  this->recorder_->mark_processed("billing", "e1");
  this->clock_->advance(std::chrono::minutes(5));
  const idem::MarkerInspection seen = this->recorder_->inspect("billing", "e1");
  EXPECT_TRUE(seen.processed);
  ASSERT_TRUE(seen.processed_at.has_value());
  // Backends keep the time to the millisecond or better.
  EXPECT_LE(*seen.processed_at, marked);
  EXPECT_GT(*seen.processed_at, marked - std::chrono::milliseconds(1));
  EXPECT_FALSE(seen.claim.has_value());
  EXPECT_FALSE(this->recorder_->inspect("shipping", "e1").processed) << "consumers are isolated";

  for (const std::string& bad : idem::testing::invalid_keys()) {
    EXPECT_THROW(static_cast<void>(this->recorder_->inspect(bad, "e1")), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->recorder_->inspect("billing", bad)), idem::InvalidKey);
  }
}

TYPED_TEST_P(IdemRecorderConformance, InspectAndCountsShowOpenClaims) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  using std::chrono::seconds;
  const auto claim = this->recorder_->claim("billing", "e1", seconds(10));
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  this->recorder_->mark_processed("billing", "e0");

  idem::MarkerInspection seen = this->recorder_->inspect("billing", "e1");
  EXPECT_FALSE(seen.processed);
  ASSERT_TRUE(seen.claim.has_value());
  EXPECT_EQ(seen.claim->token, claim.token);
  EXPECT_EQ(seen.claim->lease_until, claim.lease_until);
  EXPECT_TRUE(seen.claim->live);
  auto counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].consumer, "billing");
  EXPECT_EQ(counts[0].processed, 1u);
  EXPECT_EQ(counts[0].in_progress, 1u);

  this->clock_->advance(seconds(10));  // the lease ends exactly now: the claim is no longer live
  seen = this->recorder_->inspect("billing", "e1");
  ASSERT_TRUE(seen.claim.has_value()) << "a lapsed claim stays until taken over or purged";
  EXPECT_FALSE(seen.claim->live);
  counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].in_progress, 0u);

  ASSERT_TRUE(this->recorder_->complete("billing", "e1", claim.token));
  seen = this->recorder_->inspect("billing", "e1");
  EXPECT_TRUE(seen.processed);
  EXPECT_FALSE(seen.claim.has_value()) << "a completed claim is a marker, not an open claim";
}

// ---- claims -------------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, ClaimAcquiresWithLease) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  const std::string id = idem::new_event_id();
  const auto lease = std::chrono::milliseconds(30'000);
  const auto start = this->now();
  const auto claim = this->recorder_->claim("billing", id, lease);
  EXPECT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_FALSE(claim.took_over);
  EXPECT_LT(std::chrono::abs(claim.lease_until - (start + lease)), std::chrono::milliseconds(1))
      << "lease_until must be the clock's now + lease";
  EXPECT_FALSE(this->recorder_->is_processed("billing", id)) << "a claim is not a marker";
  // Claims are per consumer too.
  EXPECT_EQ(this->recorder_->claim("shipping", id, lease).status, idem::Claim::Status::acquired);
}

TYPED_TEST_P(IdemRecorderConformance, SecondClaimIsInProgress) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  const std::string id = idem::new_event_id();
  const auto lease = std::chrono::milliseconds(30'000);
  const auto first = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(first.status, idem::Claim::Status::acquired);
  this->clock_->advance(std::chrono::seconds(10));
  const auto second = this->recorder_->claim("billing", id, lease);
  EXPECT_EQ(second.status, idem::Claim::Status::in_progress);
  EXPECT_LT(std::chrono::abs(second.lease_until - first.lease_until), std::chrono::milliseconds(1))
      << "in_progress reports when the holder's lease ends";
  // The refused claim did not disturb the holder.
  EXPECT_TRUE(this->recorder_->complete("billing", id, first.token));
}

TYPED_TEST_P(IdemRecorderConformance, CompleteMarksProcessed) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  const std::string id = idem::new_event_id();
  const auto lease = std::chrono::seconds(30);
  const auto claim = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(this->recorder_->complete("billing", id, claim.token));
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
  EXPECT_EQ(this->recorder_->claim("billing", id, lease).status, idem::Claim::Status::processed);
  // Long after any lease, a processed event stays processed.
  this->clock_->advance(std::chrono::hours(1));
  EXPECT_EQ(this->recorder_->claim("billing", id, lease).status, idem::Claim::Status::processed);
  // A marker written by mark_processed is seen by claim() too.
  const std::string marked = idem::new_event_id();
  this->recorder_->mark_processed("billing", marked);
  EXPECT_EQ(this->recorder_->claim("billing", marked, lease).status,
            idem::Claim::Status::processed);
  EXPECT_EQ(this->count_and_purge_all_markers(), 2u);
}

TYPED_TEST_P(IdemRecorderConformance, ReleaseLetsTheNextClaimAcquire) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  const std::string id = idem::new_event_id();
  const auto lease = std::chrono::seconds(30);
  const auto first = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(first.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(this->recorder_->release("billing", id, first.token));
  EXPECT_FALSE(this->recorder_->is_processed("billing", id)) << "release does not mark";
  const auto second = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(second.status, idem::Claim::Status::acquired);
  EXPECT_GT(second.token, first.token) << "tokens for one key only grow";
  EXPECT_FALSE(second.took_over) << "a released claim is not a takeover";
  EXPECT_FALSE(this->recorder_->complete("billing", id, first.token))
      << "the released token is stale";
  EXPECT_TRUE(this->recorder_->complete("billing", id, second.token));
}

TYPED_TEST_P(IdemRecorderConformance, StaleTokensAreRefusedAndChangeNothing) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  using std::chrono::seconds;
  const std::string id = idem::new_event_id();
  const auto lease = seconds(30);

  // No claim at all: nothing to complete, release or renew.
  EXPECT_FALSE(this->recorder_->complete("billing", id, 1));
  EXPECT_FALSE(this->recorder_->release("billing", id, 1));
  EXPECT_FALSE(this->recorder_->renew("billing", id, 1, lease));
  EXPECT_FALSE(this->recorder_->is_processed("billing", id));

  const auto claim = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  for (const std::uint64_t wrong : {claim.token + 1, claim.token + 1000}) {
    EXPECT_FALSE(this->recorder_->complete("billing", id, wrong));
    EXPECT_FALSE(this->recorder_->release("billing", id, wrong));
    EXPECT_FALSE(this->recorder_->renew("billing", id, wrong, std::chrono::hours(1)));
  }
  if (claim.token > 0) {
    EXPECT_FALSE(this->recorder_->complete("billing", id, claim.token - 1));
  }
  EXPECT_FALSE(this->recorder_->is_processed("billing", id)) << "a stale complete marked";
  // The wrong renew did not extend the lease: the claim still ends at its original time.
  this->clock_->advance(seconds(31));
  const auto takeover = this->recorder_->claim("billing", id, lease);
  EXPECT_EQ(takeover.status, idem::Claim::Status::acquired) << "a stale renew extended the lease";
  EXPECT_TRUE(takeover.took_over);
}

TYPED_TEST_P(IdemRecorderConformance, ExpiredLeaseIsTakenOverAndOldTokenFenced) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  using std::chrono::seconds;
  const std::string id = idem::new_event_id();
  const auto lease = seconds(10);
  const auto crashed = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(crashed.status, idem::Claim::Status::acquired);

  this->clock_->advance(seconds(9));
  EXPECT_EQ(this->recorder_->claim("billing", id, lease).status, idem::Claim::Status::in_progress)
      << "the lease has not passed yet";

  this->clock_->advance(seconds(2));  // 11s: the first owner's lease has passed
  const auto successor = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(successor.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(successor.took_over);
  EXPECT_GT(successor.token, crashed.token);
  EXPECT_LT(std::chrono::abs(successor.lease_until - (this->now() + lease)),
            std::chrono::milliseconds(1));

  // The old owner wakes up: all its calls are fenced off and change nothing.
  EXPECT_FALSE(this->recorder_->renew("billing", id, crashed.token, lease));
  EXPECT_FALSE(this->recorder_->complete("billing", id, crashed.token));
  EXPECT_FALSE(this->recorder_->release("billing", id, crashed.token));
  EXPECT_FALSE(this->recorder_->is_processed("billing", id));
  EXPECT_EQ(this->recorder_->claim("billing", id, lease).status, idem::Claim::Status::in_progress)
      << "the old owner's release must not drop the successor's claim";

  EXPECT_TRUE(this->recorder_->complete("billing", id, successor.token));
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
}

TYPED_TEST_P(IdemRecorderConformance, RenewExtendsTheLease) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  using std::chrono::seconds;
  const std::string id = idem::new_event_id();
  const auto lease = seconds(10);
  const auto claim = this->recorder_->claim("billing", id, lease);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);

  this->clock_->advance(seconds(8));
  EXPECT_TRUE(this->recorder_->renew("billing", id, claim.token, lease));  // now ends at 18s
  this->clock_->advance(seconds(5));                                       // 13s: past 10s
  const auto during = this->recorder_->claim("billing", id, lease);
  EXPECT_EQ(during.status, idem::Claim::Status::in_progress) << "renew did not extend the lease";
  EXPECT_LT(std::chrono::abs(during.lease_until - (claim.lease_until + seconds(8))),
            std::chrono::milliseconds(1));

  this->clock_->advance(seconds(4));  // 17s: renew again, now ends at 27s
  EXPECT_TRUE(this->recorder_->renew("billing", id, claim.token, lease));
  this->clock_->advance(seconds(9));  // 26s
  EXPECT_EQ(this->recorder_->claim("billing", id, lease).status, idem::Claim::Status::in_progress);

  this->clock_->advance(seconds(2));  // 28s: the renewed lease has passed
  const auto takeover = this->recorder_->claim("billing", id, lease);
  EXPECT_EQ(takeover.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(takeover.took_over);
  EXPECT_GT(takeover.token, claim.token);
}

// ---- races --------------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, ConcurrentClaimsAcquireOncePerId) {
  IDEM_CONFORMANCE_REQUIRE_CLAIMS();
  const auto ids =
      idem::testing::fresh_event_ids(idem::testing::detail::concurrent_ids<TypeParam>());
  std::vector<std::atomic<int>> acquired(ids.size());
  std::atomic<int> errors{0};
  errors += idem::testing::detail::race_over_ids(ids.size(), [&](int, std::size_t i) {
    const auto claim = this->recorder_->claim("billing", ids[i], std::chrono::hours(1));
    if (claim.status == idem::Claim::Status::acquired) {
      acquired[i].fetch_add(1);
      // Every other winner completes, the rest keep holding the claim.
      if (i % 2 == 0 && !this->recorder_->complete("billing", ids[i], claim.token)) {
        errors.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(errors.load(), 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(acquired[i].load(), 1)
        << "id #" << i << " was acquired " << acquired[i].load() << " times";
    EXPECT_EQ(this->recorder_->is_processed("billing", ids[i]), i % 2 == 0);
  }
}

TYPED_TEST_P(IdemRecorderConformance, ConcurrentMarksAreSafe) {
  const auto ids =
      idem::testing::fresh_event_ids(idem::testing::detail::concurrent_ids<TypeParam>());
  std::atomic<int> errors{0};
  errors += idem::testing::detail::race_over_ids(ids.size(), [&](int t, std::size_t i) {
    // Two consumers share the ids: fanout under contention.
    const char* consumer = (t % 4 < 2) ? "billing" : "shipping";
    (void)this->recorder_->is_processed(consumer, ids[i]);
    this->recorder_->mark_processed(consumer, ids[i]);
    if (!this->recorder_->is_processed(consumer, ids[i])) errors.fetch_add(1);
  });
  EXPECT_EQ(errors.load(), 0);
  for (const auto& id : ids) {
    EXPECT_TRUE(this->recorder_->is_processed("billing", id));
    EXPECT_TRUE(this->recorder_->is_processed("shipping", id));
  }
  EXPECT_EQ(this->count_and_purge_all_markers(), 2 * ids.size());
}

// ---- batches (is_processed_many / mark_processed_many) ------------------------------------

TYPED_TEST_P(IdemRecorderConformance, BatchOfNoIdsReadsAndMarksNothing) {
  const std::vector<std::string> none;
  EXPECT_TRUE(this->recorder_->is_processed_many("billing", none).empty());
  EXPECT_NO_THROW(this->recorder_->mark_processed_many("billing", none));
  EXPECT_TRUE(this->recorder_->consumer_counts().empty());
  EXPECT_EQ(this->count_and_purge_all_markers(), 0u);
}

TYPED_TEST_P(IdemRecorderConformance, BatchCheckAnswersEveryIdInOrder) {
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i)
    ids.push_back(i % 3 == 2 ? "text-" + std::to_string(i) : idem::new_event_id());
  // Processed: #1, #2 (a text id) and #4; the others never seen.
  for (int i : {1, 2, 4})
    this->recorder_->mark_processed("billing", ids[static_cast<std::size_t>(i)]);
  const std::vector<bool> expected = {false, true, true, false, true, false};
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids), expected);
  // Reversed order, reversed answers.
  const std::vector<std::string> reversed(ids.rbegin(), ids.rend());
  EXPECT_EQ(this->recorder_->is_processed_many("billing", reversed),
            std::vector<bool>(expected.rbegin(), expected.rend()));
  // One id alone.
  EXPECT_EQ(this->recorder_->is_processed_many("billing", std::span(ids).subspan(1, 1)),
            std::vector<bool>{true});
}

TYPED_TEST_P(IdemRecorderConformance, BatchMarkIsSeenBySingleAndBatchChecks) {
  std::vector<std::string> ids = {idem::new_event_id(), "order-17", idem::new_event_id()};
  const idem::WallTime marked = this->now();
  this->recorder_->mark_processed_many("billing", ids);
  for (const auto& id : ids)
    EXPECT_TRUE(this->recorder_->is_processed("billing", id)) << id;
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids), std::vector<bool>(3, true));
  EXPECT_FALSE(this->recorder_->is_processed("billing", idem::new_event_id()));
  // A batch mark is an ordinary marker: inspect, counts and purge see it as one.
  this->clock_->advance(std::chrono::minutes(5));
  const idem::MarkerInspection seen = this->recorder_->inspect("billing", ids[1]);
  EXPECT_TRUE(seen.processed);
  ASSERT_TRUE(seen.processed_at.has_value());
  EXPECT_LE(*seen.processed_at, marked);
  EXPECT_GT(*seen.processed_at, marked - std::chrono::milliseconds(1));
  const auto counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].consumer, "billing");
  EXPECT_EQ(counts[0].processed, 3u);
  EXPECT_EQ(counts[0].in_progress, 0u);
  // Marking the batch again (and a single mark of one of it) adds nothing.
  this->recorder_->mark_processed_many("billing", ids);
  this->recorder_->mark_processed("billing", ids[0]);
  EXPECT_EQ(this->count_and_purge_all_markers(), 3u);
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids), std::vector<bool>(3, false));
}

TYPED_TEST_P(IdemRecorderConformance, BatchWithRepeatedIdsIsHarmless) {
  const std::string a = idem::new_event_id();
  const std::string b = "it's-b";
  const std::vector<std::string> marks = {a, b, a, a, b};
  EXPECT_NO_THROW(this->recorder_->mark_processed_many("billing", marks));
  const std::vector<std::string> checks = {a, a, "never", b, a};
  EXPECT_EQ(this->recorder_->is_processed_many("billing", checks),
            (std::vector<bool>{true, true, false, true, true}));
  EXPECT_EQ(this->count_and_purge_all_markers(), 2u) << "a repeated id is one marker";
}

TYPED_TEST_P(IdemRecorderConformance, BatchesKeepConsumersApart) {
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i)
    ids.push_back(idem::new_event_id());
  this->recorder_->mark_processed_many("billing", ids);
  EXPECT_EQ(this->recorder_->is_processed_many("shipping", ids), std::vector<bool>(5, false));
  EXPECT_EQ(this->recorder_->is_processed_many("Billing", ids), std::vector<bool>(5, false));
  this->recorder_->mark_processed_many("shipping", std::span(ids).first(2));
  EXPECT_EQ(this->recorder_->is_processed_many("shipping", ids),
            (std::vector<bool>{true, true, false, false, false}));
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids), std::vector<bool>(5, true));
  const auto counts = this->recorder_->consumer_counts();
  ASSERT_EQ(counts.size(), 2u);
  EXPECT_EQ(counts[0].consumer, "billing");
  EXPECT_EQ(counts[0].processed, 5u);
  EXPECT_EQ(counts[1].consumer, "shipping");
  EXPECT_EQ(counts[1].processed, 2u);
}

TYPED_TEST_P(IdemRecorderConformance, BatchWithAnInvalidKeyReadsAndMarksNothing) {
  auto& recorder = *this->recorder_;
  const std::string good = idem::new_event_id();
  const std::string other = "order-1";
  for (const auto& bad : idem::testing::invalid_keys()) {
    SCOPED_TRACE("bad key of " + std::to_string(bad.size()) + " bytes");
    // First, in the middle, last: nothing of the batch may be written.
    for (const std::vector<std::string>& batch :
         {std::vector<std::string>{bad, good, other}, std::vector<std::string>{good, bad, other},
          std::vector<std::string>{good, other, bad}}) {
      EXPECT_THROW(recorder.mark_processed_many("consumer", batch), idem::InvalidKey);
      EXPECT_THROW(static_cast<void>(recorder.is_processed_many("consumer", batch)),
                   idem::InvalidKey);
    }
    const std::vector<std::string> valid = {good, other};
    EXPECT_THROW(recorder.mark_processed_many(bad, valid), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(recorder.is_processed_many(bad, valid)), idem::InvalidKey);
    // A bad consumer is refused even with no ids.
    EXPECT_THROW(recorder.mark_processed_many(bad, std::vector<std::string>{}), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(recorder.is_processed_many(bad, std::vector<std::string>{})),
                 idem::InvalidKey);
  }
  try {
    recorder.mark_processed_many("billing", std::vector<std::string>{good, ""});
    FAIL() << "an empty event id in a batch was accepted";
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("event id"), std::string::npos) << e.what();
  }
  try {
    recorder.mark_processed_many("", std::vector<std::string>{good});
    FAIL() << "an empty consumer was accepted";
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("consumer"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(recorder.is_processed("consumer", good));
  EXPECT_FALSE(recorder.is_processed("consumer", other));
  EXPECT_EQ(this->count_and_purge_all_markers(), 0u);
}

TYPED_TEST_P(IdemRecorderConformance, BatchLargerThanAnyChunkWorks) {
  // Larger than the chunk of every idem backend (SQLite 512, Redis 512, PostgreSQL 1,000).
  constexpr std::size_t kIds = 1500;
  std::vector<std::string> ids;
  for (std::size_t i = 0; i < kIds; ++i)
    ids.push_back(i % 5 == 0 ? "text-" + std::to_string(i) : idem::new_event_id());
  std::vector<std::string> every_third;
  for (std::size_t i = 0; i < kIds; i += 3)
    every_third.push_back(ids[i]);
  this->recorder_->mark_processed_many("billing", every_third);
  const std::vector<bool> seen = this->recorder_->is_processed_many("billing", ids);
  ASSERT_EQ(seen.size(), kIds);
  for (std::size_t i = 0; i < kIds; ++i)
    ASSERT_EQ(seen[i], i % 3 == 0) << "id #" << i;
  this->recorder_->mark_processed_many("billing", ids);
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids), std::vector<bool>(kIds, true));
  EXPECT_TRUE(this->recorder_->is_processed("billing", ids.back()));
  EXPECT_EQ(this->count_and_purge_all_markers(), kIds);
}

TYPED_TEST_P(IdemRecorderConformance, BatchesOfUnusualValidKeysWork) {
  const auto keys = idem::testing::unusual_valid_keys();
  // Characters an array literal or a key separator would have to escape, too.
  std::vector<std::string> ids = keys;
  for (const char* extra : {"a,b", "{x}", "\"", "\\", "NULL", "a\\\"b,{c}"})
    ids.emplace_back(extra);
  EXPECT_EQ(this->recorder_->is_processed_many("consumer", ids),
            std::vector<bool>(ids.size(), false));
  this->recorder_->mark_processed_many("consumer", ids);
  EXPECT_EQ(this->recorder_->is_processed_many("consumer", ids),
            std::vector<bool>(ids.size(), true));
  for (const auto& id : ids)
    EXPECT_TRUE(this->recorder_->is_processed("consumer", id)) << id.substr(0, 40);
  // Near misses of those keys stay unmarked.
  const std::vector<std::string> near = {"it", "a", "b", "{x", "NUL", "null", "a,", "x"};
  EXPECT_EQ(this->recorder_->is_processed_many("consumer", near),
            std::vector<bool>(near.size(), false));
  // The same texts as consumer names.
  const std::vector<std::string> one = {"event-1"};
  for (const auto& key : keys) {
    SCOPED_TRACE("consumer: " + key.substr(0, 40));
    this->recorder_->mark_processed_many(key, one);
    EXPECT_EQ(this->recorder_->is_processed_many(key, one), std::vector<bool>{true});
  }
  EXPECT_EQ(this->count_and_purge_all_markers(), ids.size() + keys.size());
}

TYPED_TEST_P(IdemRecorderConformance, BatchMarksAgeAndPurgeLikeSingleMarks) {
  using std::chrono::hours;
  std::vector<std::string> old_ids;
  std::vector<std::string> new_ids;
  for (int i = 0; i < 4; ++i) {
    old_ids.push_back(idem::new_event_id());
    new_ids.push_back(idem::new_event_id());
  }
  this->recorder_->mark_processed_many("billing", old_ids);
  this->clock_->advance(hours(3));
  // Repeating an old id in a new batch must not make it look new to purge.
  std::vector<std::string> second = new_ids;
  second.push_back(old_ids[0]);
  this->recorder_->mark_processed_many("billing", second);
  this->clock_->advance(hours(1));
  EXPECT_EQ(this->recorder_->count_purgeable(hours(2)), old_ids.size());
  EXPECT_EQ(this->recorder_->purge(hours(2)), old_ids.size());
  EXPECT_EQ(this->recorder_->is_processed_many("billing", old_ids),
            std::vector<bool>(old_ids.size(), false));
  EXPECT_EQ(this->recorder_->is_processed_many("billing", new_ids),
            std::vector<bool>(new_ids.size(), true));
}

TYPED_TEST_P(IdemRecorderConformance, ConcurrentBatchAndSingleMarksOnOverlappingIds) {
  constexpr int kThreads = 8;
  constexpr std::size_t kWindow = 16;
  const auto ids =
      idem::testing::fresh_event_ids(idem::testing::detail::concurrent_ids<TypeParam>());
  std::atomic<int> errors{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      try {
        if (t % 2 == 0) {
          // Sliding windows that overlap each other and the other batch threads' windows.
          for (std::size_t begin = static_cast<std::size_t>(t); begin < ids.size();
               begin += kWindow / 2) {
            const auto window =
                std::span(ids).subspan(begin, std::min(kWindow, ids.size() - begin));
            (void)this->recorder_->is_processed_many("billing", window);
            this->recorder_->mark_processed_many("billing", window);
            for (bool marked : this->recorder_->is_processed_many("billing", window)) {
              if (!marked) errors.fetch_add(1);
            }
          }
        } else {
          for (std::size_t n = 0; n < ids.size(); ++n) {
            const std::string& id = ids[ids.size() - 1 - n];
            this->recorder_->mark_processed("billing", id);
            if (!this->recorder_->is_processed("billing", id)) errors.fetch_add(1);
          }
        }
      } catch (...) {
        errors.fetch_add(1);
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(this->recorder_->is_processed_many("billing", ids),
            std::vector<bool>(ids.size(), true));
  EXPECT_EQ(this->count_and_purge_all_markers(), ids.size());
}

// ---- transactions -------------------------------------------------------------------------

TYPED_TEST_P(IdemRecorderConformance, RunTransactionalRunsOnce) {
  IDEM_CONFORMANCE_REQUIRE_TRANSACTIONS();
  const std::string id = idem::new_event_id();
  int runs = 0;
  const auto fn = [&](idem::Transaction&) { ++runs; };
  EXPECT_TRUE(this->recorder_->run_transactional("billing", id, fn));
  EXPECT_EQ(runs, 1);
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
  EXPECT_FALSE(this->recorder_->run_transactional("billing", id, fn));
  EXPECT_EQ(runs, 1) << "a duplicate must not run the handler";
  // Another consumer has its own marker.
  EXPECT_TRUE(this->recorder_->run_transactional("shipping", id, fn));
  EXPECT_EQ(runs, 2);
  // A marker from mark_processed counts too.
  const std::string marked = idem::new_event_id();
  this->recorder_->mark_processed("billing", marked);
  EXPECT_FALSE(this->recorder_->run_transactional("billing", marked, fn));
  EXPECT_EQ(runs, 2);
}

TYPED_TEST_P(IdemRecorderConformance, RunTransactionalThrowLeavesNoMarker) {
  IDEM_CONFORMANCE_REQUIRE_TRANSACTIONS();
  struct HandlerFailed : std::runtime_error {
    HandlerFailed() : std::runtime_error("handler failed") {}
  };
  const std::string id = idem::new_event_id();
  int runs = 0;
  EXPECT_THROW(static_cast<void>(this->recorder_->run_transactional("billing", id,
                                                                    [&](idem::Transaction&) {
                                                                      ++runs;
                                                                      throw HandlerFailed();
                                                                    })),
               HandlerFailed);
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(this->recorder_->is_processed("billing", id)) << "a failed handler was marked";
  // The redelivery runs the handler again.
  EXPECT_TRUE(
      this->recorder_->run_transactional("billing", id, [&](idem::Transaction&) { ++runs; }));
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(this->recorder_->is_processed("billing", id));
}

TYPED_TEST_P(IdemRecorderConformance, ConcurrentRunTransactionalRunsOncePerId) {
  IDEM_CONFORMANCE_REQUIRE_TRANSACTIONS();
  const auto ids =
      idem::testing::fresh_event_ids(idem::testing::detail::concurrent_ids<TypeParam>());
  std::vector<std::atomic<int>> runs(ids.size());
  const int errors = idem::testing::detail::race_over_ids(ids.size(), [&](int, std::size_t i) {
    static_cast<void>(this->recorder_->run_transactional(
        "billing", ids[i], [&](idem::Transaction&) { runs[i].fetch_add(1); }));
  });
  EXPECT_EQ(errors, 0);
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ASSERT_EQ(runs[i].load(), 1) << "id #" << i;
    EXPECT_TRUE(this->recorder_->is_processed("billing", ids[i]));
  }
}

REGISTER_TYPED_TEST_SUITE_P(
    IdemRecorderConformance, ReportsDeclaredCapabilities, UnprocessedEventIsNotProcessed,
    MarkThenProcessed, RepeatedMarksAreHarmless, ConsumersAreIsolated, DistinctKeysDoNotCollide,
    UnusualValidKeysWork, InvalidKeysAreRejectedAndNothingMarked, InvalidKeyErrorNamesWhatWasWrong,
    PurgeRemovesOnlyOldMarkers, PurgeKeepsLiveClaims, PurgeReportsProgressUpToItsTotal,
    PurgeRacingWithMarksKeepsEveryNewMarker, ConsumerCountsAreSortedPerConsumer,
    InspectShowsTheMarkerAndItsTime, InspectAndCountsShowOpenClaims, ClaimAcquiresWithLease,
    SecondClaimIsInProgress, CompleteMarksProcessed, ReleaseLetsTheNextClaimAcquire,
    StaleTokensAreRefusedAndChangeNothing, ExpiredLeaseIsTakenOverAndOldTokenFenced,
    RenewExtendsTheLease, ConcurrentClaimsAcquireOncePerId, ConcurrentMarksAreSafe,
    RunTransactionalRunsOnce, RunTransactionalThrowLeavesNoMarker,
    ConcurrentRunTransactionalRunsOncePerId, BatchOfNoIdsReadsAndMarksNothing,
    BatchCheckAnswersEveryIdInOrder, BatchMarkIsSeenBySingleAndBatchChecks,
    BatchWithRepeatedIdsIsHarmless, BatchesKeepConsumersApart,
    BatchWithAnInvalidKeyReadsAndMarksNothing, BatchLargerThanAnyChunkWorks,
    BatchesOfUnusualValidKeysWork, BatchMarksAgeAndPurgeLikeSingleMarks,
    ConcurrentBatchAndSingleMarksOnOverlappingIds);

// Runs the whole suite against the recorders `Factory` makes; `Prefix` names this instantiation
// in test output (e.g. Memory/IdemRecorderConformance/0.MarkThenProcessed).
#define INSTANTIATE_RECORDER_CONFORMANCE(Prefix, Factory) \
  INSTANTIATE_TYPED_TEST_SUITE_P(Prefix, IdemRecorderConformance, ::testing::Types<Factory>)
