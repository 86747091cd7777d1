// `idem stats` and `idem purge` on a SQLite file with an outbox: stats shows the depth, parked
// rows and the oldest row's age; purge deletes old markers and leaves unsent rows; a file
// without an outbox shows `outbox: none` and gets no table from stats.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "../outbox_case.hpp"
#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "sqlite_cli_file.hpp"
#include "worker/child_process.hpp"

#ifndef IDEM_CLI
#define IDEM_CLI ""
#endif

namespace {

struct OutboxCliRun {
  int status = 0;
  std::string out;
};

OutboxCliRun cli(std::vector<std::string> args) {
  args.insert(args.begin(), IDEM_CLI);
  idem::test::ChildProcess child(args);
  OutboxCliRun run;
  run.out = child.read_all();
  run.status = child.wait();
  return run;
}

bool has_outbox_table(const std::string& path) {
  return idem::test::sqlite_query_int(
             path, "SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'") > 0;
}

class CliOutbox : public idem::test::CliOnSqliteFile {};

TEST_F(CliOutbox, StatsShowsDepthAndPurgeLeavesUnsentRows) {
  {
    idem::test::OutboxFixture f;
    ASSERT_NO_FATAL_FAILURE(charge_e1(f));
    // One row parked, to show it apart.
    auto refusing = std::make_shared<idem::test::RecordingPublisher>();
    refusing->refuse_type = "order.charged";
    idem::OutboxRelayOptions options;
    options.max_attempts = 1;
    options.batch_size = 1;
    idem::OutboxRelay(f.outbox, refusing, options).run_once();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const OutboxCliRun text = cli({"stats", url});
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("outbox: 1 waiting, 1 parked, oldest "), std::string::npos) << text.out;
  const OutboxCliRun json = cli({"stats", url, "--json"});
  ASSERT_EQ(json.status, 0) << json.out;
  const auto stats = nlohmann::json::parse(json.out);
  EXPECT_EQ(stats["outbox"]["depth"], 1);
  EXPECT_EQ(stats["outbox"]["parked"], 1);
  EXPECT_GE(stats["outbox"]["oldest_age_ms"].get<long long>(), 0);

  const OutboxCliRun purge = cli({"purge", url, "--older-than", "1ms", "--recorder-only"});
  ASSERT_EQ(purge.status, 0) << purge.out;
  EXPECT_NE(purge.out.find("purged 1 marker"), std::string::npos) << purge.out;
  const auto after = nlohmann::json::parse(cli({"stats", url, "--json"}).out);
  EXPECT_EQ(after["recorder"]["processed"], 0);
  EXPECT_EQ(after["outbox"]["depth"], 1);  // unsent rows are not the purge's
  EXPECT_EQ(after["outbox"]["parked"], 1);
}

TEST_F(CliOutbox, AFileWithoutAnOutboxShowsNoneAndGetsNoTable) {
  {
    idem::sqlite::SqliteIdempotencyRecorder recorder(db);
    recorder.mark_processed("billing", "e1");
  }
  const OutboxCliRun text = cli({"stats", url});
  ASSERT_EQ(text.status, 0) << text.out;
  EXPECT_NE(text.out.find("outbox: none"), std::string::npos) << text.out;
  EXPECT_TRUE(nlohmann::json::parse(cli({"stats", url, "--json"}).out)["outbox"].is_null());
  EXPECT_FALSE(has_outbox_table(db));
}

TEST_F(CliOutbox, RelayNeedsStoreAndBroker) {
  EXPECT_EQ(WEXITSTATUS(cli({"relay", "--broker", "amqp://127.0.0.1:1/"}).status), 2);
  EXPECT_EQ(WEXITSTATUS(cli({"relay", "--store", url}).status), 2);
  EXPECT_EQ(WEXITSTATUS(cli({"relay", "--store", url, "--broker", "http://x"}).status), 2);
}

}  // namespace
