// SqliteIdempotencyStore beyond the conformance suite: the table other tools can read, schema
// versions and bad files, the busy timeout (and claims answered from a reader meanwhile), corrupt
// rows written with plain SQL, results of every codec and the original report replayed through
// resilient(), a file shared with the recorder, and two stores on one file standing in for two
// processes (racing claims, the reject and wait policies).
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <iterator>
#include <latch>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../sqlite_names.hpp"
#include "../sqlite_raw_db.hpp"
#include "../sqlite_test_support.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using namespace idem::test::sqlite_names;

// Runs `fn` and returns the idem::Error it threw (fails the test if it threw nothing else).
template <class Fn>
std::optional<idem::Error> error_of(Fn&& fn) {
  return idem::test::error_thrown_by<idem::Error>(std::forward<Fn>(fn), "an idem::Error");
}

idem::StoredValue bytes_value(std::string bytes) {
  idem::StoredValue value;
  value.bytes = std::move(bytes);
  return value;
}

idem::ExecutionReport small_report() {
  idem::ExecutionReport report;
  report.operation = "create_payment";
  report.started_at = idem::WallTime(std::chrono::seconds(1893456000));
  report.duration = 5ms;
  report.attempts.push_back(idem::AttemptRecord{});
  return report;
}

constexpr std::int64_t kStartMs = 1893456000000;  // the ManualClock's start, in ms

// ---- the table ------------------------------------------------------------------------------

TEST(SqliteStoreFormat, CreatesTheDocumentedTableInWalMode) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  SqliteIdempotencyStore store(path);
  RawDb raw(path);
  EXPECT_EQ(raw.bytes("PRAGMA journal_mode"), "wal");
  std::map<std::string, std::string> columns;
  for (const char* name : {"key", "state", "token", "fingerprint", "lease_until_ms",
                           "completed_at_ms", "expires_at_ms", "value", "report", "took_over"}) {
    columns[name] = raw.bytes("SELECT type FROM pragma_table_info('idem_records') WHERE name = '" +
                              std::string(name) + "'")
                        .value_or("<missing>");
  }
  EXPECT_EQ(columns["key"], "TEXT");
  EXPECT_EQ(columns["state"], "TEXT");
  EXPECT_EQ(columns["token"], "INTEGER");
  EXPECT_EQ(columns["fingerprint"], "TEXT");
  EXPECT_EQ(columns["lease_until_ms"], "INTEGER");
  EXPECT_EQ(columns["completed_at_ms"], "INTEGER");
  EXPECT_EQ(columns["expires_at_ms"], "INTEGER");
  EXPECT_EQ(columns["value"], "BLOB");
  EXPECT_EQ(columns["report"], "TEXT");
  EXPECT_EQ(columns["took_over"], "INTEGER");
  EXPECT_EQ(raw.integer("SELECT pk FROM pragma_table_info('idem_records') WHERE name = 'key'"), 1);
  EXPECT_EQ(raw.integer("SELECT version FROM idem_schema WHERE component = 'store'"),
            SqliteIdempotencyStore::kSchemaVersion);
  EXPECT_EQ(raw.integer("SELECT value FROM idem_counters WHERE name = 'claim_token'"), 0);
  EXPECT_EQ(raw.integer("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = "
                        "'idem_records_expiry'"),
            1);
  // The state column refuses what is not a state.
  EXPECT_THROW(raw.exec("INSERT INTO idem_records(key, state, token) VALUES ('k', 'paused', 1)"),
               std::runtime_error);
}

TEST(SqliteStoreFormat, RecordsAreReadableWithPlainSql) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyStore store(path, with_clock(clock));
  const auto claim = store.claim("pay:1", "fp-1", 30s);
  ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);

  RawDb raw(path);
  EXPECT_EQ(raw.bytes("SELECT state FROM idem_records WHERE key = 'pay:1'"), "in_progress");
  EXPECT_EQ(raw.integer("SELECT token FROM idem_records WHERE key = 'pay:1'"),
            static_cast<long long>(claim.token));
  EXPECT_EQ(raw.bytes("SELECT fingerprint FROM idem_records WHERE key = 'pay:1'"), "fp-1");
  EXPECT_EQ(raw.integer("SELECT lease_until_ms FROM idem_records WHERE key = 'pay:1'"),
            kStartMs + 30'000);
  EXPECT_EQ(raw.integer("SELECT value FROM idem_counters WHERE name = 'claim_token'"),
            static_cast<long long>(claim.token));

  clock->advance(250ms);
  std::string binary;
  for (int b = 0; b < 256; ++b)
    binary.push_back(static_cast<char>(b));
  ASSERT_TRUE(store.complete("pay:1", claim.token, bytes_value(binary), small_report(), 1h));
  EXPECT_EQ(raw.bytes("SELECT state FROM idem_records WHERE key = 'pay:1'"), "completed");
  EXPECT_EQ(raw.bytes("SELECT typeof(value) FROM idem_records WHERE key = 'pay:1'"), "blob");
  EXPECT_EQ(raw.bytes("SELECT value FROM idem_records WHERE key = 'pay:1'"), binary);
  EXPECT_EQ(raw.integer("SELECT completed_at_ms FROM idem_records WHERE key = 'pay:1'"),
            kStartMs + 250);
  EXPECT_EQ(raw.integer("SELECT expires_at_ms FROM idem_records WHERE key = 'pay:1'"),
            kStartMs + 250 + 3'600'000);
  const auto report = raw.bytes("SELECT report FROM idem_records WHERE key = 'pay:1'");
  ASSERT_TRUE(report);
  EXPECT_EQ(idem::ExecutionReport::from_json(*report).operation, "create_payment");
  EXPECT_EQ(raw.bytes("SELECT lease_until_ms FROM idem_records WHERE key = 'pay:1'"), std::nullopt);
}

TEST(SqliteStoreFormat, TakeoverIsVisibleInTheRow) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyStore store(path, with_clock(clock));
  const auto first = store.claim("k", std::nullopt, 1s);
  clock->advance(1s);
  const auto second = store.claim("k", std::nullopt, 1s);
  ASSERT_EQ(second.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(second.took_over);
  RawDb raw(path);
  EXPECT_EQ(raw.integer("SELECT took_over FROM idem_records WHERE key = 'k'"), 1);
  ASSERT_TRUE(store.complete("k", second.token, bytes_value("v"), small_report(), 1s));
  clock->advance(1s);  // expired: reclaiming it is no takeover
  EXPECT_FALSE(store.claim("k", std::nullopt, 1s).took_over);
  EXPECT_EQ(raw.integer("SELECT took_over FROM idem_records WHERE key = 'k'"), 0);
  EXPECT_GT(first.token, 0u);
}

TEST(SqliteStoreFormat, ReopenKeepsRecordsAndTokensGrow) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  auto clock = std::make_shared<ManualClock>();
  std::uint64_t last = 0;
  {
    SqliteIdempotencyStore store(path, with_clock(clock));
    const auto claim = store.claim("kept", std::nullopt, 30s);
    ASSERT_TRUE(store.complete("kept", claim.token, bytes_value("receipt"), small_report(), 1h));
    const auto gone = store.claim("released", std::nullopt, 30s);
    ASSERT_TRUE(store.release("released", gone.token));
    last = gone.token;
  }
  SqliteIdempotencyStore store(path, with_clock(clock));
  const auto record = store.lookup("kept");
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, IdempotencyRecord::State::completed);
  EXPECT_EQ(record->value.bytes, "receipt");
  const auto again = store.claim("released", std::nullopt, 30s);
  ASSERT_EQ(again.status, ClaimOutcome::Status::acquired);
  EXPECT_GT(again.token, last) << "the counter lives in the file, not in the process";
}

TEST(SqliteStoreFormat, HugeLeasesAndTtlsSaturateInsteadOfOverflowing) {
  TempDir dir;
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyStore store(dir.file("store.db"), with_clock(clock));
  const auto claim = store.claim("k", std::nullopt, idem::Millis::max());
  ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);
  EXPECT_GT(store.lookup("k")->lease_until, clock->wall_now() + std::chrono::hours(24 * 365 * 200));
  ASSERT_TRUE(store.renew("k", claim.token, idem::Millis::max()));
  ASSERT_TRUE(
      store.complete("k", claim.token, bytes_value("v"), small_report(), idem::Millis::max()));
  EXPECT_EQ(store.claim("k", std::nullopt, 1s).status, ClaimOutcome::Status::completed);
}

TEST(SqliteStoreFormat, NewerSchemaVersionIsRefused) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  { SqliteIdempotencyStore store(path); }
  RawDb(path).exec("UPDATE idem_schema SET version = 99 WHERE component = 'store'");
  expect_refused<idem::Error>([&] { SqliteIdempotencyStore store(path); },
                              ErrorCode::store_open_failed, {"version 99", "upgrade idem"});
}

TEST(SqliteStoreFormat, ForeignIdemRecordsTableIsRefused) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  RawDb(path).exec("CREATE TABLE idem_records(key TEXT PRIMARY KEY, payload BLOB)");
  expect_refused<idem::Error>([&] { SqliteIdempotencyStore store(path); },
                              ErrorCode::store_not_a_database, {"idem_records"});
}

// A foreign idem_records (or a newer schema) is refused before the journal mode is switched or a
// table is added: the file stays byte for byte as it was.
TEST(SqliteStoreFormat, RefusedFilesAreLeftByteForByte) {
  TempDir dir;
  const idem::test::RefusedFile files[] = {
      {"foreign.db",
       "CREATE TABLE idem_records(key TEXT PRIMARY KEY, payload BLOB);"
       "INSERT INTO idem_records VALUES ('k', x'00')",
       ErrorCode::store_not_a_database},
      {"future.db",
       "CREATE TABLE idem_schema(component TEXT PRIMARY KEY, version INTEGER NOT NULL);"
       "INSERT INTO idem_schema VALUES ('store', 99)",
       ErrorCode::store_open_failed},
  };
  for (const auto& file : files) {
    SCOPED_TRACE(file.name);
    expect_refused_unchanged<idem::Error>(
        dir, file, [](const std::string& p) { SqliteIdempotencyStore store(p); });
  }
}

TEST(SqliteStoreFormat, WithoutCreateSchemaAFileWithoutTheTablesIsRefusedUnchanged) {
  TempDir dir;
  const std::string path = dir.file("other.db");
  RawDb(path).exec("CREATE TABLE unrelated(x)");
  const std::string before = file_bytes(path);
  SqliteOptions options;
  options.create_schema = false;
  const auto error = error_of([&] { SqliteIdempotencyStore store(path, options); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_error) << error->what();
  EXPECT_FALSE(error->retryable());
  EXPECT_TRUE(contains(error->what(), " do not exist ")) << error->what();
  EXPECT_EQ(file_bytes(path), before);
}

// ---- the file deleted or replaced under an open store ---------------------------------------

void expect_replaced(const std::optional<idem::Error>& error) {
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_replaced) << error->what();
  EXPECT_FALSE(error->retryable()) << error->what();
  EXPECT_FALSE(error->in_doubt()) << error->what();
}

// The check runs at most once per this interval of the store's clock (steady time): the tests
// move a ManualClock past it, so the next write is the first one that checks.
constexpr std::chrono::milliseconds kStoreCheckInterval{1};

TEST(SqliteStoreReplacedFile, DeletedFileFailsClaimsAndCompletions) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyStore store(path, with_clock(clock));
  const auto held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  for (const char* suffix : {"", "-wal", "-shm"})
    std::filesystem::remove(path + suffix);
  clock->advance(kStoreCheckInterval);
  expect_replaced(error_of([&] { (void)store.claim("new", std::nullopt, 30s); }));
  expect_replaced(error_of(
      [&] { (void)store.complete("held", held.token, bytes_value("1"), small_report(), 1h); }));
  expect_replaced(error_of([&] { (void)store.release("held", held.token); }));
  expect_replaced(error_of([&] { (void)store.renew("held", held.token, 30s); }));
  expect_replaced(error_of([&] { (void)store.purge_expired(); }));
}

TEST(SqliteStoreReplacedFile, FileRenamedOverTheOpenOneFailsTheNextClaim) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  const std::string other = dir.file("other.db");
  auto clock = std::make_shared<ManualClock>();
  SqliteIdempotencyStore store(path, with_clock(clock));
  const auto held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, ClaimOutcome::Status::acquired);
  { SqliteIdempotencyStore elsewhere(other); }
  ASSERT_EQ(std::rename(other.c_str(), path.c_str()), 0);
  clock->advance(kStoreCheckInterval);
  const auto claim = error_of([&] { (void)store.claim("new", std::nullopt, 30s); });
  expect_replaced(claim);
  ASSERT_TRUE(claim);
  EXPECT_TRUE(contains(claim->what(), "renamed over")) << claim->what();
  expect_replaced(error_of(
      [&] { (void)store.complete("held", held.token, bytes_value("1"), small_report(), 1h); }));
  expect_replaced(error_of([&] { (void)store.release("held", held.token); }));
}

// ---- bad input ------------------------------------------------------------------------------

TEST(SqliteStoreBadInput, PathsAndOptions) {
  TempDir dir;
  EXPECT_THROW(SqliteIdempotencyStore(""), idem::InvalidArgument);
  EXPECT_THROW(SqliteIdempotencyStore(std::string("a\0b", 3)), idem::InvalidArgument);
  SqliteOptions negative;
  negative.busy_timeout = -1ms;
  EXPECT_THROW(SqliteIdempotencyStore(dir.file("a.db"), negative), idem::ConfigError);

  const std::string missing = dir.file("no-such-dir") + "/store.db";
  auto error = error_of([&] { SqliteIdempotencyStore store(missing); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_open_failed);
  EXPECT_TRUE(contains(error->what(), "no-such-dir")) << error->what();
  EXPECT_TRUE(contains(error->what(), "does not exist")) << error->what();

  const std::string junk = dir.file("junk.db");
  {
    std::FILE* f = std::fopen(junk.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    const std::string text(4096, 'x');
    std::fwrite(text.data(), 1, text.size(), f);
    std::fclose(f);
  }
  error = error_of([&] { SqliteIdempotencyStore store(junk); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_not_a_database);
}

TEST(SqliteStoreBadInput, ReadOnlyOptionReadsButRefusesWrites) {
  TempDir dir;
  const std::string path = dir.file("store.db");
  SqliteOptions read_only;
  read_only.read_only = true;
  // A file without the store's tables cannot get them read-only.
  RawDb(path).exec("CREATE TABLE unrelated(x)");
  auto error = error_of([&] { SqliteIdempotencyStore store(path, read_only); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_read_only);

  {
    SqliteIdempotencyStore writer(path);
    const auto claim = writer.claim("done", std::nullopt, 30s);
    ASSERT_TRUE(writer.complete("done", claim.token, bytes_value("v"), small_report(), 1h));
  }
  SqliteIdempotencyStore store(path, read_only);
  ASSERT_TRUE(store.lookup("done"));
  EXPECT_EQ(store.claim("done", std::nullopt, 30s).status, ClaimOutcome::Status::completed)
      << "a replay needs no write";
  EXPECT_EQ(store.entry_count(), 1u);
  error = error_of([&] { (void)store.claim("new", std::nullopt, 30s); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_read_only);
  EXPECT_EQ(store.entry_count(), 1u);
}

TEST(SqliteStoreBusy, WritesWaitOutTheBusyTimeoutWhileReplaysAnswerFromAReader) {
  TempDir dir;
  const std::string path = dir.file("busy.db");
  SqliteOptions options;
  options.busy_timeout = 20ms;
  SqliteIdempotencyStore store(path, options);
  const auto done = store.claim("done", std::nullopt, 30s);
  ASSERT_TRUE(store.complete("done", done.token, bytes_value("v"), small_report(), 1h));
  const auto running = store.claim("running", std::nullopt, 30s);

  RawDb other(path);
  other.exec("BEGIN IMMEDIATE");  // another process holds the write lock
  for (const auto& attempt : std::vector<std::function<void()>>{
           [&] { (void)store.claim("new", std::nullopt, 30s); },
           [&] { (void)store.complete("running", running.token, bytes_value("v"), {}, 1h); },
           [&] { (void)store.renew("running", running.token, 30s); },
           [&] { (void)store.release("running", running.token); },
           [&] { (void)store.purge_expired(); },
       }) {
    const auto error = error_of(attempt);
    ASSERT_TRUE(error);
    EXPECT_EQ(error->code(), ErrorCode::store_busy);
    EXPECT_TRUE(error->retryable());
    EXPECT_FALSE(error->in_doubt());
  }
  // A live record is answered without the write lock.
  EXPECT_EQ(store.claim("done", std::nullopt, 30s).status, ClaimOutcome::Status::completed);
  EXPECT_EQ(store.claim("running", std::nullopt, 30s).status, ClaimOutcome::Status::in_progress);
  EXPECT_EQ(store.claim("done", "other-fingerprint", 30s).status, ClaimOutcome::Status::completed)
      << "a record without a fingerprint never mismatches";
  EXPECT_TRUE(store.lookup("running"));
  EXPECT_EQ(store.entry_count(), 2u);
  other.exec("ROLLBACK");

  EXPECT_EQ(store.claim("new", std::nullopt, 30s).status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(store.complete("running", running.token, bytes_value("v"), small_report(), 1h));
}

// ---- corrupt rows ---------------------------------------------------------------------------

struct CorruptCase {
  const char* name;
  const char* insert;  // VALUES of (key, state, token, fingerprint, lease_until_ms,
                       // completed_at_ms, expires_at_ms, value, report) for key 'bad'
  const char* says;    // what the message must name
};

// Deadlines in 2100, so every row is live and a claim must read it (never overwrite it).
const std::vector<CorruptCase>& corrupt_cases() {
  static const std::vector<CorruptCase> cases = {
      {"unknown state", "'bad', 'paused', 7, NULL, 4102444800000, NULL, NULL, NULL, NULL",
       "unknown state 'paused'"},
      {"NULL value", "'bad', 'completed', 7, NULL, NULL, 1, 4102444800000, NULL, '{}'",
       "column value"},
      {"numeric value", "'bad', 'completed', 7, NULL, NULL, 1, 4102444800000, 42, '{}'",
       "column value of a completed record holds INTEGER"},
      {"report not JSON", "'bad', 'completed', 7, NULL, NULL, 1, 4102444800000, x'00', 'nope'",
       "column report"},
      {"report not a report", "'bad', 'completed', 7, NULL, NULL, 1, 4102444800000, x'00', '[1]'",
       "column report"},
      {"NULL report", "'bad', 'completed', 7, NULL, NULL, 1, 4102444800000, x'00', NULL",
       "column report"},
      {"NULL completed_at", "'bad', 'completed', 7, NULL, NULL, NULL, 4102444800000, x'00', '{}'",
       "completed_at_ms holds NULL"},
      {"text lease", "'bad', 'in_progress', 7, NULL, 'soon', NULL, NULL, NULL, NULL",
       "lease_until_ms holds TEXT"},
      {"text token", "'bad', 'in_progress', 'seven', NULL, 4102444800000, NULL, NULL, NULL, NULL",
       "column token holds TEXT"},
      {"negative token", "'bad', 'in_progress', -3, NULL, 4102444800000, NULL, NULL, NULL, NULL",
       "tokens are > 0"},
      {"binary fingerprint",
       "'bad', 'in_progress', 7, x'00ff', 4102444800000, NULL, NULL, NULL, NULL",
       "column fingerprint holds BLOB"},
  };
  return cases;
}

TEST(SqliteStoreCorruptRows, AreClearErrorsNeverOverwrittenAndDeletable) {
  TempDir dir;
  const std::string path = dir.file("corrupt.db");
  SqliteIdempotencyStore store(path);
  RawDb raw(path);
  raw.exec("PRAGMA ignore_check_constraints = ON");  // let an unknown state in
  for (const CorruptCase& c : corrupt_cases()) {
    SCOPED_TRACE(c.name);
    raw.exec(
        "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms, "
        "completed_at_ms, expires_at_ms, value, report) VALUES (" +
        std::string(c.insert) + ")");
    for (const auto& call : std::vector<std::function<void()>>{
             [&] { (void)store.lookup("bad"); },
             [&] { (void)store.claim("bad", std::nullopt, 30s); },
             [&] { (void)store.claim("bad", "fp", 30s); },
             [&] { (void)store.wait("bad", std::chrono::steady_clock::now() + 1h, {}); },
         }) {
      const auto error = error_of(call);
      ASSERT_TRUE(error);
      EXPECT_EQ(error->code(), ErrorCode::store_corrupt_record) << error->what();
      EXPECT_FALSE(error->retryable());
      EXPECT_TRUE(contains(error->what(), "'bad'")) << error->what();
      EXPECT_TRUE(contains(error->what(), path)) << error->what();
      EXPECT_TRUE(contains(error->what(), c.says)) << error->what();
    }
    EXPECT_EQ(raw.integer("SELECT count(*) FROM idem_records WHERE key = 'bad' AND token IN "
                          "(7, 'seven', -3)"),
              1)
        << "a claim must not overwrite a row it cannot read";
    // Token operations only ever match a readable in-progress row of that token.
    EXPECT_FALSE(store.complete("bad", 99, bytes_value("v"), small_report(), 1h));
    EXPECT_EQ(store.entry_count(), 1u);
    // The documented reset: delete the row.
    raw.exec("DELETE FROM idem_records WHERE key = 'bad'");
    EXPECT_EQ(store.claim("bad", std::nullopt, 30s).status, ClaimOutcome::Status::acquired);
    raw.exec("DELETE FROM idem_records WHERE key = 'bad'");
  }
}

TEST(SqliteStoreCorruptRows, ClaimsSharingACommitWithAnUnreadableRowAreNotFailedByIt) {
  // Concurrent claims share write transactions (group commit). A claim of the unreadable row
  // fails inside such a transaction; the claims it shared it with run again alone and succeed.
  TempDir dir;
  const std::string path = dir.file("group.db");
  SqliteIdempotencyStore store(path);
  RawDb raw(path);
  raw.exec(
      "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms) VALUES ('bad', "
      "'in_progress', 'seven', NULL, 4102444800000)");
  constexpr int kThreads = 6;
  constexpr int kClaims = 40;
  std::atomic<int> acquired{0};
  std::atomic<int> corrupt{0};
  std::atomic<int> other{0};
  std::latch start(kThreads + 2);  // the claiming threads, the bad key's and this one
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      start.arrive_and_wait();
      for (int i = 0; i < kClaims; ++i) {
        const std::string key = "k" + std::to_string(t) + "-" + std::to_string(i);
        try {
          const auto claim = store.claim(key, std::nullopt, 30s);
          if (claim.status == ClaimOutcome::Status::acquired) ++acquired;
          ASSERT_TRUE(store.complete(key, claim.token, bytes_value("v"), small_report(), 1h));
        } catch (const std::exception& e) {
          ++other;
          ADD_FAILURE() << key << ": " << e.what();
        }
      }
    });
  }
  threads.emplace_back([&] {
    start.arrive_and_wait();
    for (int i = 0; i < kClaims; ++i) {
      try {
        (void)store.claim("bad", std::nullopt, 30s);
        ++other;
      } catch (const idem::Error& e) {
        if (e.code() == ErrorCode::store_corrupt_record) ++corrupt;
      }
    }
  });
  start.arrive_and_wait();
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(acquired.load(), kThreads * kClaims);
  EXPECT_EQ(corrupt.load(), kClaims);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(store.entry_count(), static_cast<std::size_t>(kThreads * kClaims + 1));
}

TEST(SqliteStoreCorruptRows, AnExpiredRowWithBadFieldsIsSimplyReplaced) {
  TempDir dir;
  const std::string path = dir.file("corrupt.db");
  SqliteIdempotencyStore store(path);
  RawDb raw(path);
  // Its lease ended in 1970: whatever else it holds, the row is dead and the claim replaces it.
  raw.exec(
      "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms) VALUES ('old', "
      "'in_progress', 'seven', 12, 5)");
  const auto claim = store.claim("old", "fp", 30s);
  EXPECT_EQ(claim.status, ClaimOutcome::Status::acquired);
  EXPECT_TRUE(claim.took_over);
  EXPECT_EQ(store.lookup("old")->fingerprint, std::optional<std::string>("fp"));
}

TEST(SqliteStoreCorruptRows, AMissingTokenCounterIsRefusedAndWritesNothing) {
  TempDir dir;
  const std::string path = dir.file("counter.db");
  SqliteIdempotencyStore store(path);
  const auto first = store.claim("a", std::nullopt, 30s);
  RawDb raw(path);
  raw.exec("DELETE FROM idem_counters WHERE name = 'claim_token'");
  const auto error = error_of([&] { (void)store.claim("b", std::nullopt, 30s); });
  ASSERT_TRUE(error);
  EXPECT_EQ(error->code(), ErrorCode::store_corrupt_record);
  EXPECT_TRUE(contains(error->what(), "claim_token")) << error->what();
  EXPECT_EQ(store.entry_count(), 1u) << "the claim was rolled back";
  raw.exec("INSERT INTO idem_counters(name, value) VALUES ('claim_token', " +
           std::to_string(first.token) + ")");
  const auto second = store.claim("b", std::nullopt, 30s);
  ASSERT_EQ(second.status, ClaimOutcome::Status::acquired);
  EXPECT_GT(second.token, first.token);
}

TEST(SqliteStoreCorruptRows, UndecodableResultIsADecodeErrorThroughResilient) {
  TempDir dir;
  const std::string path = dir.file("decode.db");
  auto store = std::make_shared<SqliteIdempotencyStore>(path);
  std::atomic<int> calls{0};
  auto op = idem::resilient(
      [&] {
        ++calls;
        return 7;
      },
      {.name = "number",
       .idempotency_key = [] { return std::string("number"); },
       .idempotency_store = store});
  EXPECT_EQ(op().value, 7);
  RawDb(path).exec(
      "UPDATE idem_records SET value = CAST('seven' AS BLOB) WHERE key = '6:number:number'");
  try {
    (void)op();
    ADD_FAILURE() << "a replay of bytes that are no int must fail";
  } catch (const idem::DecodeError& e) {
    EXPECT_TRUE(contains(e.what(), "seven")) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected idem::DecodeError, got: " << e.what();
  }
  EXPECT_EQ(calls.load(), 1) << "an unreadable result is an error, not a reason to run again";
}

// ---- values through resilient() -------------------------------------------------------------

struct Receipt {
  std::string id;
  int cents = 0;
  std::vector<std::string> notes;
  bool operator==(const Receipt&) const = default;
};
void to_json(nlohmann::json& j, const Receipt& r) {
  j = nlohmann::json{{"id", r.id}, {"cents", r.cents}, {"notes", r.notes}};
}
void from_json(const nlohmann::json& j, Receipt& r) {
  j.at("id").get_to(r.id);
  j.at("cents").get_to(r.cents);
  j.at("notes").get_to(r.notes);
}

struct NoCodec {
  int value = 0;
};

// Executes `make()` through a store on `path`, then replays it through a second store on the
// same file (a second process, as far as idem can tell): the value must come back from the bytes
// exactly, with the original report.
template <class T>
void expect_replayed_exactly(const std::string& path, const std::string& key, const T& expected) {
  SCOPED_TRACE(key);
  std::atomic<int> calls{0};
  auto make = [&] {
    ++calls;
    return expected;
  };
  auto first_store = std::make_shared<SqliteIdempotencyStore>(path);
  auto second_store = std::make_shared<SqliteIdempotencyStore>(path);
  auto first = idem::resilient(
      make,
      {.name = "make", .idempotency_key = [key] { return key; }, .idempotency_store = first_store});
  auto second = idem::resilient(make, {.name = "make",
                                       .idempotency_key = [key] { return key; },
                                       .idempotency_store = second_store});
  const auto executed = first();
  const auto replayed = second();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(executed.report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(replayed.report.metadata.at("idempotency_status"), "replayed");
  if constexpr (std::is_floating_point_v<T>) {
    EXPECT_EQ(std::signbit(replayed.value), std::signbit(expected));
  }
  EXPECT_EQ(replayed.value, expected);
  EXPECT_EQ(replayed.report.operation, executed.report.operation);
  EXPECT_EQ(replayed.report.started_at, executed.report.started_at);
  EXPECT_EQ(replayed.report.duration, executed.report.duration);
  EXPECT_EQ(replayed.report.attempts.size(), executed.report.attempts.size());
}

TEST(SqliteStoreValues, EveryCodecReplaysExactlyFromTheFile) {
  TempDir dir;
  const std::string path = dir.file("values.db");
  std::string binary;
  for (int round = 0; round < 2; ++round) {
    for (int b = 0; b < 256; ++b)
      binary.push_back(static_cast<char>(b));
  }
  expect_replayed_exactly<std::string>(path, "string", "receipt-7");
  expect_replayed_exactly<std::string>(path, "empty-string", "");
  expect_replayed_exactly<std::string>(path, "binary-string", binary);
  expect_replayed_exactly<int>(path, "int", -2499);
  expect_replayed_exactly<int>(path, "zero", 0);
  expect_replayed_exactly<std::int64_t>(path, "int64", std::numeric_limits<std::int64_t>::min());
  expect_replayed_exactly<std::uint64_t>(path, "uint64", std::numeric_limits<std::uint64_t>::max());
  expect_replayed_exactly<bool>(path, "true", true);
  expect_replayed_exactly<bool>(path, "false", false);
  expect_replayed_exactly<double>(path, "double", 0.1);
  expect_replayed_exactly<double>(path, "huge-double", 1e300);
  expect_replayed_exactly<double>(path, "negative-zero", -0.0);
  expect_replayed_exactly<nlohmann::json>(
      path, "json", nlohmann::json{{"a", 1}, {"b", {true, nullptr, "x"}}, {"c", 2.5}});
  expect_replayed_exactly<nlohmann::json>(path, "json-null", nlohmann::json());
  expect_replayed_exactly<Receipt>(path, "struct", Receipt{"r-1", 2499, {"a", ""}});
  expect_replayed_exactly<Receipt>(path, "empty-struct", Receipt{});
  expect_replayed_exactly<std::vector<std::string>>(path, "empty-vector", {});
  expect_replayed_exactly<std::vector<int>>(path, "int-vector", {3, 0, -1});
  expect_replayed_exactly<std::vector<unsigned char>>(
      path, "bytes", std::vector<unsigned char>(binary.begin(), binary.end()));
  expect_replayed_exactly<std::vector<unsigned char>>(path, "empty-bytes", {});
}

TEST(SqliteStoreValues, VoidReplaysFromTheFile) {
  TempDir dir;
  const std::string path = dir.file("void.db");
  std::atomic<int> calls{0};
  auto op_on = [&](std::shared_ptr<SqliteIdempotencyStore> store) {
    return idem::resilient([&] { ++calls; }, {.name = "v",
                                              .idempotency_key = [] { return std::string("v"); },
                                              .idempotency_store = std::move(store)});
  };
  auto first = op_on(std::make_shared<SqliteIdempotencyStore>(path));
  auto second = op_on(std::make_shared<SqliteIdempotencyStore>(path));
  EXPECT_EQ(first().report.metadata.at("idempotency_status"), "executed");
  EXPECT_EQ(second().report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(RawDb(path).bytes("SELECT value FROM idem_records WHERE key = '1:v:v'"), "");
}

TEST(SqliteStoreValues, AResultTypeWithoutACodecIsAConfigError) {
  TempDir dir;
  auto store = std::make_shared<SqliteIdempotencyStore>(dir.file("nocodec.db"));
  EXPECT_THROW(
      idem::resilient([] { return NoCodec{}; }, {.name = "no_codec",
                                                 .idempotency_key = [] { return std::string("k"); },
                                                 .idempotency_store = store}),
      idem::ConfigError);
  EXPECT_EQ(store->entry_count(), 0u);
}

TEST(SqliteStoreValues, TheOriginalReportIsReplayed) {
  TempDir dir;
  const std::string path = dir.file("report.db");
  auto clock = std::make_shared<ManualClock>();  // backoff without sleeping
  std::atomic<int> calls{0};
  auto op_on = [&](std::shared_ptr<SqliteIdempotencyStore> store) {
    return idem::resilient(
        [&](const std::string& id) {
          if (++calls == 1) throw std::runtime_error("gateway \"hiccup\"");
          return "paid:" + id;
        },
        {.name = "create_payment",
         .retries = 2,
         .retry_on = [](const std::exception&) { return true; },
         .idempotency_key = [](const std::string& id) { return "pay:" + id; },
         .idempotency_store = std::move(store),
         .clock = clock});
  };
  auto first = op_on(std::make_shared<SqliteIdempotencyStore>(path, with_clock(clock)));
  auto second = op_on(std::make_shared<SqliteIdempotencyStore>(path, with_clock(clock)));
  const auto executed = first("42");
  ASSERT_EQ(executed.report.attempts.size(), 2u);
  const auto replayed = second("42");
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(replayed.value, "paid:42");
  const auto& report = replayed.report;
  EXPECT_EQ(report.operation, "create_payment");
  EXPECT_EQ(report.status, idem::OperationStatus::succeeded);
  ASSERT_EQ(report.attempts.size(), 2u);
  EXPECT_EQ(report.attempts[0].status, idem::AttemptStatus::failed);
  EXPECT_EQ(report.attempts[0].error_message, "gateway \"hiccup\"");
  EXPECT_EQ(report.attempts[1].status, idem::AttemptStatus::succeeded);
  EXPECT_EQ(report.started_at, executed.report.started_at);
  EXPECT_EQ(report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(report.metadata.at("idempotency_key"), "pay:42");
}

TEST(SqliteStoreValues, AClaimWithoutReportReplaysTheValueAndLeavesTheReportOut) {
  TempDir dir;
  const std::string path = dir.file("no-report.db");
  SqliteIdempotencyStore store(path);
  const auto claim = store.claim("k", "fp", 30s);
  ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);
  ASSERT_TRUE(store.complete("k", claim.token, bytes_value("the value"), small_report(), 1h));
  const auto with_report = store.claim("k", "fp", 30s);
  ASSERT_EQ(with_report.status, ClaimOutcome::Status::completed);
  ASSERT_TRUE(with_report.record->report);
  EXPECT_EQ(with_report.record->report->operation, "create_payment");
  const auto without = store.claim_without_report("k", "fp", 30s);
  ASSERT_EQ(without.status, ClaimOutcome::Status::completed);
  EXPECT_EQ(without.record->value.bytes, std::optional<std::string>("the value"));
  EXPECT_FALSE(without.record->report);
  EXPECT_EQ(without.record->token, with_report.record->token);
  EXPECT_EQ(without.record->expires_at, with_report.record->expires_at);
  // Everything else as claim(): a mismatch, an absent key, the argument checks.
  EXPECT_EQ(store.claim_without_report("k", "other", 30s).status, ClaimOutcome::Status::mismatch);
  EXPECT_EQ(store.claim_without_report("new", "fp", 30s).status, ClaimOutcome::Status::acquired);
  EXPECT_THROW((void)store.claim_without_report("", "fp", 30s), idem::InvalidKey);
  EXPECT_THROW((void)store.claim_without_report("x", "fp", 0ms), idem::InvalidArgument);
  // An unparsable report does not stop a claim that does not read it.
  RawDb raw(path);
  raw.exec("UPDATE idem_records SET report = 'nope' WHERE key = 'k'");
  EXPECT_EQ(store.claim_without_report("k", "fp", 30s).status, ClaimOutcome::Status::completed);
  EXPECT_EQ(error_of([&] { (void)store.claim("k", "fp", 30s); })->code(),
            ErrorCode::store_corrupt_record);
}

TEST(SqliteStoreValues, AKeyReusedWithOtherArgumentsIsRefusedAcrossStores) {
  TempDir dir;
  const std::string path = dir.file("fingerprint.db");
  std::atomic<int> calls{0};
  auto op_on = [&](std::shared_ptr<SqliteIdempotencyStore> store) {
    return idem::resilient(
        [&](const std::string&, int amount) {
          ++calls;
          return amount;
        },
        {.name = "pay",
         .idempotency_key = [](const std::string& id, int) { return "pay:" + id; },
         .idempotency_store = std::move(store),
         .idempotency_fingerprint = true});
  };
  auto first = op_on(std::make_shared<SqliteIdempotencyStore>(path));
  auto second = op_on(std::make_shared<SqliteIdempotencyStore>(path));
  EXPECT_EQ(first("1", 2499).value, 2499);
  EXPECT_THROW(second("1", 9999), idem::KeyReuseError);
  EXPECT_EQ(second("1", 2499).value, 2499);
  EXPECT_EQ(calls.load(), 1);
}

// ---- one file with the recorder -------------------------------------------------------------

TEST(SqliteStoreSharedFile, RecorderAndStoreShareTheFileAndTheTokenCounter) {
  for (bool store_first : {true, false}) {
    SCOPED_TRACE(store_first ? "store opened first" : "recorder opened first");
    TempDir dir;
    const std::string path = dir.file("shared.db");
    auto clock = std::make_shared<ManualClock>();
    std::unique_ptr<SqliteIdempotencyStore> store;
    std::unique_ptr<SqliteIdempotencyRecorder> recorder;
    if (store_first) {
      store = std::make_unique<SqliteIdempotencyStore>(path, with_clock(clock));
      recorder = std::make_unique<SqliteIdempotencyRecorder>(path, with_clock(clock));
    } else {
      recorder = std::make_unique<SqliteIdempotencyRecorder>(path, with_clock(clock));
      store = std::make_unique<SqliteIdempotencyStore>(path, with_clock(clock));
    }
    std::uint64_t last = 0;
    for (int i = 0; i < 5; ++i) {
      const auto claim = store->claim("op-" + std::to_string(i), std::nullopt, 30s);
      ASSERT_EQ(claim.status, ClaimOutcome::Status::acquired);
      EXPECT_GT(claim.token, last);
      last = claim.token;
      const auto event = recorder->claim("billing", "event-" + std::to_string(i), 30s);
      ASSERT_EQ(event.status, idem::Claim::Status::acquired);
      EXPECT_GT(event.token, last) << "one counter for the file";
      last = event.token;
      ASSERT_TRUE(recorder->complete("billing", "event-" + std::to_string(i), event.token));
      ASSERT_TRUE(store->complete("op-" + std::to_string(i), claim.token, bytes_value("v"),
                                  small_report(), 10s));
    }
    recorder->mark_processed("billing", "plain");
    EXPECT_TRUE(recorder->is_processed("billing", "event-3"));
    EXPECT_EQ(store->entry_count(), 5u);

    clock->advance(10s);
    EXPECT_EQ(recorder->purge(1s), 6u) << "the recorder's purge leaves the store's records";
    EXPECT_EQ(store->entry_count(), 5u);
    EXPECT_EQ(store->purge_expired(), 5u);
    RawDb raw(path);
    EXPECT_EQ(raw.integer("SELECT version FROM idem_schema WHERE component = 'store'"), 1);
    EXPECT_EQ(raw.integer("SELECT version FROM idem_schema WHERE component = 'recorder'"), 1);
  }
}

// ---- two stores on one file: two processes as far as idem can tell ------------------------

TEST(SqliteStoreConcurrency, ThreadsOnTwoStoresAcquireEachKeyOnce) {
  TempDir dir;
  const std::string path = dir.file("race.db");
  auto clock = std::make_shared<ManualClock>();
  std::vector<std::shared_ptr<SqliteIdempotencyStore>> stores = {
      std::make_shared<SqliteIdempotencyStore>(path, with_clock(clock)),
      std::make_shared<SqliteIdempotencyStore>(path, with_clock(clock))};
  constexpr int kThreads = 8;
  constexpr int kKeys = 150;
  std::vector<std::atomic<int>> acquired(kKeys);
  std::atomic<int> failures{0};
  std::latch start(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<int> order(kKeys);
      for (int k = 0; k < kKeys; ++k)
        order[static_cast<std::size_t>(k)] = k;
      std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<unsigned>(t)));
      SqliteIdempotencyStore& store = *stores[static_cast<std::size_t>(t % 2)];
      start.arrive_and_wait();
      for (int k : order) {
        const std::string key = "key-" + std::to_string(k);
        try {
          const auto outcome = store.claim(key, std::nullopt, 30s);
          if (outcome.status == ClaimOutcome::Status::acquired) {
            ++acquired[static_cast<std::size_t>(k)];
            // Half the owners finish at once, so claimers also meet completed records.
            if (k % 2 == 0) {
              static_cast<void>(
                  store.complete(key, outcome.token, bytes_value(key), small_report(), 1h));
            }
          }
        } catch (const std::exception&) {
          ++failures;
        }
      }
    });
  }
  for (auto& thread : threads)
    thread.join();
  EXPECT_EQ(failures.load(), 0);
  for (int k = 0; k < kKeys; ++k)
    EXPECT_EQ(acquired[static_cast<std::size_t>(k)].load(), 1) << "key-" << k;
}

// Forwards to a store and counts down a latch when wait() is entered, so a test knows the caller
// is waiting for another process's owner (no sleeping).
class WaitSignallingStore final : public idem::IdempotencyStore {
 public:
  WaitSignallingStore(std::shared_ptr<idem::IdempotencyStore> inner, std::latch& waiting)
      : inner_(std::move(inner)), waiting_(waiting) {}
  bool do_needs_bytes() const noexcept override { return inner_->needs_bytes(); }
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        idem::Millis lease) override {
    return inner_->claim(key, fingerprint, lease);
  }
  bool do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                   const idem::ExecutionReport& report, idem::Millis ttl) override {
    return inner_->complete(key, token, std::move(value), report, ttl);
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    return inner_->release(key, token);
  }
  bool do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    return inner_->renew(key, token, lease);
  }
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override {
    return inner_->lookup(key);
  }
  std::size_t do_purge_expired(const idem::PurgeProgress& progress) override {
    return inner_->purge_expired(progress);
  }
  std::size_t do_entry_count() override { return inner_->entry_count(); }
  std::optional<IdempotencyRecord> do_wait(std::string_view key, idem::SteadyTime deadline,
                                           std::stop_token stop) override {
    if (!signalled_.exchange(true)) waiting_.count_down();
    return inner_->wait(key, deadline, std::move(stop));
  }

 private:
  std::shared_ptr<idem::IdempotencyStore> inner_;
  std::latch& waiting_;
  std::atomic<bool> signalled_{false};
};

TEST(SqliteStoreConcurrency, AnotherOwnersKeyIsRejectedOrWaitedForThenReplayed) {
  TempDir dir;
  const std::string path = dir.file("policies.db");
  std::atomic<int> calls{0};
  std::latch owner_running(1);
  std::promise<void> finish;
  std::shared_future<void> finish_signal = finish.get_future().share();
  auto owner = idem::resilient(
      [&](const std::string& id) {
        ++calls;
        owner_running.count_down();
        finish_signal.wait();
        return "paid:" + id;
      },
      {.name = "pay",
       .idempotency_key = [](const std::string& id) { return "pay:" + id; },
       .idempotency_store = std::make_shared<SqliteIdempotencyStore>(path)});
  auto other_store = std::make_shared<SqliteIdempotencyStore>(path);
  auto rejecting = idem::resilient(
      [&](const std::string& id) {
        ++calls;
        return "other:" + id;
      },
      {.name = "pay",
       .idempotency_key = [](const std::string& id) { return "pay:" + id; },
       .idempotency_store = other_store,
       .idempotency_in_progress = idem::InProgressPolicy::reject});
  std::latch waiting(1);
  auto waiting_store = std::make_shared<WaitSignallingStore>(other_store, waiting);
  auto patient = idem::resilient(
      [&](const std::string& id) {
        ++calls;
        return "other:" + id;
      },
      {.name = "pay",
       .idempotency_key = [](const std::string& id) { return "pay:" + id; },
       .idempotency_store = waiting_store,
       .idempotency_in_progress = idem::InProgressPolicy::wait,
       .idempotency_max_wait = 60s});

  auto owned = std::async(std::launch::async, [&] { return owner("7"); });
  owner_running.wait();
  try {
    (void)rejecting("7");
    ADD_FAILURE() << "the reject policy must not wait";
  } catch (const idem::AlreadyInProgress& e) {
    EXPECT_TRUE(e.retryable());
    EXPECT_TRUE(contains(e.what(), "pay:7")) << e.what();
  }
  auto waited = std::async(std::launch::async, [&] { return patient("7"); });
  waiting.wait();  // the patient caller polls the file for the owner's record
  finish.set_value();
  const auto executed = owned.get();
  const auto replayed = waited.get();
  EXPECT_EQ(executed.value, "paid:7");
  EXPECT_EQ(replayed.value, "paid:7");
  EXPECT_EQ(replayed.report.metadata.at("idempotency_status"), "replayed");
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
