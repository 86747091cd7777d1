// Re-entrancy on the coroutine face: an owner's execution that calls its own key again — at once,
// after an await, inside a timed attempt, from a coroutine it spawned, or through another key —
// gets idem::ReentryError instead of joining (and so waiting for) itself. Other keys from inside
// an owner, and other coroutines calling the owner's key while it runs, are not re-entries.
#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "../async_names.hpp"
#include "../async_test_support.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/resilient.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"

namespace {

using namespace idem::test::async_names;

// A re-entry that waited for itself would stop after this, not hang the suite.
constexpr auto kLimit = 10s;

// What the nested call ended with.
enum class Nested { none, reentry, other_error, value };

using Signature = Task<int>(std::string key, int depth);
using Self = std::function<Task<idem::OperationResult<int>>(std::string, int)>;

struct Fixture {
  asio::io_context io;
  std::shared_ptr<idem::async::AsyncMemoryStore> store =
      std::make_shared<idem::async::AsyncMemoryStore>(
          std::make_shared<idem::InMemoryIdempotencyStore>());
  // The operation, for its own body to call again.
  Self self;

  // The operation "op" that runs `body`, keyed by its first argument on `store`, with the rest of
  // `options`; `self` calls it.
  template <class Body>
  idem::async::AsyncResilient<Signature> op(Body body,
                                            idem::async::ResilientOptions<Signature> options = {}) {
    options.name = "op";
    options.idempotency_key = [](const std::string& key, int) { return key; };
    options.idempotency_store = store;
    auto made = idem::async::resilient<Signature>(std::move(body), std::move(options));
    self = [made](std::string key, int depth) { return made(std::move(key), depth); };
    return made;
  }
};

Task<Nested> nested_outcome(const Self& self, std::string key) {
  std::exception_ptr error;
  try {
    (void)co_await self(key, 1);
    co_return Nested::value;
  } catch (...) {
    error = std::current_exception();
  }
  try {
    std::rethrow_exception(error);
  } catch (const idem::ReentryError&) {
    co_return Nested::reentry;
  } catch (const idem::OperationError& e) {
    try {
      std::rethrow_exception(e.cause());
    } catch (const idem::ReentryError&) {
      co_return Nested::reentry;
    } catch (...) {
    }
  } catch (...) {
  }
  co_return Nested::other_error;
}

TEST(AsyncReentry, ANestedCallWithTheOwnersKeyIsAReentryErrorBeforeAndAfterAnAwait) {
  for (const bool await_first : {false, true}) {
    SCOPED_TRACE(await_first ? "after an await" : "before any await");
    Fixture f;
    Nested nested = Nested::none;
    std::atomic<int> executions{0};
    auto op = f.op(
        [&](std::string key, int depth) -> Task<int> {
          ++executions;
          if (depth == 0) {
            if (await_first) co_await nap(1ms);
            nested = co_await nested_outcome(f.self, key);
          }
          co_return depth;
        },
        {.retries = 2});
    const auto result = run(f.io, op("k", 0), kLimit);
    EXPECT_EQ(result.value, 0);
    EXPECT_EQ(nested, Nested::reentry);
    EXPECT_EQ(executions.load(), 1) << "the nested call never ran, nor retried the owner";
  }
}

TEST(AsyncReentry, AReentryFromATimedAttemptOrASpawnedCoroutineIsCaughtToo) {
  for (const bool spawned : {false, true}) {
    SCOPED_TRACE(spawned ? "from a coroutine the owner spawned" : "inside a timed attempt");
    Fixture f;
    Nested nested = Nested::none;
    auto op = f.op(
        [&](std::string key, int depth) -> Task<int> {
          if (depth == 0) {
            co_await nap(1ms);
            if (spawned) {
              const auto executor = co_await asio::this_coro::executor;
              auto child = nested_outcome(f.self, key);
              nested = co_await asio::co_spawn(executor, std::move(child), asio::use_awaitable);
            } else {
              nested = co_await nested_outcome(f.self, key);
            }
          }
          co_return depth;
        },
        {.timeout = 5s});
    EXPECT_EQ(run(f.io, op("k", 0), kLimit).value, 0);
    EXPECT_EQ(nested, Nested::reentry);
  }
}

TEST(AsyncReentry, AReentryThroughAnotherKeyIsCaught) {
  Fixture f;
  Nested nested = Nested::none;
  auto op = f.op([&](std::string key, int depth) -> Task<int> {
    co_await nap(1ms);
    if (key == "a" && depth == 0) {
      // a -> b -> a
      (void)co_await f.self("b", 0);
    } else if (key == "b") {
      nested = co_await nested_outcome(f.self, "a");
    }
    co_return depth;
  });
  EXPECT_EQ(run(f.io, op("a", 0), kLimit).value, 0);
  EXPECT_EQ(nested, Nested::reentry);
}

TEST(AsyncReentry, OtherKeysInsideAnOwnerAndOtherCallersOfItsKeyAreNotReentries) {
  Fixture f;
  Nested inner = Nested::none;
  std::atomic<int> executions{0};
  auto op = f.op([&](std::string key, int depth) -> Task<int> {
    ++executions;
    if (key == "outer") {
      inner = co_await nested_outcome(f.self, "inner");
      co_await nap(20ms);  // an unrelated coroutine calls "outer" meanwhile: it joins
    }
    co_return depth;
  });
  std::optional<std::string> joiner_status;
  auto joiner = [&]() -> Task<void> {
    co_await nap(5ms);
    auto r = co_await op("outer", 7);
    joiner_status = r.report.metadata.at("idempotency_status");
  };
  asio::co_spawn(f.io, joiner(), asio::detached);
  EXPECT_EQ(run(f.io, op("outer", 7), kLimit).value, 7);
  EXPECT_EQ(inner, Nested::value);
  EXPECT_EQ(joiner_status, std::optional<std::string>("joined"));
  EXPECT_EQ(executions.load(), 2) << "outer once, inner once";
}

}  // namespace
