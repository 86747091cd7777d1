// The IdempotencyStore conformance suite: what every store must do, as GoogleTest tests.
//
// Every store idem ships passes this suite (memory, SQLite, Redis, PostgreSQL), and users can run
// it against their own store. It checks the contract written in idem/idempotency_store.hpp:
// every transition of the record state machine, fencing tokens, lease takeover and TTL expiry
// exactly at their boundaries, fingerprint mismatch rules, lookup / purge_expired / entry_count,
// the operator calls list (by prefix, page by page) and remove (fencing the holder off),
// values (typed objects for in-process stores, bytes for stores that need bytes), the stored
// report, wait(), races between threads (claims of one key with different fingerprints
// included), and key validation. The ScopedKeys* tests run
// idem::resilient / idem::operation over the store: operations never share results unless they
// name one scope, and the store holds keys in the documented scoped format; a key reused with
// other arguments is refused (KeyReuseError) whether the store answers with a result or with a
// claim held for those other arguments.
//
// How to use it — a factory type and one macro, in a test file linked with gtest_main:
//
//   #include "idem/testing/store_conformance.hpp"
//
//   struct MyStoreFactory {
//     // Called once per test with a fresh ManualClock. The store must take ALL its time from
//     // this clock (lease deadlines, completion and expiry times, wait() deadlines): the tests
//     // move time with clock->advance() and expect expiry exactly at the boundary instant.
//     std::shared_ptr<idem::IdempotencyStore> make(
//         std::shared_ptr<idem::testing::ManualClock> clock);
//     // Optional: how many keys the race tests use (default 50).
//     // static constexpr int kRaceKeys = 10;
//   };
//   INSTANTIATE_STORE_CONFORMANCE(MyStore, MyStoreFactory);
//
// The factory is default-constructed once per test and destroyed after the store, so its
// constructor/destructor can create and drop a temporary database, Redis prefix or schema.
// Instantiate the macro once per configuration with different prefixes. Tests live in the
// global test suite IdemStoreConformance, so the macro can be used in any namespace.
//
// Time: the clock starts at a whole second and moves in whole milliseconds, so a store that
// keeps times with millisecond precision compares exactly. Reports are compared field by field;
// their started_at is a whole second.
//
// Thread-safety: the race tests start 8 threads on one store; run the suite under
// ThreadSanitizer to check a store's locking.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <string_view>
#include <thread>
#include <typeindex>
#include <vector>

#include "idem/error.hpp"
#include "idem/fingerprint.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/key.hpp"
#include "idem/operation.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/report.hpp"
#include "idem/resilient.hpp"
#include "idem/testing/keys.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::testing::store_conformance_detail {

using namespace std::chrono_literals;

template <class Factory>
constexpr int race_keys() {
  if constexpr (requires { Factory::kRaceKeys; }) {
    return Factory::kRaceKeys;
  } else {
    return 50;
  }
}

// Every byte value, twice, with NULs in the middle.
inline std::string binary_bytes() {
  std::string bytes;
  for (int round = 0; round < 2; ++round) {
    for (int b = 0; b < 256; ++b)
      bytes.push_back(static_cast<char>(b));
  }
  return bytes;
}

// A value as the coordinator hands it to `store`: the typed object always, the bytes too when
// the store needs bytes.
inline StoredValue string_value(const IdempotencyStore& store, const std::string& text) {
  StoredValue value;
  value.object = std::make_shared<const std::string>(text);
  value.type = std::type_index(typeid(std::string));
  if (store.needs_bytes()) value.bytes = text;
  return value;
}

// Checks that `value` (read back from `store`) holds `text`.
inline void expect_string_value(const IdempotencyStore& store, const StoredValue& value,
                                const std::string& text) {
  if (store.needs_bytes()) {
    ASSERT_TRUE(value.bytes.has_value()) << "a store that needs bytes must return the bytes";
    EXPECT_EQ(*value.bytes, text);
  } else {
    ASSERT_NE(value.object, nullptr) << "an in-process store must return the typed object";
    ASSERT_TRUE(value.type.has_value()) << "an in-process store must keep the value's type";
    EXPECT_EQ(*value.type, std::type_index(typeid(std::string)));
    EXPECT_EQ(*std::static_pointer_cast<const std::string>(value.object), text);
  }
}

// A report with every field away from its default, including text a serialiser must escape.
inline ExecutionReport sample_report(WallTime started_at) {
  ExecutionReport report;
  report.operation = "create_payment";
  report.status = OperationStatus::succeeded;
  report.started_at = started_at;
  report.duration = std::chrono::nanoseconds(123456789);
  AttemptRecord first;
  first.number = 1;
  first.source = "primary";
  first.status = AttemptStatus::timed_out;
  first.duration = std::chrono::nanoseconds(1000000001);
  first.error_type = "idem::TimeoutError";
  first.error_message = "attempt 1 \"timed out\"\nafter 1 s \xe2\x9c\x93";
  first.retryable = true;
  AttemptRecord second;
  second.number = 2;
  second.source = "fallback:cache";
  second.status = AttemptStatus::succeeded;
  second.duration = std::chrono::nanoseconds(42);
  report.attempts = {first, second};
  report.fallback_used = true;
  report.fallback_source = "fallback:cache";
  report.metadata = {{"idempotency_key", "pay:\"1\""}, {"tenant", "caf\xc3\xa9"}, {"empty", ""}};
  return report;
}

inline void expect_same_report(const ExecutionReport& actual, const ExecutionReport& expected) {
  EXPECT_EQ(actual.operation, expected.operation);
  EXPECT_EQ(actual.status, expected.status);
  EXPECT_EQ(actual.started_at, expected.started_at);
  EXPECT_EQ(actual.duration, expected.duration);
  ASSERT_EQ(actual.attempts.size(), expected.attempts.size());
  for (std::size_t i = 0; i < expected.attempts.size(); ++i) {
    SCOPED_TRACE("attempt " + std::to_string(i));
    const AttemptRecord& a = actual.attempts[i];
    const AttemptRecord& e = expected.attempts[i];
    EXPECT_EQ(a.number, e.number);
    EXPECT_EQ(a.source, e.source);
    EXPECT_EQ(a.status, e.status);
    EXPECT_EQ(a.duration, e.duration);
    EXPECT_EQ(a.error_type, e.error_type);
    EXPECT_EQ(a.error_message, e.error_message);
    EXPECT_EQ(a.retryable, e.retryable);
  }
  EXPECT_EQ(actual.fallback_used, expected.fallback_used);
  EXPECT_EQ(actual.fallback_source, expected.fallback_source);
  EXPECT_EQ(actual.metadata, expected.metadata);
}

}  // namespace idem::testing::store_conformance_detail

template <class Factory>
class IdemStoreConformance : public ::testing::Test {
 protected:
  using Status = idem::ClaimOutcome::Status;
  using State = idem::IdempotencyRecord::State;

  static constexpr idem::Millis kLease{10'000};
  static constexpr idem::Millis kTtl{60'000};

  void SetUp() override {
    clock_ = std::make_shared<idem::testing::ManualClock>();
    store_ = factory_.make(clock_);
    ASSERT_NE(store_, nullptr) << "the factory returned no store";
  }

  idem::WallTime now() const { return clock_->wall_now(); }

  // Claims `key` (which must be free) and returns the token.
  std::uint64_t acquire(const std::string& key,
                        std::optional<std::string_view> fingerprint = std::nullopt,
                        idem::Millis lease = kLease) {
    const idem::ClaimOutcome outcome = store_->claim(key, fingerprint, lease);
    EXPECT_EQ(outcome.status, Status::acquired) << "claim of '" << key << "'";
    EXPECT_GT(outcome.token, 0u);
    return outcome.token;
  }

  // Claims and completes `key` with `text` and the sample report.
  std::uint64_t complete(const std::string& key, const std::string& text = "result",
                         idem::Millis ttl = kTtl,
                         std::optional<std::string_view> fingerprint = std::nullopt) {
    const std::uint64_t token = acquire(key, fingerprint);
    EXPECT_TRUE(store_->complete(key, token, value(text), report(), ttl));
    return token;
  }

  idem::StoredValue value(const std::string& text) const {
    return idem::testing::store_conformance_detail::string_value(*store_, text);
  }
  idem::ExecutionReport report() const {
    return idem::testing::store_conformance_detail::sample_report(
        idem::WallTime(std::chrono::seconds(1893456000)));
  }

  // The current state of `key` as the store reports it, for before/after comparisons.
  std::string describe(const std::string& key) {
    auto record = store_->lookup(key);
    if (!record) return "absent";
    return std::string(idem::to_string(record->state)) + " token=" + std::to_string(record->token) +
           " lease_until=" + std::to_string(record->lease_until.time_since_epoch().count()) +
           " expires_at=" + std::to_string(record->expires_at.time_since_epoch().count()) +
           " fingerprint=" + record->fingerprint.value_or("<none>");
  }

  // Every record list(prefix) returns, page by page (`limit` each), by key: a key a store
  // returned twice (Redis SCAN may) is kept once. Checks each page's bound on the way.
  std::map<std::string, idem::IdempotencyRecord> list_all(const std::string& prefix,
                                                          std::size_t limit) {
    std::map<std::string, idem::IdempotencyRecord> found;
    std::string cursor;
    for (int pages = 0; pages < 100'000; ++pages) {
      idem::RecordPage page = this->store_->list(prefix, limit, cursor);
      EXPECT_LE(page.records.size(), limit) << "a page holds at most `limit` records";
      for (auto& record : page.records) {
        EXPECT_TRUE(record.key.starts_with(prefix)) << record.key;
        found[record.key] = std::move(record);
      }
      if (page.next.empty()) return found;
      cursor = page.next;
    }
    ADD_FAILURE() << "list('" << prefix << "') did not end";
    return found;
  }

  Factory factory_;  // declared first: destroyed after the store (temp files, ...)
  std::shared_ptr<idem::testing::ManualClock> clock_;
  std::shared_ptr<idem::IdempotencyStore> store_;
};

TYPED_TEST_SUITE_P(IdemStoreConformance);

// ---- claim --------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ClaimOfAnAbsentKeyAcquires) {
  const auto outcome = this->store_->claim("order-1", "fp-a", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(outcome.token, 0u);
  EXPECT_FALSE(outcome.took_over);

  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value()) << "a claim must be visible to lookup()";
  EXPECT_EQ(record->key, "order-1");
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_EQ(record->token, outcome.token);
  EXPECT_EQ(record->fingerprint, std::optional<std::string>("fp-a"));
  EXPECT_EQ(record->lease_until, this->now() + this->kLease);
}

TYPED_TEST_P(IdemStoreConformance, SecondClaimSeesTheOwnersClaim) {
  const std::uint64_t token = this->acquire("order-1", "fp-a");
  this->clock_->advance(std::chrono::milliseconds(1500));

  const auto outcome = this->store_->claim("order-1", "fp-a", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::in_progress);
  ASSERT_TRUE(outcome.record.has_value()) << "in_progress must carry the owner's record";
  EXPECT_EQ(outcome.record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_EQ(outcome.record->token, token);
  EXPECT_EQ(outcome.record->lease_until,
            this->now() - std::chrono::milliseconds(1500) + this->kLease)
      << "a losing claim must not extend the owner's lease";
}

TYPED_TEST_P(IdemStoreConformance, ClaimOnAnotherKeyIsIndependent) {
  this->acquire("order-1");
  this->acquire("order-2");
  this->acquire("Order-1");  // keys are exact, case included
  EXPECT_EQ(this->store_->entry_count(), 3u);
}

// ---- complete -----------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, CompleteMakesTheRecordReplayable) {
  const std::uint64_t token = this->acquire("order-1", "fp-a");
  this->clock_->advance(std::chrono::milliseconds(250));
  const idem::WallTime completed_at = this->now();
  ASSERT_TRUE(this->store_->complete("order-1", token, this->value("receipt-7"), this->report(),
                                     this->kTtl));

  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(record->token, token);
  EXPECT_EQ(record->fingerprint, std::optional<std::string>("fp-a"));
  EXPECT_EQ(record->completed_at, completed_at);
  EXPECT_EQ(record->expires_at, completed_at + this->kTtl) << "the TTL counts from completion";
  idem::testing::store_conformance_detail::expect_string_value(*this->store_, record->value,
                                                               "receipt-7");
  ASSERT_TRUE(record->report.has_value());

  const std::string before = this->describe("order-1");
  const auto outcome = this->store_->claim("order-1", "fp-a", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::completed);
  ASSERT_TRUE(outcome.record.has_value());
  EXPECT_EQ(outcome.record->state, idem::IdempotencyRecord::State::completed);
  idem::testing::store_conformance_detail::expect_string_value(*this->store_, outcome.record->value,
                                                               "receipt-7");
  ASSERT_TRUE(outcome.record->report.has_value());
  idem::testing::store_conformance_detail::expect_same_report(*outcome.record->report,
                                                              this->report());
  EXPECT_EQ(this->describe("order-1"), before) << "a claim of a completed key changes nothing";
}

TYPED_TEST_P(IdemStoreConformance, CompletedRecordRefusesEveryTokenOperation) {
  const std::uint64_t token = this->complete("order-1", "first");
  const std::string before = this->describe("order-1");
  EXPECT_FALSE(
      this->store_->complete("order-1", token, this->value("second"), this->report(), this->kTtl))
      << "completing twice must be refused";
  EXPECT_FALSE(this->store_->release("order-1", token)) << "a completed result is never released";
  EXPECT_FALSE(this->store_->renew("order-1", token, this->kLease));
  EXPECT_EQ(this->describe("order-1"), before);
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  idem::testing::store_conformance_detail::expect_string_value(*this->store_, record->value,
                                                               "first");
}

TYPED_TEST_P(IdemStoreConformance, CompleteOfAnUnknownKeyIsRefused) {
  EXPECT_FALSE(
      this->store_->complete("never-claimed", 1, this->value("x"), this->report(), this->kTtl));
  EXPECT_FALSE(this->store_->release("never-claimed", 1));
  EXPECT_FALSE(this->store_->renew("never-claimed", 1, this->kLease));
  EXPECT_FALSE(this->store_->lookup("never-claimed").has_value());
  EXPECT_EQ(this->store_->entry_count(), 0u);
}

TYPED_TEST_P(IdemStoreConformance, ZeroTtlIsExpiredAtOnce) {
  const std::uint64_t token = this->acquire("order-1");
  ASSERT_TRUE(
      this->store_->complete("order-1", token, this->value("x"), this->report(), idem::Millis(0)));
  EXPECT_FALSE(this->store_->lookup("order-1").has_value());
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_GT(outcome.token, token);
}

// ---- release ------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ReleaseForgetsTheClaim) {
  const std::uint64_t token = this->acquire("order-1", "fp-a");
  EXPECT_TRUE(this->store_->release("order-1", token));
  EXPECT_FALSE(this->store_->lookup("order-1").has_value());
  EXPECT_FALSE(this->store_->release("order-1", token)) << "releasing twice must be refused";

  // Nothing of the failed claim remains: another fingerprint is welcome.
  const auto outcome = this->store_->claim("order-1", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_FALSE(outcome.took_over);
  EXPECT_GT(outcome.token, token) << "tokens grow per key, also after a release";
  EXPECT_FALSE(
      this->store_->complete("order-1", token, this->value("x"), this->report(), this->kTtl))
      << "the released token stays fenced off";
  EXPECT_TRUE(this->store_->complete("order-1", outcome.token, this->value("x"), this->report(),
                                     this->kTtl));
}

// ---- fencing ------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, WrongTokensChangeNothing) {
  const std::uint64_t token = this->acquire("order-1");
  const std::string before = this->describe("order-1");
  for (std::uint64_t wrong : {token + 1, token - 1, std::uint64_t{0}, ~std::uint64_t{0}}) {
    SCOPED_TRACE("token " + std::to_string(wrong));
    EXPECT_FALSE(
        this->store_->complete("order-1", wrong, this->value("x"), this->report(), this->kTtl));
    EXPECT_FALSE(this->store_->release("order-1", wrong));
    EXPECT_FALSE(this->store_->renew("order-1", wrong, std::chrono::hours(1)));
    EXPECT_EQ(this->describe("order-1"), before);
  }
  EXPECT_TRUE(this->store_->renew("order-1", token, this->kLease));
}

TYPED_TEST_P(IdemStoreConformance, TakeoverFencesOffTheOldOwner) {
  const std::uint64_t old_token = this->acquire("order-1", "fp-a");
  this->clock_->advance(this->kLease);
  const auto outcome = this->store_->claim("order-1", "fp-a", this->kLease);
  ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(outcome.took_over);
  EXPECT_GT(outcome.token, old_token);

  const std::string before = this->describe("order-1");
  EXPECT_FALSE(this->store_->renew("order-1", old_token, this->kLease));
  EXPECT_FALSE(this->store_->complete("order-1", old_token, this->value("stale"), this->report(),
                                      this->kTtl));
  EXPECT_FALSE(this->store_->release("order-1", old_token));
  EXPECT_EQ(this->describe("order-1"), before) << "the stale owner changed the new claim";

  ASSERT_TRUE(this->store_->complete("order-1", outcome.token, this->value("fresh"), this->report(),
                                     this->kTtl));
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  idem::testing::store_conformance_detail::expect_string_value(*this->store_, record->value,
                                                               "fresh");
}

TYPED_TEST_P(IdemStoreConformance, AnOwnerPastItsLeaseKeepsItsClaimUntilTakenOver) {
  // Fencing is by token: nobody claimed the key after the lease passed, so the slow owner's
  // token is still the current one.
  const std::uint64_t token = this->acquire("order-1");
  this->clock_->advance(this->kLease + std::chrono::seconds(5));
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value()) << "lookup() reports a claim whose lease has passed";
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_LE(record->lease_until, this->now());

  EXPECT_TRUE(this->store_->renew("order-1", token, this->kLease));
  EXPECT_EQ(this->store_->lookup("order-1")->lease_until, this->now() + this->kLease);
  this->clock_->advance(this->kLease * 2);
  EXPECT_TRUE(
      this->store_->complete("order-1", token, this->value("late"), this->report(), this->kTtl));
  EXPECT_EQ(this->store_->claim("order-1", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::completed);
}

// ---- leases -------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, LeaseIsLiveJustBeforeItsEnd) {
  const std::uint64_t token = this->acquire("order-1");
  this->clock_->advance(this->kLease - std::chrono::milliseconds(1));
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::in_progress);
  ASSERT_TRUE(outcome.record.has_value());
  EXPECT_EQ(outcome.record->token, token);
}

TYPED_TEST_P(IdemStoreConformance, LeaseEndsExactlyAtLeaseUntil) {
  const std::uint64_t token = this->acquire("order-1");
  this->clock_->advance(this->kLease);  // now == lease_until: the lease has ended
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(outcome.took_over);
  EXPECT_GT(outcome.token, token);
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->token, outcome.token);
  EXPECT_EQ(record->lease_until, this->now() + this->kLease);
}

TYPED_TEST_P(IdemStoreConformance, LeaseTakeoverJustAfterItsEnd) {
  const std::uint64_t token = this->acquire("order-1");
  this->clock_->advance(this->kLease + std::chrono::milliseconds(1));
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(outcome.took_over);
  EXPECT_GT(outcome.token, token);
}

TYPED_TEST_P(IdemStoreConformance, RenewExtendsTheLeaseFromNow) {
  const std::uint64_t token = this->acquire("order-1");
  for (int i = 0; i < 5; ++i) {
    this->clock_->advance(this->kLease - std::chrono::milliseconds(1));
    ASSERT_TRUE(this->store_->renew("order-1", token, this->kLease)) << "renewal " << i;
    EXPECT_EQ(this->store_->lookup("order-1")->lease_until, this->now() + this->kLease);
  }
  // Five leases have passed since the claim; the renewed claim is still live.
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::in_progress);
  // A renewal may also shorten the lease (the owner's choice).
  ASSERT_TRUE(this->store_->renew("order-1", token, std::chrono::milliseconds(5)));
  this->clock_->advance(std::chrono::milliseconds(5));
  EXPECT_EQ(this->store_->claim("order-1", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::acquired);
}

// ---- TTL ----------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ResultIsLiveJustBeforeExpiry) {
  this->complete("order-1");
  this->clock_->advance(this->kTtl - std::chrono::milliseconds(1));
  EXPECT_TRUE(this->store_->lookup("order-1").has_value());
  EXPECT_EQ(this->store_->claim("order-1", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::completed);
}

TYPED_TEST_P(IdemStoreConformance, ResultExpiresExactlyAtExpiresAt) {
  const std::uint64_t token = this->complete("order-1");
  this->clock_->advance(this->kTtl);  // now == expires_at: expired
  EXPECT_FALSE(this->store_->lookup("order-1").has_value())
      << "lookup() must report an expired result absent";
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_FALSE(outcome.took_over) << "an expired result is not a lease takeover";
  EXPECT_GT(outcome.token, token) << "tokens grow per key, also after an expiry";
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_FALSE(record->report.has_value()) << "the new claim carries nothing of the old result";
}

TYPED_TEST_P(IdemStoreConformance, ResultExpiredJustAfterExpiresAt) {
  this->complete("order-1");
  this->clock_->advance(this->kTtl + std::chrono::milliseconds(1));
  EXPECT_FALSE(this->store_->lookup("order-1").has_value());
  EXPECT_EQ(this->store_->claim("order-1", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::acquired);
}

TYPED_TEST_P(IdemStoreConformance, TokensGrowAcrossEveryKindOfReclaim) {
  std::uint64_t last = 0;
  for (int round = 0; round < 3; ++round) {
    // released
    auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
    ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_GT(outcome.token, last);
    last = outcome.token;
    ASSERT_TRUE(this->store_->release("order-1", outcome.token));
    // taken over
    outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
    ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_GT(outcome.token, last);
    last = outcome.token;
    this->clock_->advance(this->kLease);
    outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
    ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
    EXPECT_GT(outcome.token, last);
    last = outcome.token;
    // expired
    ASSERT_TRUE(this->store_->complete("order-1", outcome.token, this->value("x"), this->report(),
                                       this->kTtl));
    this->clock_->advance(this->kTtl);
    ASSERT_EQ(this->store_->purge_expired(), 1u);  // even when the old record is gone entirely
  }
  const auto outcome = this->store_->claim("order-1", std::nullopt, this->kLease);
  EXPECT_GT(outcome.token, last);
}

// ---- fingerprints -------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, DifferentFingerprintOnAClaimMismatches) {
  const std::uint64_t token = this->acquire("order-1", "fp-a");
  const std::string before = this->describe("order-1");
  const auto outcome = this->store_->claim("order-1", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::mismatch);
  ASSERT_TRUE(outcome.record.has_value());
  EXPECT_EQ(outcome.record->fingerprint, std::optional<std::string>("fp-a"));
  EXPECT_EQ(outcome.record->token, token);
  EXPECT_EQ(this->describe("order-1"), before) << "a mismatch changes nothing";
  EXPECT_EQ(this->store_->claim("order-1", "fp-a", this->kLease).status,
            idem::ClaimOutcome::Status::in_progress);
}

TYPED_TEST_P(IdemStoreConformance, DifferentFingerprintOnAResultMismatches) {
  this->complete("order-1", "result", this->kTtl, "fp-a");
  const std::string before = this->describe("order-1");
  const auto outcome = this->store_->claim("order-1", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::mismatch);
  ASSERT_TRUE(outcome.record.has_value());
  EXPECT_EQ(outcome.record->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(this->describe("order-1"), before);
  EXPECT_EQ(this->store_->claim("order-1", "fp-a", this->kLease).status,
            idem::ClaimOutcome::Status::completed);
}

TYPED_TEST_P(IdemStoreConformance, AMissingFingerprintNeverMismatches) {
  this->acquire("claimed-without", std::nullopt);
  EXPECT_EQ(this->store_->claim("claimed-without", "fp-b", this->kLease).status,
            idem::ClaimOutcome::Status::in_progress);
  this->acquire("claimed-with", "fp-a");
  EXPECT_EQ(this->store_->claim("claimed-with", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::in_progress);
  this->complete("done-without", "r", this->kTtl, std::nullopt);
  EXPECT_EQ(this->store_->claim("done-without", "fp-b", this->kLease).status,
            idem::ClaimOutcome::Status::completed);
  this->complete("done-with", "r", this->kTtl, "fp-a");
  EXPECT_EQ(this->store_->claim("done-with", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::completed);
}

TYPED_TEST_P(IdemStoreConformance, DeadRecordsNeverMismatch) {
  this->acquire("abandoned", "fp-a");
  this->complete("expired", "r", this->kTtl, "fp-a");
  this->clock_->advance(this->kTtl);  // past both the lease and the TTL

  auto outcome = this->store_->claim("abandoned", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(outcome.took_over);
  EXPECT_EQ(this->store_->lookup("abandoned")->fingerprint, std::optional<std::string>("fp-b"))
      << "the new claim carries the new fingerprint";
  EXPECT_EQ(this->store_->claim("abandoned", "fp-a", this->kLease).status,
            idem::ClaimOutcome::Status::mismatch);

  outcome = this->store_->claim("expired", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(this->store_->lookup("expired")->fingerprint, std::optional<std::string>("fp-b"));
}

// ---- lookup, purge, counts ----------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, LookupOfAnUnknownKeyIsAbsent) {
  EXPECT_FALSE(this->store_->lookup("unknown").has_value());
  EXPECT_EQ(this->store_->entry_count(), 0u) << "lookup() creates nothing";
}

TYPED_TEST_P(IdemStoreConformance, PurgeRemovesOnlyExpiredResults) {
  this->complete("short", "r", std::chrono::seconds(10));
  this->complete("medium", "r", std::chrono::seconds(20));
  this->complete("long", "r", std::chrono::hours(1));
  this->acquire("running", std::nullopt, std::chrono::seconds(15));
  EXPECT_EQ(this->store_->entry_count(), 4u);
  EXPECT_EQ(this->store_->purge_expired(), 0u);

  this->clock_->advance(std::chrono::seconds(10));  // "short" expires exactly now
  EXPECT_EQ(this->store_->purge_expired(), 1u);
  EXPECT_EQ(this->store_->entry_count(), 3u);
  EXPECT_EQ(this->store_->purge_expired(), 0u) << "a second purge finds nothing more";

  this->clock_->advance(std::chrono::seconds(10));  // "medium" expires; "running"'s lease too
  EXPECT_EQ(this->store_->purge_expired(), 1u)
      << "purge_expired() removes results, never claims (their owner may still complete)";
  EXPECT_TRUE(this->store_->lookup("running").has_value());
  EXPECT_TRUE(this->store_->lookup("long").has_value());
  EXPECT_EQ(this->store_->entry_count(), 2u);
}

TYPED_TEST_P(IdemStoreConformance, EntryCountFollowsTheRecords) {
  EXPECT_EQ(this->store_->entry_count(), 0u);
  const std::uint64_t a = this->acquire("a");
  this->acquire("b");
  this->complete("c");
  EXPECT_EQ(this->store_->entry_count(), 3u);
  ASSERT_TRUE(this->store_->release("a", a));
  EXPECT_EQ(this->store_->entry_count(), 2u);
  static_cast<void>(
      this->store_->claim("b", std::nullopt, this->kLease));  // in progress: no new record
  static_cast<void>(
      this->store_->claim("c", std::nullopt, this->kLease));  // completed: no new record
  EXPECT_EQ(this->store_->entry_count(), 2u);
}

TYPED_TEST_P(IdemStoreConformance, CountsSplitTheRecordsByState) {
  using std::chrono::seconds;
  const auto expect_counts = [&](std::uint64_t in_progress, std::uint64_t abandoned,
                                 std::uint64_t completed, std::uint64_t expired, const char* when) {
    const idem::StoreCounts counts = this->store_->counts();
    EXPECT_EQ(counts.in_progress, in_progress) << when;
    EXPECT_EQ(counts.abandoned, abandoned) << when;
    EXPECT_EQ(counts.completed, completed) << when;
    EXPECT_EQ(counts.expired, expired) << when;
    EXPECT_EQ(counts.in_progress + counts.abandoned + counts.completed + counts.expired,
              this->store_->entry_count())
        << when << ": the four states add up to entry_count()";
  };
  expect_counts(0, 0, 0, 0, "empty");
  this->acquire("running", std::nullopt, seconds(15));
  this->acquire("stalled", std::nullopt, seconds(5));
  this->complete("short", "r", seconds(10));
  this->complete("long", "r", std::chrono::hours(1));
  expect_counts(2, 0, 2, 0, "all live");
  this->clock_->advance(seconds(5));  // "stalled"'s lease ends exactly now
  expect_counts(1, 1, 2, 0, "at the end of a lease");
  this->clock_->advance(seconds(5));  // "short" expires exactly now
  expect_counts(1, 1, 1, 1, "at an expiry");
  EXPECT_EQ(this->store_->purge_expired(), 1u);
  expect_counts(1, 1, 1, 0, "after the purge");
}

TYPED_TEST_P(IdemStoreConformance, PurgeReportsProgressUpToItsTotal) {
  constexpr int kExpired = 30;
  for (int i = 0; i < kExpired; ++i)
    this->complete("old-" + std::to_string(i), "r", std::chrono::seconds(1));
  this->complete("young", "r", std::chrono::hours(1));
  this->acquire("running", std::nullopt, std::chrono::milliseconds(500));

  std::vector<std::size_t> calls;
  const idem::PurgeProgress record = [&](std::size_t done) { calls.push_back(done); };
  EXPECT_EQ(this->store_->purge_expired(record), 0u);
  EXPECT_TRUE(calls.empty()) << "nothing deleted, nothing reported";

  this->clock_->advance(std::chrono::seconds(1));
  EXPECT_EQ(this->store_->counts().expired, static_cast<std::uint64_t>(kExpired))
      << "counts().expired is what purge_expired() will delete";
  const std::size_t purged = this->store_->purge_expired(record);
  EXPECT_EQ(purged, static_cast<std::size_t>(kExpired));
  ASSERT_FALSE(calls.empty()) << "a purge that deleted something reports it";
  for (std::size_t i = 1; i < calls.size(); ++i)
    EXPECT_LT(calls[i - 1], calls[i]) << "progress only grows (call " << i << ")";
  EXPECT_EQ(calls.back(), purged) << "the last report is the total";
  EXPECT_EQ(this->store_->entry_count(), 2u);
  EXPECT_TRUE(this->store_->lookup("young").has_value());
  EXPECT_TRUE(this->store_->lookup("running").has_value()) << "claims are never purged";

  // An empty callback is allowed, and a callback that throws stops the purge with its error.
  this->clock_->advance(std::chrono::hours(2));
  EXPECT_THROW(this->store_->purge_expired([](std::size_t) { throw std::runtime_error("stop"); }),
               std::runtime_error);
  EXPECT_FALSE(this->store_->lookup("young").has_value());
  EXPECT_EQ(this->store_->purge_expired(idem::PurgeProgress{}), 0u) << "it was purged already";
}

// ---- values and reports -------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ValuesRoundTrip) {
  const std::vector<std::string> texts = {
      "", "x", idem::testing::store_conformance_detail::binary_bytes(), std::string(100'000, 'v')};
  for (std::size_t i = 0; i < texts.size(); ++i) {
    SCOPED_TRACE("value " + std::to_string(i) + " (" + std::to_string(texts[i].size()) + " bytes)");
    const std::string key = "value-" + std::to_string(i);
    const std::uint64_t token = this->acquire(key);
    ASSERT_TRUE(
        this->store_->complete(key, token, this->value(texts[i]), this->report(), this->kTtl));
    const auto outcome = this->store_->claim(key, std::nullopt, this->kLease);
    ASSERT_EQ(outcome.status, idem::ClaimOutcome::Status::completed);
    idem::testing::store_conformance_detail::expect_string_value(*this->store_,
                                                                 outcome.record->value, texts[i]);
  }
}

TYPED_TEST_P(IdemStoreConformance, TypedObjectsKeepTheirType) {
  if (this->store_->needs_bytes()) {
    GTEST_SKIP() << "capability: the store needs bytes (typed objects are for in-process stores)";
  }
  struct Receipt {
    std::string id;
    int cents = 0;
  };
  const std::uint64_t token = this->acquire("typed");
  auto receipt = std::make_shared<const Receipt>(Receipt{"r-1", 2499});
  idem::StoredValue value;
  value.object = receipt;
  value.type = std::type_index(typeid(Receipt));
  ASSERT_TRUE(this->store_->complete("typed", token, value, this->report(), this->kTtl));
  auto record = this->store_->lookup("typed");
  ASSERT_TRUE(record.has_value());
  ASSERT_TRUE(record->value.type.has_value());
  EXPECT_EQ(*record->value.type, std::type_index(typeid(Receipt)));
  auto back = std::static_pointer_cast<const Receipt>(record->value.object);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(back->id, "r-1");
  EXPECT_EQ(back->cents, 2499);

  // A void operation stores no object.
  const std::uint64_t void_token = this->acquire("void");
  idem::StoredValue nothing;
  nothing.type = std::type_index(typeid(void));
  ASSERT_TRUE(this->store_->complete("void", void_token, nothing, this->report(), this->kTtl));
  record = this->store_->lookup("void");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->value.object, nullptr);
}

TYPED_TEST_P(IdemStoreConformance, ReportRoundTrips) {
  const std::uint64_t token = this->acquire("order-1");
  ASSERT_TRUE(
      this->store_->complete("order-1", token, this->value("x"), this->report(), this->kTtl));
  auto record = this->store_->lookup("order-1");
  ASSERT_TRUE(record.has_value());
  ASSERT_TRUE(record->report.has_value());
  idem::testing::store_conformance_detail::expect_same_report(*record->report, this->report());

  // A minimal report (defaults everywhere) too.
  const std::uint64_t token2 = this->acquire("order-2");
  ASSERT_TRUE(this->store_->complete("order-2", token2, this->value("x"), idem::ExecutionReport{},
                                     this->kTtl));
  record = this->store_->lookup("order-2");
  ASSERT_TRUE(record.has_value());
  ASSERT_TRUE(record->report.has_value());
  idem::testing::store_conformance_detail::expect_same_report(*record->report,
                                                              idem::ExecutionReport{});
}

// ---- wait ---------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, WaitReturnsAtOnceWhenNothingIsInProgress) {
  const idem::SteadyTime far = this->clock_->steady_now() + std::chrono::hours(1000);
  EXPECT_FALSE(this->store_->wait("absent", far, {}).has_value());

  this->complete("done", "r");
  auto record = this->store_->wait("done", far, {});
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed);

  this->acquire("abandoned");
  this->clock_->advance(this->kLease);
  record =
      this->store_->wait("abandoned", this->clock_->steady_now() + std::chrono::hours(1000), {});
  ASSERT_TRUE(record.has_value()) << "a claim whose lease has passed is reported, not waited on";
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_LE(record->lease_until, this->now());
}

TYPED_TEST_P(IdemStoreConformance, WaitStopsAtTheDeadlineOrOnStop) {
  const std::uint64_t token = this->acquire("running", std::nullopt, std::chrono::hours(2000));
  auto record = this->store_->wait("running", this->clock_->steady_now(), {});
  ASSERT_TRUE(record.has_value()) << "a passed deadline returns what is seen";
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_EQ(record->token, token);

  std::stop_source stop;
  stop.request_stop();
  record = this->store_->wait("running", this->clock_->steady_now() + std::chrono::hours(1000),
                              stop.get_token());
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, idem::IdempotencyRecord::State::in_progress);
}

TYPED_TEST_P(IdemStoreConformance, WaitSeesTheOwnerFinish) {
  // The owner finishes while (or before) the waiter waits; either way the waiter returns what
  // the owner left. The deadline and lease are far beyond any polling a store may do.
  for (bool succeed : {true, false}) {
    SCOPED_TRACE(succeed ? "complete" : "release");
    const std::string key = succeed ? "completes" : "releases";
    const std::uint64_t token = this->acquire(key, std::nullopt, std::chrono::hours(20000));
    std::optional<idem::IdempotencyRecord> seen;
    std::thread waiter([&] {
      seen = this->store_->wait(key, this->clock_->steady_now() + std::chrono::hours(10000), {});
    });
    if (succeed) {
      EXPECT_TRUE(this->store_->complete(key, token, this->value("done"), this->report(),
                                         std::chrono::hours(100000)));
    } else {
      EXPECT_TRUE(this->store_->release(key, token));
    }
    waiter.join();
    if (succeed) {
      ASSERT_TRUE(seen.has_value());
      EXPECT_EQ(seen->state, idem::IdempotencyRecord::State::completed);
    } else {
      EXPECT_FALSE(seen.has_value());
    }
  }
}

// ---- races --------------------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, EightThreadsClaimingOneKeyYieldOneOwner) {
  constexpr int kThreads = 8;
  const int keys = idem::testing::store_conformance_detail::race_keys<TypeParam>();
  for (int k = 0; k < keys; ++k) {
    const std::string key = "race-" + std::to_string(k);
    // Odd rounds race for an abandoned claim instead of an absent key.
    if (k % 2 == 1) {
      this->acquire(key);
      this->clock_->advance(this->kLease);
    }
    std::latch start(kThreads);
    std::atomic<int> acquired{0};
    std::atomic<int> in_progress{0};
    std::atomic<int> other{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&] {
        start.arrive_and_wait();
        try {
          const auto outcome = this->store_->claim(key, std::nullopt, this->kLease);
          if (outcome.status == idem::ClaimOutcome::Status::acquired) {
            ++acquired;
          } else if (outcome.status == idem::ClaimOutcome::Status::in_progress) {
            ++in_progress;
          } else {
            ++other;
          }
        } catch (...) {
          ++other;
        }
      });
    }
    for (auto& thread : threads)
      thread.join();
    EXPECT_EQ(acquired.load(), 1) << key;
    EXPECT_EQ(in_progress.load(), kThreads - 1) << key;
    EXPECT_EQ(other.load(), 0) << key;
  }
}

TYPED_TEST_P(IdemStoreConformance, RacingOwnersAndClaimersKeepOneResult) {
  // One owner completes while 7 threads keep claiming: every claim sees in_progress or the one
  // completed result, never a second acquisition.
  constexpr int kClaimers = 7;
  const int keys = idem::testing::store_conformance_detail::race_keys<TypeParam>();
  for (int k = 0; k < keys; ++k) {
    const std::string key = "race-" + std::to_string(k);
    const std::uint64_t token = this->acquire(key);
    std::latch start(kClaimers + 1);
    std::atomic<int> acquired{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kClaimers; ++t) {
      threads.emplace_back([&] {
        start.arrive_and_wait();
        for (int i = 0; i < 3; ++i) {
          if (this->store_->claim(key, std::nullopt, this->kLease).status ==
              idem::ClaimOutcome::Status::acquired) {
            ++acquired;
          }
        }
      });
    }
    start.arrive_and_wait();
    EXPECT_TRUE(this->store_->complete(key, token, this->value("v"), this->report(), this->kTtl));
    for (auto& thread : threads)
      thread.join();
    EXPECT_EQ(acquired.load(), 0) << key;
    EXPECT_EQ(this->store_->claim(key, std::nullopt, this->kLease).status,
              idem::ClaimOutcome::Status::completed);
  }
}

// ---- operator calls: list and remove ------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ListFindsKeysByPrefixPageByPage) {
  std::map<std::string, std::uint64_t> tokens;
  for (int i = 0; i < 23; ++i) {
    const std::string key = "pay-" + std::to_string(100 + i);
    tokens[key] = i % 2 == 0 ? this->complete(key, "r", this->kTtl, "fp-" + std::to_string(i))
                             : this->acquire(key);
  }
  this->complete("refund-1");
  this->acquire("pa");  // shorter than the prefix: not listed
  for (const std::size_t limit :
       {std::size_t{1}, std::size_t{5}, std::size_t{23}, idem::kMaxListLimit}) {
    SCOPED_TRACE("limit " + std::to_string(limit));
    const auto found = this->list_all("pay-", limit);
    ASSERT_EQ(found.size(), tokens.size());
    for (const auto& [key, token] : tokens) {
      const auto it = found.find(key);
      ASSERT_NE(it, found.end()) << key;
      const idem::IdempotencyRecord& record = it->second;
      EXPECT_EQ(record.token, token) << key;
      EXPECT_FALSE(record.value.bytes.has_value()) << "a listing carries no values";
      EXPECT_EQ(record.value.object, nullptr);
      EXPECT_FALSE(record.report.has_value()) << "a listing carries no reports";
      const int i = std::stoi(key.substr(4)) - 100;
      if (i % 2 == 0) {
        EXPECT_EQ(record.state, idem::IdempotencyRecord::State::completed) << key;
        EXPECT_EQ(record.completed_at, this->now());
        EXPECT_EQ(record.expires_at, this->now() + this->kTtl);
        EXPECT_EQ(record.fingerprint, std::optional<std::string>("fp-" + std::to_string(i)));
      } else {
        EXPECT_EQ(record.state, idem::IdempotencyRecord::State::in_progress) << key;
        EXPECT_EQ(record.lease_until, this->now() + this->kLease);
        EXPECT_FALSE(record.fingerprint.has_value());
      }
    }
  }
  EXPECT_EQ(this->list_all("", 7).size(), tokens.size() + 2) << "\"\" lists every record";
  EXPECT_TRUE(this->list_all("nothing-", 10).empty());
  EXPECT_EQ(this->list_all("refund-1", 10).size(), 1u) << "a whole key is its own prefix";
}

TYPED_TEST_P(IdemStoreConformance, ListShowsRecordsThatAreNoLongerLive) {
  const std::uint64_t abandoned = this->acquire("k-abandoned", std::nullopt, this->kLease);
  this->complete("k-expired", "r", this->kLease);
  this->clock_->advance(this->kLease);
  const auto found = this->list_all("k-", 10);
  ASSERT_EQ(found.size(), 2u) << "list shows what is held, as entry_count() counts it";
  EXPECT_EQ(found.at("k-abandoned").state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_EQ(found.at("k-abandoned").token, abandoned);
  EXPECT_LE(found.at("k-abandoned").lease_until, this->now());
  EXPECT_EQ(found.at("k-expired").state, idem::IdempotencyRecord::State::completed);
  EXPECT_LE(found.at("k-expired").expires_at, this->now());
  ASSERT_EQ(this->store_->purge_expired(), 1u);
  EXPECT_EQ(this->list_all("k-", 10).size(), 1u);
}

TYPED_TEST_P(IdemStoreConformance, ListTakesPrefixCharactersLiterally) {
  // Characters that are wildcards or escapes somewhere (SQL LIKE, Redis MATCH, regexes).
  const std::vector<std::string> keys = {"a*b",   "a?c", "a[d]", "a\\e", "a%f",    "a_g",
                                         "a{h}:", "a.i", "aXb",  "aXc",  "a\\\\x", "a'j"};
  for (const std::string& key : keys)
    this->acquire(key);
  for (const std::string& key : keys) {
    SCOPED_TRACE(key);
    const auto found = this->list_all(key, 20);
    const auto expected = static_cast<std::size_t>(std::count_if(
        keys.begin(), keys.end(), [&](const auto& other) { return other.starts_with(key); }));
    EXPECT_EQ(found.size(), expected);
    EXPECT_TRUE(found.contains(key));
  }
  EXPECT_EQ(this->list_all("a*", 20).size(), 1u);
  EXPECT_EQ(this->list_all("a%", 20).size(), 1u);
  EXPECT_EQ(this->list_all("a_", 20).size(), 1u);
  EXPECT_EQ(this->list_all("a\\", 20).size(), 2u);
  EXPECT_EQ(this->list_all("a", 20).size(), keys.size());
}

TYPED_TEST_P(IdemStoreConformance, ListRejectsBadArguments) {
  this->acquire("order-1");
  EXPECT_THROW(static_cast<void>(this->store_->list("", 0)), idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(this->store_->list("", idem::kMaxListLimit + 1)),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(this->store_->list("a\nb", 10)), idem::InvalidKey);
  EXPECT_THROW(static_cast<void>(this->store_->list(std::string(idem::kMaxKeyLength + 1, 'o'), 10)),
               idem::InvalidKey);
  EXPECT_EQ(this->list_all(std::string(idem::kMaxKeyLength, 'o'), 10).size(), 0u);
  EXPECT_EQ(this->list_all(" ", 10).size(), 0u) << "a prefix of spaces is a prefix";
}

TYPED_TEST_P(IdemStoreConformance, RemoveFencesTheHolderOff) {
  const std::uint64_t token = this->acquire("order-1", "fp-a");
  EXPECT_FALSE(this->store_->remove("order-1", token + 1)) << "another token changes nothing";
  EXPECT_EQ(this->store_->lookup("order-1")->token, token);
  EXPECT_TRUE(this->store_->remove("order-1", token)) << "a live claim is removed";
  EXPECT_FALSE(this->store_->lookup("order-1").has_value());
  EXPECT_EQ(this->store_->entry_count(), 0u);
  EXPECT_FALSE(this->store_->remove("order-1", token)) << "removing twice is refused";
  EXPECT_FALSE(this->store_->renew("order-1", token, this->kLease));
  EXPECT_FALSE(
      this->store_->complete("order-1", token, this->value("late"), this->report(), this->kTtl))
      << "the holder of a removed claim is fenced off";
  EXPECT_FALSE(this->store_->release("order-1", token));
  const auto outcome = this->store_->claim("order-1", "fp-b", this->kLease);
  EXPECT_EQ(outcome.status, idem::ClaimOutcome::Status::acquired);
  EXPECT_FALSE(outcome.took_over);
  EXPECT_GT(outcome.token, token) << "the next claim gets a larger token";
  EXPECT_FALSE(
      this->store_->complete("order-1", token, this->value("late"), this->report(), this->kTtl))
      << "the old holder is still fenced off once the key is claimed again";
  EXPECT_TRUE(this->store_->complete("order-1", outcome.token, this->value("fresh"), this->report(),
                                     this->kTtl));
}

TYPED_TEST_P(IdemStoreConformance, RemoveTakesResultsAndDeadRecordsToo) {
  const std::uint64_t done = this->complete("done");
  const std::uint64_t expired = this->complete("expired", "r", this->kLease);
  const std::uint64_t abandoned = this->acquire("abandoned");
  this->clock_->advance(this->kLease);
  EXPECT_TRUE(this->store_->remove("done", done)) << "a live result is forgotten";
  EXPECT_EQ(this->store_->claim("done", std::nullopt, this->kLease).status,
            idem::ClaimOutcome::Status::acquired)
      << "its key runs again";
  EXPECT_TRUE(this->store_->remove("expired", expired));
  EXPECT_TRUE(this->store_->remove("abandoned", abandoned));
  EXPECT_FALSE(this->store_->remove("never-claimed", 1));
  EXPECT_EQ(this->store_->entry_count(), 1u);
}

TYPED_TEST_P(IdemStoreConformance, RacingClaimsWithOtherArgumentsAllMismatch) {
  // 8 threads claim one key, each with a fingerprint of its own: one acquires, and every other
  // claim fails and is answered with the winner's claim, which mismatches. The fingerprint is
  // checked where a claim fails, not only where a result is read.
  constexpr int kThreads = 8;
  const int keys = idem::testing::store_conformance_detail::race_keys<TypeParam>();
  for (int k = 0; k < keys; ++k) {
    const std::string key = "reuse-race-" + std::to_string(k);
    if (k % 2 == 1) {  // odd rounds race for an abandoned claim instead of an absent key
      this->acquire(key, "fp-abandoned");
      this->clock_->advance(this->kLease);
    }
    std::latch start(kThreads);
    std::vector<idem::ClaimOutcome> outcomes(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string fingerprint = "fp-" + std::to_string(t);
        start.arrive_and_wait();
        outcomes[t] = this->store_->claim(key, fingerprint, this->kLease);
      });
    }
    for (auto& thread : threads)
      thread.join();
    int winner = -1;
    for (int t = 0; t < kThreads; ++t) {
      if (outcomes[t].status == idem::ClaimOutcome::Status::acquired) {
        EXPECT_EQ(winner, -1) << key << ": two owners";
        winner = t;
      }
    }
    ASSERT_NE(winner, -1) << key;
    for (int t = 0; t < kThreads; ++t) {
      if (t == winner) continue;
      EXPECT_EQ(outcomes[t].status, idem::ClaimOutcome::Status::mismatch) << key << " thread " << t;
      ASSERT_TRUE(outcomes[t].record.has_value()) << key;
      EXPECT_EQ(outcomes[t].record->fingerprint, "fp-" + std::to_string(winner)) << key;
      EXPECT_EQ(outcomes[t].record->token, outcomes[winner].token) << key;
    }
  }
}

// ---- keys and arguments -------------------------------------------------------------------

TYPED_TEST_P(IdemStoreConformance, InvalidKeysAreRejectedByEveryMethod) {
  const idem::SteadyTime far = this->clock_->steady_now() + std::chrono::hours(1);
  for (const std::string& key : idem::testing::invalid_keys()) {
    SCOPED_TRACE("key of " + std::to_string(key.size()) + " bytes");
    EXPECT_THROW(static_cast<void>(this->store_->claim(key, std::nullopt, this->kLease)),
                 idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(
                     this->store_->complete(key, 1, this->value("x"), this->report(), this->kTtl)),
                 idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->store_->release(key, 1)), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->store_->renew(key, 1, this->kLease)), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->store_->lookup(key)), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->store_->wait(key, far, {})), idem::InvalidKey);
    EXPECT_THROW(static_cast<void>(this->store_->remove(key, 1)), idem::InvalidKey);
  }
  EXPECT_EQ(this->store_->entry_count(), 0u) << "a rejected key must store nothing";
}

TYPED_TEST_P(IdemStoreConformance, UnusualValidKeysWorkAndStayDistinct) {
  const auto keys = idem::testing::unusual_valid_keys();
  for (const std::string& key : keys) {
    SCOPED_TRACE(key.substr(0, 40));
    this->complete(key, "value of " + key);
  }
  EXPECT_EQ(this->store_->entry_count(), keys.size());
  for (const std::string& key : keys) {
    SCOPED_TRACE(key.substr(0, 40));
    auto record = this->store_->lookup(key);
    ASSERT_TRUE(record.has_value());
    EXPECT_EQ(record->key, key);
    idem::testing::store_conformance_detail::expect_string_value(*this->store_, record->value,
                                                                 "value of " + key);
  }
}

TYPED_TEST_P(IdemStoreConformance, BadLeaseOrTtlIsRejected) {
  EXPECT_THROW(static_cast<void>(this->store_->claim("order-1", std::nullopt, idem::Millis(0))),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(this->store_->claim("order-1", std::nullopt, idem::Millis(-5))),
               idem::InvalidArgument);
  EXPECT_EQ(this->store_->entry_count(), 0u);
  const std::uint64_t token = this->acquire("order-1");
  EXPECT_THROW(static_cast<void>(this->store_->renew("order-1", token, idem::Millis(0))),
               idem::InvalidArgument);
  EXPECT_THROW(static_cast<void>(this->store_->complete("order-1", token, this->value("x"),
                                                        this->report(), idem::Millis(-1))),
               idem::InvalidArgument);
  EXPECT_EQ(this->store_->lookup("order-1")->state, idem::IdempotencyRecord::State::in_progress)
      << "a rejected call changes nothing";
}

// ---- scoped keys (operations over the store) ----------------------------------------------

TYPED_TEST_P(IdemStoreConformance, ScopedKeysKeepOperationsApart) {
  auto a_calls = std::make_shared<std::atomic<int>>(0);
  auto b_calls = std::make_shared<std::atomic<int>>(0);
  auto key = [](const std::string&) { return std::string("same-key"); };
  auto a =
      idem::resilient([a_calls](const std::string&) { return "a-" + std::to_string(++*a_calls); },
                      {.name = "conformance_a",
                       .idempotency_key = key,
                       .idempotency_store = this->store_,
                       .clock = this->clock_});
  auto b =
      idem::resilient([b_calls](const std::string&) { return "b-" + std::to_string(++*b_calls); },
                      {.name = "conformance_b",
                       .idempotency_key = key,
                       .idempotency_store = this->store_,
                       .clock = this->clock_});
  EXPECT_EQ(a("x").value, "a-1");
  EXPECT_EQ(b("x").value, "b-1") << "operation b must not replay operation a's result";
  EXPECT_EQ(a("x").value, "a-1");
  const auto replay = b("x");
  EXPECT_EQ(replay.value, "b-1");
  EXPECT_EQ(replay.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(*a_calls, 1);
  EXPECT_EQ(*b_calls, 1);
  // The stored keys carry the scope in the documented format.
  EXPECT_TRUE(this->store_->lookup("13:conformance_a:same-key").has_value());
  EXPECT_TRUE(this->store_->lookup("13:conformance_b:same-key").has_value());
  EXPECT_FALSE(this->store_->lookup("same-key").has_value());
}

TYPED_TEST_P(IdemStoreConformance, ScopedKeysAreSharedOnlyByAnExplicitScope) {
  auto key = [](const std::string&) { return std::string("shared-key"); };
  auto writer = idem::resilient([](const std::string&) { return std::string("written"); },
                                {.name = "conformance_writer",
                                 .idempotency_key = key,
                                 .idempotency_scope = "payments",
                                 .idempotency_store = this->store_,
                                 .clock = this->clock_});
  auto reader =
      idem::operation("conformance_reader", [](const std::string&) { return std::string("read"); })
          .with_clock(this->clock_)
          .with_idempotency({.key = key, .scope = "payments", .store = this->store_});
  EXPECT_EQ(writer("x").value, "written");
  const auto shared = reader.run("x");
  EXPECT_EQ(shared.value, "written");
  EXPECT_EQ(shared.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_TRUE(this->store_->lookup(idem::scoped_idempotency_key("payments", "shared-key")));
}

TYPED_TEST_P(IdemStoreConformance, ScopedKeysUpToTheLimitWork) {
  // "18:conformance_limits:" is 22 bytes; 233 bytes of key make the 255-byte maximum.
  auto op = idem::resilient([](const std::string& k) { return std::to_string(k.size()); },
                            {.name = "conformance_limits",
                             .idempotency_key = [](const std::string& k) { return k; },
                             .idempotency_store = this->store_,
                             .clock = this->clock_});
  const std::string longest(233, 'k');
  EXPECT_EQ(op(longest).value, "233");
  const std::string stored = idem::scoped_idempotency_key("conformance_limits", longest);
  EXPECT_EQ(stored.size(), idem::kMaxKeyLength);
  EXPECT_TRUE(this->store_->lookup(stored).has_value());
  EXPECT_THROW(op(longest + "k"), idem::InvalidKey);
}

TYPED_TEST_P(IdemStoreConformance, AKeyReusedWithOtherArgumentsIsRefusedOnEveryPath) {
  // An operation fingerprints its arguments by default. Its key comes back with other arguments:
  // after the first call completed (the store answers with the result), and while another
  // process holds the claim for other arguments (the store answers the failed claim with that
  // claim). Each is KeyReuseError naming the operation and the caller's key, and nothing runs.
  auto calls = std::make_shared<std::atomic<int>>(0);
  auto fn = [calls](const std::string& id, int amount) {
    ++*calls;
    return id + ":" + std::to_string(amount);
  };
  auto key = [](const std::string& id, int) { return id; };
  auto pay = idem::resilient(fn, {.name = "conformance_reuse",
                                  .idempotency_key = key,
                                  .idempotency_store = this->store_,
                                  .clock = this->clock_});
  auto expect_reuse = [&](const std::string& id, int amount, const std::string& what) {
    try {
      pay(id, amount);
      ADD_FAILURE() << "expected KeyReuseError for " << id;
    } catch (const idem::KeyReuseError& e) {
      const std::string message = e.what();
      EXPECT_EQ(e.key(), id);
      EXPECT_EQ(e.operation(), "conformance_reuse");
      EXPECT_NE(message.find("operation 'conformance_reuse': idempotency key '" + id + "' " + what),
                std::string::npos)
          << message;
      EXPECT_NE(message.find("claim token "), std::string::npos) << message;
    }
  };
  EXPECT_EQ(pay("k-1", 1).value, "k-1:1");
  expect_reuse("k-1", 2, "was first used with different arguments");

  const std::string held = idem::scoped_idempotency_key("conformance_reuse", "k-2");
  const auto other =
      this->store_->claim(held, idem::fingerprint(std::string("k-2"), 1), this->kLease);
  ASSERT_EQ(other.status, idem::ClaimOutcome::Status::acquired);
  expect_reuse("k-2", 2, "is in progress with different arguments");
  EXPECT_EQ(*calls, 1);

  // A caller whose arguments carry noise opts out, and replays.
  auto lax = idem::resilient(fn, {.name = "conformance_reuse",
                                  .idempotency_key = key,
                                  .idempotency_store = this->store_,
                                  .idempotency_fingerprint = false,
                                  .clock = this->clock_});
  EXPECT_EQ(lax("k-1", 3).value, "k-1:1");
  EXPECT_EQ(*calls, 1);
}

REGISTER_TYPED_TEST_SUITE_P(
    IdemStoreConformance, ClaimOfAnAbsentKeyAcquires, SecondClaimSeesTheOwnersClaim,
    ClaimOnAnotherKeyIsIndependent, CompleteMakesTheRecordReplayable,
    CompletedRecordRefusesEveryTokenOperation, CompleteOfAnUnknownKeyIsRefused,
    ZeroTtlIsExpiredAtOnce, ReleaseForgetsTheClaim, WrongTokensChangeNothing,
    TakeoverFencesOffTheOldOwner, AnOwnerPastItsLeaseKeepsItsClaimUntilTakenOver,
    LeaseIsLiveJustBeforeItsEnd, LeaseEndsExactlyAtLeaseUntil, LeaseTakeoverJustAfterItsEnd,
    RenewExtendsTheLeaseFromNow, ResultIsLiveJustBeforeExpiry, ResultExpiresExactlyAtExpiresAt,
    ResultExpiredJustAfterExpiresAt, TokensGrowAcrossEveryKindOfReclaim,
    DifferentFingerprintOnAClaimMismatches, DifferentFingerprintOnAResultMismatches,
    AMissingFingerprintNeverMismatches, DeadRecordsNeverMismatch, LookupOfAnUnknownKeyIsAbsent,
    PurgeRemovesOnlyExpiredResults, EntryCountFollowsTheRecords, ValuesRoundTrip,
    TypedObjectsKeepTheirType, ReportRoundTrips, WaitReturnsAtOnceWhenNothingIsInProgress,
    WaitStopsAtTheDeadlineOrOnStop, WaitSeesTheOwnerFinish, EightThreadsClaimingOneKeyYieldOneOwner,
    RacingOwnersAndClaimersKeepOneResult, RacingClaimsWithOtherArgumentsAllMismatch,
    InvalidKeysAreRejectedByEveryMethod, UnusualValidKeysWorkAndStayDistinct,
    BadLeaseOrTtlIsRejected, CountsSplitTheRecordsByState, PurgeReportsProgressUpToItsTotal,
    ScopedKeysKeepOperationsApart, ScopedKeysAreSharedOnlyByAnExplicitScope,
    ScopedKeysUpToTheLimitWork, AKeyReusedWithOtherArgumentsIsRefusedOnEveryPath,
    ListFindsKeysByPrefixPageByPage, ListShowsRecordsThatAreNoLongerLive,
    ListTakesPrefixCharactersLiterally, ListRejectsBadArguments, RemoveFencesTheHolderOff,
    RemoveTakesResultsAndDeadRecordsToo);

// Runs the whole suite against the store made by `Factory` (see the top of this file).
#define INSTANTIATE_STORE_CONFORMANCE(Prefix, Factory) \
  INSTANTIATE_TYPED_TEST_SUITE_P(Prefix, IdemStoreConformance, ::testing::Types<Factory>)
