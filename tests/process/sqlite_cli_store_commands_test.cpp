// `idem stats`, `idem purge` and `idem inspect` run as processes (the CLI binary, IDEM_CLI) on
// a SQLite file filled through the library: their output, totals, exit codes and error
// messages. Times are written with a ManualClock set relative to the real clock, because the
// CLI decides ages and expiry with the system clock.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo_cli.hpp"
#include "idem/report.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/testing/manual_clock.hpp"
#include "sqlite_cli_fixture.hpp"

namespace {

namespace fs = std::filesystem;
using idem::test::CliResult;
using idem::test::CliStoreCommands;
using idem::test::raw_exec;
using idem::test::raw_text;
using idem::test::side_files;
using idem::test::slurp;
using std::chrono::hours;

// A file only infinity_bus has touched: its processed_log, created with the DDL its
// SqliteIdempotencyRecorder runs, in SQLite's default rollback-journal mode; 3 markers older than
// a week (2 billing, 1 shipping) and 1 recent one, with Python's isoformat() timestamps.
class CliOnInfinityBusFile : public CliStoreCommands {
 protected:
  void SetUp() override {
    CliStoreCommands::SetUp();
    if (IsSkipped()) return;
    const auto now = std::chrono::system_clock::now();
    const std::string old_ts = idem::sqlite::marker_timestamp(now - hours(240));
    const std::string new_ts = idem::sqlite::marker_timestamp(now);
    raw_exec(db_,
             "CREATE TABLE IF NOT EXISTS processed_log ( consumer TEXT NOT NULL, event_id TEXT "
             "NOT NULL, ts TEXT NOT NULL, PRIMARY KEY (consumer, event_id))");
    raw_exec(db_, "INSERT INTO processed_log VALUES ('billing', 'old-1', '" + old_ts +
                      "'), ('billing', 'old-2', '" + old_ts + "'), ('shipping', 'old-3', '" +
                      old_ts + "'), ('billing', 'new-1', '" + new_ts + "')");
    ASSERT_EQ(raw_text(db_, "PRAGMA journal_mode"), "delete");
  }
};

TEST_F(CliOnInfinityBusFile, LookingLeavesTheFileByteForByte) {
  const std::string before = slurp(db_);
  ASSERT_FALSE(before.empty());

  const CliResult text = run({"stats", url_});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("recorder: 4 markers, 0 live claims, 2 consumers"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("store: none"), std::string::npos) << text.out;
  const CliResult json = run({"stats", url_, "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  EXPECT_EQ(nlohmann::json::parse(json.out)["recorder"]["processed"], 4);

  const CliResult marker = run({"inspect", url_, "old-1", "--consumer", "billing"});
  ASSERT_EQ(marker.code, 0) << marker.err;
  EXPECT_NE(marker.out.find("processed     yes, at "), std::string::npos) << marker.out;
  EXPECT_NE(marker.out.find("claim         none"), std::string::npos) << marker.out;
  EXPECT_EQ(run({"inspect", url_, "nope", "--consumer", "billing"}).code, 1);

  const CliResult dry = run({"purge", url_, "--older-than", "7d", "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("recorder: would purge 3 markers older than 7d"), std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("store: none"), std::string::npos) << dry.out;

  EXPECT_TRUE(slurp(db_) == before) << "looking changed the file";
  EXPECT_TRUE(side_files(db_).empty());
}

TEST_F(CliOnInfinityBusFile, PurgeDeletesOldMarkersAndAddsNothing) {
  const CliResult purge = run({"purge", url_, "--older-than", "7d"});
  ASSERT_EQ(purge.code, 0) << purge.err;
  EXPECT_EQ(purge.out, "recorder: purged 3 markers older than 7d\nstore: none\n");
  EXPECT_EQ(raw_text(db_, "SELECT group_concat(event_id) FROM processed_log"), "new-1");
  EXPECT_EQ(raw_text(db_, "PRAGMA journal_mode"), "delete") << "the journal mode is the file's";
  EXPECT_EQ(raw_text(db_, "SELECT group_concat(name) FROM sqlite_master WHERE type = 'table'"),
            "processed_log")
      << "no table added";
  EXPECT_TRUE(side_files(db_).empty());
}

// Rows another program wrote with a ts SQLite cannot read are never purged (their age is
// unknown): purge says how many it kept, per consumer, in text and JSON, dry run or not.
TEST_F(CliOnInfinityBusFile, PurgeReportsMarkersWhoseTimeCannotBeRead) {
  raw_exec(db_,
           "INSERT INTO processed_log VALUES ('odd', 'bad-1', 'not a time'), "
           "('odd', 'bad-2', ''), ('billing', 'bad-3', 'yesterday')");
  const CliResult dry = run({"purge", url_, "--older-than", "7d", "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("recorder: would purge 3 markers older than 7d\n"
                         "recorder: kept 3 markers whose time cannot be read (never purged):\n"
                         "  billing             1\n"
                         "  odd                 2\n"),
            std::string::npos)
      << dry.out;
  const CliResult json = run({"purge", url_, "--older-than", "7d", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const auto out = nlohmann::json::parse(json.out);
  EXPECT_EQ(out["recorder"]["purged"], 3) << json.out;
  EXPECT_EQ(out["recorder"]["unreadable"], 3) << json.out;
  ASSERT_EQ(out["recorder"]["consumers"].size(), 3u) << json.out;
  EXPECT_EQ(out["recorder"]["consumers"][0]["consumer"], "billing");
  EXPECT_EQ(out["recorder"]["consumers"][0]["old"], 2);
  EXPECT_EQ(out["recorder"]["consumers"][0]["unreadable"], 1);
  EXPECT_EQ(out["recorder"]["consumers"][1]["consumer"], "odd");
  EXPECT_EQ(out["recorder"]["consumers"][1]["old"], 0);
  EXPECT_EQ(out["recorder"]["consumers"][1]["unreadable"], 2);
  EXPECT_EQ(out["recorder"]["consumers"][2]["consumer"], "shipping");
  EXPECT_EQ(out["recorder"]["consumers"][2]["unreadable"], 0);
  EXPECT_TRUE(out["store"].is_null());
  EXPECT_EQ(raw_text(db_, "SELECT count(*) FROM processed_log"), "4") << "new-1 and the 3 kept";
  const CliResult again = run({"purge", url_, "--older-than", "0s"});
  ASSERT_EQ(again.code, 0) << again.err;
  EXPECT_NE(again.out.find("kept 3 markers whose time cannot be read"), std::string::npos)
      << again.out;
}

// A processed_log of another shape is refused before anything is written, whichever command.
TEST_F(CliStoreCommands, AForeignProcessedLogIsRefusedAndLeftByteForByte) {
  raw_exec(db_, "CREATE TABLE processed_log(id INTEGER PRIMARY KEY, payload BLOB)");
  raw_exec(db_, "INSERT INTO processed_log(payload) VALUES (x'0102')");
  const std::string before = slurp(db_);
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"stats", url_},
        std::vector<std::string>{"purge", url_, "--older-than", "7d"},
        std::vector<std::string>{"inspect", url_, "e", "--consumer", "billing"}}) {
    const CliResult result = run(args);
    EXPECT_EQ(result.code, 3) << args[0] << ": " << result.err;
    EXPECT_NE(result.err.find("store_not_a_database"), std::string::npos) << result.err;
    EXPECT_TRUE(slurp(db_) == before) << args[0] << " changed the refused file";
  }
  EXPECT_TRUE(side_files(db_).empty());
  // The library, opened read-write (as an application would), refuses it the same way.
  EXPECT_THROW(idem::sqlite::SqliteIdempotencyRecorder recorder(db_.string()),
               idem::sqlite::SqliteError);
  EXPECT_TRUE(slurp(db_) == before) << "the recorder changed the refused file";
  EXPECT_EQ(raw_text(db_, "PRAGMA journal_mode"), "delete");
}

TEST_F(CliStoreCommands, StatsCountsPerConsumerAndPerState) {
  fill_recorder();
  fill_store();
  const CliResult text = run({"stats", url_});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("recorder: 6 markers, 1 live claims, 2 consumers"), std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("billing"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("store: 4 records"), std::string::npos) << text.out;

  const CliResult json = run({"stats", url_, "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  const auto stats = nlohmann::json::parse(json.out);
  ASSERT_EQ(stats["recorder"]["consumers"].size(), 2u);
  EXPECT_EQ(stats["recorder"]["consumers"][0]["consumer"], "billing");
  EXPECT_EQ(stats["recorder"]["consumers"][0]["processed"], 4);
  EXPECT_EQ(stats["recorder"]["consumers"][0]["in_progress"], 1);
  EXPECT_EQ(stats["recorder"]["consumers"][1]["consumer"], "shipping");
  EXPECT_EQ(stats["recorder"]["consumers"][1]["processed"], 2);
  EXPECT_EQ(stats["store"]["in_progress"], 1);
  EXPECT_EQ(stats["store"]["abandoned"], 0);
  EXPECT_EQ(stats["store"]["completed"], 1);
  EXPECT_EQ(stats["store"]["expired"], 2);
}

TEST_F(CliStoreCommands, StatsSaysNoneForAFaceWithoutTablesAndCreatesNothing) {
  fill_recorder();  // no store tables in the file
  const CliResult result = run({"stats", url_, "--json"});
  ASSERT_EQ(result.code, 0) << result.err;
  const auto stats = nlohmann::json::parse(result.out);
  EXPECT_TRUE(stats["store"].is_null());
  EXPECT_EQ(stats["recorder"]["processed"], 6);
  const CliResult text = run({"stats", url_});
  EXPECT_NE(text.out.find("store: none"), std::string::npos) << text.out;
  EXPECT_EQ(run({"inspect", url_, "order-1"}).code, 1) << "no store: nothing to find";
  // Looking must not have created the store's tables.
  EXPECT_TRUE(nlohmann::json::parse(run({"stats", url_, "--json"}).out)["store"].is_null());
}

TEST_F(CliStoreCommands, PurgeDryRunCountsAndRealRunDeletes) {
  fill_recorder();
  fill_store();
  const CliResult dry = run({"purge", url_, "--older-than", "7d", "--dry-run"});
  ASSERT_EQ(dry.code, 0) << dry.err;
  EXPECT_NE(dry.out.find("recorder: would purge 5 markers older than 7d"), std::string::npos)
      << dry.out;
  EXPECT_NE(dry.out.find("store: would purge 2 expired records"), std::string::npos) << dry.out;
  auto stats = nlohmann::json::parse(run({"stats", url_, "--json"}).out);
  EXPECT_EQ(stats["recorder"]["processed"], 6) << "a dry run deletes nothing";
  EXPECT_EQ(stats["store"]["expired"], 2);

  const CliResult real = run({"purge", url_, "--older-than", "7d"});
  ASSERT_EQ(real.code, 0) << real.err;
  EXPECT_NE(real.out.find("recorder: purged 5 markers older than 7d"), std::string::npos)
      << real.out;
  EXPECT_NE(real.out.find("store: purged 2 expired records"), std::string::npos) << real.out;
  stats = nlohmann::json::parse(run({"stats", url_, "--json"}).out);
  EXPECT_EQ(stats["recorder"]["processed"], 1);
  EXPECT_EQ(stats["recorder"]["in_progress"], 1) << "a live claim is never purged";
  EXPECT_EQ(stats["store"]["expired"], 0);
  EXPECT_EQ(stats["store"]["completed"], 1);
  EXPECT_EQ(stats["store"]["in_progress"], 1);

  const CliResult again = run({"purge", url_, "--older-than", "7d"});
  EXPECT_NE(again.out.find("recorder: purged 0 markers"), std::string::npos) << again.out;
  EXPECT_NE(again.out.find("store: purged 0 expired records"), std::string::npos) << again.out;
}

TEST_F(CliStoreCommands, PurgeOfOneFaceLeavesTheOther) {
  fill_recorder();
  fill_store();
  const CliResult store_only = run({"purge", url_, "--store-only"});
  ASSERT_EQ(store_only.code, 0) << store_only.err;
  EXPECT_EQ(store_only.out, "store: purged 2 expired records\n");
  const CliResult recorder_only = run({"purge", url_, "--older-than", "1h", "--recorder-only"});
  ASSERT_EQ(recorder_only.code, 0) << recorder_only.err;
  EXPECT_EQ(recorder_only.out, "recorder: purged 5 markers older than 1h\n");
}

TEST_F(CliStoreCommands, LargePurgeShowsProgressOnStderrAndTheTotalOnStdout) {
  {
    idem::sqlite::SqliteIdempotencyRecorder old(db_.string(), options_at(-hours(240)));
    for (int i = 0; i < 4500; ++i)
      old.mark_processed("billing", "e-" + std::to_string(i));
  }
  const CliResult result = run({"purge", url_, "--older-than", "7d", "--recorder-only"});
  ASSERT_EQ(result.code, 0) << result.err;
  EXPECT_EQ(result.out, "recorder: purged 4500 markers older than 7d\n");
  // Not a terminal: the bar prints a line per 10% step, the last at 100%.
  EXPECT_NE(result.err.find("purging markers"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("100% 4500/4500"), std::string::npos) << result.err;
}

TEST_F(CliStoreCommands, InspectShowsARecordAndAMarker) {
  fill_recorder();
  fill_store();
  const CliResult record = run({"inspect", url_, "order-1"});
  ASSERT_EQ(record.code, 0) << record.err;
  EXPECT_NE(record.out.find("state         completed"), std::string::npos) << record.out;
  EXPECT_NE(record.out.find("fingerprint   fp-order-1"), std::string::npos) << record.out;
  EXPECT_NE(record.out.find("value         10 bytes: {\"id\":42}\\x01"), std::string::npos)
      << record.out;
  EXPECT_NE(record.out.find("create_payment"), std::string::npos) << "the stored report";

  const auto json = nlohmann::json::parse(run({"inspect", url_, "order-1", "--json"}).out);
  EXPECT_EQ(json["state"], "completed");
  EXPECT_EQ(json["value_size"], 10);
  EXPECT_EQ(json["report"]["operation"], "create_payment");

  const CliResult running = run({"inspect", url_, "order-running", "--json"});
  ASSERT_EQ(running.code, 0) << running.err;
  EXPECT_EQ(nlohmann::json::parse(running.out)["state"], "in_progress");

  const CliResult marker = run({"inspect", url_, "new-1", "--consumer", "billing"});
  ASSERT_EQ(marker.code, 0) << marker.err;
  EXPECT_NE(marker.out.find("processed     yes, at "), std::string::npos) << marker.out;
  EXPECT_NE(marker.out.find("claim         none"), std::string::npos) << marker.out;
  const auto claim = nlohmann::json::parse(
      run({"inspect", url_, "running", "--consumer", "billing", "--json"}).out);
  EXPECT_EQ(claim["processed"], false);
  EXPECT_EQ(claim["claim"]["live"], true);
}

TEST_F(CliStoreCommands, InspectOfAMissingKeyExitsOneWithNotFound) {
  fill_recorder();
  fill_store();
  const CliResult missing = run({"inspect", url_, "no-such-order"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_TRUE(missing.out.empty()) << missing.out;
  EXPECT_NE(missing.err.find("not found"), std::string::npos) << missing.err;
  const CliResult expired = run({"inspect", url_, "order-old-1"});
  EXPECT_EQ(expired.code, 1) << "an expired record is not live";
  const CliResult marker = run({"inspect", url_, "never", "--consumer", "billing"});
  EXPECT_EQ(marker.code, 1);
  EXPECT_NE(marker.err.find("not found"), std::string::npos) << marker.err;
}

TEST_F(CliStoreCommands, UsageAndConfigurationErrorsExitTwo) {
  fill_recorder();
  const CliResult scheme = run({"stats", "nosuch://x"});
  EXPECT_EQ(scheme.code, 2);
  EXPECT_NE(scheme.err.find("nosuch"), std::string::npos) << scheme.err;
  EXPECT_EQ(run({"stats"}).code, 2) << "no URL";
  EXPECT_EQ(run({"stats", url_, "extra"}).code, 2) << "an unexpected argument";
  EXPECT_EQ(run({"stats", url_, "--bogus"}).code, 2) << "an unknown option";
  EXPECT_EQ(run({"purge", url_}).code, 2) << "markers need --older-than";
  const CliResult duration = run({"purge", url_, "--older-than", "7 days"});
  EXPECT_EQ(duration.code, 2);
  EXPECT_NE(duration.err.find("7 days"), std::string::npos) << duration.err;
  EXPECT_EQ(run({"purge", url_, "--store-only", "--recorder-only"}).code, 2);
  EXPECT_EQ(run({"inspect", url_}).code, 2) << "no KEY";
  EXPECT_EQ(run({"inspect", url_, "bad\tkey", "--consumer", "billing"}).code, 2) << "InvalidKey";
  EXPECT_EQ(run({"stats", url_ + "?durability=sometimes"}).code, 2) << "a bad parameter";
}

TEST_F(CliStoreCommands, StoreErrorsExitThreeAndNeverPrintAPassword) {
  const CliResult missing = run({"stats", "sqlite://" + (dir_ / "missing.db").string()});
  EXPECT_EQ(missing.code, 3) << missing.err;
  EXPECT_FALSE(fs::exists(dir_ / "missing.db")) << "stats must not create a database";

  // Nothing listens on port 1: the connection is refused at once.
  const CliResult pg = run({"stats", "postgresql://app:s3cr3t-pw@127.0.0.1:1/db"});
  EXPECT_NE(pg.code, 0);
  EXPECT_TRUE(pg.code == 3 || pg.code == 2) << pg.code << " " << pg.err;
  EXPECT_FALSE(pg.err.empty());
  EXPECT_EQ(pg.err.find("s3cr3t-pw"), std::string::npos) << pg.err;
  const CliResult redis = run({"purge", "redis://:s3cr3t-pw@127.0.0.1:1/0", "--store-only"});
  EXPECT_NE(redis.code, 0);
  EXPECT_EQ(redis.err.find("s3cr3t-pw"), std::string::npos) << redis.err;
  EXPECT_EQ(redis.out.find("s3cr3t-pw"), std::string::npos) << redis.out;
}

}  // namespace
