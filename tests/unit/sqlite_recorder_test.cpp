// SqliteIdempotencyRecorder beyond the conformance suite: the file format other programs share
// (infinity_bus's processed_log, the ts format), WAL and durability settings, the busy timeout,
// bad inputs and their error codes, group commit under 8 threads, the SQLite specifics of claims
// (file-wide tokens, purge of dead claims) and the transactional inbox's SqliteTransaction.
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <latch>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "../../backends/sqlite/src/connection.hpp"  // the error mapping, tested directly
#include "../recorder_argument_checks.hpp"
#include "../run_together.hpp"
#include "../sqlite_names.hpp"
#include "../sqlite_raw_db.hpp"
#include "../sqlite_test_support.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::sqlite_names;

// infinity_bus's table, exactly as its SqliteIdempotencyRecorder.start() creates it.
constexpr const char* kInfinityBusSchema =
    "CREATE TABLE IF NOT EXISTS processed_log ( consumer TEXT NOT NULL, event_id TEXT NOT NULL,"
    " ts TEXT NOT NULL, PRIMARY KEY (consumer, event_id))";

// Runs `fn` and returns the SqliteError it threw (fails the test if it threw nothing else).
template <class Fn>
std::optional<SqliteError> sqlite_error_of(Fn&& fn) {
  return idem::test::error_thrown_by<SqliteError>(std::forward<Fn>(fn), "a SqliteError");
}

bool exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// ---- file format: schema and timestamps -----------------------------------------------------

TEST(SqliteRecorderFormat, TimestampIsPythonIsoformatForUtc) {
  using std::chrono::microseconds;
  const idem::WallTime t0{std::chrono::seconds(1893456000)};  // 2030-01-01T00:00:00Z
  EXPECT_EQ(idem::sqlite::marker_timestamp(t0), "2030-01-01T00:00:00.000000+00:00");
  EXPECT_EQ(idem::sqlite::marker_timestamp(t0 + 3723s + microseconds(4056)),
            "2030-01-01T01:02:03.004056+00:00");
  // Sub-microsecond digits are truncated, as Python's datetime holds microseconds.
  EXPECT_EQ(idem::sqlite::marker_timestamp(t0 + std::chrono::nanoseconds(999)),
            "2030-01-01T00:00:00.000000+00:00");
  EXPECT_EQ(idem::sqlite::marker_timestamp(idem::WallTime{}), "1970-01-01T00:00:00.000000+00:00");
  EXPECT_EQ(idem::sqlite::marker_timestamp(idem::WallTime{} - microseconds(1)),
            "1969-12-31T23:59:59.999999+00:00");
  EXPECT_EQ(idem::sqlite::marker_timestamp(idem::WallTime{std::chrono::seconds(951782400)}),
            "2000-02-29T00:00:00.000000+00:00");
}

TEST(SqliteRecorderFormat, CreatesTheDocumentedSchemaInWalMode) {
  TempDir dir;
  const std::string path = dir.file("idem.db");
  SqliteIdempotencyRecorder recorder(path);
  RawDb raw(path);
  EXPECT_EQ(raw.text("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.integer("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN "
                        "('processed_log', 'idem_claims', 'idem_schema', 'idem_counters')"),
            4);
  EXPECT_EQ(raw.integer("SELECT version FROM idem_schema WHERE component = 'recorder'"),
            SqliteIdempotencyRecorder::kSchemaVersion);
  // processed_log has exactly infinity_bus's columns and key.
  EXPECT_EQ(raw.text("SELECT group_concat(name || ':' || type || ':' || pk, ',') FROM "
                     "pragma_table_info('processed_log')"),
            "consumer:TEXT:1,event_id:TEXT:2,ts:TEXT:0");
}

TEST(SqliteRecorderFormat, RowWrittenLikeInfinityBusCountsAsProcessed) {
  TempDir dir;
  const std::string path = dir.file("shared.db");
  {
    // The Python program made the file first (rollback journal, its own table only).
    RawDb python(path);
    python.exec(kInfinityBusSchema);
    python.exec(
        "INSERT OR IGNORE INTO processed_log (consumer, event_id, ts) VALUES ('billing', "
        "'3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e', '2026-11-30T04:14:15.754789+00:00')");
    python.exec(
        "INSERT OR IGNORE INTO processed_log (consumer, event_id, ts) VALUES ('billing', "
        "'whole-second', '2026-01-01T00:00:00+00:00')");  // isoformat() drops .000000
  }
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  EXPECT_TRUE(recorder.is_processed("billing", "3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e"));
  EXPECT_TRUE(recorder.is_processed("billing", "whole-second"));
  EXPECT_FALSE(recorder.is_processed("shipping", "3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e"));
  EXPECT_EQ(recorder.claim("billing", "3f2b8c0e9d4a4f6b8e1c2d3a4b5c6d7e", 30s).status,
            Claim::Status::processed);
  bool ran = false;
  EXPECT_FALSE(recorder.run_transactional("billing", "whole-second",
                                          [&](idem::Transaction&) { ran = true; }));
  EXPECT_FALSE(ran);
  // Opening switched the file to WAL and added idem's tables beside the Python one.
  RawDb raw(path);
  EXPECT_EQ(raw.text("PRAGMA journal_mode"), "wal");
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), 2);
}

TEST(SqliteRecorderFormat, MarkerIsReadableByPlainSql) {
  TempDir dir;
  const std::string path = dir.file("idem.db");
  auto clock = std::make_shared<ManualClock>();  // 2030-01-01T00:00:00Z
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  clock->advance(1h + 2min + 3s + std::chrono::microseconds(456789));
  recorder.mark_processed("billing", "evt-1");
  ASSERT_EQ(recorder.claim("billing", "evt-2", 30s).status, Claim::Status::acquired);

  RawDb raw(path);
  EXPECT_EQ(raw.text("SELECT ts FROM processed_log WHERE consumer = 'billing' AND "
                     "event_id = 'evt-1'"),
            "2030-01-01T01:02:03.456789+00:00");
  // SQLite's own date functions read it as the same instant (to their millisecond, rounded).
  EXPECT_EQ(raw.text("SELECT strftime('%Y-%m-%d %H:%M:%f', ts) FROM processed_log WHERE "
                     "event_id = 'evt-1'"),
            "2030-01-01 01:02:03.457");
  // A claim is not a marker: plain readers of processed_log do not see it.
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log WHERE event_id = 'evt-2'"), 0);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM idem_claims WHERE event_id = 'evt-2'"), 1);
}

TEST(SqliteRecorderFormat, PurgeAgesEveryIsoFormatAsAnInstant) {
  TempDir dir;
  const std::string path = dir.file("mixed.db");
  auto clock = std::make_shared<ManualClock>(
      idem::WallTime{std::chrono::seconds(1893456000)});  // 2030-01-01T00:00:00Z
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  {
    RawDb other(path);
    // Rows other writers might leave, around the purge cutoff 2029-12-31T23:00:00Z.
    other.exec(
        "INSERT INTO processed_log VALUES "
        "('c', 'old-z', '2029-12-31T22:59:59.999Z'),"
        "('c', 'old-no-fraction', '2029-12-31T22:59:59+00:00'),"
        "('c', 'old-offset', '2029-12-31T23:59:59+01:00'),"  // 22:59:59Z
        "('c', 'new-z', '2029-12-31T23:00:00.001Z'),"
        "('c', 'new-offset', '2030-01-01T00:00:01+01:00'),"  // 23:00:01Z
        "('c', 'new-python', '2029-12-31T23:30:00.123456+00:00'),"
        "('c', 'garbage', 'not a timestamp')");
  }
  EXPECT_EQ(recorder.purge(1h), 3u);
  for (const char* gone : {"old-z", "old-no-fraction", "old-offset"}) {
    EXPECT_FALSE(recorder.is_processed("c", gone)) << gone;
  }
  for (const char* kept : {"new-z", "new-offset", "new-python"}) {
    EXPECT_TRUE(recorder.is_processed("c", kept)) << kept;
  }
  EXPECT_TRUE(recorder.is_processed("c", "garbage")) << "an unparsable ts is kept, never lost";
}

TEST(SqliteRecorderFormat, NewerSchemaVersionIsRefused) {
  TempDir dir;
  const std::string path = dir.file("future.db");
  { SqliteIdempotencyRecorder recorder(path); }
  RawDb(path).exec("UPDATE idem_schema SET version = 99 WHERE component = 'recorder'");
  expect_refused<SqliteError>([&] { SqliteIdempotencyRecorder again(path); },
                              ErrorCode::store_open_failed, {"version 99"});
}

TEST(SqliteRecorderFormat, ForeignProcessedLogWithOtherColumnsIsRefused) {
  TempDir dir;
  const std::string path = dir.file("foreign.db");
  RawDb(path).exec("CREATE TABLE processed_log(id INTEGER PRIMARY KEY, payload BLOB)");
  expect_refused<SqliteError>([&] { SqliteIdempotencyRecorder recorder(path); },
                              ErrorCode::store_not_a_database, {"processed_log"});
}

// A file the recorder refuses is left exactly as it was: the checks run before the journal mode
// is switched or a table is added (the file here is in rollback mode, as Python leaves it).
TEST(SqliteRecorderFormat, RefusedFilesAreLeftByteForByte) {
  TempDir dir;
  const idem::test::RefusedFile files[] = {
      {"foreign.db",
       "CREATE TABLE processed_log(id INTEGER PRIMARY KEY, payload BLOB);"
       "INSERT INTO processed_log(payload) VALUES (x'00ff')",
       ErrorCode::store_not_a_database},
      {"future.db",
       "CREATE TABLE idem_schema(component TEXT PRIMARY KEY, version INTEGER NOT NULL);"
       "INSERT INTO idem_schema VALUES ('recorder', 99)",
       ErrorCode::store_open_failed},
  };
  for (const auto& file : files) {
    SCOPED_TRACE(file.name);
    const std::string path = expect_refused_unchanged<SqliteError>(
        dir, file, [](const std::string& p) { SqliteIdempotencyRecorder recorder(p); });
    EXPECT_EQ(RawDb(path).integer("SELECT count(*) FROM sqlite_master WHERE name = 'idem_claims'"),
              0);
  }
}

// create_schema = false opens an infinity_bus file as it is: it stays in rollback mode with its
// one table, and everything that needs only processed_log works on it.
TEST(SqliteRecorderFormat, InfinityBusFileOpenedAsItIsKeepsItsJournalAndTables) {
  TempDir dir;
  const std::string path = dir.file("python.db");
  {
    RawDb python(path);
    python.exec(kInfinityBusSchema);
    python.exec(
        "INSERT INTO processed_log VALUES ('billing', 'old', '2026-01-01T00:00:00.000001+00:00'),"
        " ('billing', 'recent', '2037-12-31T00:00:00+00:00')");
  }
  auto clock = std::make_shared<ManualClock>();  // 2030-01-01
  SqliteOptions options = with_clock(clock);
  options.create_schema = false;
  {
    SqliteIdempotencyRecorder recorder(path, options);
    EXPECT_TRUE(recorder.is_processed("billing", "old"));
    recorder.mark_processed("billing", "from-idem");
    EXPECT_TRUE(recorder.is_processed("billing", "from-idem"));
    const auto counts = recorder.consumer_counts();
    ASSERT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts[0].processed, 3u);
    EXPECT_EQ(counts[0].in_progress, 0u);
    const auto seen = recorder.inspect("billing", "old");
    EXPECT_TRUE(seen.processed);
    EXPECT_FALSE(seen.claim.has_value());
    EXPECT_EQ(recorder.count_purgeable(24h), 1u);  // "old" (2026); not 2030's nor 2037's
    EXPECT_EQ(recorder.purge(std::chrono::hours(24 * 365)), 1u);
    EXPECT_FALSE(recorder.is_processed("billing", "old"));
    // Claims need idem's own table: a clear error, nothing written.
    const auto claim = sqlite_error_of([&] { (void)recorder.claim("billing", "e", 30s); });
    ASSERT_TRUE(claim);
    EXPECT_EQ(claim->code(), ErrorCode::store_error) << claim->what();
    EXPECT_TRUE(contains(claim->what(), "idem_claims")) << claim->what();
  }
  RawDb raw(path);
  EXPECT_EQ(raw.text("PRAGMA journal_mode"), "delete");
  EXPECT_EQ(raw.integer("SELECT count(*) FROM sqlite_master"), 2) << "the table and its index";
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), 2);
  EXPECT_FALSE(exists(path + "-wal"));

  // A file without processed_log is refused (and not created) rather than changed.
  const std::string empty = dir.file("empty.db");
  RawDb(empty).exec("CREATE TABLE unrelated(x)");
  const auto none = sqlite_error_of([&] { SqliteIdempotencyRecorder recorder(empty, options); });
  ASSERT_TRUE(none);
  EXPECT_EQ(none->code(), ErrorCode::store_error);
  EXPECT_TRUE(contains(none->what(), " do not exist ")) << none->what();
  const auto missing =
      sqlite_error_of([&] { SqliteIdempotencyRecorder recorder(dir.file("missing.db"), options); });
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code(), ErrorCode::store_open_failed);
  EXPECT_FALSE(exists(dir.file("missing.db")));
}

// Read-only, an infinity_bus file answers counts and inspections too (there are no claims).
TEST(SqliteRecorderFormat, InfinityBusFileReadOnlyCountsAndInspectsWithoutChangingIt) {
  TempDir dir;
  const std::string path = dir.file("python.db");
  {
    RawDb python(path);
    python.exec(kInfinityBusSchema);
    python.exec(
        "INSERT INTO processed_log VALUES ('billing', 'e1', '2026-01-01T00:00:00+00:00'),"
        " ('shipping', 'e1', '2026-01-01T00:00:00+00:00')");
  }
  const std::string before = file_bytes(path);
  SqliteOptions options;
  options.read_only = true;
  {
    SqliteIdempotencyRecorder recorder(path, options);
    EXPECT_EQ(recorder.consumer_counts().size(), 2u);
    const auto seen = recorder.inspect("billing", "e1");
    EXPECT_TRUE(seen.processed);
    ASSERT_TRUE(seen.processed_at.has_value());
    EXPECT_FALSE(seen.claim.has_value());
    EXPECT_EQ(recorder.count_purgeable(0s), 2u);
  }
  EXPECT_EQ(file_bytes(path), before);
}

TEST(SqliteRecorderFormat, ReopenKeepsMarkersClaimsAndTokens) {
  TempDir dir;
  const std::string path = dir.file("reopen.db");
  auto clock = std::make_shared<ManualClock>();
  std::uint64_t token = 0;
  {
    SqliteIdempotencyRecorder recorder(path, with_clock(clock));
    recorder.mark_processed("billing", "marked");
    const auto claim = recorder.claim("billing", "claimed", 1h);
    ASSERT_EQ(claim.status, Claim::Status::acquired);
    token = claim.token;
  }
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  EXPECT_TRUE(recorder.is_processed("billing", "marked"));
  EXPECT_EQ(recorder.claim("billing", "claimed", 1h).status, Claim::Status::in_progress);
  const auto other = recorder.claim("billing", "another", 1h);
  EXPECT_GT(other.token, token) << "the token counter lives in the file";
  EXPECT_TRUE(recorder.complete("billing", "claimed", token));
}

// ---- WAL, durability, busy timeout ------------------------------------------------------------

std::optional<std::int64_t> writer_pragma(SqliteIdempotencyRecorder& recorder, const char* pragma) {
  std::optional<std::int64_t> value;
  static_cast<void>(
      recorder.run_transactional("probe", idem::new_event_id(), [&](idem::Transaction& tx) {
        value = dynamic_cast<SqliteTransaction&>(tx).query_int64(pragma);
      }));
  return value;
}

TEST(SqliteRecorderDurability, EachLevelSetsSynchronousOnTheWriter) {
  TempDir dir;
  const struct {
    Durability durability;
    std::int64_t synchronous;
  } cases[] = {{Durability::full, 2}, {Durability::normal, 1}, {Durability::off, 0}};
  for (const auto& c : cases) {
    SqliteOptions options;
    options.durability = c.durability;
    const std::string path = dir.file("durability-" + std::to_string(c.synchronous) + ".db");
    SqliteIdempotencyRecorder recorder(path, options);
    EXPECT_EQ(writer_pragma(recorder, "PRAGMA synchronous"), c.synchronous);
    recorder.mark_processed("billing", "evt");
    EXPECT_TRUE(recorder.is_processed("billing", "evt"));
    EXPECT_EQ(RawDb(path).text("PRAGMA journal_mode"), "wal");
  }
}

TEST(SqliteRecorderDurability, DefaultIsNormal) {
  EXPECT_EQ(SqliteOptions{}.durability, Durability::normal);
  EXPECT_EQ(SqliteOptions{}.busy_timeout, 5s);
  SqliteIdempotencyRecorder recorder(":memory:");
  EXPECT_EQ(writer_pragma(recorder, "PRAGMA synchronous"), 1);
}

TEST(SqliteRecorderBusy, LockHeldPastTheBusyTimeoutIsRetryableStoreBusy) {
  TempDir dir;
  const std::string path = dir.file("busy.db");
  SqliteOptions options;
  options.busy_timeout = 20ms;
  SqliteIdempotencyRecorder recorder(path, options);
  recorder.mark_processed("billing", "before");

  RawDb other(path);
  other.exec("BEGIN IMMEDIATE");  // another process holds the write lock
  for (const auto& attempt : std::vector<std::function<void()>>{
           [&] { recorder.mark_processed("billing", "during"); },
           [&] { (void)recorder.claim("billing", "during", 30s); },
           [&] { (void)recorder.run_transactional("billing", "during", [](auto&) {}); },
           [&] { (void)recorder.purge(1h); },
       }) {
    const auto error = sqlite_error_of(attempt);
    ASSERT_TRUE(error);
    EXPECT_EQ(error->code(), ErrorCode::store_busy);
    EXPECT_TRUE(error->retryable());
    EXPECT_FALSE(error->in_doubt());
    EXPECT_EQ(error->sqlite_code(), SQLITE_BUSY);
    EXPECT_TRUE(contains(error->what(), path)) << error->what();
    EXPECT_TRUE(contains(error->what(), "SQLITE_BUSY")) << error->what();
  }
  // WAL: readers do not wait for the writer.
  EXPECT_TRUE(recorder.is_processed("billing", "before"));
  EXPECT_FALSE(recorder.is_processed("billing", "during"));
  other.exec("ROLLBACK");

  recorder.mark_processed("billing", "during");
  EXPECT_TRUE(recorder.is_processed("billing", "during"));
}

TEST(SqliteRecorderBusy, ZeroTimeoutFailsAtOnce) {
  TempDir dir;
  const std::string path = dir.file("busy0.db");
  SqliteOptions options;
  options.busy_timeout = 0ms;
  SqliteIdempotencyRecorder recorder(path, options);
  RawDb other(path);
  other.exec("BEGIN IMMEDIATE");
  const auto error = sqlite_error_of([&] { recorder.mark_processed("billing", "evt"); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_busy);
  other.exec("ROLLBACK");
}

TEST(SqliteRecorderBusy, WaitsForALockThatIsReleased) {
  TempDir dir;
  const std::string path = dir.file("wait.db");
  SqliteOptions options;
  options.busy_timeout = 60s;  // far longer than the lock is held
  SqliteIdempotencyRecorder recorder(path, options);
  RawDb other(path);
  other.exec("BEGIN IMMEDIATE");
  std::latch started(1);
  std::thread writer([&] {
    started.count_down();
    recorder.mark_processed("billing", "waited");  // waits in the busy handler
  });
  started.wait();
  other.exec("ROLLBACK");
  writer.join();
  EXPECT_TRUE(recorder.is_processed("billing", "waited"));
}

// ---- bad input --------------------------------------------------------------------------------

TEST(SqliteRecorderBadInput, MissingDirectoryIsOpenFailedNamingThePath) {
  TempDir dir;
  const std::string path = dir.file("no-such-dir/idem.db");
  const auto error = sqlite_error_of([&] { SqliteIdempotencyRecorder recorder(path); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_open_failed);
  EXPECT_EQ(error->sqlite_code(), SQLITE_CANTOPEN);
  EXPECT_FALSE(error->retryable());
  EXPECT_TRUE(contains(error->what(), path)) << error->what();
  EXPECT_TRUE(contains(error->what(), "does not exist")) << error->what();
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "no-such-dir")) << "nothing was created";
}

TEST(SqliteRecorderBadInput, DirectoryAsPathIsOpenFailed) {
  TempDir dir;
  const auto error = sqlite_error_of([&] { SqliteIdempotencyRecorder recorder(dir.path()); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_open_failed);
  EXPECT_TRUE(contains(error->what(), "directory")) << error->what();
}

TEST(SqliteRecorderBadInput, FileThatIsNotADatabase) {
  TempDir dir;
  const std::string path = dir.file("notes.txt");
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i)
      out << "these are my notes, not a database, line " << i << "\n";
  }
  const auto error = sqlite_error_of([&] { SqliteIdempotencyRecorder recorder(path); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_not_a_database);
  EXPECT_EQ(error->sqlite_code(), SQLITE_NOTADB);
  EXPECT_TRUE(contains(error->what(), path)) << error->what();
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "these are my notes, not a database, line 0") << "the file was not touched";
}

TEST(SqliteRecorderBadInput, BadArgumentsAndOptions) {
  EXPECT_THROW(SqliteIdempotencyRecorder(""), idem::InvalidArgument);
  EXPECT_THROW(SqliteIdempotencyRecorder(std::string("a\0b.db", 6)), idem::InvalidArgument);
  SqliteOptions negative;
  negative.busy_timeout = -1ms;
  EXPECT_THROW(SqliteIdempotencyRecorder(":memory:", negative), idem::ConfigError);
  SqliteOptions no_batch;
  no_batch.max_batch_size = 0;
  EXPECT_THROW(SqliteIdempotencyRecorder(":memory:", no_batch), idem::ConfigError);

  SqliteIdempotencyRecorder recorder(":memory:");
  const auto claim = idem::test::expect_bad_leases_and_ages_refused(recorder, "billing", "evt");
  // Tokens beyond SQLite's INTEGER are simply not current.
  EXPECT_FALSE(recorder.complete("billing", "evt", ~std::uint64_t{0}));
  EXPECT_FALSE(recorder.release("billing", "evt", ~std::uint64_t{0}));
  EXPECT_TRUE(recorder.complete("billing", "evt", claim.token));
}

TEST(SqliteRecorderBadInput, ReadOnlyOptionReadsButRefusesWrites) {
  TempDir dir;
  const std::string path = dir.file("ro.db");
  { SqliteIdempotencyRecorder(path).mark_processed("billing", "old"); }
  SqliteOptions options;
  options.read_only = true;
  SqliteIdempotencyRecorder recorder(path, options);
  EXPECT_TRUE(recorder.is_processed("billing", "old"));
  EXPECT_FALSE(recorder.is_processed("billing", "new"));
  for (const auto& write : std::vector<std::function<void()>>{
           [&] { recorder.mark_processed("billing", "new"); },
           [&] { (void)recorder.claim("billing", "new", 30s); },
           [&] { (void)recorder.run_transactional("billing", "new", [](auto&) {}); },
       }) {
    const auto error = sqlite_error_of(write);
    ASSERT_TRUE(error);
    EXPECT_EQ(error->code(), ErrorCode::store_read_only) << error->what();
    EXPECT_FALSE(error->retryable());
  }
  EXPECT_FALSE(recorder.is_processed("billing", "new"));

  // read_only never creates a file.
  const auto missing =
      sqlite_error_of([&] { SqliteIdempotencyRecorder absent(dir.file("absent.db"), options); });
  ASSERT_TRUE(missing);
  EXPECT_EQ(missing->code(), ErrorCode::store_open_failed);
  EXPECT_FALSE(std::filesystem::exists(dir.file("absent.db")));
}

TEST(SqliteRecorderErrors, ResultCodesMapInOnePlace) {
  using idem::sqlite::detail::make_sqlite_error;
  using idem::sqlite::detail::Phase;
  const struct {
    int rc;
    Phase phase;
    ErrorCode code;
    bool retryable;
    bool in_doubt;
  } cases[] = {
      {SQLITE_BUSY, Phase::other, ErrorCode::store_busy, true, false},
      {SQLITE_BUSY_SNAPSHOT, Phase::other, ErrorCode::store_busy, true, false},
      {SQLITE_LOCKED, Phase::other, ErrorCode::store_busy, true, false},
      {SQLITE_BUSY, Phase::commit, ErrorCode::store_busy, true, false},  // not committed
      {SQLITE_READONLY, Phase::other, ErrorCode::store_read_only, false, false},
      {SQLITE_NOTADB, Phase::other, ErrorCode::store_not_a_database, false, false},
      {SQLITE_CANTOPEN, Phase::other, ErrorCode::store_open_failed, false, false},
      {SQLITE_IOERR_WRITE, Phase::other, ErrorCode::store_error, true, false},
      {SQLITE_IOERR_FSYNC, Phase::commit, ErrorCode::store_error, false, true},
      {SQLITE_FULL, Phase::commit, ErrorCode::store_error, false, true},
      {SQLITE_CONSTRAINT_PRIMARYKEY, Phase::other, ErrorCode::store_error, false, false},
      {SQLITE_CORRUPT, Phase::other, ErrorCode::store_corrupt, false, false},
      {SQLITE_CORRUPT_INDEX, Phase::other, ErrorCode::store_corrupt, false, false},
      {SQLITE_READONLY_DBMOVED, Phase::other, ErrorCode::store_replaced, false, false},
  };
  for (const auto& c : cases) {
    const SqliteError e = make_sqlite_error(nullptr, c.rc, "testing", "/tmp/x.db", c.phase);
    SCOPED_TRACE(e.what());
    EXPECT_EQ(e.code(), c.code);
    EXPECT_EQ(e.retryable(), c.retryable);
    EXPECT_EQ(e.in_doubt(), c.in_doubt);
    EXPECT_EQ(e.sqlite_code(), c.rc & 0xff);
    EXPECT_EQ(e.extended_code(), c.rc);
    EXPECT_TRUE(contains(e.what(), idem::sqlite::sqlite_code_name(c.rc)));
    EXPECT_TRUE(contains(e.what(), "extended code " + std::to_string(c.rc)));
    EXPECT_TRUE(contains(e.what(), "/tmp/x.db"));
  }
}

// ---- group commit -----------------------------------------------------------------------------

TEST(SqliteRecorderGroupCommit, EightThreadsMarkEverythingOnce) {
  TempDir dir;
  const std::string path = dir.file("group.db");
  SqliteIdempotencyRecorder recorder(path);
  constexpr int kThreads = 8;
  constexpr int kPerThread = 300;
  std::vector<std::string> shared;
  for (int i = 0; i < kPerThread; ++i)
    shared.push_back(idem::new_event_id());
  std::atomic<int> errors{0};
  idem::test::run_together(kThreads, [&](int t) {
    for (int i = 0; i < kPerThread; ++i) {
      try {
        const std::string own = "t" + std::to_string(t) + "-" + std::to_string(i);
        recorder.mark_processed("billing", own);
        // Returned means committed: visible to a fresh read at once.
        if (!recorder.is_processed("billing", own)) errors.fetch_add(1);
        recorder.mark_processed("billing", shared[static_cast<std::size_t>(i)]);  // 8x each
      } catch (const std::exception& e) {
        if (errors.fetch_add(1) == 0) ADD_FAILURE() << e.what();
      }
    }
  });
  EXPECT_EQ(errors.load(), 0);
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.marks, 2u * kThreads * kPerThread);
  EXPECT_LE(stats.mark_commits, stats.marks);
  EXPECT_GE(stats.mark_commits, 1u);
  EXPECT_EQ(stats.queued_marks, 0u);
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), kThreads * kPerThread + kPerThread);
}

TEST(SqliteRecorderGroupCommit, MarksQueuedBehindABusyWriterShareOneCommit) {
  SqliteIdempotencyRecorder recorder(":memory:");
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  // run_transactional holds the writer while its handler runs: every mark queues behind it.
  static_cast<void>(recorder.run_transactional("holder", "evt", [&](idem::Transaction&) {
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back(
          [&recorder, t] { recorder.mark_processed("billing", "m" + std::to_string(t)); });
    }
    while (recorder.stats().queued_marks < kThreads)
      std::this_thread::yield();
  }));
  for (auto& thread : threads)
    thread.join();
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.marks, static_cast<std::uint64_t>(kThreads));
  // The first mark may have taken its batch before the others queued; the rest share one.
  EXPECT_LE(stats.mark_commits, 2u);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_TRUE(recorder.is_processed("billing", "m" + std::to_string(t)));
  }
}

TEST(SqliteRecorderGroupCommit, FailedBatchFailsEveryMarkAndMarksNone) {
  TempDir dir;
  const std::string path = dir.file("failing.db");
  SqliteOptions options;
  options.busy_timeout = 10ms;
  SqliteIdempotencyRecorder recorder(path, options);
  RawDb other(path);
  other.exec("BEGIN IMMEDIATE");
  constexpr int kThreads = 8;
  std::atomic<int> busy{0};
  idem::test::run_together(kThreads, [&](int t) {
    try {
      recorder.mark_processed("billing", "f" + std::to_string(t));
    } catch (const idem::Error& e) {
      if (e.code() == ErrorCode::store_busy && e.retryable()) busy.fetch_add(1);
    }
  });
  other.exec("ROLLBACK");
  EXPECT_EQ(busy.load(), kThreads);
  for (int t = 0; t < kThreads; ++t) {
    EXPECT_FALSE(recorder.is_processed("billing", "f" + std::to_string(t)));
  }
  EXPECT_EQ(recorder.stats().marks, 0u);
}

// ---- batches --------------------------------------------------------------------------------

namespace {

std::vector<std::string> numbered_ids(const std::string& prefix, int n) {
  std::vector<std::string> ids;
  for (int i = 0; i < n; ++i)
    ids.push_back(prefix + std::to_string(i));
  return ids;
}

}  // namespace

TEST(SqliteRecorderBatch, BatchIsOneCommitEvenPastMaxBatchSize) {
  TempDir dir;
  const std::string path = dir.file("batch.db");
  SqliteOptions options;
  options.max_batch_size = 8;
  options.durability = Durability::full;
  SqliteIdempotencyRecorder recorder(path, options);
  const auto ids = numbered_ids("b", 100);
  recorder.mark_processed_many("billing", ids);
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.marks, 100u);
  EXPECT_EQ(stats.mark_commits, 1u) << "a batch must be one transaction, not one per id";
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log WHERE consumer = 'billing'"), 100);
  EXPECT_EQ(raw.integer("SELECT count(DISTINCT ts) FROM processed_log"), 1);
  EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>(ids.size(), true));
}

TEST(SqliteRecorderBatch, BatchesAndSinglesQueuedBehindABusyWriterShareOneCommit) {
  SqliteIdempotencyRecorder recorder(":memory:");
  const auto first = numbered_ids("x", 10);
  const auto second = numbered_ids("y", 10);
  constexpr int kSingles = 4;
  std::vector<std::thread> threads;
  static_cast<void>(recorder.run_transactional("holder", "evt", [&](idem::Transaction&) {
    threads.emplace_back([&] { recorder.mark_processed_many("billing", first); });
    threads.emplace_back([&] { recorder.mark_processed_many("billing", second); });
    for (int t = 0; t < kSingles; ++t) {
      threads.emplace_back(
          [&recorder, t] { recorder.mark_processed("billing", "m" + std::to_string(t)); });
    }
    while (recorder.stats().queued_marks < 2 + kSingles)
      std::this_thread::yield();
  }));
  for (auto& thread : threads)
    thread.join();
  const auto stats = recorder.stats();
  EXPECT_EQ(stats.marks, 20u + kSingles);
  EXPECT_LE(stats.mark_commits, 2u);
  EXPECT_EQ(recorder.is_processed_many("billing", first), std::vector<bool>(10, true));
  EXPECT_EQ(recorder.is_processed_many("billing", second), std::vector<bool>(10, true));
  for (int t = 0; t < kSingles; ++t)
    EXPECT_TRUE(recorder.is_processed("billing", "m" + std::to_string(t)));
}

TEST(SqliteRecorderBatch, BatchMarkInsideRunTransactionalIsAReentryError) {
  SqliteIdempotencyRecorder recorder(":memory:");
  const std::vector<std::string> ids = {"a", "b"};
  std::vector<bool> seen;
  EXPECT_TRUE(recorder.run_transactional("billing", "evt", [&](idem::Transaction&) {
    try {
      recorder.mark_processed_many("billing", ids);
      ADD_FAILURE() << "mark_processed_many inside run_transactional did not throw";
    } catch (const idem::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::reentry) << e.what();
    }
    // Reads see the handler's own transaction.
    seen = recorder.is_processed_many("billing", std::vector<std::string>{"evt", "a"});
  }));
  EXPECT_EQ(seen, (std::vector<bool>{true, false}));
  EXPECT_EQ(recorder.is_processed_many("billing", ids), (std::vector<bool>{false, false}));
}

TEST(SqliteRecorderBatch, LockedFileFailsTheBatchRetryablyAndMarksNone) {
  TempDir dir;
  const std::string path = dir.file("locked.db");
  SqliteOptions options;
  options.busy_timeout = 10ms;
  SqliteIdempotencyRecorder recorder(path, options);
  const auto ids = numbered_ids("l", 20);
  {
    RawDb other(path);
    other.exec("BEGIN IMMEDIATE");
    try {
      recorder.mark_processed_many("billing", ids);
      ADD_FAILURE() << "the batch was marked while another connection held the write lock";
    } catch (const idem::Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::store_busy) << e.what();
      EXPECT_TRUE(e.retryable());
    }
    // Reads do not wait for the writer.
    EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>(ids.size(), false));
    other.exec("ROLLBACK");
  }
  EXPECT_EQ(recorder.stats().marks, 0u);
  recorder.mark_processed_many("billing", ids);  // the retry
  EXPECT_EQ(recorder.is_processed_many("billing", ids), std::vector<bool>(ids.size(), true));
}

// ---- claims: SQLite specifics -----------------------------------------------------------------

TEST(SqliteRecorderClaims, TokensComeFromOneCounterForTheWholeFile) {
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(":memory:", with_clock(clock));
  const auto a = recorder.claim("billing", "a", 30s);
  const auto b = recorder.claim("shipping", "b", 30s);
  EXPECT_LT(a.token, b.token);
  EXPECT_TRUE(recorder.release("billing", "a", a.token));
  const auto a2 = recorder.claim("billing", "a", 30s);
  EXPECT_GT(a2.token, b.token);
  // A purge that drops dead claims does not restart the count.
  clock->advance(2h);
  EXPECT_EQ(recorder.purge(1h), 0u);
  const auto a3 = recorder.claim("billing", "a", 30s);
  EXPECT_GT(a3.token, a2.token);
  EXPECT_FALSE(a3.took_over) << "the dead claim was purged: nothing to take over";
  EXPECT_FALSE(recorder.complete("billing", "a", a2.token));
}

TEST(SqliteRecorderClaims, PurgeDropsOnlyClaimsWhoseLeaseEndedBeforeTheCutoff) {
  TempDir dir;
  const std::string path = dir.file("claims.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  (void)recorder.claim("c", "dead-long-ago", 1min);
  (void)recorder.claim("c", "dead-recently", 90min);
  (void)recorder.claim("c", "live", 5h);
  clock->advance(2h);
  EXPECT_EQ(recorder.purge(1h), 0u);  // cutoff: 1h after the claims were made
  RawDb raw(path);
  EXPECT_EQ(raw.text("SELECT group_concat(event_id, ',') FROM (SELECT event_id FROM idem_claims "
                     "ORDER BY event_id)"),
            "dead-recently,live");
}

TEST(SqliteRecorderClaims, TwoRecordersOnOneFileShareClaimsAndMarkers) {
  TempDir dir;
  const std::string path = dir.file("shared.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder first(path, with_clock(clock));
  SqliteIdempotencyRecorder second(path, with_clock(clock));
  const auto claim = first.claim("billing", "evt", 10s);
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  const auto seen = second.claim("billing", "evt", 10s);
  EXPECT_EQ(seen.status, Claim::Status::in_progress);
  EXPECT_EQ(seen.lease_until, claim.lease_until);
  clock->advance(11s);
  const auto takeover = second.claim("billing", "evt", 10s);
  ASSERT_EQ(takeover.status, Claim::Status::acquired);
  EXPECT_TRUE(takeover.took_over);
  EXPECT_FALSE(first.complete("billing", "evt", claim.token));
  EXPECT_TRUE(second.complete("billing", "evt", takeover.token));
  EXPECT_TRUE(first.is_processed("billing", "evt"));
}

TEST(SqliteRecorderClaims, ManyThreadsOnTwoRecordersAcquireOncePerId) {
  TempDir dir;
  const std::string path = dir.file("race.db");
  SqliteIdempotencyRecorder first(path);
  SqliteIdempotencyRecorder second(path);
  constexpr int kThreads = 8;
  constexpr int kIds = 150;
  std::vector<std::string> ids;
  for (int i = 0; i < kIds; ++i)
    ids.push_back(idem::new_event_id());
  std::vector<std::atomic<int>> acquired(kIds);
  std::atomic<int> errors{0};
  idem::test::run_together(kThreads, [&](int t) {
    SqliteIdempotencyRecorder& recorder = (t % 2 == 0) ? first : second;
    for (int n = 0; n < kIds; ++n) {
      const int i = (t % 4 < 2) ? n : kIds - 1 - n;
      try {
        const auto claim = recorder.claim("billing", ids[static_cast<std::size_t>(i)], 1h);
        if (claim.status == Claim::Status::acquired) {
          acquired[static_cast<std::size_t>(i)].fetch_add(1);
          if (!recorder.complete("billing", ids[static_cast<std::size_t>(i)], claim.token)) {
            errors.fetch_add(1);
          }
        }
      } catch (...) {
        errors.fetch_add(1);
      }
    }
  });
  EXPECT_EQ(errors.load(), 0);
  for (int i = 0; i < kIds; ++i) {
    EXPECT_EQ(acquired[static_cast<std::size_t>(i)].load(), 1) << "id #" << i;
  }
}

// ---- the transactional inbox ------------------------------------------------------------------

TEST(SqliteRecorderTransaction, HandlerWritesCommitWithTheMarker) {
  TempDir dir;
  const std::string path = dir.file("inbox.db");
  SqliteIdempotencyRecorder recorder(path);
  RawDb(path).exec(
      "CREATE TABLE shipments(order_id TEXT, qty INTEGER, weight REAL, note TEXT, photo BLOB)");
  const auto ship = [&](idem::Transaction& t) {
    auto& tx = dynamic_cast<SqliteTransaction&>(t);
    EXPECT_EQ(tx.consumer(), "shipping");
    EXPECT_EQ(tx.event_id(), "order-7");
    EXPECT_NE(tx.db(), nullptr);
    const std::string order = "order-7";
    EXPECT_EQ(
        tx.exec("INSERT INTO shipments VALUES (?, ?, ?, ?, ?)",
                {order, 3, 1.5, nullptr, idem::sqlite::SqlParam::blob(std::string("\0x", 2))}),
        1);
    EXPECT_EQ(tx.query_int64("SELECT qty FROM shipments WHERE order_id = ?", {order}), 3);
    EXPECT_EQ(tx.query_text("SELECT order_id FROM shipments WHERE qty = ?", {3u}), order);
    EXPECT_EQ(tx.query_text("SELECT note FROM shipments"), std::nullopt) << "NULL";
    EXPECT_EQ(tx.query_int64("SELECT qty FROM shipments WHERE order_id = 'none'"), std::nullopt);
    // The handler's own reads through the recorder see its transaction.
    EXPECT_TRUE(recorder.is_processed("shipping", "order-7"));
  };
  EXPECT_TRUE(recorder.run_transactional("shipping", "order-7", ship));
  EXPECT_FALSE(recorder.run_transactional("shipping", "order-7", ship));
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM shipments"), 1);
  EXPECT_EQ(raw.integer("SELECT length(photo) FROM shipments"), 2);
  EXPECT_EQ(raw.text("SELECT weight FROM shipments"), "1.5");
}

TEST(SqliteRecorderTransaction, ThrowingHandlerLeavesNeitherRowsNorMarker) {
  TempDir dir;
  const std::string path = dir.file("rollback.db");
  SqliteIdempotencyRecorder recorder(path);
  RawDb(path).exec("CREATE TABLE effects(event_id TEXT)");
  EXPECT_THROW(static_cast<void>(recorder.run_transactional(
                   "c", "evt",
                   [](idem::Transaction& t) {
                     dynamic_cast<SqliteTransaction&>(t).exec("INSERT INTO effects VALUES ('evt')");
                     throw std::runtime_error("payment gateway down");
                   })),
               std::runtime_error);
  EXPECT_FALSE(recorder.is_processed("c", "evt"));
  EXPECT_EQ(RawDb(path).integer("SELECT count(*) FROM effects"), 0);
}

TEST(SqliteRecorderTransaction, BadSqlIsAClearErrorAndRollsBack) {
  SqliteIdempotencyRecorder recorder(":memory:");
  const auto run = [&](const std::function<void(SqliteTransaction&)>& body) {
    return recorder.run_transactional(
        "c", "evt", [&](idem::Transaction& t) { body(dynamic_cast<SqliteTransaction&>(t)); });
  };
  EXPECT_THROW(run([](SqliteTransaction& tx) { tx.exec("SELECT ?, ?", {1}); }),
               idem::InvalidArgument);
  EXPECT_THROW(run([](SqliteTransaction& tx) { tx.exec("SELECT 1; SELECT 2"); }),
               idem::InvalidArgument);
  EXPECT_THROW(run([](SqliteTransaction& tx) { tx.exec(""); }), idem::InvalidArgument);
  EXPECT_THROW(run([](SqliteTransaction& tx) { tx.exec("SELECT", {}); }), SqliteError);
  const auto error = sqlite_error_of(
      [&] { run([](SqliteTransaction& tx) { tx.exec("INSERT INTO no_such_table VALUES (1)"); }); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_error);
  EXPECT_TRUE(contains(error->what(), "no_such_table")) << error->what();
  EXPECT_THROW(idem::sqlite::SqlParam(~std::uint64_t{0}), idem::InvalidArgument);
  EXPECT_FALSE(recorder.is_processed("c", "evt"));
}

TEST(SqliteRecorderTransaction, HandlerEndingTheTransactionIsInDoubt) {
  SqliteIdempotencyRecorder recorder(":memory:");
  try {
    static_cast<void>(recorder.run_transactional("c", "evt", [](idem::Transaction& t) {
      sqlite3_exec(dynamic_cast<SqliteTransaction&>(t).db(), "COMMIT", nullptr, nullptr, nullptr);
    }));
    FAIL() << "a handler that committed idem's transaction went unnoticed";
  } catch (const idem::StoreError& e) {
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_FALSE(e.retryable());
  }
  // The recorder is still usable afterwards.
  EXPECT_TRUE(recorder.run_transactional("c", "next", [](idem::Transaction&) {}));
}

TEST(SqliteRecorderTransaction, CallingTheRecorderFromInsideIsReentryNotDeadlock) {
  SqliteIdempotencyRecorder recorder(":memory:");
  std::vector<ErrorCode> codes;
  static_cast<void>(recorder.run_transactional("c", "outer", [&](idem::Transaction&) {
    for (const auto& call : std::vector<std::function<void()>>{
             [&] { recorder.mark_processed("c", "inner"); },
             [&] { (void)recorder.claim("c", "inner", 1s); },
             [&] { (void)recorder.run_transactional("c", "inner", [](auto&) {}); },
             [&] { (void)recorder.purge(1h); },
         }) {
      try {
        call();
        codes.push_back(ErrorCode::invalid_argument);  // unexpected: it ran
      } catch (const idem::Error& e) {
        codes.push_back(e.code());
      }
    }
  }));
  EXPECT_EQ(codes, std::vector<ErrorCode>(4, ErrorCode::reentry));
  EXPECT_TRUE(recorder.is_processed("c", "outer"));
  EXPECT_FALSE(recorder.is_processed("c", "inner"));
}

TEST(SqliteRecorderTransaction, LiveClaimBlocksAndDeadClaimIsFencedOff) {
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(":memory:", with_clock(clock));
  const auto claim = recorder.claim("c", "evt", 10s);
  ASSERT_EQ(claim.status, Claim::Status::acquired);
  int runs = 0;
  const auto fn = [&](idem::Transaction&) { ++runs; };
  EXPECT_THROW(static_cast<void>(recorder.run_transactional("c", "evt", fn)),
               idem::AlreadyInProgress);
  EXPECT_EQ(runs, 0);
  EXPECT_FALSE(recorder.is_processed("c", "evt"));

  clock->advance(11s);  // the exclusive owner's lease passed
  EXPECT_TRUE(recorder.run_transactional("c", "evt", fn));
  EXPECT_EQ(runs, 1);
  EXPECT_FALSE(recorder.complete("c", "evt", claim.token)) << "the old owner is fenced off";
  EXPECT_FALSE(recorder.renew("c", "evt", claim.token, 10s));
}

// ---- the file deleted or replaced under an open recorder --------------------------------------

// What a replaced file must give: store_replaced, not retryable (the same object fails again),
// not in doubt (nothing of the call was written).
void expect_replaced(const std::optional<SqliteError>& error) {
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_replaced) << error->what();
  EXPECT_FALSE(error->retryable()) << error->what();
  EXPECT_FALSE(error->in_doubt()) << error->what();
}

// The check runs at most once per interval of the recorder's clock (steady time): the tests
// move a ManualClock past it, so the next write is the first one that checks.
constexpr auto kCheckInterval = idem::sqlite::detail::Connection::kReplacementCheckInterval;

TEST(SqliteRecorderReplacedFile, DeletedFileFailsEveryWriteInsteadOfMarkingIntoIt) {
  TempDir dir;
  const std::string path = dir.file("idem.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  recorder.mark_processed("billing", "before");
  const Claim held = recorder.claim("billing", "held", 30s);
  ASSERT_EQ(held.status, Claim::Status::acquired);
  for (const char* suffix : {"", "-wal", "-shm"})
    std::filesystem::remove(path + suffix);
  clock->advance(kCheckInterval);

  const auto mark = sqlite_error_of([&] { recorder.mark_processed("billing", "e1"); });
  expect_replaced(mark);
  ASSERT_TRUE(mark);
  EXPECT_TRUE(contains(mark->what(), "deleted")) << mark->what();
  EXPECT_TRUE(contains(mark->what(), path)) << mark->what();
  expect_replaced(sqlite_error_of([&] {
    const std::vector<std::string> ids = {"e2", "e3"};
    recorder.mark_processed_many("billing", ids);
  }));
  expect_replaced(sqlite_error_of([&] { (void)recorder.claim("billing", "e4", 30s); }));
  expect_replaced(sqlite_error_of([&] { (void)recorder.complete("billing", "held", held.token); }));
  bool ran = false;
  expect_replaced(sqlite_error_of([&] {
    (void)recorder.run_transactional("billing", "e5", [&](idem::Transaction&) { ran = true; });
  }));
  EXPECT_FALSE(ran) << "refused before the handler ran";
  expect_replaced(sqlite_error_of([&] { (void)recorder.purge(0s); }));

  // A new recorder on the path starts a new file; the old object still refuses.
  SqliteIdempotencyRecorder fresh(path);
  EXPECT_FALSE(fresh.is_processed("billing", "before"));
  fresh.mark_processed("billing", "e1");
  expect_replaced(sqlite_error_of([&] { recorder.mark_processed("billing", "e6"); }));
}

TEST(SqliteRecorderReplacedFile, FileRenamedOverTheOpenOneFailsTheNextMark) {
  TempDir dir;
  const std::string path = dir.file("idem.db");
  const std::string other = dir.file("other.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyRecorder recorder(path, with_clock(clock));
  recorder.mark_processed("billing", "before");
  { SqliteIdempotencyRecorder elsewhere(other); }
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  clock->advance(kCheckInterval);

  const auto mark = sqlite_error_of([&] { recorder.mark_processed("billing", "e1"); });
  expect_replaced(mark);
  ASSERT_TRUE(mark);
  EXPECT_TRUE(contains(mark->what(), "renamed over")) << mark->what();
  // A handler that started before the replacement, and ran for longer than the interval, is
  // refused at its COMMIT: rolled back.
  SqliteIdempotencyRecorder second(dir.file("second.db"), with_clock(clock));
  const std::string second_other = dir.file("second-other.db");
  { SqliteIdempotencyRecorder elsewhere(second_other); }
  const auto late = sqlite_error_of([&] {
    (void)second.run_transactional("billing", "e1", [&](idem::Transaction& tx) {
      dynamic_cast<SqliteTransaction&>(tx).exec("CREATE TABLE side_effect(x)");
      ASSERT_EQ(std::rename(second_other.c_str(), dir.file("second.db").c_str()), 0);
      clock->advance(kCheckInterval);
    });
  });
  expect_replaced(late);
  ASSERT_TRUE(late);
  EXPECT_TRUE(contains(late->what(), "COMMIT")) << late->what();
}

// ---- WAL checkpoints on a thread of their own (DESIGN-NOTES §30) ------------------------------

std::uintmax_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

// The checkpointer, driven directly: a commit that takes the WAL past kWakePages wakes its
// thread, which copies the WAL into the database file while the writer does nothing more.
TEST(SqliteRecorderCheckpoints, TheThreadCheckpointsOnceTheWalIsPastItsThreshold) {
  namespace detail = idem::sqlite::detail;
  TempDir dir;
  const std::string path = dir.file("ckpt.db");
  SqliteOptions options;
  auto writer = detail::open_writer(path, options);
  detail::use_wal(*writer);
  writer->exec_script("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB)");
  detail::Checkpointer checkpointer(*writer, path, options);
  const auto db_size_before = file_size_or_zero(path);
  // ~1,300 pages of WAL in one commit: 5,000 rows of 1 KiB.
  {
    detail::WriteTransaction tx(*writer);
    for (int i = 0; i < 5000; ++i) {
      const std::string key = idem::new_event_id();  // bound without a copy: outlives insert
      detail::Statement insert = writer->prepare("INSERT INTO t VALUES (?1, zeroblob(1024))");
      insert.bind(1, std::string_view(key)).run();
    }
    tx.commit();
  }
  EXPECT_GE(checkpointer.wait_for_checkpoints(1, 20s), 1u);
  EXPECT_GT(file_size_or_zero(path), db_size_before + 4'000'000)
      << "the pages were copied into the database file without another call on the writer";
}

// Many small commits: the thread checkpoints once per kWakePages pages the commits add, not
// once per commit. (A PASSIVE checkpoint racing a stream of commits rarely copies the last
// frame, so the WAL does not restart and its total size stays past the threshold; the first
// version asked for a checkpoint, with its fsyncs, after nearly every commit from then on.)
TEST(SqliteRecorderCheckpoints, ACheckpointWaitsForAThresholdOfNewPages) {
  namespace detail = idem::sqlite::detail;
  TempDir dir;
  const std::string path = dir.file("stretch.db");
  SqliteOptions options;
  options.durability = Durability::off;  // fast checkpoints: they could keep up
  auto writer = detail::open_writer(path, options);
  detail::use_wal(*writer);
  writer->exec_script("CREATE TABLE t (k INTEGER PRIMARY KEY, v BLOB)");
  constexpr int kCommits = 2000;  // a row of 3 KiB each
  {
    detail::Checkpointer checkpointer(*writer, path, options);
    for (int i = 0; i < kCommits; ++i) {
      detail::WriteTransaction tx(*writer);
      writer->prepare("INSERT INTO t (v) VALUES (zeroblob(3000))").run();
      tx.commit();
    }
    // Each commit writes a few pages (the row's leaf, its parent, the header page), so the
    // 1,000 pages between checkpoints take a few hundred commits: 8 to 10 checkpoints were
    // seen. Every commit past the first 1,000 pages asking for one made over 1,000.
    EXPECT_GE(checkpointer.wait_for_checkpoints(1, 20s), 1u);
    EXPECT_LE(checkpointer.checkpoints(), static_cast<std::uint64_t>(kCommits / 100))
        << "a checkpoint ran for (nearly) every commit";
  }
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM t"), kCommits);
}

// Through the recorder, several threads marking and reading at once: every marker lands, the
// WAL stays bounded (a checkpoint that completes lets the next commit start the WAL over), and
// the file closes clean.
TEST(SqliteRecorderCheckpoints, ManyMarksKeepTheWalBoundedAndLoseNothing) {
  TempDir dir;
  const std::string path = dir.file("wal.db");
  constexpr int kThreads = 4;
  constexpr int kBatches = 40;
  constexpr int kBatchSize = 250;  // 40,000 random ids in all: well past 8,000 pages of WAL
  std::vector<std::vector<std::string>> ids(kThreads);
  for (auto& own : ids) {
    for (int i = 0; i < kBatches * kBatchSize; ++i)
      own.push_back(idem::new_event_id());
  }
  std::atomic<std::uintmax_t> largest_wal{0};
  std::atomic<int> errors{0};
  {
    SqliteIdempotencyRecorder recorder(path);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        try {
          const auto& own = ids[static_cast<std::size_t>(t)];
          for (int b = 0; b < kBatches; ++b) {
            const std::span<const std::string> batch(own.data() + b * kBatchSize, kBatchSize);
            const auto before = recorder.is_processed_many("c", batch);
            if (std::find(before.begin(), before.end(), true) != before.end()) errors.fetch_add(1);
            recorder.mark_processed_many("c", batch);
            const auto after = recorder.is_processed_many("c", batch);
            if (std::find(after.begin(), after.end(), false) != after.end()) errors.fetch_add(1);
            const auto wal = file_size_or_zero(path + "-wal");
            auto seen = largest_wal.load();
            while (wal > seen && !largest_wal.compare_exchange_weak(seen, wal)) {
            }
          }
        } catch (const std::exception& e) {
          if (errors.fetch_add(1) == 0) ADD_FAILURE() << e.what();
        }
      });
    }
    for (auto& thread : threads)
      thread.join();
  }
  EXPECT_EQ(errors.load(), 0);
  // Without checkpoints these 160 commits of ~250 scattered pages would take the WAL past
  // 100 MB. With them it stays near kInlinePages; not under a hard figure, because a PASSIVE
  // checkpoint cannot pass a reader's snapshot (the other threads read all along) and the
  // fallback's returns at once while the thread's is still running. Twice the fallback's
  // threshold leaves room for both and still tells the two apart.
  constexpr std::uintmax_t kBound =
      2 * idem::sqlite::detail::Checkpointer::kInlinePages * (4096 + 24);
  EXPECT_LT(largest_wal.load(), kBound) << "the WAL grew past what the fallback allows";
  EXPECT_EQ(file_size_or_zero(path + "-wal"), 0u) << "closing the last connection removed it";
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), kThreads * kBatches * kBatchSize);
}

// One thread marking at durability full, a commit at a time: after each background checkpoint
// the committing thread copies the few frames committed meanwhile, so the WAL restarts and stays
// near kWakePages pages instead of growing toward kInlinePages (commits that extend the file
// cost an extra metadata sync each).
TEST(SqliteRecorderCheckpoints, ALoneWritersWalRestartsNearTheThreshold) {
  TempDir dir;
  const std::string path = dir.file("lone.db");
  SqliteOptions options;
  options.durability = Durability::full;
  constexpr int kMarks = 2500;  // ~2.5 pages a commit: about 6,000 pages of WAL without restarts
  std::uintmax_t largest_wal = 0;
  {
    SqliteIdempotencyRecorder recorder(path, options);
    for (int i = 0; i < kMarks; ++i) {
      const std::string id = idem::new_event_id();
      ASSERT_FALSE(recorder.is_processed("c", id));
      recorder.mark_processed("c", id);
      largest_wal = std::max(largest_wal, file_size_or_zero(path + "-wal"));
    }
  }
  constexpr std::uintmax_t kBound =
      3 * idem::sqlite::detail::Checkpointer::kWakePages * (4096 + 24);
  EXPECT_LT(largest_wal, kBound) << "the WAL did not restart after the thread's checkpoints";
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM processed_log"), kMarks);
}

}  // namespace
