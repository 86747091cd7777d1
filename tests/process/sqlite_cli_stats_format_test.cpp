// `idem stats URL --format text|json|prometheus` as a process on a SQLite file with markers, a
// live claim, store records and an outbox: the Prometheus text passes `promtool check metrics`
// and carries the same counts as the JSON; bad formats are usage errors (exit 2).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "../outbox_case.hpp"
#include "../promtool.hpp"
#include "../temp_dir.hpp"
#include "demo_cli.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "sqlite_cli_file.hpp"

namespace {

using idem::test::run_cli;

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class CliStatsFormat : public idem::test::CliOnSqliteFile {};

TEST_F(CliStatsFormat, PrometheusTextCarriesWhatTheJsonSays) {
  {
    idem::test::OutboxFixture f;
    ASSERT_NO_FATAL_FAILURE(charge_e1(f));
    // A consumer name a label value must escape, and a live claim.
    f.recorder->mark_processed("ship\"ping\\eu", "e1");
    ASSERT_EQ(f.recorder->claim("ship\"ping\\eu", "e2", std::chrono::hours(1)).status,
              idem::Claim::Status::acquired);
    idem::sqlite::SqliteIdempotencyStore store(db);
    const auto claim = store.claim("14:create_payment:r-1", std::nullopt, std::chrono::hours(1));
    ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
    ASSERT_EQ(store.claim("14:create_payment:r-2", std::nullopt, std::chrono::hours(1)).status,
              idem::ClaimOutcome::Status::acquired);
    ASSERT_TRUE(store.complete("14:create_payment:r-1", claim.token,
                               idem::StoredValue{{}, {}, std::string("receipt")},
                               idem::ExecutionReport{}, std::chrono::hours(1)));
  }
  const idem::test::CliRun prometheus = run_cli({"stats", url, "--format", "prometheus"});
  ASSERT_EQ(prometheus.exit_code, 0) << prometheus.output;
  const std::string& text = prometheus.output;
  EXPECT_TRUE(has(text, "# TYPE idem_recorder_markers gauge\n")) << text;
  EXPECT_TRUE(has(text, "idem_recorder_markers{consumer=\"billing\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "idem_recorder_markers{consumer=\"ship\\\"ping\\\\eu\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "idem_recorder_live_claims{consumer=\"ship\\\"ping\\\\eu\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "idem_store_records{state=\"completed\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "idem_store_records{state=\"in_progress\"} 1\n")) << text;
  EXPECT_TRUE(has(text, "idem_outbox_rows{state=\"waiting\"} 2\n")) << text;
  EXPECT_TRUE(has(text, "idem_outbox_rows{state=\"parked\"} 0\n")) << text;
  EXPECT_TRUE(has(text, "# TYPE idem_outbox_oldest_age_seconds gauge\n")) << text;
  IDEM_EXPECT_PROMTOOL_ACCEPTS(text);

  const idem::test::CliRun json = run_cli({"stats", url, "--format", "json"});
  ASSERT_EQ(json.exit_code, 0) << json.output;
  const auto parsed = nlohmann::json::parse(json.output);
  EXPECT_EQ(parsed["recorder"]["processed"], 2);
  EXPECT_EQ(parsed["store"]["completed"], 1);
  EXPECT_EQ(parsed["outbox"]["depth"], 2);
  // The oldest row's age grows between runs; everything else is the same.
  const auto without_age = [](std::string out) {
    auto document = nlohmann::json::parse(out);
    document["outbox"].erase("oldest_age_ms");
    return document;
  };
  EXPECT_EQ(without_age(run_cli({"stats", url, "--json"}).output), without_age(json.output))
      << "--json is --format json";
  const auto before_outbox = [](const std::string& out) {
    return out.substr(0, out.find("outbox:"));
  };
  const idem::test::CliRun plain = run_cli({"stats", url, "--format", "text"});
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  EXPECT_TRUE(has(plain.output, "recorder: 2 markers, 1 live claims, 2 consumers\n"))
      << plain.output;
  EXPECT_EQ(before_outbox(plain.output), before_outbox(run_cli({"stats", url}).output))
      << "text is the default";
}

TEST_F(CliStatsFormat, AnEmptyFileWritesNoFamilies) {
  { idem::sqlite::SqliteIdempotencyRecorder recorder(db); }
  const idem::test::CliRun run = run_cli({"stats", url, "--format", "prometheus"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(has(run.output, "# TYPE idem_recorder_markers gauge\n")) << run.output;
  EXPECT_FALSE(has(run.output, "idem_store_records")) << "no store in the file: " << run.output;
  EXPECT_FALSE(has(run.output, "idem_outbox_rows")) << run.output;
  IDEM_EXPECT_PROMTOOL_ACCEPTS(run.output);
}

TEST_F(CliStatsFormat, BadFormatsAreUsageErrors) {
  { idem::sqlite::SqliteIdempotencyRecorder recorder(db); }
  const idem::test::CliRun unknown = run_cli({"stats", url, "--format", "yaml"});
  EXPECT_EQ(unknown.exit_code, 2) << unknown.output;
  EXPECT_TRUE(has(unknown.output, "--format yaml: expected text, json or prometheus"))
      << unknown.output;
  const idem::test::CliRun both = run_cli({"stats", url, "--json", "--format", "prometheus"});
  EXPECT_EQ(both.exit_code, 2) << both.output;
  EXPECT_TRUE(has(both.output, "exclude each other")) << both.output;
}

}  // namespace
