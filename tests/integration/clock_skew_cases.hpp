// Clock skew between processes sharing one store.
//
// Two recorder (or store) OBJECTS open the same database, each with its own ManualClock: they
// stand for two processes whose wall clocks disagree or jump. Every idem backend computes lease
// deadlines, marker times and result expiries from the CALLER's clock at the moment of the write
// (claim, renew, mark, complete) and compares them with the reader's clock — never with a server
// clock. These cases pin down what that means (docs/guarantees.md, "Clocks"):
//   * skew smaller than the lease: no premature takeover;
//   * a reader ahead by at least the lease takes over (the documented limit);
//   * a holder whose clock jumped backwards writes deadlines that are already past for others:
//     it can lose its lease early (fenced, LeaseLost), but it never blocks a takeover longer than
//     what it was granted by the clock it had;
//   * a holder ahead by H holds its lease H longer in others' eyes (bounded by H, not forever);
//   * a writer behind by hours writes records that expire (and purge) EARLIER, never later;
//   * the purger's clock decides purges: one behind deletes less, one ahead deletes records that
//     are still live for everyone else.
//
// A binary includes this header once, defines a SkewBackend for its database and instantiates
// the suite: INSTANTIATE_TEST_SUITE_P(Sqlite, ClockSkewTest, ::testing::Values(factory)).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/report.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::test {

// One shared database and a way to open another "process" on it with a given clock.
class SkewBackend {
 public:
  virtual ~SkewBackend() = default;
  virtual std::shared_ptr<IdempotencyRecorder> recorder(std::shared_ptr<Clock> clock) = 0;
  virtual std::shared_ptr<IdempotencyStore> store(std::shared_ptr<Clock> clock) = 0;
};

using SkewBackendFactory = std::function<std::unique_ptr<SkewBackend>()>;

class ClockSkewTest : public ::testing::TestWithParam<SkewBackendFactory> {
 protected:
  static constexpr Millis kLease{10'000};

  void SetUp() override { backend_ = GetParam()(); }
  void TearDown() override { backend_.reset(); }

  // A clock for one process, started at `offset` from the shared reference instant t0.
  std::shared_ptr<testing::ManualClock> clock_at(std::chrono::milliseconds offset) const {
    return std::make_shared<testing::ManualClock>(t0_ + offset);
  }

  StoredValue value(const IdempotencyStore& store, const std::string& text) const {
    StoredValue stored;
    if (store.needs_bytes()) {
      stored.bytes = text;
    } else {
      stored.object = std::make_shared<const std::string>(text);
      stored.type = typeid(std::string);
    }
    return stored;
  }

  ExecutionReport report() const {
    ExecutionReport r;
    r.operation = "skew";
    r.started_at = t0_;
    return r;
  }

  const WallTime t0_ = WallTime(std::chrono::seconds(1893456000));  // 2030-01-01
  std::unique_ptr<SkewBackend> backend_;
};

using std::chrono::hours;
using std::chrono::milliseconds;

// ---- recorder claims ----------------------------------------------------------------------

TEST_P(ClockSkewTest, RecorderReaderAheadByLessThanLeaseCannotTakeOver) {
  auto a = backend_->recorder(clock_at(milliseconds(0)));
  auto b = backend_->recorder(clock_at(kLease - milliseconds(1)));
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  const Claim seen = b->claim("orders", "e1", kLease);
  EXPECT_EQ(seen.status, Claim::Status::in_progress);
  EXPECT_EQ(seen.lease_until, t0_ + kLease);  // A's deadline, computed by A's clock
  EXPECT_TRUE(a->complete("orders", "e1", held.token));
  EXPECT_EQ(b->claim("orders", "e1", kLease).status, Claim::Status::processed);
}

TEST_P(ClockSkewTest, RecorderReaderAheadByTheLeaseTakesOverAndFencesTheOwner) {
  auto a = backend_->recorder(clock_at(milliseconds(0)));
  auto b = backend_->recorder(clock_at(kLease));  // the boundary instant is already past
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  const Claim taken = b->claim("orders", "e1", kLease);
  ASSERT_EQ(taken.status, Claim::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_GT(taken.token, held.token);
  // A still believes its lease is live, but its token is fenced off: it cannot mark.
  EXPECT_FALSE(a->renew("orders", "e1", held.token, kLease));
  EXPECT_FALSE(a->complete("orders", "e1", held.token));
  EXPECT_TRUE(b->complete("orders", "e1", taken.token));
}

TEST_P(ClockSkewTest, RecorderOwnerJumpingBackwardsDoesNotExtendWhatItWasGranted) {
  auto a_clock = clock_at(milliseconds(0));
  auto a = backend_->recorder(a_clock);
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  a_clock->set_wall(t0_ - hours(3));  // NTP steps A back; then A dies holding the claim
  auto b_clock = clock_at(kLease - milliseconds(1));
  auto b = backend_->recorder(b_clock);
  EXPECT_EQ(b->claim("orders", "e1", kLease).status, Claim::Status::in_progress);
  b_clock->advance(milliseconds(1));
  const Claim taken = b->claim("orders", "e1", kLease);
  ASSERT_EQ(taken.status, Claim::Status::acquired);
  EXPECT_TRUE(taken.took_over);
}

TEST_P(ClockSkewTest, RecorderRenewalAfterBackwardJumpShortensTheLeaseForOthers) {
  auto a_clock = clock_at(milliseconds(0));
  auto a = backend_->recorder(a_clock);
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  a_clock->set_wall(t0_ - hours(3));
  // The heartbeat still succeeds (the token is current), but writes a deadline 3 h in the past
  // for correct clocks: others may take over at once. Never a lease that outlives its grant.
  ASSERT_TRUE(a->renew("orders", "e1", held.token, kLease));
  auto b = backend_->recorder(clock_at(milliseconds(1)));
  const Claim taken = b->claim("orders", "e1", kLease);
  ASSERT_EQ(taken.status, Claim::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_FALSE(a->complete("orders", "e1", held.token));  // A gets LeaseLost in a handler
  EXPECT_TRUE(b->complete("orders", "e1", taken.token));
  EXPECT_TRUE(a->is_processed("orders", "e1"));
}

TEST_P(ClockSkewTest, RecorderOwnerAheadHoldsItsLeaseLongerByExactlyItsSkew) {
  const milliseconds skew = hours(1);
  auto a = backend_->recorder(clock_at(skew));
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  EXPECT_EQ(held.lease_until, t0_ + skew + kLease);
  auto b_clock = clock_at(kLease);
  auto b = backend_->recorder(b_clock);
  EXPECT_EQ(b->claim("orders", "e1", kLease).status, Claim::Status::in_progress);
  b_clock->set_wall(t0_ + skew + kLease - milliseconds(1));
  EXPECT_EQ(b->claim("orders", "e1", kLease).status, Claim::Status::in_progress);
  b_clock->advance(milliseconds(1));
  const Claim taken = b->claim("orders", "e1", kLease);
  ASSERT_EQ(taken.status, Claim::Status::acquired);
  EXPECT_TRUE(taken.took_over);
}

TEST_P(ClockSkewTest, RecorderRenewalAfterForwardJumpIsBoundedByTheJump) {
  auto a_clock = clock_at(milliseconds(0));
  auto a = backend_->recorder(a_clock);
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  a_clock->set_wall(t0_ + hours(2));
  ASSERT_TRUE(a->renew("orders", "e1", held.token, kLease));  // deadline t0 + 2 h + lease
  a_clock->set_wall(t0_);                                     // the jump is corrected; A dies
  auto b = backend_->recorder(clock_at(hours(2) + kLease - milliseconds(1)));
  EXPECT_EQ(b->claim("orders", "e1", kLease).status, Claim::Status::in_progress);
  auto c = backend_->recorder(clock_at(hours(2) + kLease));
  EXPECT_EQ(c->claim("orders", "e1", kLease).status, Claim::Status::acquired);
}

// ---- recorder markers and purge -------------------------------------------------------------

TEST_P(ClockSkewTest, MarkerWrittenByAClockHoursBehindIsPurgedEarlierNotNever) {
  auto behind = backend_->recorder(clock_at(-hours(3)));
  behind->mark_processed("orders", "old");
  auto sane = backend_->recorder(clock_at(milliseconds(0)));
  sane->mark_processed("orders", "new");
  // Retention of 1 h: the marker from the clock 3 h behind already looks 3 h old.
  EXPECT_EQ(sane->purge(hours(1)), 1U);
  EXPECT_FALSE(sane->is_processed("orders", "old"));
  EXPECT_TRUE(sane->is_processed("orders", "new"));
}

TEST_P(ClockSkewTest, PurgeIsDecidedByThePurgersClock) {
  auto writer = backend_->recorder(clock_at(milliseconds(0)));
  writer->mark_processed("orders", "e1");
  // A purger behind by hours deletes nothing that its own clock calls young.
  auto behind = backend_->recorder(clock_at(-hours(3)));
  EXPECT_EQ(behind->purge(hours(1)), 0U);
  // A purger ahead by less than (retention - age) keeps the marker ...
  auto slightly_ahead = backend_->recorder(clock_at(hours(1) - milliseconds(1)));
  EXPECT_EQ(slightly_ahead->purge(hours(1)), 0U);
  EXPECT_TRUE(writer->is_processed("orders", "e1"));
  // ... one ahead by more deletes a marker that is young for everyone else.
  auto far_ahead = backend_->recorder(clock_at(hours(1) + milliseconds(1)));
  EXPECT_EQ(far_ahead->purge(hours(1)), 1U);
  EXPECT_FALSE(writer->is_processed("orders", "e1"));
}

TEST_P(ClockSkewTest, PurgeLeavesALiveClaimOfAnotherClockAlone) {
  auto a = backend_->recorder(clock_at(milliseconds(0)));
  const Claim held = a->claim("orders", "e1", kLease);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  // Dead claims go with purge(older_than) only when their lease ended before now - older_than.
  auto purger = backend_->recorder(clock_at(kLease));
  EXPECT_EQ(purger->purge(milliseconds(1)), 0U);
  EXPECT_TRUE(a->complete("orders", "e1", held.token));
}

// ---- store leases and expiries --------------------------------------------------------------

TEST_P(ClockSkewTest, StoreReaderWithinTheLeaseSeesInProgressBeyondItTakesOver) {
  auto a = backend_->store(clock_at(milliseconds(0)));
  const ClaimOutcome held = a->claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  auto b = backend_->store(clock_at(kLease - milliseconds(1)));
  const ClaimOutcome seen = b->claim("k", std::nullopt, kLease);
  ASSERT_EQ(seen.status, ClaimOutcome::Status::in_progress);
  ASSERT_TRUE(seen.record.has_value());
  EXPECT_EQ(seen.record->lease_until, t0_ + kLease);
  auto c = backend_->store(clock_at(kLease));
  const ClaimOutcome taken = c->claim("k", std::nullopt, kLease);
  ASSERT_EQ(taken.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_FALSE(a->complete("k", held.token, value(*a, "a"), report(), hours(1)));
  EXPECT_TRUE(c->complete("k", taken.token, value(*c, "c"), report(), hours(1)));
}

TEST_P(ClockSkewTest, StoreRenewalAfterBackwardJumpNeverOutlivesTheGrant) {
  auto a_clock = clock_at(milliseconds(0));
  auto a = backend_->store(a_clock);
  const ClaimOutcome held = a->claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  a_clock->set_wall(t0_ - hours(3));
  ASSERT_TRUE(a->renew("k", held.token, kLease));
  auto b = backend_->store(clock_at(milliseconds(1)));
  const ClaimOutcome taken = b->claim("k", std::nullopt, kLease);
  ASSERT_EQ(taken.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(taken.took_over);
  EXPECT_FALSE(a->complete("k", held.token, value(*a, "a"), report(), hours(1)));
}

TEST_P(ClockSkewTest, StoreResultWrittenByAClockHoursBehindExpiresEarlierAndIsPurged) {
  auto behind = backend_->store(clock_at(-hours(3)));
  const ClaimOutcome held = behind->claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  ASSERT_TRUE(behind->complete("k", held.token, value(*behind, "v"), report(), hours(1)));
  // expires_at = (t0 - 3 h) + 1 h: the writer itself still replays it ...
  ASSERT_TRUE(behind->lookup("k").has_value());
  EXPECT_EQ(behind->lookup("k")->expires_at, t0_ - hours(2));
  // ... a correct clock finds it expired and purges it: no record outlives its TTL.
  auto sane = backend_->store(clock_at(milliseconds(0)));
  EXPECT_FALSE(sane->lookup("k").has_value());
  EXPECT_EQ(sane->purge_expired(), 1U);
  EXPECT_EQ(sane->entry_count(), 0U);
}

TEST_P(ClockSkewTest, StorePurgeExpiredIsDecidedByThePurgersClock) {
  auto writer = backend_->store(clock_at(milliseconds(0)));
  const ClaimOutcome held = writer->claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  ASSERT_TRUE(writer->complete("k", held.token, value(*writer, "v"), report(), hours(1)));
  auto behind = backend_->store(clock_at(-hours(3)));
  EXPECT_EQ(behind->purge_expired(), 0U);
  auto slightly_ahead = backend_->store(clock_at(hours(1) - milliseconds(1)));
  EXPECT_EQ(slightly_ahead->purge_expired(), 0U);
  EXPECT_TRUE(writer->lookup("k").has_value());
  // Ahead by the remaining TTL: the purger deletes a result still live for the writer.
  auto ahead = backend_->store(clock_at(hours(1)));
  EXPECT_EQ(ahead->purge_expired(), 1U);
  EXPECT_FALSE(writer->lookup("k").has_value());
}

TEST_P(ClockSkewTest, StorePurgeExpiredNeverDeletesAClaimWhateverTheClock) {
  auto a = backend_->store(clock_at(milliseconds(0)));
  const ClaimOutcome held = a->claim("k", std::nullopt, kLease);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  auto ahead = backend_->store(clock_at(hours(24)));
  EXPECT_EQ(ahead->purge_expired(), 0U);  // purge_expired removes completed results only
  EXPECT_TRUE(a->complete("k", held.token, value(*a, "v"), report(), hours(1)));
}

}  // namespace idem::test
