// The Outbox conformance suite: what every outbox must do, as GoogleTest tests.
//
// Every outbox idem ships passes this suite (SQLite, PostgreSQL), and users can run it against
// their own. It checks the contract written in idem/outbox.hpp: rows appended in a recorder's
// transaction commit (or roll back) with it; relay passes take waiting rows oldest first, at most
// max_rows, and never the rows another relay holds; a confirmed row is deleted; a refused one
// counts an attempt and is parked at the max_attempts-th refusal; a row neither confirmed nor
// refused is left as it was; a publisher that throws (or answers for the wrong number of rows)
// changes nothing; unpark() puts parked rows back with their attempts reset and wakes relays;
// stats() counts waiting and parked rows and ages the oldest; notify_committed() wakes
// wait_for_rows(); and bad arguments are refused before the backend sees them.
//
// How to use it — a factory type and one macro, in a test file linked with gtest_main:
//
//   #include "idem/testing/outbox_conformance.hpp"
//
//   struct MyOutboxFactory {
//     // Called once per test: a recorder with transactions and an outbox on one fresh, empty
//     // database (rows are appended through the recorder's run_transactional, whose
//     // Transaction must be an idem::SqlTransaction).
//     idem::testing::OutboxUnderTest make();
//     // Another outbox on the same database, as another relay process would open it.
//     std::shared_ptr<idem::Outbox> another();
//   };
//   INSTANTIATE_OUTBOX_CONFORMANCE(MyOutbox, MyOutboxFactory);
//
// The factory is default-constructed once per test and destroyed after the objects it made, so
// its constructor/destructor can create and remove a temporary database. A factory whose make()
// returns a null recorder or outbox skips the test (e.g. no server configured). Tests live in the
// global test suite IdemOutboxConformance, so the macro can be used in any namespace.
//
// Thread-safety: the race test runs relays on two threads (one per outbox object); run the suite
// under ThreadSanitizer to check an outbox's locking.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/key.hpp"
#include "idem/outbox.hpp"
#include "idem/recorder.hpp"
#include "idem/sql.hpp"

namespace idem::testing {

// What a factory's make() returns: a recorder and the outbox on its database.
struct OutboxUnderTest {
  std::shared_ptr<IdempotencyRecorder> recorder;
  std::shared_ptr<Outbox> outbox;
};

namespace detail {

// Answers each row as `verdict(row)` says and keeps every row it was given, in order. Not for
// concurrent use unless `mutex` is held by the caller (the race test locks it in `verdict`).
class ScriptedPublisher : public OutboxPublisher {
 public:
  std::vector<PublishVerdict> publish(std::span<const OutboxRow> rows) override {
    std::vector<PublishVerdict> verdicts;
    {
      std::lock_guard lock(mutex);
      ++calls;
      batches.emplace_back(rows.begin(), rows.end());
    }
    if (during) during(rows);
    for (const OutboxRow& row : rows)
      verdicts.push_back(verdict ? verdict(row) : PublishVerdict{.confirmed = true, .refusal = {}});
    return verdicts;
  }

  std::vector<OutboxRow> all_rows() {
    std::lock_guard lock(mutex);
    std::vector<OutboxRow> all;
    for (const auto& batch : batches)
      all.insert(all.end(), batch.begin(), batch.end());
    return all;
  }

  std::mutex mutex;
  int calls = 0;                                            // guarded by mutex
  std::vector<std::vector<OutboxRow>> batches;              // guarded by mutex
  std::function<PublishVerdict(const OutboxRow&)> verdict;  // default: confirm
  std::function<void(std::span<const OutboxRow>)> during;   // runs while the batch is held
};

inline PublishVerdict refuse(std::string reason) {
  return {.confirmed = false, .refusal = std::move(reason)};
}
inline PublishVerdict defer() {
  return {.confirmed = false, .refusal = {}};
}

}  // namespace detail
}  // namespace idem::testing

template <class Factory>
class IdemOutboxConformance : public ::testing::Test {
 protected:
  void SetUp() override {
    made_ = factory_.make();
    if (!made_.recorder || !made_.outbox) GTEST_SKIP() << "the factory made no outbox";
    ASSERT_TRUE(made_.recorder->supports_transactions())
        << "the outbox's recorder must support transactions";
  }

  idem::Outbox& outbox() { return *made_.outbox; }

  // An event with a whole-millisecond timestamp (every backend keeps milliseconds).
  static idem::Event event(const std::string& id, const std::string& type = "order.charged") {
    idem::Event e;
    e.id = id;
    e.type = type;
    e.payload = "payload of " + id;
    e.headers["trace"] = "t-" + id;
    e.timestamp = idem::WallTime(std::chrono::milliseconds(1'700'000'000'123));
    return e;
  }

  // Appends `events` as follow-ups of (consumer, source) in one committed transaction.
  void append(const std::string& consumer, const std::string& source,
              const std::vector<idem::Event>& events) {
    const bool ran =
        made_.recorder->run_transactional(consumer, source, [&](idem::Transaction& tx) {
          auto* sql = dynamic_cast<idem::SqlTransaction*>(&tx);
          ASSERT_NE(sql, nullptr) << "the recorder's Transaction is not an idem::SqlTransaction";
          for (const idem::Event& e : events)
            outbox().append(*sql, consumer, source, e);
        });
    ASSERT_TRUE(ran) << "(" << consumer << ", " << source << ") was already processed";
    outbox().notify_committed();
  }

  // `n` rows of `consumer`, one transaction each, with ids "<consumer>-<i>".
  void append_rows(const std::string& consumer, int n) {
    for (int i = 0; i < n; ++i) {
      const std::string id = consumer + "-" + std::to_string(i);
      append(consumer, "src-" + id, {event(id)});
    }
  }

  Factory factory_;  // declared first: destroyed after what it made (temp files, schemas)
  idem::testing::OutboxUnderTest made_;
};

TYPED_TEST_SUITE_P(IdemOutboxConformance);

TYPED_TEST_P(IdemOutboxConformance, RowsGoOutOldestFirstWithEveryField) {
  this->append("billing", "e1", {this->event("f1"), this->event("f2")});
  this->append("audit", "e2", {this->event("f3")});
  this->append("billing", "e3", {this->event("f4")});
  idem::testing::detail::ScriptedPublisher publisher;
  const auto result = this->outbox().relay_batch(publisher, 100, 5);
  EXPECT_EQ(result.taken, 4u);
  EXPECT_EQ(result.published, 4u);
  const auto rows = publisher.all_rows();
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::string> ids = {"f1", "f2", "f3", "f4"};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].event.id, ids[i]);
    if (i > 0) {
      EXPECT_LT(rows[i - 1].seq, rows[i].seq);
    }
    EXPECT_EQ(rows[i].attempts, 0);
    EXPECT_EQ(rows[i].last_error, "");
  }
  const idem::Event expected = TestFixture::event("f3");
  EXPECT_EQ(rows[2].consumer, "audit");
  EXPECT_EQ(rows[2].source_event_id, "e2");
  EXPECT_EQ(rows[2].event.type, expected.type);
  EXPECT_EQ(rows[2].event.payload, expected.payload);
  EXPECT_EQ(rows[2].event.headers, expected.headers);
  EXPECT_EQ(rows[2].event.timestamp, expected.timestamp);
}

TYPED_TEST_P(IdemOutboxConformance, BinaryPayloadsAndUnusualTextSurvive) {
  idem::Event e = TestFixture::event("it's \"odd\"; --");
  e.payload = std::string("a\0b\xff\x01", 5);
  e.headers = {{"k'ey", "v\"al"}, {"empty", ""}};
  this->append("consumer with spaces", "source:with:colons", {e});
  idem::testing::detail::ScriptedPublisher publisher;
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 5).published, 1u);
  const auto rows = publisher.all_rows();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].event.id, e.id);
  EXPECT_EQ(rows[0].event.payload, e.payload);
  EXPECT_EQ(rows[0].event.headers, e.headers);
  EXPECT_EQ(rows[0].consumer, "consumer with spaces");
  EXPECT_EQ(rows[0].source_event_id, "source:with:colons");
}

TYPED_TEST_P(IdemOutboxConformance, RolledBackTransactionLeavesNoRow) {
  EXPECT_THROW((void)this->made_.recorder->run_transactional(
                   "billing", "e1",
                   [&](idem::Transaction& tx) {
                     this->outbox().append(dynamic_cast<idem::SqlTransaction&>(tx), "billing", "e1",
                                           TestFixture::event("f1"));
                     throw std::runtime_error("handler failed after appending");
                   }),
               std::runtime_error);
  EXPECT_EQ(this->outbox().stats().depth, 0u);
  idem::testing::detail::ScriptedPublisher publisher;
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 5).taken, 0u);
  EXPECT_EQ(publisher.calls, 0);
}

TYPED_TEST_P(IdemOutboxConformance, TakesAtMostMaxRows) {
  this->append_rows("billing", 5);
  idem::testing::detail::ScriptedPublisher publisher;
  const auto first = this->outbox().relay_batch(publisher, 2, 5);
  EXPECT_EQ(first.taken, 2u);
  EXPECT_EQ(first.published, 2u);
  EXPECT_EQ(this->outbox().stats().depth, 3u);
  EXPECT_EQ(this->outbox().relay_batch(publisher, 2, 5).taken, 2u);
  EXPECT_EQ(this->outbox().relay_batch(publisher, 2, 5).taken, 1u);
  const auto last = this->outbox().relay_batch(publisher, 2, 5);
  EXPECT_EQ(last.taken, 0u);
  EXPECT_FALSE(last.busy);
  EXPECT_EQ(publisher.calls, 3);  // an empty pass publishes nothing
  const auto rows = publisher.all_rows();
  ASSERT_EQ(rows.size(), 5u);
  for (int i = 0; i < 5; ++i)
    EXPECT_EQ(rows[i].event.id, "billing-" + std::to_string(i));
}

TYPED_TEST_P(IdemOutboxConformance, ConfirmedRowsAreDeleted) {
  this->append_rows("billing", 3);
  idem::testing::detail::ScriptedPublisher publisher;
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 5).published, 3u);
  const auto stats = this->outbox().stats();
  EXPECT_EQ(stats.depth, 0u);
  EXPECT_EQ(stats.parked, 0u);
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 5).taken, 0u);
  EXPECT_TRUE(this->outbox().parked(10).empty());
}

TYPED_TEST_P(IdemOutboxConformance, RefusalsCountAndParkAtMaxAttempts) {
  this->append_rows("billing", 1);
  idem::testing::detail::ScriptedPublisher publisher;
  int refusal = 0;
  publisher.verdict = [&](const idem::OutboxRow&) {
    return idem::testing::detail::refuse("no route #" + std::to_string(++refusal));
  };
  for (int attempt = 0; attempt < 2; ++attempt) {
    const auto r = this->outbox().relay_batch(publisher, 10, 3);
    EXPECT_EQ(r.taken, 1u);
    EXPECT_EQ(r.refused, 1u);
    EXPECT_EQ(r.parked, 0u);
    EXPECT_EQ(r.published, 0u);
  }
  // Each pass saw the attempts and reason of the one before.
  ASSERT_EQ(publisher.batches.size(), 2u);
  EXPECT_EQ(publisher.batches[0].at(0).attempts, 0);
  EXPECT_EQ(publisher.batches[1].at(0).attempts, 1);
  EXPECT_EQ(publisher.batches[1].at(0).last_error, "no route #1");
  const auto third = this->outbox().relay_batch(publisher, 10, 3);
  EXPECT_EQ(third.refused, 0u);
  EXPECT_EQ(third.parked, 1u);
  // Parked: kept with its reason, no longer taken.
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 3).taken, 0u);
  const auto stats = this->outbox().stats();
  EXPECT_EQ(stats.depth, 0u);
  EXPECT_EQ(stats.parked, 1u);
  EXPECT_FALSE(stats.oldest_age.has_value());
  const auto parked = this->outbox().parked(10);
  ASSERT_EQ(parked.size(), 1u);
  EXPECT_EQ(parked[0].event.id, "billing-0");
  EXPECT_EQ(parked[0].attempts, 3);
  EXPECT_EQ(parked[0].last_error, "no route #3");
}

TYPED_TEST_P(IdemOutboxConformance, MaxAttemptsOneParksAtTheFirstRefusal) {
  this->append_rows("billing", 1);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.verdict = [](const idem::OutboxRow&) {
    return idem::testing::detail::refuse("rejected");
  };
  const auto r = this->outbox().relay_batch(publisher, 10, 1);
  EXPECT_EQ(r.parked, 1u);
  EXPECT_EQ(r.refused, 0u);
  EXPECT_EQ(this->outbox().stats().parked, 1u);
}

TYPED_TEST_P(IdemOutboxConformance, DeferredRowsAreLeftAsTheyWere) {
  this->append_rows("billing", 2);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.verdict = [](const idem::OutboxRow&) { return idem::testing::detail::defer(); };
  for (int pass = 0; pass < 3; ++pass) {
    const auto r = this->outbox().relay_batch(publisher, 10, 1);  // 1: a count would park
    EXPECT_EQ(r.taken, 2u);
    EXPECT_EQ(r.deferred, 2u);
    EXPECT_EQ(r.refused + r.parked + r.published, 0u);
  }
  for (const auto& row : publisher.batches.back()) {
    EXPECT_EQ(row.attempts, 0);
    EXPECT_EQ(row.last_error, "");
  }
  EXPECT_EQ(this->outbox().stats().depth, 2u);
  EXPECT_EQ(this->outbox().stats().parked, 0u);
}

TYPED_TEST_P(IdemOutboxConformance, OneBatchSettlesEachRowByItsVerdict) {
  this->append_rows("billing", 4);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.verdict = [](const idem::OutboxRow& row) -> idem::PublishVerdict {
    if (row.event.id == "billing-0") return {.confirmed = true, .refusal = {}};
    if (row.event.id == "billing-1") return idem::testing::detail::refuse("full");
    if (row.event.id == "billing-2") return idem::testing::detail::defer();
    return idem::testing::detail::refuse("poison");
  };
  publisher.during = nullptr;
  const auto r = this->outbox().relay_batch(publisher, 10, 2);
  EXPECT_EQ(r.taken, 4u);
  EXPECT_EQ(r.published, 1u);
  EXPECT_EQ(r.refused, 2u);
  EXPECT_EQ(r.deferred, 1u);
  EXPECT_EQ(r.parked, 0u);
  idem::testing::detail::ScriptedPublisher confirming;
  confirming.verdict = [](const idem::OutboxRow&) { return idem::testing::detail::defer(); };
  EXPECT_EQ(this->outbox().relay_batch(confirming, 10, 2).taken, 3u);
  const auto rows = confirming.all_rows();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].event.id, "billing-1");
  EXPECT_EQ(rows[0].attempts, 1);
  EXPECT_EQ(rows[0].last_error, "full");
  EXPECT_EQ(rows[1].event.id, "billing-2");
  EXPECT_EQ(rows[1].attempts, 0);
  EXPECT_EQ(rows[2].event.id, "billing-3");
  EXPECT_EQ(rows[2].attempts, 1);
  EXPECT_EQ(rows[2].last_error, "poison");
}

TYPED_TEST_P(IdemOutboxConformance, PublisherThrowChangesNothing) {
  this->append_rows("billing", 3);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.during = [](std::span<const idem::OutboxRow>) {
    throw std::runtime_error("connection lost before the confirms");
  };
  EXPECT_THROW((void)this->outbox().relay_batch(publisher, 10, 1), std::runtime_error);
  EXPECT_EQ(this->outbox().stats().depth, 3u);
  EXPECT_EQ(this->outbox().stats().parked, 0u);
  // Released: another relay takes the same rows, unchanged.
  auto other = this->factory_.another();
  ASSERT_NE(other, nullptr);
  idem::testing::detail::ScriptedPublisher next;
  const auto r = other->relay_batch(next, 10, 1);
  EXPECT_EQ(r.taken, 3u);
  EXPECT_EQ(r.published, 3u);
  for (const auto& row : next.all_rows())
    EXPECT_EQ(row.attempts, 0);
}

TYPED_TEST_P(IdemOutboxConformance, WrongVerdictCountChangesNothing) {
  this->append_rows("billing", 2);
  class ShortPublisher : public idem::OutboxPublisher {
   public:
    std::vector<idem::PublishVerdict> publish(std::span<const idem::OutboxRow>) override {
      return {idem::PublishVerdict{.confirmed = true, .refusal = {}}};
    }
  } publisher;
  EXPECT_THROW((void)this->outbox().relay_batch(publisher, 10, 1), idem::InvalidArgument);
  EXPECT_EQ(this->outbox().stats().depth, 2u);
  idem::testing::detail::ScriptedPublisher next;
  EXPECT_EQ(this->outbox().relay_batch(next, 10, 1).published, 2u);
}

TYPED_TEST_P(IdemOutboxConformance, UnparkResetsAttemptsAndWakesRelays) {
  this->append_rows("billing", 2);
  idem::testing::detail::ScriptedPublisher refusing;
  refusing.verdict = [](const idem::OutboxRow&) { return idem::testing::detail::refuse("down"); };
  EXPECT_EQ(this->outbox().relay_batch(refusing, 10, 1).parked, 2u);
  EXPECT_EQ(this->outbox().stats().parked, 2u);
  (void)this->outbox().wait_for_rows(std::chrono::milliseconds(0));  // consume earlier wakes
  EXPECT_EQ(this->outbox().unpark(), 2u);
  EXPECT_TRUE(this->outbox().wait_for_rows(std::chrono::hours(1)));
  const auto stats = this->outbox().stats();
  EXPECT_EQ(stats.parked, 0u);
  EXPECT_EQ(stats.depth, 2u);
  EXPECT_EQ(this->outbox().unpark(), 0u);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.verdict = [](const idem::OutboxRow&) { return idem::testing::detail::defer(); };
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 1).taken, 2u);
  for (const auto& row : publisher.all_rows()) {
    EXPECT_EQ(row.attempts, 0);
    EXPECT_EQ(row.last_error, "down");  // the reason stays for the operator
  }
}

TYPED_TEST_P(IdemOutboxConformance, StatsCountWaitingAndParkedRowsAndAgeTheOldest) {
  auto stats = this->outbox().stats();
  EXPECT_EQ(stats.depth, 0u);
  EXPECT_EQ(stats.parked, 0u);
  EXPECT_FALSE(stats.oldest_age.has_value());
  this->append_rows("billing", 3);
  stats = this->outbox().stats();
  EXPECT_EQ(stats.depth, 3u);
  EXPECT_EQ(stats.parked, 0u);
  ASSERT_TRUE(stats.oldest_age.has_value());
  EXPECT_GE(stats.oldest_age->count(), 0);
  idem::testing::detail::ScriptedPublisher publisher;
  publisher.verdict = [](const idem::OutboxRow& row) -> idem::PublishVerdict {
    if (row.event.id == "billing-0") return idem::testing::detail::refuse("poison");
    return idem::testing::detail::defer();
  };
  EXPECT_EQ(this->outbox().relay_batch(publisher, 10, 1).parked, 1u);
  stats = this->outbox().stats();
  EXPECT_EQ(stats.depth, 2u);
  EXPECT_EQ(stats.parked, 1u);
  EXPECT_TRUE(stats.oldest_age.has_value());
  EXPECT_EQ(this->outbox().parked(10).size(), 1u);
  EXPECT_TRUE(this->outbox().parked(0).empty());
}

TYPED_TEST_P(IdemOutboxConformance, NotifyCommittedWakesWaitForRows) {
  (void)this->outbox().wait_for_rows(std::chrono::milliseconds(0));  // consume earlier wakes
  EXPECT_FALSE(this->outbox().wait_for_rows(std::chrono::milliseconds(0)));
  this->outbox().notify_committed();
  EXPECT_TRUE(this->outbox().wait_for_rows(std::chrono::hours(1)));
  // From another thread, while the waiter waits (or before it starts: a wake is kept).
  std::thread notifier([&] { this->outbox().notify_committed(); });
  EXPECT_TRUE(this->outbox().wait_for_rows(std::chrono::hours(1)));
  notifier.join();
}

TYPED_TEST_P(IdemOutboxConformance, BadRelayArgumentsAreRefusedBeforeAnythingIsTaken) {
  this->append_rows("billing", 1);
  idem::testing::detail::ScriptedPublisher publisher;
  EXPECT_THROW((void)this->outbox().relay_batch(publisher, 0, 5), idem::InvalidArgument);
  EXPECT_THROW((void)this->outbox().relay_batch(publisher, 10, 0), idem::InvalidArgument);
  EXPECT_THROW((void)this->outbox().relay_batch(publisher, 10, -3), idem::InvalidArgument);
  EXPECT_THROW((void)this->outbox().wait_for_rows(std::chrono::milliseconds(-1)),
               idem::InvalidArgument);
  EXPECT_EQ(publisher.calls, 0);
  EXPECT_EQ(this->outbox().stats().depth, 1u);
}

TYPED_TEST_P(IdemOutboxConformance, BadAppendArgumentsWriteNothing) {
  const std::string bad_keys[] = {std::string(), std::string("a\0b", 3), "line\nbreak",
                                  std::string(idem::kMaxKeyLength + 1, 'x')};
  int refused = 0;
  const bool ran =
      this->made_.recorder->run_transactional("billing", "e1", [&](idem::Transaction& tx) {
        auto& sql = dynamic_cast<idem::SqlTransaction&>(tx);
        auto expect_refused = [&](auto&& call, bool key) {
          try {
            call();
            ADD_FAILURE() << "append accepted a bad argument";
          } catch (const idem::InvalidKey&) {
            EXPECT_TRUE(key);
            ++refused;
          } catch (const idem::InvalidArgument&) {
            EXPECT_FALSE(key);
            ++refused;
          }
        };
        for (const std::string& bad : bad_keys) {
          expect_refused([&] { this->outbox().append(sql, bad, "e1", TestFixture::event("f")); },
                         true);
          expect_refused(
              [&] { this->outbox().append(sql, "billing", bad, TestFixture::event("f")); }, true);
          expect_refused(
              [&] { this->outbox().append(sql, "billing", "e1", TestFixture::event(bad)); }, true);
        }
        expect_refused(
            [&] { this->outbox().append(sql, "billing", "e1", TestFixture::event("f", "")); },
            false);
      });
  EXPECT_TRUE(ran);  // the transaction committed: whatever a bad append wrote would be there
  EXPECT_EQ(refused, 13);
  EXPECT_EQ(this->outbox().stats().depth, 0u);
}

// Two relays (two outbox objects on one database, as two processes): while one holds a batch,
// the other takes none of its rows.
TYPED_TEST_P(IdemOutboxConformance, TwoRelaysNeverTakeTheSameRows) {
  this->append_rows("billing", 4);
  auto other = this->factory_.another();
  ASSERT_NE(other, nullptr);
  idem::testing::detail::ScriptedPublisher inner;
  idem::RelayBatchResult during{};
  idem::testing::detail::ScriptedPublisher outer;
  outer.during = [&](std::span<const idem::OutboxRow>) {
    during = other->relay_batch(inner, 10, 5);
  };
  const auto held = this->outbox().relay_batch(outer, 10, 5);
  EXPECT_EQ(held.taken, 4u);
  EXPECT_EQ(held.published, 4u);
  EXPECT_EQ(during.taken, 0u) << "the second relay took rows the first one held";
  EXPECT_EQ(inner.calls, 0);
  EXPECT_EQ(this->outbox().stats().depth, 0u);
  // Once released, the other relay works as well.
  this->append_rows("audit", 1);
  EXPECT_EQ(other->relay_batch(inner, 10, 5).published, 1u);
}

// Relays on two threads and two outbox objects drain rows of three consumers: every row is
// published exactly once, and each consumer's rows in commit order.
TYPED_TEST_P(IdemOutboxConformance, ConcurrentRelaysPublishEveryRowOnceInOrder) {
  const std::vector<std::string> consumers = {"billing", "audit", "mail"};
  constexpr int kRows = 30;
  for (int i = 0; i < kRows; ++i) {
    for (const auto& consumer : consumers) {
      const std::string id = consumer + "-" + std::to_string(i);
      this->append(consumer, "src-" + id, {TestFixture::event(id)});
    }
  }
  const std::size_t total = consumers.size() * kRows;
  idem::testing::detail::ScriptedPublisher publisher;
  std::atomic<std::size_t> published{0};
  std::vector<std::shared_ptr<idem::Outbox>> relays = {this->made_.outbox,
                                                       this->factory_.another()};
  ASSERT_NE(relays[1], nullptr);
  std::vector<std::thread> threads;
  for (const auto& relay : relays) {
    threads.emplace_back([&, relay] {
      for (int pass = 0; pass < 100000 && published.load() < total; ++pass) {
        const auto r = relay->relay_batch(publisher, 4, 5);
        published += r.published;
        if (r.taken == 0) std::this_thread::yield();
      }
    });
  }
  for (auto& t : threads)
    t.join();
  const auto rows = publisher.all_rows();
  ASSERT_EQ(rows.size(), total);
  std::set<std::string> ids;
  std::map<std::string, std::int64_t> last_seq;
  for (const auto& row : rows) {
    EXPECT_TRUE(ids.insert(row.event.id).second) << "published twice: " << row.event.id;
    auto& last = last_seq[row.consumer];
    EXPECT_GT(row.seq, last) << "out of order for " << row.consumer;
    last = row.seq;
  }
  EXPECT_EQ(this->outbox().stats().depth, 0u);
}

REGISTER_TYPED_TEST_SUITE_P(
    IdemOutboxConformance, RowsGoOutOldestFirstWithEveryField, BinaryPayloadsAndUnusualTextSurvive,
    RolledBackTransactionLeavesNoRow, TakesAtMostMaxRows, ConfirmedRowsAreDeleted,
    RefusalsCountAndParkAtMaxAttempts, MaxAttemptsOneParksAtTheFirstRefusal,
    DeferredRowsAreLeftAsTheyWere, OneBatchSettlesEachRowByItsVerdict, PublisherThrowChangesNothing,
    WrongVerdictCountChangesNothing, UnparkResetsAttemptsAndWakesRelays,
    StatsCountWaitingAndParkedRowsAndAgeTheOldest, NotifyCommittedWakesWaitForRows,
    BadRelayArgumentsAreRefusedBeforeAnythingIsTaken, BadAppendArgumentsWriteNothing,
    TwoRelaysNeverTakeTheSameRows, ConcurrentRelaysPublishEveryRowOnceInOrder);

// Instantiates the suite for `Factory` under the name prefix `Prefix`.
#define INSTANTIATE_OUTBOX_CONFORMANCE(Prefix, Factory) \
  INSTANTIATE_TYPED_TEST_SUITE_P(Prefix, IdemOutboxConformance, Factory)
