// InMemoryIdempotencyRecorder beyond the shared contract (which
// tests/conformance/memory_recorder_conformance_test.cpp checks): options, counters, its own
// documented choices, edge values.
#include "idem/memory_recorder.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../recorder_argument_checks.hpp"
#include "../run_together.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using idem::Claim;
using idem::InMemoryIdempotencyRecorder;
using idem::InMemoryRecorderOptions;
using idem::testing::ManualClock;
using namespace std::chrono_literals;

class MemoryRecorder : public ::testing::Test {
 protected:
  std::shared_ptr<ManualClock> clock_ = std::make_shared<ManualClock>();
  InMemoryIdempotencyRecorder recorder_{InMemoryRecorderOptions{.clock = clock_}};
};

TEST(MemoryRecorderOptions, ShardCountIsValidated) {
  EXPECT_THROW(InMemoryIdempotencyRecorder({.shards = 0}), idem::ConfigError);
  EXPECT_THROW(InMemoryIdempotencyRecorder({.shards = (1u << 16) + 1}), idem::ConfigError);
  for (std::size_t shards : {1u, 3u, 64u, 100u}) {
    InMemoryIdempotencyRecorder recorder({.shards = shards});
    for (int i = 0; i < 50; ++i)
      recorder.mark_processed("c", idem::new_event_id());
    EXPECT_EQ(recorder.marker_count(), 50u) << shards << " shards";
  }
}

// expected_markers sizes the tables up front (as unordered_set::reserve); marking past it, and
// purging below it, work as without it.
TEST(MemoryRecorderOptions, ExpectedMarkersReservesWithoutChangingBehaviour) {
  EXPECT_THROW(InMemoryIdempotencyRecorder({.expected_markers = (std::size_t{1} << 36) + 1}),
               idem::ConfigError);
  auto clock = std::make_shared<ManualClock>();
  InMemoryIdempotencyRecorder recorder({.clock = clock, .shards = 4, .expected_markers = 1'000});
  std::vector<std::string> ids;
  for (int i = 0; i < 3'000; ++i)  // three times what was reserved: the tables still grow
    ids.push_back(i % 2 == 0 ? idem::new_event_id() : "order-" + std::to_string(i));
  for (int i = 0; i < 1'500; ++i)
    recorder.mark_processed("c", ids[static_cast<std::size_t>(i)]);
  clock->advance(2h);
  for (int i = 1'500; i < 3'000; ++i)
    recorder.mark_processed("c", ids[static_cast<std::size_t>(i)]);
  EXPECT_EQ(recorder.marker_count(), 3'000u);
  EXPECT_EQ(recorder.purge(1h), 1'500u);
  for (int i = 0; i < 3'000; ++i)
    ASSERT_EQ(recorder.is_processed("c", ids[static_cast<std::size_t>(i)]), i >= 1'500) << i;
  clock->advance(1s);
  EXPECT_EQ(recorder.purge(0s), 1'500u);  // everything: the tables keep their reserved size
  EXPECT_EQ(recorder.marker_count(), 0u);
  recorder.mark_processed("c", ids[0]);
  EXPECT_TRUE(recorder.is_processed("c", ids[0]));
}

TEST(MemoryRecorderOptions, DefaultsToTheSystemClock) {
  InMemoryIdempotencyRecorder recorder;
  const auto before = std::chrono::system_clock::now();
  const Claim claim = recorder.claim("c", "e", 1h);
  EXPECT_GE(claim.lease_until, before + 1h);
  EXPECT_TRUE(recorder.supports_claims());
  EXPECT_FALSE(recorder.supports_transactions());
  EXPECT_THROW(static_cast<void>(recorder.run_transactional("c", "e", [](idem::Transaction&) {})),
               idem::NotSupported);
}

TEST_F(MemoryRecorder, CountsMarkersAndClaims) {
  EXPECT_EQ(recorder_.marker_count(), 0u);
  recorder_.mark_processed("a", idem::new_event_id());  // packed uuid
  recorder_.mark_processed("a", "order-17");            // text
  const Claim claim = recorder_.claim("a", "order-18", 1min);
  EXPECT_EQ(recorder_.marker_count(), 2u);
  EXPECT_EQ(recorder_.claim_count(), 1u);
  EXPECT_TRUE(recorder_.complete("a", "order-18", claim.token));
  EXPECT_EQ(recorder_.marker_count(), 3u);
  EXPECT_EQ(recorder_.claim_count(), 0u);
}

TEST_F(MemoryRecorder, RepeatedMarkKeepsTheFirstTimestamp) {
  // Otherwise a redelivered duplicate would keep an old event's marker from ever aging out.
  recorder_.mark_processed("c", "e");
  clock_->advance(2h);
  recorder_.mark_processed("c", "e");
  EXPECT_EQ(recorder_.purge(1h), 1u);
  EXPECT_FALSE(recorder_.is_processed("c", "e"));
}

TEST_F(MemoryRecorder, PurgeBoundaryIsStrictlyOlder) {
  recorder_.mark_processed("c", "e");
  clock_->advance(1h);
  EXPECT_EQ(recorder_.purge(1h), 0u) << "exactly one hour old is not older than one hour";
  clock_->advance(1ns);
  EXPECT_EQ(recorder_.purge(1h), 1u);
}

TEST_F(MemoryRecorder, PurgeDropsLongDeadClaimsButNotLiveOnes) {
  static_cast<void>(recorder_.claim("c", "dead", 1s));
  static_cast<void>(recorder_.claim("c", "alive", 10h));
  clock_->advance(2h);
  EXPECT_EQ(recorder_.purge(1h), 0u) << "claims are not counted as markers";
  EXPECT_EQ(recorder_.claim_count(), 1u);
  EXPECT_EQ(recorder_.claim("c", "alive", 1s).status, Claim::Status::in_progress);
}

TEST_F(MemoryRecorder, RejectsNonPositiveLeasesAndNegativeAges) {
  idem::test::expect_bad_leases_and_ages_refused(recorder_, "c", "e");
  EXPECT_EQ(recorder_.claim("c", "e", 1s).status, Claim::Status::in_progress);
}

TEST_F(MemoryRecorder, HugeLeasesSaturateInsteadOfOverflowing) {
  const Claim claim = recorder_.claim("c", "e", idem::Millis::max());
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  EXPECT_GT(claim.lease_until, clock_->wall_now() + 24h * 365 * 100);
  clock_->advance(24h * 365 * 100);
  EXPECT_EQ(recorder_.claim("c", "e", 1s).status, Claim::Status::in_progress);
  EXPECT_TRUE(recorder_.renew("c", "e", claim.token, idem::Millis::max()));
  EXPECT_EQ(recorder_.purge(std::chrono::system_clock::duration::max()), 0u);
}

TEST_F(MemoryRecorder, ALapsedClaimNobodyTookStillBelongsToItsOwner) {
  const Claim claim = recorder_.claim("c", "e", 1s);
  clock_->advance(5s);
  EXPECT_TRUE(recorder_.renew("c", "e", claim.token, 1s));
  EXPECT_TRUE(recorder_.complete("c", "e", claim.token));
  EXPECT_TRUE(recorder_.is_processed("c", "e"));
}

TEST_F(MemoryRecorder, ALeaseEndingExactlyNowCanBeTakenOver) {
  const Claim first = recorder_.claim("c", "e", 1s);
  clock_->advance(1s);
  const Claim second = recorder_.claim("c", "e", 1s);
  EXPECT_EQ(second.status, Claim::Status::acquired);
  EXPECT_TRUE(second.took_over);
  EXPECT_GT(second.token, first.token);
}

TEST_F(MemoryRecorder, ManyConsumersStayApart) {
  const std::string id = idem::new_event_id();
  for (int c = 0; c < 1000; c += 2)
    recorder_.mark_processed("consumer-" + std::to_string(c), id);
  for (int c = 0; c < 1000; ++c) {
    ASSERT_EQ(recorder_.is_processed("consumer-" + std::to_string(c), id), c % 2 == 0) << c;
  }
}

TEST_F(MemoryRecorder, UnknownConsumerCallsDoNotRegisterIt) {
  EXPECT_FALSE(recorder_.is_processed("ghost", "e"));
  EXPECT_FALSE(recorder_.complete("ghost", "e", 1));
  EXPECT_FALSE(recorder_.release("ghost", "e", 1));
  EXPECT_FALSE(recorder_.renew("ghost", "e", 1, 1s));
  EXPECT_EQ(recorder_.marker_count(), 0u);
  EXPECT_EQ(recorder_.claim_count(), 0u);
}

TEST_F(MemoryRecorder, PurgeRacesWithWritersSafely) {
  // Writers mark and claim while a purger sweeps and the clock moves: no crash, no lost
  // fencing, and whatever survives is consistent (run under ThreadSanitizer too).
  constexpr int kWriters = 6;
  constexpr int kPerWriter = 2'000;
  std::atomic<int> errors{0};
  idem::test::run_together_while(
      kWriters,
      [&](int w) {
        for (int i = 0; i < kPerWriter; ++i) {
          const std::string id = std::to_string(w) + ":" + std::to_string(i);
          try {
            recorder_.mark_processed("c", id);
            const Claim claim = recorder_.claim("d", id, 24h * 365 * 10);
            if (claim.status != Claim::Status::acquired) errors++;
            if (!recorder_.complete("d", id, claim.token)) errors++;
          } catch (...) {
            errors++;
          }
        }
      },
      [&] {
        clock_->advance(1s);
        recorder_.purge(1h);
      });
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(recorder_.claim_count(), 0u);
}

// Ids of the packed shapes (32 hex digits, dashed UUID) and text ids are distinct keys exactly
// when their texts differ: one changed character anywhere, the case of a digit, the dashes.
TEST_F(MemoryRecorder, EveryIdShapeIsItsOwnKey) {
  const std::string hex = "0123456789abcdef0123456789abcdef";
  const std::string uuid = "01234567-89ab-cdef-0123-456789abcdef";
  recorder_.mark_processed("c", hex);
  recorder_.mark_processed("c", uuid);
  EXPECT_TRUE(recorder_.is_processed("c", hex));
  EXPECT_TRUE(recorder_.is_processed("c", uuid));
  EXPECT_FALSE(recorder_.is_processed("c", "0123456789ABCDEF0123456789abcdef"));
  EXPECT_FALSE(recorder_.is_processed("c", "01234567-89AB-cdef-0123-456789abcdef"));
  EXPECT_FALSE(recorder_.is_processed("c", "01234567_89ab-cdef-0123-456789abcdef"));
  for (const std::string& id : {hex, uuid}) {
    for (std::size_t i = 0; i < id.size(); ++i) {
      for (const char c : {'0', '9', 'a', 'f', 'g', 'A', '-', 'z'}) {
        if (id[i] == c) continue;
        std::string other = id;
        other[i] = c;
        ASSERT_FALSE(recorder_.is_processed("c", other)) << other;
      }
    }
  }
  EXPECT_EQ(recorder_.marker_count(), 2u);
}

// Ids of up to 16 bytes are kept in the slot, zero-padded: a prefix, an extension by one byte,
// a trailing space or a different byte anywhere is another id, at every length up to 17.
TEST_F(MemoryRecorder, ShortTextIdsAreTheirOwnKeys) {
  const std::string text = "Az09 ~\xc3\xa9\xff-:/.?!xyz";
  for (std::size_t length = 1; length <= 17; ++length) {
    const std::string id = text.substr(0, length);
    ASSERT_FALSE(recorder_.is_processed("c", id)) << length;  // the shorter prefixes are not it
    recorder_.mark_processed("c", id);
    ASSERT_TRUE(recorder_.is_processed("c", id)) << length;
    ASSERT_FALSE(recorder_.is_processed("c", id + ' ')) << length;
    ASSERT_FALSE(recorder_.is_processed("other", id)) << length;
    for (std::size_t at = 0; at < length; ++at) {
      std::string changed = id;
      changed[at] = changed[at] == 'q' ? 'r' : 'q';
      ASSERT_FALSE(recorder_.is_processed("c", changed)) << length << " " << at;
    }
  }
  EXPECT_EQ(recorder_.marker_count(), 17u);
  for (std::size_t length = 1; length <= 17; ++length)
    EXPECT_TRUE(recorder_.is_processed("c", text.substr(0, length))) << length;
}

// Text ids and consumer names are rejected as validate_key() rejects them, a bad byte at every
// position of ids short and long, and everything else is accepted (UTF-8 included).
TEST_F(MemoryRecorder, TextIdsAreValidatedAtEveryPosition) {
  for (std::size_t length = 1; length <= 20; ++length) {
    for (std::size_t at = 0; at < length; ++at) {
      for (const char bad : {'\0', '\x01', '\x1f', '\x7f', '\n'}) {
        std::string id(length, 'x');
        id[at] = bad;
        EXPECT_THROW(recorder_.mark_processed("c", id), idem::InvalidKey) << length << " " << at;
        EXPECT_THROW(static_cast<void>(recorder_.is_processed(id, "e")), idem::InvalidKey)
            << length << " " << at;
      }
      std::string fine(length, ' ');
      fine[at] = '\xc3';
      EXPECT_NO_THROW(recorder_.mark_processed("c", fine));
      EXPECT_TRUE(recorder_.is_processed("c", fine));
    }
    EXPECT_THROW(recorder_.mark_processed("c", std::string(length, ' ')), idem::InvalidKey);
    EXPECT_THROW(recorder_.mark_processed(std::string(length, ' '), "e"), idem::InvalidKey);
  }
  EXPECT_THROW(recorder_.mark_processed("c", ""), idem::InvalidKey);
  EXPECT_THROW(recorder_.mark_processed("", "e"), idem::InvalidKey);
  EXPECT_THROW(recorder_.mark_processed("c", std::string(256, 'x')), idem::InvalidKey);
  EXPECT_NO_THROW(recorder_.mark_processed("c", std::string(255, 'x')));
  EXPECT_NO_THROW(recorder_.mark_processed(std::string(255, 'y'), "e"));
  // 32 or 36 characters that are not the packed shapes are validated as text.
  EXPECT_THROW(recorder_.mark_processed("c", std::string(31, 'a') + '\x01'), idem::InvalidKey);
  EXPECT_THROW(recorder_.mark_processed("c", std::string(35, 'a') + '\x7f'), idem::InvalidKey);
}

// Text ids live in an arena: they survive the table's growth, and a purge that drops some
// compacts it without losing the others.
TEST_F(MemoryRecorder, TextIdsSurviveGrowthAndPurge) {
  InMemoryIdempotencyRecorder recorder({.clock = clock_, .shards = 2});
  const auto id = [](int i) { return "order-" + std::to_string(i) + std::string(i % 200, 'p'); };
  for (int i = 0; i < 5'000; ++i)
    recorder.mark_processed(i % 3 == 0 ? "a" : "b", id(i));
  clock_->advance(2h);
  for (int i = 5'000; i < 10'000; ++i)
    recorder.mark_processed(i % 3 == 0 ? "a" : "b", id(i));
  EXPECT_EQ(recorder.marker_count(), 10'000u);
  EXPECT_EQ(recorder.purge(1h), 5'000u);
  for (int i = 0; i < 10'000; ++i) {
    const std::string consumer = i % 3 == 0 ? "a" : "b";
    ASSERT_EQ(recorder.is_processed(consumer, id(i)), i >= 5'000) << i;
    ASSERT_FALSE(recorder.is_processed(i % 3 == 0 ? "b" : "a", id(i))) << i;
  }
  for (int i = 0; i < 5'000; ++i)
    recorder.mark_processed("a", id(i));
  EXPECT_EQ(recorder.marker_count(), 10'000u);
}

// Long text ids fill arena chunks cut from huge pages that the shards share: a purge gives one
// shard's chunks back while the other shards' chunks on the same pages stay, and a purge of
// everything gives back every page. Every survivor must still read back (a page unmapped too
// early would fault here).
TEST_F(MemoryRecorder, TextIdsOnSharedPagesSurvivePurges) {
  InMemoryIdempotencyRecorder recorder({.clock = clock_, .shards = 4});
  const auto id = [](int i) { return std::string(240, 'p') + "-" + std::to_string(i); };
  constexpr int kIds = 40'000;  // about 10 MB of text: several 2 MiB pages
  for (int i = 0; i < kIds; ++i) {
    if (i == kIds / 2) clock_->advance(2h);
    recorder.mark_processed("billing", id(i));
  }
  EXPECT_EQ(recorder.purge(1h), static_cast<std::size_t>(kIds / 2));
  for (int i = 0; i < kIds; ++i)
    ASSERT_EQ(recorder.is_processed("billing", id(i)), i >= kIds / 2) << i;
  for (int i = 0; i < kIds / 2; ++i)
    recorder.mark_processed("billing", id(i));
  clock_->advance(3h);
  EXPECT_EQ(recorder.purge(1h), static_cast<std::size_t>(kIds));
  EXPECT_EQ(recorder.marker_count(), 0u);
  for (int i = 0; i < kIds; i += 7)
    recorder.mark_processed("billing", id(i));
  for (int i = 0; i < kIds; ++i)
    ASSERT_EQ(recorder.is_processed("billing", id(i)), i % 7 == 0) << i;
}

// A new marker's slot is written some marks later (the table parks it while its cache line is
// fetched): every reader must see it at once, whatever it reads. One shard, so every mark lands
// in the same table and the parked list is full and written out many times over.
TEST_F(MemoryRecorder, EveryReaderSeesAMarkerAtOnce) {
  InMemoryIdempotencyRecorder recorder({.clock = clock_, .shards = 1});
  for (int i = 0; i < 100; ++i) {
    const std::string id = i % 2 == 0 ? idem::new_event_id() : "order-" + std::to_string(i);
    clock_->advance(2s);
    recorder.mark_processed("c", id);
    // One reader after each mark, so that each one meets a marker not yet written out.
    switch (i % 4) {
      case 0:
        ASSERT_TRUE(recorder.is_processed("c", id)) << i;
        break;
      case 1: {
        const idem::MarkerInspection seen = recorder.inspect("c", id);
        ASSERT_TRUE(seen.processed) << i;
        ASSERT_EQ(seen.processed_at, clock_->wall_now()) << i;
        break;
      }
      case 2: {
        const std::vector<idem::ConsumerCounts> counts = recorder.consumer_counts();
        ASSERT_EQ(counts.size(), 1u);
        ASSERT_EQ(counts[0].processed, static_cast<std::size_t>(i + 1));
        break;
      }
      default:
        // Everything but the marker just made is more than 1 s old.
        ASSERT_EQ(recorder.count_purgeable(1s), static_cast<std::size_t>(i)) << i;
    }
  }
  EXPECT_EQ(recorder.purge(99s), 50u);  // marked 2 s apart, the last one now
  EXPECT_EQ(recorder.marker_count(), 50u);
}

// Many ids of every shape in one shard, marked and checked in turn against a std::set: lookups
// compare 7 bits of the hash first, so with tens of thousands of ids many agree on those bits
// for different ids, and none may be taken for another. Two consumers share the table.
TEST_F(MemoryRecorder, AgreesWithASetOnManyIdsInOneShard) {
  InMemoryIdempotencyRecorder recorder({.clock = clock_, .shards = 1});
  std::set<std::pair<std::string, std::string>> marked;
  const auto id_of = [](int i) {
    switch (i % 4) {
      case 0: {
        char hex[33];
        std::snprintf(hex, sizeof hex, "%032x", i * 2654435761u);
        return std::string(hex);
      }
      case 1: {
        char uuid[37];
        std::snprintf(uuid, sizeof uuid, "%08x-0000-4000-8000-%012x", i, i * 7u);
        return std::string(uuid);
      }
      case 2:
        return "event " + std::to_string(i);  // up to 16 bytes: kept in the slot
      default: {
        // 10 to 29 bytes, across the slot's 16: short ones in the slot, the rest in the arena.
        std::string id = "event " + std::to_string(i);
        id.resize(std::max<std::size_t>(id.size(), 10 + static_cast<std::size_t>(i % 20)), '.');
        return id;
      }
    }
  };
  for (int i = 0; i < 30'000; ++i) {
    const std::string consumer = i % 5 == 0 ? "audit" : "billing";
    const std::string id = id_of(i);
    // Every third id is marked; each is checked before and after, and so is an id never marked.
    ASSERT_FALSE(recorder.is_processed(consumer, id)) << i;
    if (i % 3 != 2 || i % 2 == 0) {
      recorder.mark_processed(consumer, id);
      marked.emplace(consumer, id);
    }
    ASSERT_EQ(recorder.is_processed(consumer, id), marked.count({consumer, id}) == 1) << i;
    ASSERT_FALSE(recorder.is_processed(consumer, id_of(i + 1))) << i;
  }
  EXPECT_EQ(recorder.marker_count(), marked.size());
  for (int i = 0; i < 30'000; ++i) {
    for (const std::string consumer : {"audit", "billing"}) {
      ASSERT_EQ(recorder.is_processed(consumer, id_of(i)), marked.count({consumer, id_of(i)}) == 1)
          << consumer << " " << i;
    }
  }
}

// One shard, so every call contends for one lock: threads that find it held spin, then sleep
// until the holder wakes them (the sweeps below hold it long enough for that). No marker may be
// lost or doubled, and every thread must get through (run under ThreadSanitizer too).
TEST_F(MemoryRecorder, OneShardUnderContentionLosesNoMarker) {
  InMemoryIdempotencyRecorder recorder({.clock = clock_, .shards = 1});
  constexpr int kThreads = 6;
  constexpr int kPerThread = 2'000;
  idem::test::run_together_while(
      kThreads,
      [&](int t) {
        // Threads 2k and 2k+1 mark the same ids, each checking first.
        for (int i = 0; i < kPerThread; ++i) {
          const std::string id = "e" + std::to_string(t / 2) + "-" + std::to_string(i);
          if (!recorder.is_processed("c", id)) recorder.mark_processed("c", id);
        }
      },
      [&] {
        EXPECT_EQ(recorder.purge(24h), 0u);  // nothing is that old: a sweep under the lock
        static_cast<void>(recorder.consumer_counts());
        std::this_thread::sleep_for(200us);
      });
  EXPECT_EQ(recorder.marker_count(), static_cast<std::size_t>(kThreads / 2 * kPerThread));
  for (int pair = 0; pair < kThreads / 2; ++pair) {
    for (int i = 0; i < kPerThread; ++i)
      ASSERT_TRUE(recorder.is_processed("c", "e" + std::to_string(pair) + "-" + std::to_string(i)));
  }
}

}  // namespace
