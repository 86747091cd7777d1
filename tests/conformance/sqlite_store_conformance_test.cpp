// The store conformance suite (idem/testing/store_conformance.hpp) against SqliteIdempotencyStore:
// on a file in a fresh temporary directory, on ":memory:", and on a file that a
// SqliteIdempotencyRecorder opened first (the store then shares its tables and token counter).
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"
#include "idem/testing/store_conformance.hpp"

namespace {

using idem::test::TempDir;

idem::sqlite::SqliteOptions options_with(std::shared_ptr<idem::testing::ManualClock> clock) {
  idem::sqlite::SqliteOptions options;
  options.clock = std::move(clock);
  return options;
}

struct SqliteStoreFileFactory {
  static constexpr int kRaceKeys = 20;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(
        (dir.path() / "store.db").string(), options_with(std::move(clock)));
  }

  TempDir dir;
};

struct SqliteStoreMemoryFactory {
  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(":memory:",
                                                                  options_with(std::move(clock)));
  }
};

// The recorder creates the file (its tables, the token counter) and keeps it open; the store
// adds its table next to them.
struct SqliteStoreSharedFileFactory {
  static constexpr int kRaceKeys = 10;

  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    const std::string path = (dir.path() / "shared.db").string();
    recorder = std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path, options_with(clock));
    return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path,
                                                                  options_with(std::move(clock)));
  }

  TempDir dir;
  std::shared_ptr<idem::sqlite::SqliteIdempotencyRecorder> recorder;
};

}  // namespace

INSTANTIATE_STORE_CONFORMANCE(SqliteStoreFile, SqliteStoreFileFactory);
INSTANTIATE_STORE_CONFORMANCE(SqliteStoreMemory, SqliteStoreMemoryFactory);
INSTANTIATE_STORE_CONFORMANCE(SqliteStoreSharedFile, SqliteStoreSharedFileFactory);
