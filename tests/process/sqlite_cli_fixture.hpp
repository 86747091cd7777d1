// The fixture of the process tests that run `idem` (IDEM_CLI) on a SQLite file filled through
// the library: a temp dir with idem.db, the CLI run with stdout and stderr captured apart, and
// clocks at the real time shifted (the CLI decides ages and expiry with the system clock).
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../sqlite_raw_db.hpp"
#include "demo_cli.hpp"
#include "idem/report.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::test {

namespace fs = std::filesystem;

struct CliResult {
  int code = -1;
  std::string out;
  std::string err;
};

inline std::string slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

class CliStoreCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    IDEM_REQUIRE_CLI();
    char pattern[] = "/tmp/idem-cli-test-XXXXXX";
    ASSERT_NE(::mkdtemp(pattern), nullptr);
    dir_ = pattern;
    db_ = dir_ / "idem.db";
    url_ = "sqlite://" + db_.string();
  }
  void TearDown() override {
    std::error_code ignored;
    if (!dir_.empty()) fs::remove_all(dir_, ignored);
  }

  // Runs the CLI with `args`; stdout and stderr are captured separately (in files, so a large
  // output can never block the child on a full pipe: a /bin/sh wrapper redirects them).
  CliResult run(std::vector<std::string> args) {
    const fs::path out = dir_ / "stdout";
    const fs::path err = dir_ / "stderr";
    std::vector<std::string> argv = {
        "/bin/sh",    "-c",    R"(o=$1 e=$2; shift 2; exec "$@" >"$o" 2>"$e")", "sh", out.string(),
        err.string(), IDEM_CLI};
    argv.insert(argv.end(), args.begin(), args.end());
    idem::test::ChildProcess child(argv);
    child.close_stdin();
    const int status = child.wait();
    CliResult result;
    if (WIFEXITED(status)) result.code = WEXITSTATUS(status);
    result.out = slurp(out);
    result.err = slurp(err);
    return result;
  }

  // A clock at the real time shifted by `offset` (negative: in the past).
  static std::shared_ptr<idem::testing::ManualClock> clock_at(
      std::chrono::system_clock::duration offset) {
    return std::make_shared<idem::testing::ManualClock>(std::chrono::system_clock::now() + offset);
  }

  idem::sqlite::SqliteOptions options_at(std::chrono::system_clock::duration offset) {
    idem::sqlite::SqliteOptions options;
    options.clock = clock_at(offset);
    options.durability = idem::sqlite::Durability::off;  // test data: fast commits
    return options;
  }

  // billing: 3 old markers (10 days) + 1 new one; shipping: 2 old ones; one live claim.
  void fill_recorder() {
    {
      idem::sqlite::SqliteIdempotencyRecorder old(db_.string(),
                                                  options_at(-std::chrono::hours(240)));
      for (int i = 0; i < 3; ++i)
        old.mark_processed("billing", "old-" + std::to_string(i));
      old.mark_processed("shipping", "old-a");
      old.mark_processed("shipping", "old-b");
    }
    idem::sqlite::SqliteIdempotencyRecorder now(db_.string(), options_at({}));
    now.mark_processed("billing", "new-1");
    ASSERT_EQ(now.claim("billing", "running", std::chrono::hours(1)).status,
              idem::Claim::Status::acquired);
  }

  // Two expired results, one live result ("order-1"), one live claim ("order-running").
  void fill_store() {
    const auto complete = [](idem::IdempotencyStore& store, const std::string& key,
                             const std::string& bytes, idem::Millis ttl) {
      const auto claim = store.claim(key, std::string("fp-") + key, std::chrono::hours(1));
      ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired) << key;
      idem::ExecutionReport report;
      report.operation = "create_payment";
      ASSERT_TRUE(store.complete(key, claim.token, idem::StoredValue{{}, {}, bytes}, report, ttl));
    };
    {
      idem::sqlite::SqliteIdempotencyStore old(db_.string(), options_at(-std::chrono::hours(48)));
      complete(old, "order-old-1", "x", std::chrono::hours(1));
      complete(old, "order-old-2", "y", std::chrono::hours(1));
    }
    idem::sqlite::SqliteIdempotencyStore now(db_.string(), options_at({}));
    complete(now, "order-1", std::string("{\"id\":42}\x01", 10), std::chrono::hours(24));
    ASSERT_EQ(now.claim("order-running", std::nullopt, std::chrono::hours(1)).status,
              idem::ClaimOutcome::Status::acquired);
  }

  fs::path dir_;
  fs::path db_;
  std::string url_;
};

// SQL run on a plain sqlite3 connection, as the Python program does (rollback journal).
inline void raw_exec(const fs::path& path, const std::string& sql) {
  RawDb(path.string()).exec(sql);
}

// The first column of the first row, as text ("" when none).
inline std::string raw_text(const fs::path& path, const std::string& sql) {
  return RawDb(path.string(), RawDb::kReadOnly).text(sql).value_or("");
}

// The files next to a database that SQLite makes when it writes (or switches to WAL).
inline std::vector<std::string> side_files(const fs::path& db) {
  std::vector<std::string> found;
  for (const char* suffix : {"-wal", "-shm", "-journal"}) {
    if (fs::exists(db.string() + suffix)) found.push_back(db.string() + suffix);
  }
  return found;
}

}  // namespace idem::test
