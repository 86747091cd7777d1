// Opening a SQLite file that other programs are writing at that moment never fails on a lock
// that waiting would clear.
//
// The other programs are written the way infinity_bus's Python services write their
// processed_log: Python's sqlite3 module, the rollback journal the file was created with, one
// `INSERT OR IGNORE` committed at a time, in a loop. While three of them write, the test opens a
// recorder, a store and an outbox on the file, so the first of them switches the file from the
// rollback journal to WAL and creates idem's tables under their feet. SQLite answers that switch
// with SQLITE_BUSY without calling the busy handler whenever another connection holds the
// write lock (waiting there could deadlock), so without idem's own retry an open failed with
// `store_busy: running "PRAGMA journal_mode=WAL" ... database is locked` long before its busy
// timeout ran out. Each round makes a new file, so every round switches a journal mode; the
// rounds rotate which of the three opens first.
//
// Asserted: every open succeeds, and no marker is lost (every row a writer committed is there,
// and so is every marker idem wrote).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/sqlite/sqlite_outbox.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "worker/child_process.hpp"

namespace {

using idem::test::ChildProcess;
using idem::test::sqlite_exec;
using idem::test::sqlite_query_int;
using idem::test::TempDir;

constexpr int kRounds = 12;
constexpr int kWriters = 3;
// Each writer stops when the test closes its stdin, and after this many rows at the latest.
constexpr int kMaxRowsPerWriter = 200'000;
const char* const kPython = "/usr/bin/python3";

// A writer as the Python services write: default isolation (an implicit BEGIN before the
// INSERT, commit() after it), a busy timeout; only synchronous=OFF is not theirs (the locks are
// the same, and the test need not wait for the disk). Prints "ready" once its first row is
// committed, then, when its stdin closes, how many rows it committed and how often SQLite
// refused a statement. A refused row is tried again, so rows seed-0 .. seed-(n-1) all exist.
constexpr const char* kSeedWriter = R"py(
import datetime, select, sqlite3, sys
path, name, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = sqlite3.connect(path, timeout=30)
db.execute("PRAGMA synchronous=OFF")
written = refused = 0
while written < limit:
    try:
        db.execute("INSERT OR IGNORE INTO processed_log (consumer, event_id, ts) VALUES (?, ?, ?)",
                   ("seed", "%s-%d" % (name, written),
                    datetime.datetime.now(datetime.timezone.utc).isoformat()))
        db.commit()
    except sqlite3.OperationalError:
        db.rollback()
        refused += 1
        if refused > 10000:
            raise
        continue
    written += 1
    if written == 1:
        print("ready", flush=True)
    if select.select([sys.stdin], [], [], 0)[0]:
        break
print(written, refused, flush=True)
)py";

constexpr const char* kInfinityBusSchema =
    "CREATE TABLE IF NOT EXISTS processed_log (consumer TEXT NOT NULL, event_id TEXT NOT NULL, "
    "ts TEXT NOT NULL, PRIMARY KEY (consumer, event_id))";

// Opens one of idem's three SQLite components on `path` and, for the recorder, writes a marker.
void open_component(int which, const std::string& path, const std::string& marker) {
  switch (which % 3) {
    case 0: {
      idem::sqlite::SqliteIdempotencyRecorder recorder(path);
      recorder.mark_processed("idem", marker);
      break;
    }
    case 1: {
      idem::sqlite::SqliteIdempotencyStore store(path);
      break;
    }
    default: {
      idem::sqlite::SqliteOutbox outbox(path);
      break;
    }
  }
}

TEST(SqliteOpenContention, OpensWhileRollbackJournalWritersCommitAlwaysSucceed) {
  if (!std::filesystem::exists(kPython)) GTEST_SKIP() << kPython << " is not installed";
  TempDir dir;
  int failed_opens = 0;
  long long seed_rows = 0;
  long long refused = 0;
  for (int round = 0; round < kRounds; ++round) {
    const std::string path = dir.file("round-" + std::to_string(round) + ".db");
    sqlite_exec(path, kInfinityBusSchema);  // made by "Python": rollback journal, its table only

    std::vector<std::unique_ptr<ChildProcess>> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.push_back(std::make_unique<ChildProcess>(
          std::vector<std::string>{kPython, "-c", kSeedWriter, path, "w" + std::to_string(w),
                                   std::to_string(kMaxRowsPerWriter)}));
    }
    for (auto& writer : writers) {
      ASSERT_EQ(writer->read_line(), "ready")
          << "a seed writer did not start (round " << round << ")";
    }

    // All three components, the one that switches the journal mode rotating with the round.
    const std::string marker = "round-" + std::to_string(round);
    for (int i = 0; i < 3; ++i) {
      try {
        open_component(round + i, path, marker);
      } catch (const std::exception& e) {
        ++failed_opens;
        ADD_FAILURE() << "round " << round << ", component " << (round + i) % 3
                      << ": opening failed: " << e.what();
      }
    }

    long long round_rows = 0;
    for (auto& writer : writers) {
      writer->close_stdin();
      std::istringstream summary(writer->read_line());
      long long written = -1;
      long long writer_refused = -1;
      summary >> written >> writer_refused;
      const int status = writer->wait();
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "a seed writer failed (round " << round << ")";
      ASSERT_GE(written, 1);
      round_rows += written;
      refused += writer_refused;
    }
    seed_rows += round_rows;

    // Nothing lost: every row the writers committed, and idem's marker.
    EXPECT_EQ(sqlite_query_int(path, "SELECT count(*) FROM processed_log WHERE consumer = 'seed'"),
              round_rows)
        << "round " << round;
    EXPECT_EQ(sqlite_query_int(path,
                               "SELECT count(*) FROM processed_log WHERE consumer = 'idem' AND "
                               "event_id = '" +
                                   marker + "'"),
              1)
        << "round " << round;
    EXPECT_EQ(sqlite_query_int(path,
                               "SELECT count(*) FROM sqlite_master WHERE name IN ('idem_claims', "
                               "'idem_records', 'idem_outbox')"),
              3)
        << "round " << round;
  }
  EXPECT_EQ(failed_opens, 0);
  std::cout << kRounds * 3 << " opens during " << seed_rows << " rows committed by " << kWriters
            << " writers per round (" << refused << " statements refused by SQLite)\n";
}

}  // namespace
