// The names the SQLite backend's unit tests (sqlite_recorder_test.cpp, sqlite_store_test.cpp)
// use, brought in with `using namespace idem::test::sqlite_names;` instead of a list of
// using-declarations in every file, as the integration tests' per-backend names headers do.
#pragma once

#include <chrono>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/sqlite/sqlite_error.hpp"
#include "idem/sqlite/sqlite_options.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/sqlite/sqlite_transaction.hpp"
#include "idem/testing/manual_clock.hpp"
#include "sqlite_raw_db.hpp"
#include "sqlite_test_support.hpp"
#include "temp_dir.hpp"

namespace idem::test::sqlite_names {

using idem::Claim;
using idem::ClaimOutcome;
using idem::ErrorCode;
using idem::IdempotencyRecord;
using idem::sqlite::Durability;
using idem::sqlite::SqliteError;
using idem::sqlite::SqliteIdempotencyRecorder;
using idem::sqlite::SqliteIdempotencyStore;
using idem::sqlite::SqliteOptions;
using idem::sqlite::SqliteTransaction;
using idem::testing::ManualClock;
using namespace std::chrono_literals;

using idem::test::RawDb;
using idem::test::TempDir;

using idem::test::contains;
using idem::test::expect_refused;
using idem::test::expect_refused_unchanged;
using idem::test::file_bytes;
using idem::test::with_clock;

}  // namespace idem::test::sqlite_names
