// `idem demo --store` on SQLite files: every mode passes its own check (exit 0 and the "OK:"
// line), a file the demo made is gone afterwards, runs on one file that already holds data
// (--allow-nonempty-store) stay independent and leave it as it was, and recorders the demo
// cannot use are refused before anything starts (exit 2, a message saying why).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "../temp_dir.hpp"
#include "demo_cli.hpp"

namespace {

namespace fs = std::filesystem;
using idem::test::has;
using idem::test::run_demo;

using idem::test::TempDir;

TEST(SqliteDemoStore, EveryModeOnAFileUrlTwice) {
  IDEM_REQUIRE_CLI();
  TempDir dir;
  const std::string file = (dir.path() / "shared.db").string();
  const std::string url = "sqlite://" + file + "?durability=off";
  for (const char* mode : {"transactional", "exclusive", "check_then_mark"}) {
    // A new file each time: the demo made it, so the demo deletes it.
    for (int run = 0; run < 2; ++run) {
      const auto result = run_demo(url, mode);
      SCOPED_TRACE(mode);
      idem::test::expect_demo_ok(result, "400", mode);
      EXPECT_TRUE(has(result, "(a fresh name for this run)")) << result.output;
      EXPECT_FALSE(fs::exists(file)) << result.output;
      EXPECT_FALSE(fs::exists(file + "-wal")) << result.output;
    }
  }
}

TEST(SqliteDemoStore, DefaultStoreIsUnchanged) {
  IDEM_REQUIRE_CLI();
  const auto result = run_demo("", "transactional", "300");
  idem::test::expect_demo_ok(result, "300");
  EXPECT_TRUE(has(result, "consumer:  billing\n")) << result.output;
}

TEST(SqliteDemoStore, TwoHopsThroughTheOutboxOnTheDefaultStore) {
  IDEM_REQUIRE_CLI();
  const auto result = idem::test::run_two_hop_demo("300");
  idem::test::expect_two_hop_demo_ok(result, 300);
  EXPECT_TRUE(has(result, "hops:      2: billing -> outbox -> relay process -> shipping\n"))
      << result.output;
  // The follow-ups were published only by billing's committed handlers: one per distinct order,
  // however often billing saw each one.
  EXPECT_EQ(idem::test::row(result, "handlers completed"), 300) << result.output;
}

TEST(SqliteDemoStore, TwoHopsOnAFileUrlTwice) {
  IDEM_REQUIRE_CLI();
  TempDir dir;
  const std::string url = "sqlite://" + (dir.path() / "hops.db").string() + "?durability=off";
  for (int run = 0; run < 2; ++run) {
    const auto result = idem::test::run_two_hop_demo("200", url);
    idem::test::expect_two_hop_demo_ok(result, 200);
    EXPECT_TRUE(has(result, "(a fresh name for this run)")) << result.output;
  }
}

TEST(SqliteDemoStore, RecordersTheDemoCannotUseAreRefusedFirst) {
  IDEM_REQUIRE_CLI();
  for (const char* url : {"memory://", "sqlite::memory:"}) {
    const auto result = run_demo(url, "exclusive");
    idem::test::expect_stopped_before_start(result, 2, {"not_supported", "in-memory recorder"});
  }
  const auto bad = run_demo("sqlite://host/x.db", "exclusive");
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_TRUE(has(bad, "config_error")) << bad.output;
  EXPECT_TRUE(has(bad, "host")) << bad.output;
  const auto nonsense = run_demo("not a url", "exclusive");
  EXPECT_EQ(nonsense.exit_code, 2) << nonsense.output;
}

}  // namespace
