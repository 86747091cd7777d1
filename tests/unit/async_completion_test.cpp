// idem::async::detail::Completion, the one type-erased completion handler under every async
// operation of idem: it posts (or dispatches) once, to the handler's executor (or the fallback),
// keeps that executor's work outstanding meanwhile, moves its arguments (an error is released where
// it is read), clears the cancellation slot before the handler runs, keeps a use_awaitable handler
// inline, and destroys an unposted handler without calling it.
#include <gtest/gtest.h>

#include <asio/async_result.hpp>
#include <asio/bind_cancellation_slot.hpp>
#include <asio/bind_executor.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/strand.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "idem/async/detail/completion.hpp"

namespace {

using idem::async::detail::allows_side_effects;
using idem::async::detail::Completion;

// Counts its copies; moves are free.
struct Counted {
  Counted() = default;
  explicit Counted(int* counter) : copies(counter) {}
  Counted(const Counted& other) : copies(other.copies) {
    if (copies != nullptr) ++*copies;
  }
  Counted(Counted&&) noexcept = default;
  Counted& operator=(const Counted& other) {
    copies = other.copies;
    if (copies != nullptr) ++*copies;
    return *this;
  }
  Counted& operator=(Counted&&) noexcept = default;
  int* copies = nullptr;
};

// An exception whose destruction is seen.
struct Watched : std::runtime_error {
  explicit Watched(std::atomic<bool>* flag) : std::runtime_error("watched"), gone(flag) {}
  Watched(const Watched&) = default;
  ~Watched() override {
    if (gone != nullptr) gone->store(true);
  }
  std::atomic<bool>* gone;
};

TEST(AsyncCompletion, PostsOnceToTheHandlersExecutorNotTheCallers) {
  asio::io_context home;
  asio::io_context other;
  std::thread::id ran_on;
  int calls = 0;
  Completion<void(int)> completion(asio::bind_executor(home, [&](int value) {
    ++calls;
    ran_on = std::this_thread::get_id();
    EXPECT_EQ(value, 7);
  }));
  ASSERT_TRUE(completion);
  // Posted from another thread: it runs only when `home` runs.
  std::thread([&] { completion.post(7); }).join();
  EXPECT_FALSE(completion);
  other.run();
  EXPECT_EQ(calls, 0);
  std::thread runner([&] { home.run(); });
  const std::thread::id runner_id = runner.get_id();
  runner.join();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ran_on, runner_id);
}

TEST(AsyncCompletion, AHandlerWithoutAnExecutorGoesToTheFallback) {
  asio::io_context fallback;
  bool ran = false;
  Completion<void()> completion([&] { ran = true; }, fallback.get_executor());
  completion.post();
  EXPECT_FALSE(ran);
  fallback.run();
  EXPECT_TRUE(ran);
}

TEST(AsyncCompletion, KeepsTheExecutorsWorkOutstandingUntilTheHandlerRan) {
  asio::io_context io;
  std::atomic<bool> ran{false};
  bool ran_when_run_returned = false;
  Completion<void()> completion(asio::bind_executor(io, [&] { ran = true; }));
  // Without the completion's work, run() would return at once: nothing else is queued.
  std::thread runner([&] {
    io.run();
    ran_when_run_returned = ran.load();
  });
  completion.post();
  runner.join();
  EXPECT_TRUE(ran_when_run_returned);
}

TEST(AsyncCompletion, ANotPostedHandlerIsDestroyedUncalledAndItsWorkEnds) {
  asio::io_context io;
  auto owned = std::make_shared<int>(1);
  std::weak_ptr<int> watch = owned;
  bool called = false;
  {
    Completion<void()> completion(
        asio::bind_executor(io, [&called, owned = std::move(owned)] { called = true; }));
    EXPECT_FALSE(watch.expired());
  }
  EXPECT_TRUE(watch.expired());
  io.run();  // returns: no work is left outstanding
  EXPECT_FALSE(called);
}

TEST(AsyncCompletion, MovesItsArgumentsNeverCopies) {
  asio::io_context io;
  int copies = 0;
  Counted received;
  Completion<void(std::exception_ptr, Counted)> completion(asio::bind_executor(
      io, [&](std::exception_ptr, Counted value) { received = std::move(value); }));
  completion.post(nullptr, Counted(&copies));
  io.run();
  EXPECT_EQ(received.copies, &copies);
  EXPECT_EQ(copies, 0);
}

TEST(AsyncCompletion, TheErrorsLastReferenceIsTheHandlers) {
  // The hazard two backends fixed: an error copied into the posted handler while the party that
  // completed keeps a reference, released later on its own thread (a ThreadSanitizer report).
  asio::io_context io;
  std::atomic<bool> gone{false};
  bool gone_when_dropped = false;
  Completion<void(std::exception_ptr)> completion(
      asio::bind_executor(io, [&](std::exception_ptr error) {
        error = nullptr;
        gone_when_dropped = gone.load();
      }));
  completion.post(std::make_exception_ptr(Watched(&gone)));
  io.run();
  EXPECT_TRUE(gone_when_dropped);
}

TEST(AsyncCompletion, TheSlotIsClearedBeforeTheHandlerRuns) {
  asio::io_context io;
  asio::cancellation_signal signal;
  bool slot_had_handler = true;
  Completion<void()> completion(asio::bind_cancellation_slot(
      signal.slot(),
      asio::bind_executor(io, [&] { slot_had_handler = signal.slot().has_handler(); })));
  auto slot = completion.slot();
  ASSERT_TRUE(slot.is_connected());
  slot.assign([](asio::cancellation_type) {});  // what an operation installs
  ASSERT_TRUE(signal.slot().has_handler());
  completion.post();
  io.run();
  EXPECT_FALSE(slot_had_handler);
}

TEST(AsyncCompletion, DispatchRunsTheHandlerAtOnceOnlyOnAThreadThatRunsItsExecutor) {
  asio::io_context io;
  asio::cancellation_signal signal;
  int calls = 0;
  bool slot_had_handler = true;
  auto handler = [&](int value) {
    ++calls;
    slot_had_handler = signal.slot().has_handler();
    EXPECT_EQ(value, 7);
  };
  // From a thread that does not run `io`: posted, like post().
  Completion<void(int)> elsewhere(asio::bind_executor(io, handler));
  elsewhere.dispatch(7);
  EXPECT_FALSE(elsewhere);
  EXPECT_EQ(calls, 0);
  io.run();
  EXPECT_EQ(calls, 1);
  // From a handler that `io` runs: before dispatch() returns, its slot cleared first.
  Completion<void(int)> here(
      asio::bind_cancellation_slot(signal.slot(), asio::bind_executor(io, handler)));
  here.slot().assign([](asio::cancellation_type) {});
  int calls_when_returned = 0;
  asio::post(io, [&] {
    here.dispatch(7);
    calls_when_returned = calls;
  });
  io.restart();
  io.run();
  EXPECT_EQ(calls_when_returned, 2);
  EXPECT_FALSE(slot_had_handler);
}

TEST(AsyncCompletion, APostFromTheContextsOwnThreadRunsAfterTheCurrentHandler) {
  asio::io_context io;
  std::vector<int> order;
  Completion<void(int)> completion(
      asio::bind_executor(io, [&](int value) { order.push_back(value); }));
  asio::post(io, [&] {
    completion.post(2);  // deferred: a continuation of this handler, never run inside it
    order.push_back(1);
  });
  io.run();
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

TEST(AsyncCompletion, DispatchThroughAStrandRunsAtOnceWhenTheStrandIsFree) {
  asio::io_context io;
  auto strand = asio::make_strand(io);
  int calls = 0;
  int calls_when_returned = -1;
  Completion<void()> completion(asio::bind_executor(strand, [&] { ++calls; }));
  asio::post(io, [&] {  // on io's thread, outside the strand
    completion.dispatch();
    calls_when_returned = calls;
  });
  io.run();
  EXPECT_EQ(calls_when_returned, 1);
}

// The handler's owner may stop and destroy its context as soon as the handler has run (as the
// blocking-over-async adapters do). A completion posted from another thread must be done with
// the context by then, work included; ASan reports the use after free this repeats for.
TEST(AsyncCompletion, APostFromAnotherThreadIsDoneWithTheContextWhenTheHandlerRuns) {
  for (int round = 0; round < 1000; ++round) {
    auto io = std::make_unique<asio::io_context>();
    auto guard = asio::make_work_guard(*io);
    std::thread runner([&io] { io->run(); });
    std::mutex mutex;
    std::condition_variable ran_cv;
    bool ran = false;
    Completion<void(int)> completion(
        [&](int) {
          std::lock_guard lock(mutex);
          ran = true;
          ran_cv.notify_all();
        },
        io->get_executor());
    std::thread worker([completion = std::move(completion)]() mutable { completion.post(1); });
    {
      std::unique_lock lock(mutex);
      ran_cv.wait(lock, [&] { return ran; });
    }
    guard.reset();
    io->stop();
    runner.join();
    io.reset();
    worker.join();
  }
}

TEST(AsyncCompletion, MovingACompletionMovesItsHandlerInlineOrOnTheHeap) {
  asio::io_context io;
  std::string small_seen;
  std::string large_seen;
  Completion<void(std::string)> small(
      asio::bind_executor(io, [&](std::string s) { small_seen = std::move(s); }));
  struct Large {
    char bulk[256] = {};
    std::string* seen;
    void operator()(std::string s) const { *seen = "large:" + s; }
  };
  Completion<void(std::string)> large(asio::bind_executor(io, Large{{}, &large_seen}));
  static_assert(!Completion<void(std::string)>::fits_inline<Large>());
  Completion<void(std::string)> moved_small = std::move(small);
  Completion<void(std::string)> moved_large;
  moved_large = std::move(large);
  EXPECT_FALSE(small);
  EXPECT_FALSE(large);
  moved_small.post("a");
  moved_large.post("b");
  io.run();
  EXPECT_EQ(small_seen, "a");
  EXPECT_EQ(large_seen, "large:b");
}

TEST(AsyncCompletion, AnAwaitingCoroutinesHandlerIsKeptInline) {
  asio::io_context io;
  bool inline_storage = false;
  int value = 0;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        value = co_await asio::async_initiate<const asio::use_awaitable_t<>&, void(int)>(
            [&](auto handler) {
              inline_storage = Completion<void(int)>::fits_inline<decltype(handler)>() &&
                               Completion<void(std::exception_ptr, std::string),
                                          72>::fits_inline<decltype(handler)>();
              Completion<void(int)> completion(std::move(handler));
              completion.post(42);
            },
            asio::use_awaitable);
      },
      asio::detached);
  io.run();
  EXPECT_TRUE(inline_storage);
  EXPECT_EQ(value, 42);
}

TEST(AsyncCompletion, CancellationTypesThatAcceptSideEffects) {
  EXPECT_TRUE(allows_side_effects(asio::cancellation_type::terminal));
  EXPECT_TRUE(allows_side_effects(asio::cancellation_type::partial));
  EXPECT_TRUE(allows_side_effects(asio::cancellation_type::all));
  EXPECT_FALSE(allows_side_effects(asio::cancellation_type::total));
  EXPECT_FALSE(allows_side_effects(asio::cancellation_type::none));
}

}  // namespace
