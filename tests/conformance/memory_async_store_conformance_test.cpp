// AsyncMemoryStore, over a store of its own and over a one-shard store: the async store suite
// (idem/testing/async_store_conformance.hpp), and the blocking store suite
// (idem/testing/store_conformance.hpp) through BlockingOverAsyncStore, its operator calls
// answered by the blocking store it adapts (blocking_store()).
#include <memory>
#include <utility>

#include "idem/async/memory_store.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/async_store_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/store_conformance.hpp"

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

template <std::size_t Shards>
struct BlockingOverAsyncMemoryStoreFactory {
  static std::shared_ptr<idem::IdempotencyStore> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::InMemoryStoreOptions options;
    options.clock = std::move(clock);
    if (Shards > 0) options.shards = Shards;
    return std::make_shared<idem::testing::BlockingOverAsyncStore>(
        std::make_shared<idem::async::AsyncMemoryStore>(
            std::make_shared<idem::InMemoryIdempotencyStore>(options)));
  }
};

}  // namespace

INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncMemoryStore, AsyncMemoryStoreFactory);
INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncMemorySingleShardStore,
                                    AsyncMemorySingleShardStoreFactory);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncMemoryStore, BlockingOverAsyncMemoryStoreFactory<0>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncMemorySingleShardStore,
                              BlockingOverAsyncMemoryStoreFactory<1>);
