// The async store cases (tests/async_store_cases.hpp) against AsyncMemoryStore, over a store of
// its own and over a one-shard store.
#include <memory>

#include "../async_store_cases.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/memory_store.hpp"

namespace {

struct AsyncMemoryStoreFactory {
  static std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::async::AsyncMemoryStore>();
  }
};

struct AsyncMemorySingleShardStoreFactory {
  static constexpr int kCoroutines = 100;
  static std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::async::AsyncMemoryStore>(
        std::make_shared<idem::InMemoryIdempotencyStore>(idem::InMemoryStoreOptions{.shards = 1}));
  }
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CASES(AsyncMemoryStore, AsyncMemoryStoreFactory);
INSTANTIATE_ASYNC_STORE_CASES(AsyncMemorySingleShardStore, AsyncMemorySingleShardStoreFactory);
