// The recorder conformance suite run against InMemoryIdempotencyRecorder, with the default shard
// count and with a single shard (every key contends on one lock).
#include "idem/memory_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"

namespace {

struct MemoryRecorderFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = false;
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyRecorder>(
        idem::InMemoryRecorderOptions{.clock = std::move(clock)});
  }
};

struct SingleShardMemoryRecorderFactory {
  static constexpr bool kSupportsClaims = true;
  static constexpr bool kSupportsTransactions = false;
  static constexpr int kConcurrentIds = 500;
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyRecorder>(
        idem::InMemoryRecorderOptions{.clock = std::move(clock), .shards = 1});
  }
};

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(Memory, MemoryRecorderFactory);
INSTANTIATE_RECORDER_CONFORMANCE(MemorySingleShard, SingleShardMemoryRecorderFactory);
