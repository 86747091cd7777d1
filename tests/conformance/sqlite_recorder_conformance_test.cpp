// The recorder conformance suite (idem/testing/recorder_conformance.hpp) against
// SqliteIdempotencyRecorder, on a file in a fresh temporary directory and on ":memory:".
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"

namespace {

// A temporary directory per test, removed with the factory (after the recorder).
class TempDir {
 public:
  TempDir() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "idem-sqlite-conformance-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

struct SqliteFileFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = true;

  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(
        (dir.path() / "recorder.db").string(), options);
  }

  TempDir dir;
};

struct SqliteMemoryFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = true;

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
