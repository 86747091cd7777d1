// The crash matrix: every crash point × every mode × every durable backend, with a real process
// SIGKILLed at the point and a fresh process finishing the work, checked against the outcome
// docs/guarantees.md promises for that cell.
//
// One cell = one new event (or key):
//   1. idem_test_crash_worker runs with IDEM_CRASH_POINT=<point> IDEM_CRASH_ACTION=kill in its
//      environment (CrashPlan::from_env) and must die by SIGKILL — which only the plan sends.
//   2. Where the dead owner left a claim (exclusive mode, operations), a worker within its lease
//      is refused (AlreadyInProgress) and runs nothing.
//   3. A fresh worker without a plan handles the same event (the redelivery) or calls the same key.
//      Its wall clock runs 61 s ahead, past the dead owner's 60 s lease: an abandoned claim is
//      taken over without the test sleeping through the lease (the pattern of the other crash
//      tests; a real short lease would only add waiting, not coverage).
//   4. The side effects are counted — lines in an fsync'ed append-only file, and for the
//      transactional mode also rows written through the handler's transaction — and compared
//      with the cell's promise: 1 (exactly once) or 2 (at least once, in the named window). The
//      event must end marked (no open claim); the key must end completed.
// A failure names its cell: "postgres/exclusive/before_complete: expected 2 side effects, got 1".
// At the end the observed matrix is printed as the Markdown table docs/guarantees.md carries.
//
// Backends: SQLite (a file in a temp dir), Redis and PostgreSQL from IDEM_TEST_REDIS_URL /
// IDEM_TEST_POSTGRES_URL (scripts/servers.sh); a missing server skips its cells, or fails them
// with IDEM_REQUIRE_SERVERS=1. Backends not built into idem are left out.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "../server_env.hpp"
#include "idem/event.hpp"
#include "idem/open.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/testing/crash_points.hpp"
#include "worker/child_process.hpp"

#if __has_include("idem/sqlite/sqlite_recorder.hpp")
#include <sqlite3.h>
#define IDEM_MATRIX_SQLITE 1
#endif
#if __has_include("idem/redis/redis_options.hpp")
#include "../integration/redis_test_env.hpp"
#define IDEM_MATRIX_REDIS 1
#endif
#if __has_include("idem/postgres/postgres_options.hpp")
#include "../postgres_test_support.hpp"
#include "../temp_dir.hpp"
#define IDEM_MATRIX_POSTGRES 1
#endif

namespace {

using idem::test::ChildProcess;
using idem::testing::CrashPoint;

constexpr const char* kLeaseMs = "60000";
constexpr const char* kAheadMs = "61000";  // the fresh process's clock: past the lease

enum class Backend { sqlite, redis, postgres };
enum class Face { consumer, operation };

std::string_view name_of(Backend backend) {
  switch (backend) {
    case Backend::sqlite:
      return "sqlite";
    case Backend::redis:
      return "redis";
    case Backend::postgres:
      return "postgres";
  }
  return "?";
}

struct Cell {
  Backend backend;
  Face face;
  std::string mode;  // a HandlerMode name, or "operation"
  CrashPoint point;

  std::string name() const {
    return std::string(name_of(backend)) + "/" + mode + "/" +
           std::string(idem::testing::to_string(point));
  }
};

// gtest prints a failing parameter with this instead of its bytes.
void PrintTo(const Cell& cell, std::ostream* out) {
  *out << cell.name();
}

// What docs/guarantees.md promises for a cell.
struct Promise {
  int effects;         // side effects in total, after the crash and the fresh process
  int rows;            // transactional mode: rows written through the transaction (else -1)
  std::string second;  // what the fresh process reports
};

Promise promise_of(const Cell& cell) {
  // Between the side effect and the commit of the marker (or result) the work is done but not
  // recorded: a crash there runs it again. Everywhere else it runs once.
  const bool in_window =
      cell.point == CrashPoint::after_side_effect || cell.point == CrashPoint::before_complete;
  const bool committed = cell.point == CrashPoint::during_complete ||
                         cell.point == CrashPoint::after_commit_before_ack;
  Promise promise;
  promise.effects = in_window ? 2 : 1;
  promise.rows = cell.mode == "transactional" ? 1 : -1;  // rolled back with the marker
  if (cell.face == Face::consumer) {
    promise.second = committed ? "duplicate" : "processed";
  } else {
    promise.second = committed ? "replayed" : "executed";
  }
  return promise;
}

// ---- the backends -----------------------------------------------------------------------------

using idem::test::servers_required;

using idem::test::TempDir;

// One backend's URL, its side table and how to count the table's rows. Made once per backend
// for the whole binary (opening a PostgreSQL schema per cell would cost more than the cell).
class BackendUnderTest {
 public:
  virtual ~BackendUnderTest() = default;
  virtual std::string url() const = 0;
  virtual bool supports_transactions() const = 0;
  virtual std::string table() const { return ""; }
  virtual long long rows(const std::string& event_id) const = 0;
};

#ifdef IDEM_MATRIX_SQLITE
class SqliteUnderTest final : public BackendUnderTest {
 public:
  explicit SqliteUnderTest(const TempDir& dir) : path_(dir.file("matrix.db")) {
    run("CREATE TABLE crash_effects(event_id TEXT NOT NULL)");
  }
  std::string url() const override { return "sqlite://" + path_; }
  bool supports_transactions() const override { return true; }
  std::string table() const override { return "crash_effects"; }
  long long rows(const std::string& event_id) const override {
    return std::stoll(
        run("SELECT count(*) FROM crash_effects WHERE event_id = '" + event_id + "'"));
  }

 private:
  // Runs `sql` on a connection of the test's own; the first column of the last row.
  std::string run(const std::string& sql) const {
    sqlite3* db = nullptr;
    if (sqlite3_open(path_.c_str(), &db) != SQLITE_OK) {
      sqlite3_close(db);
      throw std::runtime_error("cannot open " + path_);
    }
    sqlite3_busy_timeout(db, 5000);
    std::string value;
    char* error = nullptr;
    const int rc = sqlite3_exec(
        db, sql.c_str(),
        [](void* out, int, char** columns, char**) {
          *static_cast<std::string*>(out) = columns[0] ? columns[0] : "";
          return 0;
        },
        &value, &error);
    const std::string message = error ? error : "";
    sqlite3_free(error);
    sqlite3_close(db);
    if (rc != SQLITE_OK) throw std::runtime_error("test SQL failed: " + sql + ": " + message);
    return value;
  }

  std::string path_;
};
#endif

#ifdef IDEM_MATRIX_REDIS
class RedisUnderTest final : public BackendUnderTest {
 public:
  std::string url() const override {
    const std::string base = idem::test::redis_url();
    return base + (base.find('?') == std::string::npos ? "?" : "&") + "prefix=" + keys_.prefix();
  }
  bool supports_transactions() const override { return false; }
  long long rows(const std::string&) const override { return -1; }

 private:
  idem::test::RedisTestPrefix keys_{"matrix"};  // deletes every key of the matrix at the end
};
#endif

#ifdef IDEM_MATRIX_POSTGRES
class PostgresUnderTest final : public BackendUnderTest {
 public:
  PostgresUnderTest() {
    idem::test::pg::query("CREATE SCHEMA \"" + schema_.name() + "\"");
    idem::test::pg::query("CREATE TABLE " + table() + "(event_id text NOT NULL)");
  }
  std::string url() const override {
    const std::string base = idem::test::pg::server_url().value();
    return base + (base.find('?') == std::string::npos ? "?" : "&") + "schema=" + schema_.name();
  }
  bool supports_transactions() const override { return true; }
  std::string table() const override { return schema_.table("crash_effects"); }
  long long rows(const std::string& event_id) const override {
    return idem::test::pg::query_int("SELECT count(*) FROM " + table() + " WHERE event_id = '" +
                                     event_id + "'");
  }

 private:
  idem::test::pg::TempSchema schema_;  // dropped with the side table at the end
};
#endif

// Why a backend cannot run here (empty: it can).
std::string unavailable(Backend backend) {
  switch (backend) {
    case Backend::sqlite:
#ifdef IDEM_MATRIX_SQLITE
      return "";
#else
      return "the SQLite backend is not built";
#endif
    case Backend::redis:
#ifdef IDEM_MATRIX_REDIS
      return idem::test::redis_url().empty() ? "no Redis server: set IDEM_TEST_REDIS_URL" : "";
#else
      return "the Redis backend is not built";
#endif
    case Backend::postgres:
#ifdef IDEM_MATRIX_POSTGRES
      return idem::test::pg::server_url() ? "" : "no PostgreSQL server: set IDEM_TEST_POSTGRES_URL";
#else
      return "the PostgreSQL backend is not built";
#endif
  }
  return "unknown backend";
}

// ---- the matrix -------------------------------------------------------------------------------

int count_lines(const std::string& path, const std::string& wanted) {
  std::ifstream in(path);
  int n = 0;
  for (std::string line; std::getline(in, line);)
    n += line == wanted ? 1 : 0;
  return n;
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  if (WIFEXITED(status)) return "exit code " + std::to_string(WEXITSTATUS(status));
  return "status " + std::to_string(status);
}

std::vector<Cell> all_cells() {
  std::vector<Cell> cells;
  for (const Backend backend : {Backend::sqlite, Backend::redis, Backend::postgres}) {
    for (const std::string mode : {"check_then_mark", "exclusive", "transactional"}) {
      // Redis has no transactions to put a handler's writes in (docs/redis.md).
      if (backend == Backend::redis && mode == "transactional") continue;
      for (const CrashPoint point : idem::testing::kCrashPoints)
        cells.push_back({backend, Face::consumer, mode, point});
    }
    for (const CrashPoint point : idem::testing::kCrashPoints)
      cells.push_back({backend, Face::operation, "operation", point});
  }
  return cells;
}

std::string column_of(const Cell& cell) {
  return std::string(name_of(cell.backend)) + " " + cell.mode;
}

class CrashMatrix : public ::testing::TestWithParam<Cell> {
 public:
  static void SetUpTestSuite() { dir_ = new TempDir(); }
  static void TearDownTestSuite() {
    print_observed();
    backends_.clear();
    delete dir_;
    dir_ = nullptr;
  }

 protected:
  // The backend of `backend`, made on first use.
  static BackendUnderTest& backend_of(Backend backend) {
    auto& slot = backends_[backend];
    if (!slot) {
      switch (backend) {
        case Backend::sqlite:
#ifdef IDEM_MATRIX_SQLITE
          slot = std::make_unique<SqliteUnderTest>(*dir_);
#endif
          break;
        case Backend::redis:
#ifdef IDEM_MATRIX_REDIS
          slot = std::make_unique<RedisUnderTest>();
#endif
          break;
        case Backend::postgres:
#ifdef IDEM_MATRIX_POSTGRES
          slot = std::make_unique<PostgresUnderTest>();
#endif
          break;
      }
    }
    if (!slot) throw std::logic_error("backend not built");
    return *slot;
  }

  // The worker's argv; armed at `point` through its environment (via env(1), so the plan reaches
  // the child exactly as an operator would set it).
  static std::vector<std::string> worker(std::optional<CrashPoint> point,
                                         std::vector<std::string> args) {
    std::vector<std::string> argv;
    if (point) {
      argv = {"/usr/bin/env", "IDEM_CRASH_POINT=" + std::string(idem::testing::to_string(*point)),
              "IDEM_CRASH_ACTION=kill"};
    }
    argv.push_back(IDEM_CRASH_WORKER);
    argv.insert(argv.end(), args.begin(), args.end());
    return argv;
  }

  static void record(const Cell& cell, const std::string& observed) {
    observed_[std::string(idem::testing::to_string(cell.point))][column_of(cell)] = observed;
  }

  // The observed outcomes, one row per point, one column per backend and mode.
  static void print_observed() {
    if (observed_.empty()) return;
    // Columns in the matrix's own order (backend, then mode), each once.
    std::vector<std::string> columns;
    for (const Cell& cell : all_cells()) {
      const std::string column = column_of(cell);
      const bool seen = std::find(columns.begin(), columns.end(), column) != columns.end();
      if (!seen && observed_[std::string(idem::testing::to_string(cell.point))].count(column)) {
        columns.push_back(column);
      }
    }
    std::cout << "\nObserved crash matrix (side effects after the crash and a fresh process):\n"
              << "| point |";
    for (const auto& column : columns)
      std::cout << " " << column << " |";
    std::cout << "\n|---|";
    for (std::size_t i = 0; i < columns.size(); ++i)
      std::cout << "---|";
    std::cout << "\n";
    for (const CrashPoint point : idem::testing::kCrashPoints) {
      const auto row = observed_.find(std::string(idem::testing::to_string(point)));
      if (row == observed_.end()) continue;
      std::cout << "| " << row->first << " |";
      for (const auto& column : columns) {
        const auto value = row->second.find(column);
        std::cout << " " << (value == row->second.end() ? "-" : value->second) << " |";
      }
      std::cout << "\n";
    }
  }

  static inline TempDir* dir_ = nullptr;
  static inline std::map<Backend, std::unique_ptr<BackendUnderTest>> backends_;
  static inline std::map<std::string, std::map<std::string, std::string>> observed_;
};

TEST_P(CrashMatrix, AFreshProcessFinishesTheWorkWithThePromisedSideEffects) {
  const Cell cell = GetParam();
  const std::string name = cell.name();
  if (const std::string why = unavailable(cell.backend); !why.empty()) {
    if (servers_required() && cell.backend != Backend::sqlite) FAIL() << name << ": " << why;
    GTEST_SKIP() << name << ": " << why;
  }
  BackendUnderTest& backend = backend_of(cell.backend);
  if (cell.mode == "transactional" && !backend.supports_transactions()) {
    GTEST_SKIP() << name << ": the backend has no transactional mode";
  }
  const Promise promise = promise_of(cell);

  // Every cell works on its own event (or key) and effects file, so cells never see each other.
  const std::string id = idem::new_event_id();
  const std::string effects = dir_->file(id + ".effects");
  std::vector<std::string> args;
  if (cell.face == Face::consumer) {
    args = {"consume",
            "--url",
            backend.url(),
            "--mode",
            cell.mode,
            "--consumer",
            "matrix-" + cell.mode,
            "--event",
            id,
            "--effects",
            effects,
            "--lease-ms",
            kLeaseMs};
    if (cell.mode == "transactional") {
      args.push_back("--table");
      args.push_back(backend.table());
    }
  } else {
    args = {"operate",   "--url", backend.url(), "--key", "matrix:" + id,
            "--effects", effects, "--lease-ms",  kLeaseMs};
  }
  const std::string effect_line = cell.face == Face::consumer ? id : "matrix:" + id;

  // 1. The armed process dies at the point.
  {
    ChildProcess child(worker(cell.point, args));
    child.close_stdin();
    const std::string output = child.read_all();
    const int status = child.wait();
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        << name << ": the armed worker was not killed at its crash point (" << describe(status)
        << ", output '" << output << "')";
    ASSERT_EQ(output, "") << name << ": the armed worker got past its crash point";
  }

  // 1b. Where the dead owner left a claim (exclusive mode, operations), a fresh process within
  //     its lease is refused and runs nothing: the claim, not luck, keeps W2/W4 to one rerun.
  const bool claim_left =
      (cell.mode == "exclusive" || cell.face == Face::operation) &&
      (cell.point == CrashPoint::after_claim || cell.point == CrashPoint::after_side_effect ||
       cell.point == CrashPoint::before_complete);
  if (claim_left) {
    const int before = count_lines(effects, effect_line);
    ChildProcess child(worker(std::nullopt, args));
    child.close_stdin();
    const std::string output = child.read_all();
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << name << ": the worker within the lease failed (" << describe(status) << ")";
    EXPECT_EQ(output, "in_progress\n") << name << ": a delivery within the dead owner's lease";
    EXPECT_EQ(count_lines(effects, effect_line), before) << name << ": ran within the lease";
  }

  // 2. A fresh process, past the dead owner's lease, handles the same event / calls the same key.
  std::vector<std::string> fresh_args = args;
  fresh_args.push_back("--clock-ahead-ms");
  fresh_args.push_back(kAheadMs);
  std::string second;
  {
    ChildProcess child(worker(std::nullopt, fresh_args));
    child.close_stdin();
    second = child.read_all();
    const int status = child.wait();
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << name << ": the fresh worker failed (" << describe(status) << ", output '" << second
        << "')";
  }
  second = second.substr(0, second.find_first_of(" \n"));

  // 4. The outcome the docs promise.
  const int effects_seen = count_lines(effects, effect_line);
  const long long rows = promise.rows >= 0 ? backend.rows(id) : -1;
  std::string observed = std::to_string(effects_seen);
  if (promise.rows >= 0) observed = std::to_string(rows) + " row, " + observed + " outside";
  record(cell, observed);
  EXPECT_EQ(effects_seen, promise.effects)
      << name << ": expected " << promise.effects << " side effects, got " << effects_seen;
  if (promise.rows >= 0) {
    EXPECT_EQ(rows, promise.rows) << name << ": expected " << promise.rows
                                  << " rows written through the transaction, got " << rows;
  }
  EXPECT_EQ(second, promise.second) << name << ": the fresh process reported '" << second
                                    << "', expected '" << promise.second << "'";

  // The work ends recorded: the event marked with no claim left, the key completed.
  if (cell.face == Face::consumer) {
    auto recorder = idem::open_recorder(backend.url());
    const auto inspection = recorder->inspect("matrix-" + cell.mode, id);
    EXPECT_TRUE(inspection.processed) << name << ": the event is not marked processed";
    EXPECT_FALSE(inspection.claim.has_value()) << name << ": a claim was left open";
  } else {
    auto store = idem::open_store(backend.url());
    const auto record = store->lookup(idem::scoped_idempotency_key("crash-worker", "matrix:" + id));
    ASSERT_TRUE(record.has_value()) << name << ": the key has no record";
    EXPECT_EQ(record->state, idem::IdempotencyRecord::State::completed) << name;
    ASSERT_TRUE(record->value.bytes.has_value()) << name;
    EXPECT_NE(record->value.bytes->find("value:matrix:" + id), std::string::npos)
        << name << ": the stored value is '" << *record->value.bytes << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(EveryCell, CrashMatrix, ::testing::ValuesIn(all_cells()),
                         [](const ::testing::TestParamInfo<Cell>& param_info) {
                           std::string name = param_info.param.name();
                           for (char& c : name)
                             if (c == '/') c = '_';
                           return name;
                         });

}  // namespace
