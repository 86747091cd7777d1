// Chunked purges of the PostgreSQL recorder and store on more rows than one chunk holds (1,000
// per transaction): every chunk reports progress, the recorder's walk along the primary key
// resumes after the last chunk's key without skipping or repeating rows (consumer names that
// sort around each other, young rows between old ones), and the totals are exact. Rows are
// written with one INSERT ... SELECT generate_series.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../postgres_test_support.hpp"
#include "../purge_progress.hpp"
#include "idem/postgres/postgres_recorder.hpp"
#include "idem/postgres/postgres_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

IDEM_POSTGRES_TEST_ENVIRONMENT();

using idem::test::expect_chunked;
using idem::test::pg::query;
using idem::test::pg::query_int;
using std::chrono::hours;

// The ManualClock's start (2030-01-01T00:00:00Z) in SQL.
constexpr const char* kNow = "'2030-01-01T00:00:00Z'::timestamptz";

TEST(PostgresPurgeChunks, RecorderPurgeWalksThePrimaryKeyAcrossChunks) {
  idem::test::pg::TempSchema schema;
  auto options = schema.options();
  options.clock = std::make_shared<idem::testing::ManualClock>();
  idem::postgres::PostgresIdempotencyRecorder recorder(options);
  // 3,000 markers of four consumers ("a", "a b", "ab", "it's"); every fifth one young, so young
  // rows sit between old ones of every consumer.
  query("INSERT INTO " + schema.table("processed_log") +
        " SELECT (ARRAY['a', 'a b', 'ab', 'it''s'])[1 + i % 4], 'e' || i, "
        "CASE WHEN i % 5 = 0 THEN " +
        kNow + " ELSE " + kNow + " - interval '10 days' END FROM generate_series(0, 2999) AS i");
  constexpr std::size_t kOld = 2400;
  EXPECT_EQ(recorder.count_purgeable(hours(24)), kOld);
  std::vector<std::size_t> calls;
  EXPECT_EQ(recorder.purge(hours(24), [&](std::size_t done) { calls.push_back(done); }), kOld);
  expect_chunked(calls, kOld, 1000, 3);
  EXPECT_EQ(query_int("SELECT count(*) FROM " + schema.table("processed_log")), 600);
  EXPECT_EQ(
      query_int("SELECT count(*) FROM " + schema.table("processed_log") + " WHERE ts < " + kNow),
      0);
  const auto counts = recorder.consumer_counts();
  ASSERT_EQ(counts.size(), 4u);
  const std::vector<std::string> names = {"a", "a b", "ab", "it's"};  // bytewise order
  for (std::size_t i = 0; i < counts.size(); ++i) {
    EXPECT_EQ(counts[i].consumer, names[i]);
    EXPECT_EQ(counts[i].processed, 150u) << names[i];
  }
}

TEST(PostgresPurgeChunks, StorePurgeDeletesAThousandRowsPerTransaction) {
  idem::test::pg::TempSchema schema;
  auto options = schema.options();
  options.clock = std::make_shared<idem::testing::ManualClock>();
  idem::postgres::PostgresIdempotencyStore store(options);
  query("INSERT INTO " + schema.table("records") +
        " (key, state, token, completed_at, expires_at, value, report) "
        "SELECT 'k' || i, 'completed', i + 1, " +
        kNow +
        " - interval '2 hours', CASE WHEN i < "
        "2500 THEN " +
        kNow + " - interval '1 hour' ELSE " + kNow +
        " + interval '1 hour' END, ''::bytea, '{}' FROM generate_series(0, 2509) AS i");
  EXPECT_EQ(store.counts().expired, 2500u);
  EXPECT_EQ(store.counts().completed, 10u);
  std::vector<std::size_t> calls;
  EXPECT_EQ(store.purge_expired([&](std::size_t done) { calls.push_back(done); }), 2500u);
  EXPECT_EQ(calls, (std::vector<std::size_t>{1000, 2000, 2500}));
  EXPECT_EQ(store.entry_count(), 10u);
}

}  // namespace
