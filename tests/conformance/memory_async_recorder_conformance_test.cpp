// The async recorder cases (tests/async_recorder_cases.hpp) against AsyncMemoryRecorder, over a
// recorder of its own and over one shared with a blocking user.
#include <memory>

#include "../async_recorder_cases.hpp"
#include "idem/async/memory_recorder.hpp"

namespace {

struct AsyncMemoryFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities{.claims = true,
                                                                   .transactions = false};
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::async::AsyncMemoryRecorder>();
  }
};

struct AsyncMemorySingleShardFactory {
  static constexpr idem::async::RecorderCapabilities kCapabilities{.claims = true,
                                                                   .transactions = false};
  static constexpr int kCoroutines = 200;
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::async::AsyncMemoryRecorder>(
        std::make_shared<idem::InMemoryIdempotencyRecorder>(
            idem::InMemoryRecorderOptions{.shards = 1}));
  }
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CASES(AsyncMemory, AsyncMemoryFactory);
INSTANTIATE_ASYNC_RECORDER_CASES(AsyncMemorySingleShard, AsyncMemorySingleShardFactory);
