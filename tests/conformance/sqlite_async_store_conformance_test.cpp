// AsyncSqliteStore, on a file in a fresh temporary directory and with one pool thread: the async
// store suite (idem/testing/async_store_conformance.hpp), and the blocking store suite
// (idem/testing/store_conformance.hpp) through BlockingOverAsyncStore, its operator calls
// answered by the SqliteIdempotencyStore the async store serves (blocking_store()).
#include <memory>
#include <utility>

#include "../temp_dir.hpp"
#include "idem/sqlite/async_store.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/store_conformance.hpp"

namespace {

struct AsyncSqliteStoreFileFactory {
  std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteStore>((dir.path() / "store.db").string());
  }
  idem::test::TempDir dir;
};

struct AsyncSqliteStoreOneThreadFactory {
  static constexpr int kCoroutines = 16;
  std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::sqlite::AsyncSqliteStore>(
        (dir.path() / "store.db").string(), idem::sqlite::SqliteOptions{},
        idem::sqlite::AsyncSqliteOptions{.threads = 1});
  }
  idem::test::TempDir dir;
};

// Threads 0: the default pool.
template <int Threads>
struct BlockingOverAsyncSqliteStoreFactory {
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    idem::sqlite::AsyncSqliteOptions async_options;
    if (Threads > 0) async_options.threads = Threads;
    return std::make_shared<idem::testing::BlockingOverAsyncStore>(
        std::make_shared<idem::sqlite::AsyncSqliteStore>((dir.path() / "store.db").string(),
                                                         options, async_options));
  }
  idem::test::TempDir dir;
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncSqliteStoreFile, AsyncSqliteStoreFileFactory);
INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncSqliteStoreOneThread, AsyncSqliteStoreOneThreadFactory);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncSqliteStoreFile,
                              BlockingOverAsyncSqliteStoreFactory<0>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncSqliteStoreOneThread,
                              BlockingOverAsyncSqliteStoreFactory<1>);
