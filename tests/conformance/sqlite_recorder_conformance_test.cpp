// The recorder conformance suite (idem/testing/recorder_conformance.hpp) against
// SqliteIdempotencyRecorder, on a file in a fresh temporary directory and on ":memory:".
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "../temp_dir.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

namespace {

using idem::test::TempDir;

struct SqliteFileFactory : idem::test::RecorderTraits<true> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(
        (dir.path() / "recorder.db").string(), options);
  }

  TempDir dir;
};

struct SqliteMemoryFactory : idem::test::RecorderTraits<true> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(":memory:", options);
  }
};

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(SqliteFile, SqliteFileFactory);
INSTANTIATE_RECORDER_CONFORMANCE(SqliteMemory, SqliteMemoryFactory);
