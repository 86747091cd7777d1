// AsyncMemoryRecorder, over a recorder of its own and over a one-shard recorder: the async
// recorder suite (idem/testing/async_recorder_conformance.hpp), and the blocking recorder suite
// (idem/testing/recorder_conformance.hpp) through BlockingOverAsyncRecorder, its operator calls
// answered by the blocking recorder it wraps; the async suite also through
// idem::async::RecorderWrapper and AsyncCrashingRecorder.
#include <memory>
#include <utility>

#include "idem/async/memory_recorder.hpp"
#include "idem/async/wrapper.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/testing/async_crash_points.hpp"
#include "idem/testing/async_recorder_conformance.hpp"
#include "idem/testing/blocking_over_async.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

namespace {

struct AsyncMemoryFactory : idem::test::AsyncRecorderTraits<false> {
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::async::AsyncMemoryRecorder>();
  }
};

struct AsyncMemorySingleShardFactory : idem::test::AsyncRecorderTraits<false> {
  static constexpr int kCoroutines = 200;
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::async::AsyncMemoryRecorder>(
        std::make_shared<idem::InMemoryIdempotencyRecorder>(
            idem::InMemoryRecorderOptions{.shards = 1}));
  }
};

// Through a RecorderWrapper and a crash decorator whose plan never fires: both forward every
// call, so the suite holds as it does for the recorder they wrap.
struct AsyncMemoryWrappedFactory : idem::test::AsyncRecorderTraits<false> {
  static std::shared_ptr<idem::async::AsyncRecorder> make() {
    return std::make_shared<idem::testing::AsyncCrashingRecorder>(
        std::make_shared<idem::async::RecorderWrapper>(
            std::make_shared<idem::async::AsyncMemoryRecorder>()),
        idem::testing::CrashPlan{});
  }
};

template <std::size_t Shards>
struct BlockingOverAsyncMemoryFactory : idem::test::RecorderTraits<false> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    idem::InMemoryRecorderOptions options;
    options.clock = std::move(clock);
    if (Shards > 0) options.shards = Shards;
    auto blocking = std::make_shared<idem::InMemoryIdempotencyRecorder>(options);
    return std::make_shared<idem::testing::BlockingOverAsyncRecorder>(
        std::make_shared<idem::async::AsyncMemoryRecorder>(blocking), blocking);
  }
};

}  // namespace

INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncMemory, AsyncMemoryFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncMemorySingleShard, AsyncMemorySingleShardFactory);
INSTANTIATE_ASYNC_RECORDER_CONFORMANCE(AsyncMemoryWrapped, AsyncMemoryWrappedFactory);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncMemory, BlockingOverAsyncMemoryFactory<0>);
INSTANTIATE_RECORDER_CONFORMANCE(BlockingOverAsyncMemorySingleShard,
                                 BlockingOverAsyncMemoryFactory<1>);
