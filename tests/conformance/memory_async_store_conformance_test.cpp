// AsyncMemoryStore, over a store of its own and over a one-shard store: the async store suite
// (idem/testing/async_store_conformance.hpp), and the blocking store suite
// (idem/testing/store_conformance.hpp) through BlockingOverAsyncStore, its operator calls
// answered by the blocking store it adapts (blocking_store()); the async suite also through
// idem::async::StoreWrapper and AsyncCrashingStore.
#include <memory>
#include <utility>

#include "idem/async/memory_store.hpp"
#include "idem/async/wrapper.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/async_crash_points.hpp"
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

// Through a StoreWrapper and a crash decorator whose plan never fires: both forward every call,
// so the suite holds as it does for the store they wrap.
struct AsyncMemoryWrappedStoreFactory {
  static std::shared_ptr<idem::async::AsyncStore> make() {
    return std::make_shared<idem::testing::AsyncCrashingStore>(
        std::make_shared<idem::async::StoreWrapper>(
            std::make_shared<idem::async::AsyncMemoryStore>()),
        idem::testing::CrashPlan{});
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
INSTANTIATE_ASYNC_STORE_CONFORMANCE(AsyncMemoryWrappedStore, AsyncMemoryWrappedStoreFactory);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncMemoryStore, BlockingOverAsyncMemoryStoreFactory<0>);
INSTANTIATE_STORE_CONFORMANCE(BlockingOverAsyncMemorySingleShardStore,
                              BlockingOverAsyncMemoryStoreFactory<1>);
