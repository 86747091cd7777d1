// Resource faults on the SQLite backend: a full disk or an I/O error while writing (and what a
// failed COMMIT says about its outcome), a failed fsync, a corrupted file, a read-only database,
// and a database locked past the busy timeout. Each must give a
// clear, classified SqliteError; nothing may be reported processed (or completed) that was not;
// and the same recorder/store objects must work again once the fault clears, without a reopen.
//
// Disk full and I/O errors come from a fault VFS: a shim over the platform's default VFS that
// this binary registers AS the default (idem opens its files through the default VFS), passing
// every call through until a test arms it; then every xWrite fails with the armed code. That is
// the most faithful fault: SQLite sees exactly what a full disk gives it. PRAGMA max_page_count
// would not do, because it is per connection and idem's own connections never set it.
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../process/worker/child_process.hpp"
#include "../sqlite_raw_db.hpp"
#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/report.hpp"
#include "idem/sqlite/sqlite_error.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

using namespace std::chrono_literals;
using idem::ErrorCode;
using idem::sqlite::SqliteError;

// ---- the fault VFS -----------------------------------------------------------------------------

// 0: writes pass through; otherwise the (extended) result code every xWrite returns.
std::atomic<int> g_write_fault{0};
// 0: syncs pass through; otherwise the result code every xSync returns.
std::atomic<int> g_sync_fault{0};
// xWrite calls refused while armed (to show the fault was really hit).
std::atomic<int> g_refused_writes{0};
sqlite3_vfs* g_real_vfs = nullptr;

// Our file object: the real VFS's file follows it in the same allocation.
struct FaultFile {
  sqlite3_file base;
  sqlite3_file* real;
};

sqlite3_file* real_of(sqlite3_file* file) {
  return reinterpret_cast<FaultFile*>(file)->real;
}

int fault_close(sqlite3_file* f) {
  return real_of(f)->pMethods->xClose(real_of(f));
}
int fault_read(sqlite3_file* f, void* buffer, int amount, sqlite3_int64 offset) {
  return real_of(f)->pMethods->xRead(real_of(f), buffer, amount, offset);
}
int fault_write(sqlite3_file* f, const void* buffer, int amount, sqlite3_int64 offset) {
  if (const int fault = g_write_fault.load(); fault != 0) {
    g_refused_writes.fetch_add(1);
    return fault;
  }
  return real_of(f)->pMethods->xWrite(real_of(f), buffer, amount, offset);
}
int fault_truncate(sqlite3_file* f, sqlite3_int64 size) {
  return real_of(f)->pMethods->xTruncate(real_of(f), size);
}
int fault_sync(sqlite3_file* f, int flags) {
  if (const int fault = g_sync_fault.load(); fault != 0) return fault;
  return real_of(f)->pMethods->xSync(real_of(f), flags);
}
int fault_file_size(sqlite3_file* f, sqlite3_int64* size) {
  return real_of(f)->pMethods->xFileSize(real_of(f), size);
}
int fault_lock(sqlite3_file* f, int level) {
  return real_of(f)->pMethods->xLock(real_of(f), level);
}
int fault_unlock(sqlite3_file* f, int level) {
  return real_of(f)->pMethods->xUnlock(real_of(f), level);
}
int fault_check_reserved(sqlite3_file* f, int* out) {
  return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out);
}
int fault_file_control(sqlite3_file* f, int op, void* arg) {
  return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
}
int fault_sector_size(sqlite3_file* f) {
  return real_of(f)->pMethods->xSectorSize(real_of(f));
}
int fault_device_characteristics(sqlite3_file* f) {
  return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f));
}
int fault_shm_map(sqlite3_file* f, int page, int page_size, int extend, void volatile** out) {
  return real_of(f)->pMethods->xShmMap(real_of(f), page, page_size, extend, out);
}
int fault_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  return real_of(f)->pMethods->xShmLock(real_of(f), offset, n, flags);
}
void fault_shm_barrier(sqlite3_file* f) {
  real_of(f)->pMethods->xShmBarrier(real_of(f));
}
int fault_shm_unmap(sqlite3_file* f, int delete_flag) {
  return real_of(f)->pMethods->xShmUnmap(real_of(f), delete_flag);
}
int fault_fetch(sqlite3_file* f, sqlite3_int64 offset, int amount, void** out) {
  return real_of(f)->pMethods->xFetch(real_of(f), offset, amount, out);
}
int fault_unfetch(sqlite3_file* f, sqlite3_int64 offset, void* page) {
  return real_of(f)->pMethods->xUnfetch(real_of(f), offset, page);
}

// Version 3 methods: the unix VFS's files all have them (WAL needs xShm*).
const sqlite3_io_methods kFaultMethods = {
    3,
    fault_close,
    fault_read,
    fault_write,
    fault_truncate,
    fault_sync,
    fault_file_size,
    fault_lock,
    fault_unlock,
    fault_check_reserved,
    fault_file_control,
    fault_sector_size,
    fault_device_characteristics,
    fault_shm_map,
    fault_shm_lock,
    fault_shm_barrier,
    fault_shm_unmap,
    fault_fetch,
    fault_unfetch,
};

int fault_open(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
  auto* ours = reinterpret_cast<FaultFile*>(file);
  ours->base.pMethods = nullptr;
  ours->real = reinterpret_cast<sqlite3_file*>(ours + 1);
  const int rc = g_real_vfs->xOpen(g_real_vfs, name, ours->real, flags, out_flags);
  // A failed open may leave the real pMethods null: then ours stays null too (no xClose).
  if (ours->real->pMethods != nullptr) {
    if (ours->real->pMethods->iVersion < 3) {
      ours->real->pMethods->xClose(ours->real);
      return SQLITE_CANTOPEN;
    }
    ours->base.pMethods = &kFaultMethods;
  }
  return rc;
}
int fault_delete(sqlite3_vfs*, const char* name, int sync_dir) {
  return g_real_vfs->xDelete(g_real_vfs, name, sync_dir);
}
int fault_access(sqlite3_vfs*, const char* name, int flags, int* out) {
  return g_real_vfs->xAccess(g_real_vfs, name, flags, out);
}
int fault_full_pathname(sqlite3_vfs*, const char* name, int size, char* out) {
  return g_real_vfs->xFullPathname(g_real_vfs, name, size, out);
}
void* fault_dl_open(sqlite3_vfs*, const char* name) {
  return g_real_vfs->xDlOpen(g_real_vfs, name);
}
void fault_dl_error(sqlite3_vfs*, int size, char* out) {
  g_real_vfs->xDlError(g_real_vfs, size, out);
}
void (*fault_dl_sym(sqlite3_vfs*, void* handle, const char* symbol))(void) {
  return g_real_vfs->xDlSym(g_real_vfs, handle, symbol);
}
void fault_dl_close(sqlite3_vfs*, void* handle) {
  g_real_vfs->xDlClose(g_real_vfs, handle);
}
int fault_randomness(sqlite3_vfs*, int size, char* out) {
  return g_real_vfs->xRandomness(g_real_vfs, size, out);
}
int fault_sleep(sqlite3_vfs*, int micros) {
  return g_real_vfs->xSleep(g_real_vfs, micros);
}
int fault_current_time(sqlite3_vfs*, double* out) {
  return g_real_vfs->xCurrentTime(g_real_vfs, out);
}
int fault_get_last_error(sqlite3_vfs*, int size, char* out) {
  return g_real_vfs->xGetLastError(g_real_vfs, size, out);
}
int fault_current_time_int64(sqlite3_vfs*, sqlite3_int64* out) {
  return g_real_vfs->xCurrentTimeInt64(g_real_vfs, out);
}

sqlite3_vfs g_fault_vfs{};

// Registers the fault VFS as the default, once, before any test opens a database.
class FaultVfsEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    ASSERT_EQ(sqlite3_initialize(), SQLITE_OK);
    g_real_vfs = sqlite3_vfs_find(nullptr);
    ASSERT_NE(g_real_vfs, nullptr);
    ASSERT_GE(g_real_vfs->iVersion, 2);
    g_fault_vfs.iVersion = 2;
    g_fault_vfs.szOsFile = static_cast<int>(sizeof(FaultFile)) + g_real_vfs->szOsFile;
    g_fault_vfs.mxPathname = g_real_vfs->mxPathname;
    g_fault_vfs.zName = "idem-fault";
    g_fault_vfs.xOpen = fault_open;
    g_fault_vfs.xDelete = fault_delete;
    g_fault_vfs.xAccess = fault_access;
    g_fault_vfs.xFullPathname = fault_full_pathname;
    g_fault_vfs.xDlOpen = fault_dl_open;
    g_fault_vfs.xDlError = fault_dl_error;
    g_fault_vfs.xDlSym = fault_dl_sym;
    g_fault_vfs.xDlClose = fault_dl_close;
    g_fault_vfs.xRandomness = fault_randomness;
    g_fault_vfs.xSleep = fault_sleep;
    g_fault_vfs.xCurrentTime = fault_current_time;
    g_fault_vfs.xGetLastError = fault_get_last_error;
    g_fault_vfs.xCurrentTimeInt64 = fault_current_time_int64;
    ASSERT_EQ(sqlite3_vfs_register(&g_fault_vfs, /*makeDflt=*/1), SQLITE_OK);
    ASSERT_EQ(sqlite3_vfs_find(nullptr), &g_fault_vfs);
  }
};

[[maybe_unused]] ::testing::Environment* const g_fault_environment =
    ::testing::AddGlobalTestEnvironment(new FaultVfsEnvironment);

// Arms the fault for its lifetime: disarmed again even when an assertion fails.
class ArmedWriteFault {
 public:
  explicit ArmedWriteFault(int code) {
    g_refused_writes = 0;
    g_write_fault = code;
  }
  ArmedWriteFault(const ArmedWriteFault&) = delete;
  ArmedWriteFault& operator=(const ArmedWriteFault&) = delete;
  ~ArmedWriteFault() { g_write_fault = 0; }
};

// Arms a sync fault for its lifetime.
class ArmedSyncFault {
 public:
  explicit ArmedSyncFault(int code) { g_sync_fault = code; }
  ArmedSyncFault(const ArmedSyncFault&) = delete;
  ArmedSyncFault& operator=(const ArmedSyncFault&) = delete;
  ~ArmedSyncFault() { g_sync_fault = 0; }
};

// ---- helpers -----------------------------------------------------------------------------------

using idem::test::TempDir;

using idem::test::RawDb;

// Runs `fn`, which must throw a SqliteError; returns it.
template <class Fn>
SqliteError expect_sqlite_error(Fn&& fn) {
  try {
    fn();
  } catch (const SqliteError& e) {
    return e;
  }
  ADD_FAILURE() << "expected a SqliteError";
  return SqliteError(ErrorCode::store_error, "none", 0, 0, false, false);
}

idem::sqlite::SqliteOptions fast_options() {
  idem::sqlite::SqliteOptions options;
  options.busy_timeout = 50ms;  // only how long a locked call waits; nothing is timed
  return options;
}

idem::StoredValue bytes_value(std::string bytes) {
  idem::StoredValue value;
  value.bytes = std::move(bytes);
  return value;
}

// ---- disk full / I/O error ---------------------------------------------------------------------

// The classification a write fault must get (sqlite_error.hpp): store_error, and either retryable
// (the statement failed before anything committed) or in doubt (COMMIT failed, so idem cannot
// claim it did not reach the disk) — never "fine" and never an unclassified exception.
void expect_write_fault(const SqliteError& e, int primary_code) {
  EXPECT_EQ(e.code(), ErrorCode::store_error) << e.what();
  EXPECT_EQ(e.sqlite_code(), primary_code) << e.what();
  EXPECT_TRUE(e.retryable() || e.in_doubt()) << e.what();
  EXPECT_NE(std::string(e.what()).find(idem::sqlite::sqlite_code_name(primary_code)),
            std::string::npos)
      << e.what();
}

class SqliteWriteFault : public ::testing::TestWithParam<int> {};

TEST_P(SqliteWriteFault, RecorderRefusesToMarkAndRecoversOnTheSameObject) {
  TempDir dir;
  auto recorder =
      std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(dir.file("r.db"), fast_options());
  recorder->mark_processed("billing", "before");
  const int primary = GetParam() & 0xff;
  {
    ArmedWriteFault fault(GetParam());
    expect_write_fault(expect_sqlite_error([&] { recorder->mark_processed("billing", "e1"); }),
                       primary);
    expect_write_fault(expect_sqlite_error([&] { (void)recorder->claim("billing", "e2", 30s); }),
                       primary);
    EXPECT_GT(g_refused_writes.load(), 0);
    // Reads still work during the fault, and show nothing that failed.
    EXPECT_TRUE(recorder->is_processed("billing", "before"));
    EXPECT_FALSE(recorder->is_processed("billing", "e1"));
    EXPECT_FALSE(recorder->is_processed("billing", "e2"));
  }
  // The fault cleared: the same object works, nothing it refused had been written.
  EXPECT_FALSE(recorder->is_processed("billing", "e1"));
  recorder->mark_processed("billing", "e1");
  EXPECT_TRUE(recorder->is_processed("billing", "e1"));
  const idem::Claim claim = recorder->claim("billing", "e2", 30s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  EXPECT_TRUE(recorder->complete("billing", "e2", claim.token));
  EXPECT_TRUE(recorder->is_processed("billing", "e2"));
}

TEST_P(SqliteWriteFault, CompleteOfAHeldClaimFailsUnmarkedThenCompletes) {
  TempDir dir;
  idem::sqlite::SqliteIdempotencyRecorder recorder(dir.file("r.db"), fast_options());
  const idem::Claim claim = recorder.claim("billing", "e1", 30s);
  ASSERT_EQ(claim.status, idem::Claim::Status::acquired);
  {
    ArmedWriteFault fault(GetParam());
    expect_write_fault(
        expect_sqlite_error([&] { (void)recorder.complete("billing", "e1", claim.token); }),
        GetParam() & 0xff);
    EXPECT_FALSE(recorder.is_processed("billing", "e1"));
  }
  EXPECT_FALSE(recorder.is_processed("billing", "e1"));
  // The claim is still ours: completing it again succeeds.
  EXPECT_TRUE(recorder.complete("billing", "e1", claim.token));
  EXPECT_TRUE(recorder.is_processed("billing", "e1"));
}

TEST_P(SqliteWriteFault, HandlerRunDuringTheFaultLeavesTheEventUnmarkedForRedelivery) {
  TempDir dir;
  auto recorder =
      std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(dir.file("r.db"), fast_options());
  for (const idem::HandlerMode mode :
       {idem::HandlerMode::check_then_mark, idem::HandlerMode::exclusive,
        idem::HandlerMode::transactional}) {
    SCOPED_TRACE(std::string(idem::to_string(mode)));
    const std::string consumer = "c-" + std::string(idem::to_string(mode));
    int runs = 0;
    idem::HandlerOptions options;
    options.mode = mode;
    auto handler = idem::make_idempotent_handler(
        consumer, recorder, [&](const std::string&) { ++runs; }, options);
    const idem::Event event = idem::Event::make("order.created", "{}");
    idem::CollectingBusProxy bus;
    {
      ArmedWriteFault fault(GetParam());
      EXPECT_THROW((*handler)(event, bus), idem::StoreError);
    }
    EXPECT_FALSE(recorder->is_processed(consumer, event.id));
    const int runs_during_fault = runs;
    // Redelivery after the fault: the handler runs (again, for the modes that ran it before the
    // marker failed) and the event is now marked; a third delivery is a duplicate.
    EXPECT_EQ((*handler)(event, bus), idem::HandleResult::processed);
    EXPECT_EQ(runs, runs_during_fault + 1);
    EXPECT_TRUE(recorder->is_processed(consumer, event.id));
    EXPECT_EQ((*handler)(event, bus), idem::HandleResult::duplicate);
    EXPECT_EQ(runs, runs_during_fault + 1);
  }
}

TEST_P(SqliteWriteFault, StoreRefusesClaimAndCompleteAndRecovers) {
  TempDir dir;
  idem::sqlite::SqliteIdempotencyStore store(dir.file("s.db"), fast_options());
  const idem::ClaimOutcome held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);
  const int primary = GetParam() & 0xff;
  {
    ArmedWriteFault fault(GetParam());
    expect_write_fault(expect_sqlite_error([&] { (void)store.claim("fresh", std::nullopt, 30s); }),
                       primary);
    expect_write_fault(expect_sqlite_error([&] {
                         (void)store.complete("held", held.token, bytes_value("42"),
                                              idem::ExecutionReport{}, 1h);
                       }),
                       primary);
    EXPECT_FALSE(store.lookup("fresh").has_value());
    const auto during = store.lookup("held");
    ASSERT_TRUE(during.has_value());
    EXPECT_EQ(during->state, idem::IdempotencyRecord::State::in_progress);
  }
  const auto after = store.lookup("held");
  ASSERT_TRUE(after.has_value());
  EXPECT_EQ(after->state, idem::IdempotencyRecord::State::in_progress);
  EXPECT_TRUE(store.complete("held", held.token, bytes_value("42"), idem::ExecutionReport{}, 1h));
  const auto completed = store.lookup("held");
  ASSERT_TRUE(completed.has_value());
  EXPECT_EQ(completed->state, idem::IdempotencyRecord::State::completed);
  EXPECT_EQ(completed->value.bytes, "42");
  EXPECT_EQ(store.claim("fresh", std::nullopt, 30s).status, idem::ClaimOutcome::Status::acquired);
}

INSTANTIATE_TEST_SUITE_P(Faults, SqliteWriteFault,
                         ::testing::Values(SQLITE_FULL, SQLITE_IOERR_WRITE),
                         [](const ::testing::TestParamInfo<int>& param_info) {
                           return param_info.param == SQLITE_FULL ? std::string("DiskFull")
                                                                  : std::string("IoError");
                         });

// ---- what a failed COMMIT says about its outcome ---------------------------------------------

bool mentions(const SqliteError& e, const std::string& text) {
  return std::string(e.what()).find(text) != std::string::npos;
}

// In WAL mode a small transaction writes nothing until COMMIT, so a full disk surfaces there.
// SQLite then has rolled the transaction back (autocommit is on again) before its commit record
// reached the WAL: the outcome is known (not committed), so it is retryable and not in doubt.
TEST(SqliteCommitFault, DiskFullAtCommitThatRolledBackIsNotInDoubt) {
  TempDir dir;
  idem::sqlite::SqliteIdempotencyRecorder recorder(dir.file("r.db"), fast_options());
  idem::sqlite::SqliteIdempotencyStore store(dir.file("r.db"), fast_options());
  const idem::ClaimOutcome held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);
  {
    ArmedWriteFault fault(SQLITE_FULL);
    for (const SqliteError& e :
         {expect_sqlite_error([&] { recorder.mark_processed("billing", "e1"); }),
          expect_sqlite_error([&] { (void)recorder.claim("billing", "e2", 30s); }),
          expect_sqlite_error([&] {
            (void)recorder.run_transactional("billing", "e3", [](idem::Transaction&) {});
          }),
          expect_sqlite_error([&] {
            (void)store.complete("held", held.token, bytes_value("1"), idem::ExecutionReport{}, 1h);
          })}) {
      EXPECT_TRUE(mentions(e, "COMMIT")) << "the fault must hit the commit: " << e.what();
      EXPECT_EQ(e.code(), ErrorCode::store_error) << e.what();
      EXPECT_EQ(e.sqlite_code(), SQLITE_FULL) << e.what();
      EXPECT_FALSE(e.in_doubt()) << e.what();
      EXPECT_TRUE(e.retryable()) << e.what();
      EXPECT_TRUE(mentions(e, "nothing was committed")) << e.what();
    }
  }
  // Known not committed, and really not: the same calls succeed once there is room.
  EXPECT_FALSE(recorder.is_processed("billing", "e1"));
  EXPECT_FALSE(recorder.is_processed("billing", "e3"));
  recorder.mark_processed("billing", "e1");
  EXPECT_EQ(recorder.claim("billing", "e2", 30s).status, idem::Claim::Status::acquired);
  EXPECT_TRUE(recorder.run_transactional("billing", "e3", [](idem::Transaction&) {}));
  EXPECT_TRUE(store.complete("held", held.token, bytes_value("1"), idem::ExecutionReport{}, 1h));
}

// A failed fsync comes after the commit record was written to the WAL: SQLite rolls back in
// memory, but recovery may still find that record, so the outcome is unknown.
TEST(SqliteCommitFault, FailedFsyncAtCommitIsInDoubt) {
  TempDir dir;
  idem::sqlite::SqliteOptions options = fast_options();
  options.durability = idem::sqlite::Durability::full;  // the WAL is synced at every commit
  idem::sqlite::SqliteIdempotencyRecorder recorder(dir.file("r.db"), options);
  recorder.mark_processed("billing", "before");
  {
    ArmedSyncFault fault(SQLITE_IOERR_FSYNC);
    const SqliteError e = expect_sqlite_error([&] { recorder.mark_processed("billing", "e1"); });
    EXPECT_TRUE(mentions(e, "COMMIT")) << e.what();
    EXPECT_EQ(e.code(), ErrorCode::store_error) << e.what();
    EXPECT_EQ(e.extended_code(), SQLITE_IOERR_FSYNC) << e.what();
    EXPECT_TRUE(e.in_doubt()) << e.what();
    EXPECT_FALSE(e.retryable()) << e.what();
  }
  recorder.mark_processed("billing", "e2");  // the connection works again
  EXPECT_TRUE(recorder.is_processed("billing", "e2"));
}

// ---- a corrupted file --------------------------------------------------------------------------

// Overwrites `length` bytes of `path` at `offset` with 0xff.
void scribble(const std::string& path, std::size_t offset, std::size_t length) {
  std::FILE* file = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(file, nullptr);
  ASSERT_EQ(std::fseek(file, static_cast<long>(offset), SEEK_SET), 0);
  const std::string garbage(length, '\xff');
  ASSERT_EQ(std::fwrite(garbage.data(), 1, garbage.size(), file), garbage.size());
  ASSERT_EQ(std::fclose(file), 0);
}

// A file with a recorder's and a store's tables and enough markers to fill several pages, closed
// (so the WAL is checkpointed into it and removed). Returns its page size.
std::size_t make_database(const std::string& path) {
  {
    idem::sqlite::SqliteIdempotencyRecorder recorder(path);
    std::vector<std::string> ids;
    for (int i = 0; i < 2000; ++i)
      ids.push_back("event-" + std::to_string(i));
    recorder.mark_processed_many("billing", ids);
    idem::sqlite::SqliteIdempotencyStore store(path);
    (void)store.claim("k", std::nullopt, 30s);
  }
  return static_cast<std::size_t>(RawDb(path).integer("PRAGMA page_size"));
}

// What a damaged file must give: a classified, non-retryable SqliteError naming the file.
void expect_damaged(const SqliteError& e, ErrorCode code, const std::string& path) {
  EXPECT_EQ(e.code(), code) << e.what();
  EXPECT_FALSE(e.retryable()) << e.what();
  EXPECT_FALSE(e.in_doubt()) << e.what();
  EXPECT_TRUE(mentions(e, path)) << e.what();
}

TEST(SqliteCorruption, OverwrittenHeaderIsNotADatabase) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  make_database(path);
  scribble(path, 0, 100);  // the "SQLite format 3" magic and the rest of the header
  expect_damaged(
      expect_sqlite_error([&] { idem::sqlite::SqliteIdempotencyRecorder recorder(path); }),
      ErrorCode::store_not_a_database, path);
  expect_damaged(expect_sqlite_error([&] { idem::sqlite::SqliteIdempotencyStore store(path); }),
                 ErrorCode::store_not_a_database, path);
}

TEST(SqliteCorruption, OverwrittenPagesAreStoreCorruptAtOpen) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  const std::size_t page = make_database(path);
  // Every page but the first (the schema): the open reads idem_schema's and fails there.
  scribble(path, page, static_cast<std::size_t>(std::filesystem::file_size(path)) - page);
  const SqliteError recorder_error =
      expect_sqlite_error([&] { idem::sqlite::SqliteIdempotencyRecorder recorder(path); });
  expect_damaged(recorder_error, ErrorCode::store_corrupt, path);
  EXPECT_EQ(recorder_error.sqlite_code(), SQLITE_CORRUPT) << recorder_error.what();
  expect_damaged(expect_sqlite_error([&] { idem::sqlite::SqliteIdempotencyStore store(path); }),
                 ErrorCode::store_corrupt, path);
}

TEST(SqliteCorruption, AnOverwrittenIndexPageIsStoreCorruptAtTheCallThatReadsIt) {
  TempDir dir;
  const std::string path = dir.file("r.db");
  const std::size_t page = make_database(path);
  // The primary key's index, which the marker lookups read.
  const long long root = RawDb(path).integer(
      "SELECT rootpage FROM sqlite_master WHERE name = 'sqlite_autoindex_processed_log_1'");
  ASSERT_GT(root, 1);
  scribble(path, static_cast<std::size_t>(root - 1) * page, page);
  idem::sqlite::SqliteIdempotencyRecorder recorder(path, fast_options());
  for (int i = 0; i < 2; ++i) {  // the same call fails the same way: not a transient fault
    expect_damaged(expect_sqlite_error([&] { (void)recorder.is_processed("billing", "event-7"); }),
                   ErrorCode::store_corrupt, path);
    expect_damaged(expect_sqlite_error([&] { recorder.mark_processed("billing", "new"); }),
                   ErrorCode::store_corrupt, path);
  }
}

// ---- read-only ---------------------------------------------------------------------------------

TEST(SqliteReadOnly, ReadOnlyRecorderAndStoreReadButRefuseEveryWrite) {
  TempDir dir;
  const std::string path = dir.file("ro.db");
  {
    idem::sqlite::SqliteIdempotencyRecorder writer(path);
    writer.mark_processed("billing", "old");
    idem::sqlite::SqliteIdempotencyStore store(path);
    const auto claim = store.claim("k", std::nullopt, 30s);
    ASSERT_TRUE(store.complete("k", claim.token, bytes_value("v"), idem::ExecutionReport{}, 1h));
  }
  idem::sqlite::SqliteOptions options = fast_options();
  options.read_only = true;
  idem::sqlite::SqliteIdempotencyRecorder recorder(path, options);
  EXPECT_TRUE(recorder.is_processed("billing", "old"));
  for (int i = 0; i < 2; ++i) {  // twice: a refused write leaves the connection usable
    const SqliteError mark =
        expect_sqlite_error([&] { recorder.mark_processed("billing", "new"); });
    EXPECT_EQ(mark.code(), ErrorCode::store_read_only) << mark.what();
    EXPECT_FALSE(mark.retryable());
    EXPECT_FALSE(mark.in_doubt());
    const SqliteError claim =
        expect_sqlite_error([&] { (void)recorder.claim("billing", "new", 30s); });
    EXPECT_EQ(claim.code(), ErrorCode::store_read_only) << claim.what();
  }
  EXPECT_FALSE(recorder.is_processed("billing", "new"));

  idem::sqlite::SqliteIdempotencyStore store(path, options);
  const auto record = store.lookup("k");
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->value.bytes, "v");
  const SqliteError claim =
      expect_sqlite_error([&] { (void)store.claim("k2", std::nullopt, 30s); });
  EXPECT_EQ(claim.code(), ErrorCode::store_read_only) << claim.what();
  EXPECT_FALSE(store.lookup("k2").has_value());
}

// What a recorder does with a database file it may read but not write: reads work, a write is
// refused as store_read_only (or the open as store_open_failed); never a crash or a silent
// success. Returns what went wrong, "" if nothing. No gtest macros: it also runs in a child.
std::string check_write_protected_file(const std::string& path) {
  const auto classified = [](const SqliteError& e) {
    return e.code() == ErrorCode::store_read_only || e.code() == ErrorCode::store_open_failed;
  };
  try {
    idem::sqlite::SqliteIdempotencyRecorder recorder(path, fast_options());
    if (!recorder.is_processed("billing", "old")) return "the old marker is not read back";
    try {
      recorder.mark_processed("billing", "new");
    } catch (const SqliteError& e) {
      return classified(e) ? "" : std::string("mark refused as: ") + e.what();
    }
    return "mark_processed on a write-protected file did not throw";
  } catch (const SqliteError& e) {
    // Refused at open (or at the first read) is fine too, as long as it is classified.
    return classified(e) ? "" : std::string("open refused as: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("not a SqliteError: ") + e.what();
  }
}

TEST(SqliteReadOnly, WriteProtectedFileIsRefusedAsReadOnly) {
  TempDir dir;
  const std::string path = dir.file("chmod.db");
  {
    idem::sqlite::SqliteIdempotencyRecorder writer(path);
    writer.mark_processed("billing", "old");
  }
  namespace fs = std::filesystem;
  fs::permissions(path, fs::perms::owner_read | fs::perms::group_read | fs::perms::others_read);
  if (::geteuid() != 0) {
    EXPECT_EQ(check_write_protected_file(path), "");
    return;
  }
  // Root ignores file permissions, so the check runs in a child that has given up root (to
  // "nobody"). The directory lets it create the -wal and -shm files; the database stays
  // read-only to it.
  fs::permissions(dir.path(), fs::perms::all);
  idem::test::ForkedChild child([&path] {
    constexpr uid_t kNobody = 65534;
    if (::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)
      return std::string("cannot become nobody");
    return check_write_protected_file(path);
  });
  const idem::test::ForkedChild::End end = child.wait();
  EXPECT_EQ(end.problem(), "");
  // And the file is unchanged: no marker written behind the refusal.
  idem::sqlite::SqliteIdempotencyRecorder reader(path);
  EXPECT_FALSE(reader.is_processed("billing", "new"));
}

// ---- locked past the busy timeout --------------------------------------------------------------

TEST(SqliteLocked, WriterLockedPastBusyTimeoutIsRetryableBusyThenSucceeds) {
  TempDir dir;
  const std::string path = dir.file("locked.db");
  idem::sqlite::SqliteIdempotencyRecorder recorder(path, fast_options());
  idem::sqlite::SqliteIdempotencyStore store(path, fast_options());
  recorder.mark_processed("billing", "before");
  const auto held = store.claim("held", std::nullopt, 30s);
  ASSERT_EQ(held.status, idem::ClaimOutcome::Status::acquired);
  {
    RawDb other(path);
    other.exec("BEGIN EXCLUSIVE");
    for (const SqliteError& e :
         {expect_sqlite_error([&] { recorder.mark_processed("billing", "e1"); }),
          expect_sqlite_error([&] { (void)recorder.claim("billing", "e2", 30s); }),
          expect_sqlite_error([&] { (void)store.claim("fresh", std::nullopt, 30s); }),
          expect_sqlite_error([&] {
            (void)store.complete("held", held.token, bytes_value("1"), idem::ExecutionReport{}, 1h);
          })}) {
      EXPECT_EQ(e.code(), ErrorCode::store_busy) << e.what();
      EXPECT_TRUE(e.retryable()) << e.what();
      EXPECT_FALSE(e.in_doubt()) << e.what();
      EXPECT_EQ(e.sqlite_code(), SQLITE_BUSY) << e.what();
    }
    // WAL: readers are not blocked by the writer's lock.
    EXPECT_TRUE(recorder.is_processed("billing", "before"));
    EXPECT_FALSE(recorder.is_processed("billing", "e1"));
    other.exec("COMMIT");
  }
  recorder.mark_processed("billing", "e1");
  EXPECT_TRUE(recorder.is_processed("billing", "e1"));
  EXPECT_EQ(recorder.claim("billing", "e2", 30s).status, idem::Claim::Status::acquired);
  EXPECT_EQ(store.claim("fresh", std::nullopt, 30s).status, idem::ClaimOutcome::Status::acquired);
  EXPECT_TRUE(store.complete("held", held.token, bytes_value("1"), idem::ExecutionReport{}, 1h));
}

}  // namespace
