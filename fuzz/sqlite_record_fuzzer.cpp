// Stored records as the SQLite store reads them back: arbitrary column values (any SQLite type,
// any bytes) written straight into idem_records, then read through SqliteIdempotencyStore's
// lookup(), counts() and claim(). A row idem did not write — a corrupted file, another program's
// bug, a hand edit — must give a classified StoreError (store_corrupt_record) or a sensible
// answer, never a crash or a wrong "completed".
#include <sqlite3.h>
#include <unistd.h>

#include <fuzzer/FuzzedDataProvider.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "fuzz_support.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

// One database file per fuzzing process, opened once: the store and a raw connection that writes
// the fuzzed row.
struct Fixture {
  std::string path;
  std::unique_ptr<idem::sqlite::SqliteIdempotencyStore> store;
  sqlite3* raw = nullptr;

  Fixture() {
    const char* dir = std::getenv("TMPDIR");
    path = std::string(dir != nullptr ? dir : "/tmp") + "/idem-fuzz-sqlite-" +
           std::to_string(::getpid()) + ".db";
    ::unlink(path.c_str());
    store = std::make_unique<idem::sqlite::SqliteIdempotencyStore>(path);
    if (sqlite3_open(path.c_str(), &raw) != SQLITE_OK) std::abort();
  }
  ~Fixture() {
    store.reset();
    sqlite3_close(raw);
    ::unlink(path.c_str());
    ::unlink((path + "-wal").c_str());
    ::unlink((path + "-shm").c_str());
  }
};

// Binds a fuzzed value of a fuzzed SQLite type.
void bind_any(FuzzedDataProvider& in, sqlite3_stmt* statement, int index) {
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0:
      sqlite3_bind_null(statement, index);
      break;
    case 1:
      sqlite3_bind_int64(statement, index, in.ConsumeIntegral<std::int64_t>());
      break;
    case 2:
      sqlite3_bind_double(statement, index, in.ConsumeFloatingPoint<double>());
      break;
    case 3: {
      const std::string text = in.ConsumeRandomLengthString(256);
      sqlite3_bind_text(statement, index, text.data(), static_cast<int>(text.size()),
                        SQLITE_TRANSIENT);
      break;
    }
    default: {
      const std::string blob = in.ConsumeRandomLengthString(512);
      sqlite3_bind_blob(statement, index, blob.data(), static_cast<int>(blob.size()),
                        SQLITE_TRANSIENT);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Fixture fixture;
  FuzzedDataProvider in(data, size);

  sqlite3_exec(fixture.raw, "DELETE FROM idem_records", nullptr, nullptr, nullptr);
  sqlite3_stmt* insert = nullptr;
  // The state column has a CHECK constraint; the other columns take anything, as SQLite does.
  const char* sql =
      "INSERT INTO idem_records(key, state, token, fingerprint, lease_until_ms, completed_at_ms,"
      " expires_at_ms, value, report, took_over) VALUES ('k', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";
  if (sqlite3_prepare_v2(fixture.raw, sql, -1, &insert, nullptr) != SQLITE_OK) std::abort();
  sqlite3_bind_text(insert, 1, in.ConsumeBool() ? "completed" : "in_progress", -1, SQLITE_STATIC);
  for (int column = 2; column <= 9; ++column)
    bind_any(in, insert, column);
  const int rc = sqlite3_step(insert);
  sqlite3_finalize(insert);
  if (rc != SQLITE_DONE) return 0;  // a NOT NULL column got NULL: nothing was stored

  using idem::fuzz::expect_only_idem_errors;
  expect_only_idem_errors("lookup", [&] {
    const auto record = fixture.store->lookup("k");
    if (!record) return;
    // A completed record is replayed with its report: one without is corrupt, not completed.
    if (record->state == idem::IdempotencyRecord::State::completed && !record->report) {
      idem::fuzz::fail("a completed record came back without its report");
    }
  });
  expect_only_idem_errors("counts", [&] { (void)fixture.store->counts(); });
  expect_only_idem_errors("entry_count", [&] { (void)fixture.store->entry_count(); });
  expect_only_idem_errors("claim", [&] {
    (void)fixture.store->claim("k", std::nullopt, std::chrono::milliseconds(1000));
  });
  return 0;
}
