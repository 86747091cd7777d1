// Chunked purges of the SQLite recorder and store on more rows than one chunk holds: every
// chunk reports progress, old and young rows interleaved in rowid order are told apart across
// chunk boundaries, and the totals are exact. Rows are written with plain SQL in one transaction
// (thousands of marks through the API would test nothing more, only slower).
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "../purge_progress.hpp"
#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using idem::test::RawDb;
using std::chrono::hours;

class SqlitePurgeChunks : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.clock = clock_;
    options_.durability = idem::sqlite::Durability::off;
  }

  idem::test::TempDir dir_;
  std::string path_ = dir_.file("idem.db");
  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
  idem::sqlite::SqliteOptions options_;
};

TEST_F(SqlitePurgeChunks, RecorderPurgeScansInRowidChunksAndKeepsYoungRowsBetweenThem) {
  idem::sqlite::SqliteIdempotencyRecorder recorder(path_, options_);
  const std::string old_ts = idem::sqlite::marker_timestamp(clock_->wall_now() - hours(240));
  const std::string young_ts = idem::sqlite::marker_timestamp(clock_->wall_now());
  constexpr int kRows = 5000;
  int old_rows = 0;
  {
    RawDb raw(path_);
    std::string sql = "BEGIN;";
    for (int i = 0; i < kRows; ++i) {
      const bool old = i % 5 != 0;  // young rows spread over every chunk
      old_rows += old ? 1 : 0;
      sql += "INSERT INTO processed_log VALUES ('c" + std::to_string(i % 3) + "', 'e" +
             std::to_string(i) + "', '" + (old ? old_ts : young_ts) + "');";
    }
    raw.exec(sql + "COMMIT;");
  }
  EXPECT_EQ(recorder.count_purgeable(hours(24)), static_cast<std::size_t>(old_rows));
  std::vector<std::size_t> calls;
  const std::size_t purged =
      recorder.purge(hours(24), [&](std::size_t done) { calls.push_back(done); });
  EXPECT_EQ(purged, static_cast<std::size_t>(old_rows));
  // 5,000 rows at 2,000 scanned per chunk: three chunks, each deleting at most 2,000.
  idem::test::expect_chunked(calls, purged, 2000, 3);
  RawDb raw(path_);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), kRows - old_rows);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log WHERE ts = '" + young_ts + "'"),
            kRows - old_rows);
  EXPECT_EQ(recorder.purge(hours(24)), 0u);
}

TEST_F(SqlitePurgeChunks, StorePurgeDeletesAThousandRowsPerTransaction) {
  idem::sqlite::SqliteIdempotencyStore store(path_, options_);
  const long long now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(clock_->wall_now().time_since_epoch())
          .count();
  constexpr int kExpired = 2500;
  {
    RawDb raw(path_);
    std::string sql = "BEGIN;";
    for (int i = 0; i < kExpired + 10; ++i) {
      const long long expires = i < kExpired ? now_ms - 1000 : now_ms + 3600000;
      sql +=
          "INSERT INTO idem_records(key, state, token, completed_at_ms, expires_at_ms, value, "
          "report) VALUES ('k" +
          std::to_string(i) + "', 'completed', " + std::to_string(i + 1) + ", " +
          std::to_string(now_ms - 5000) + ", " + std::to_string(expires) + ", x'', '{}');";
    }
    raw.exec(sql + "COMMIT;");
  }
  EXPECT_EQ(store.counts().expired, static_cast<std::uint64_t>(kExpired));
  EXPECT_EQ(store.counts().completed, 10u);
  std::vector<std::size_t> calls;
  EXPECT_EQ(store.purge_expired([&](std::size_t done) { calls.push_back(done); }),
            static_cast<std::size_t>(kExpired));
  EXPECT_EQ(calls, (std::vector<std::size_t>{1000, 2000, 2500}));
  EXPECT_EQ(store.entry_count(), 10u);
}

}  // namespace
