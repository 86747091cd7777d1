// AsyncSqliteRecorder, on a file in a fresh temporary directory, on ":memory:", and with one pool
// thread: the async recorder suite (idem/testing/async_recorder_conformance.hpp), and the
// blocking recorder suite (idem/testing/recorder_conformance.hpp) through
// BlockingOverAsyncRecorder, its operator calls answered by the SqliteIdempotencyRecorder the
// async recorder serves (blocking()).
#include <memory>
#include <utility>

#include "../temp_dir.hpp"
#include "idem/sqlite/async_recorder.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"

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

// A file in the factory's directory or ":memory:"; Threads 0: the default pool.
template <bool InMemory, int Threads>
struct BlockingOverAsyncSqliteFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = true;
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    idem::sqlite::AsyncSqliteOptions async_options;
    if (Threads > 0) async_options.threads = Threads;
    auto recorder = std::make_shared<idem::sqlite::AsyncSqliteRecorder>(
        InMemory ? std::string(":memory:") : (dir.path() / "recorder.db").string(), options,
        async_options);
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(recorder,
                                                                      recorder->blocking());
  }
  idem::test::TempDir dir;
};

using BlockingOverAsyncSqliteFileFactory = BlockingOverAsyncSqliteFactory<false, 0>;
using BlockingOverAsyncSqliteMemoryFactory = BlockingOverAsyncSqliteFactory<true, 0>;
using BlockingOverAsyncSqliteOneThreadFactory = BlockingOverAsyncSqliteFactory<false, 1>;

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteFile, AsyncSqliteFileFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteMemory, AsyncSqliteMemoryFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncSqliteOneThread, AsyncSqliteOneThreadFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteFile, BlockingOverAsyncSqliteFileFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteMemory,
                                 BlockingOverAsyncSqliteMemoryFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncSqliteOneThread,
                                 BlockingOverAsyncSqliteOneThreadFactory);
