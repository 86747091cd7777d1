// The async recorder cases (tests/async_recorder_cases.hpp) against AsyncSqliteRecorder, on a
// file in a fresh temporary directory, on ":memory:", and with one pool thread.
#include <memory>

#include "../async_recorder_cases.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/async_recorder.hpp"

namespace {

constexpr idem::async::RecorderCapabilities kAll{.claims = true, .transactions = true};

struct AsyncSqliteFileFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kAll;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        (dir.path() / "recorder.db").string());
  }
  idem::test::TempDir dir;
};

struct AsyncSqliteMemoryFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kAll;
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(":memory:");
  }
};

struct AsyncSqliteOneThreadFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities = kAll;
  static constexpr int kCoroutines = 32;
  std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        (dir.path() / "recorder.db").string(), idem::sqlite::SqliteOptions{},
        idem::sqlite::AsyncSqliteOptions{.threads = 1});
  }
  idem::test::TempDir dir;
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CASES(AsyncSqliteFile, AsyncSqliteFileFactory);
INSTANTIATE_ASYNC_RECORDER_CASES(AsyncSqliteMemory, AsyncSqliteMemoryFactory);
INSTANTIATE_ASYNC_RECORDER_CASES(AsyncSqliteOneThread, AsyncSqliteOneThreadFactory);
