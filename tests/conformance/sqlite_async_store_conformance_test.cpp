// The async store cases (tests/async_store_cases.hpp) against AsyncSqliteStore, on a file in a
// fresh temporary directory and with one pool thread.
#include <memory>

#include "../async_store_cases.hpp"
#include "../temp_dir.hpp"
#include "idem/sqlite/async_store.hpp"

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

}  // namespace

INSTANTIATE_ASYNC_STORE_CASES(AsyncSqliteStoreFile, AsyncSqliteStoreFileFactory);
INSTANTIATE_ASYNC_STORE_CASES(AsyncSqliteStoreOneThread, AsyncSqliteStoreOneThreadFactory);
