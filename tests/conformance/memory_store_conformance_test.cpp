// The store conformance suite, run against InMemoryIdempotencyStore (the reference store) with
// one shard and with many, so both the single-lock and the sharded paths are covered.
#include "idem/memory_store.hpp"
#include "idem/testing/store_conformance.hpp"

namespace {

struct MemoryStoreFactory {
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyStore>(
        idem::InMemoryStoreOptions{.clock = std::move(clock)});
  }
};

struct SingleShardMemoryStoreFactory {
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyStore>(
        idem::InMemoryStoreOptions{.clock = std::move(clock), .shards = 1});
  }
};

// A capacity bound far above what the suite stores must not change any behaviour.
struct BoundedMemoryStoreFactory {
  std::shared_ptr<idem::IdempotencyStore> make(std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyStore>(
        idem::InMemoryStoreOptions{.clock = std::move(clock), .capacity = 100'000});
  }
};

}  // namespace

INSTANTIATE_STORE_CONFORMANCE(Memory, MemoryStoreFactory);
INSTANTIATE_STORE_CONFORMANCE(MemorySingleShard, SingleShardMemoryStoreFactory);
INSTANTIATE_STORE_CONFORMANCE(MemoryBounded, BoundedMemoryStoreFactory);
