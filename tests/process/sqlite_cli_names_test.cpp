// `idem stats` and `idem inspect` print consumer names as they are: UTF-8 in any script as
// UTF-8 (not \xNN escapes), aligned by the characters shown; bytes that are not UTF-8 as \xNN in
// text and as U+FFFD in JSON, never a failed command.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "demo_cli.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "sqlite_cli_fixture.hpp"

namespace {

using idem::test::CliRun;
using idem::test::run_cli;

class CliNames : public idem::test::CliStoreCommands {
 protected:
  void SetUp() override {
    CliStoreCommands::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    idem::sqlite::SqliteOptions options;
    options.durability = idem::sqlite::Durability::off;
    idem::sqlite::SqliteIdempotencyRecorder recorder(db_.string(), options);
    recorder.mark_processed(kCyrillic, "e-1");
    recorder.mark_processed(kCyrillic, "e-2");
    recorder.mark_processed(kHan, "e-1");
    recorder.mark_processed(kNotUtf8, "e-1");
    recorder.mark_processed("billing", "e-1");
  }
  static constexpr const char* kCyrillic = "счёт";    // 4 characters, 8 bytes
  static constexpr const char* kHan = "請求";         // 2 characters, 6 bytes
  static constexpr const char* kNotUtf8 = "bad\xff";  // a byte no UTF-8 text has
};

TEST_F(CliNames, StatsPrintsUtf8NamesAsTheyAre) {
  const CliRun run = run_cli({"stats", url_});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(std::string("  ") + kCyrillic + "  "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find(std::string("  ") + kHan + " "), std::string::npos) << run.output;
  EXPECT_NE(run.output.find("bad\\xff"), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("\\xd1"), std::string::npos) << "escaped UTF-8:\n" << run.output;
  // Aligned by characters: the count column starts at the same character in every row.
  const auto row_prefix = [&](const std::string& name) {
    const std::size_t at = run.output.find("  " + name);
    const std::size_t end = run.output.find_first_not_of(' ', at + 2 + name.size());
    std::size_t characters = 0;
    for (std::size_t i = at; i < end; ++i)
      characters += (static_cast<unsigned char>(run.output[i]) & 0xc0) != 0x80 ? 1 : 0;
    return characters;
  };
  EXPECT_EQ(row_prefix(kCyrillic), row_prefix("billing")) << run.output;
  EXPECT_EQ(row_prefix(kHan), row_prefix("billing")) << run.output;
}

TEST_F(CliNames, StatsJsonCarriesUtf8NamesAndReplacesBytesThatAreNot) {
  const CliRun run = run_cli({"stats", url_, "--json"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  const auto json = nlohmann::json::parse(run.output);
  std::vector<std::string> names;
  for (const auto& c : json.at("recorder").at("consumers"))
    names.push_back(c.at("consumer").get<std::string>());
  EXPECT_NE(std::find(names.begin(), names.end(), kCyrillic), names.end()) << run.output;
  EXPECT_NE(std::find(names.begin(), names.end(), kHan), names.end()) << run.output;
  EXPECT_NE(std::find(names.begin(), names.end(), "bad\xef\xbf\xbd"), names.end()) << run.output;
}

TEST_F(CliNames, InspectPrintsAUtf8ConsumerAsItIs) {
  const CliRun run = run_cli({"inspect", url_, "e-1", "--consumer", kCyrillic});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find(kCyrillic), std::string::npos) << run.output;
  const CliRun missing = run_cli({"inspect", url_, "e-9", "--consumer", kHan});
  EXPECT_EQ(missing.exit_code, 1) << missing.output;
  EXPECT_NE(missing.output.find(kHan), std::string::npos) << missing.output;
}

}  // namespace
