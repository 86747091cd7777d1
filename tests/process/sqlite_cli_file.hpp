// The fixture of the CLI tests that first fill a SQLite file of their own through the library
// (sqlite_cli_outbox_test.cpp, sqlite_cli_stats_format_test.cpp).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "../outbox_case.hpp"
#include "../temp_dir.hpp"
#include "demo_cli.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"

namespace idem::test {

class CliOnSqliteFile : public ::testing::Test {
 protected:
  void SetUp() override { IDEM_REQUIRE_CLI(); }

  // Sets `f` to the file's recorder and outbox after the charging handler of "billing" took
  // "e1": its marker, and its two follow-ups in the outbox.
  void charge_e1(OutboxFixture& f) const {
    f = {std::make_shared<sqlite::SqliteIdempotencyRecorder>(db),
         std::make_shared<sqlite::SqliteOutbox>(db)};
    CollectingBusProxy proxy("billing");
    auto handler = charging_handler(f, "billing", 2);
    ASSERT_EQ((*handler)(incoming("e1"), proxy), HandleResult::processed);
  }

  TempDir dir;
  std::string db = dir.file("idem.db");
  std::string url = "sqlite:" + db;
};

}  // namespace idem::test
