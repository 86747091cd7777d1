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

#include "../async_test_support.hpp"
#include "idem/async/memory_store.hpp"
#include "idem/async/resilient.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"

namespace {

using namespace std::chrono_literals;
using idem::async::Task;

using idem::test::nap;
using idem::test::run;

// A re-entry that waited for itself would stop after this, not hang the suite.
constexpr auto kLimit = 10s;

// What the nested call ended with.
enum class Nested { none, reentry, other_error, value };

struct Fixture {
  std::shared_ptr<idem::async::AsyncMemoryStore> store =
      std::make_shared<idem::async::AsyncMemoryStore>(
          std::make_shared<idem::InMemoryIdempotencyStore>());
};

using Self = std::function<Task<idem::OperationResult<int>>(std::string, int)>;

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
    asio::io_context io;
    Fixture f;
    Self self;
    Nested nested = Nested::none;
    std::atomic<int> executions{0};
    auto op = idem::async::resilient(
        [&](std::string key, int depth) -> Task<int> {
          ++executions;
          if (depth == 0) {
            if (await_first) co_await nap(1ms);
            nested = co_await nested_outcome(self, key);
          }
          co_return depth;
        },
        {.name = "op",
         .retries = 2,
         .idempotency_key = [](const std::string& key, int) { return key; },
         .idempotency_store = f.store});
    self = [&](std::string key, int depth) { return op(std::move(key), depth); };
    const auto result = run(io, op("k", 0), kLimit);
    EXPECT_EQ(result.value, 0);
    EXPECT_EQ(nested, Nested::reentry);
    EXPECT_EQ(executions.load(), 1) << "the nested call never ran, nor retried the owner";
  }
}

TEST(AsyncReentry, AReentryFromATimedAttemptOrASpawnedCoroutineIsCaughtToo) {
  for (const bool spawned : {false, true}) {
    SCOPED_TRACE(spawned ? "from a coroutine the owner spawned" : "inside a timed attempt");
    asio::io_context io;
    Fixture f;
    Self self;
    Nested nested = Nested::none;
    auto op = idem::async::resilient(
        [&](std::string key, int depth) -> Task<int> {
          if (depth == 0) {
            co_await nap(1ms);
            if (spawned) {
              const auto executor = co_await asio::this_coro::executor;
              auto child = nested_outcome(self, key);
              nested = co_await asio::co_spawn(executor, std::move(child), asio::use_awaitable);
            } else {
              nested = co_await nested_outcome(self, key);
            }
          }
          co_return depth;
        },
        {.name = "op",
         .timeout = 5s,
         .idempotency_key = [](const std::string& key, int) { return key; },
         .idempotency_store = f.store});
    self = [&](std::string key, int depth) { return op(std::move(key), depth); };
    EXPECT_EQ(run(io, op("k", 0), kLimit).value, 0);
    EXPECT_EQ(nested, Nested::reentry);
  }
}

TEST(AsyncReentry, AReentryThroughAnotherKeyIsCaught) {
  asio::io_context io;
  Fixture f;
  Self self;
  Nested nested = Nested::none;
  auto op = idem::async::resilient(
      [&](std::string key, int depth) -> Task<int> {
        co_await nap(1ms);
        if (key == "a" && depth == 0) {
          // a -> b -> a
          (void)co_await self("b", 0);
        } else if (key == "b") {
          nested = co_await nested_outcome(self, "a");
        }
        co_return depth;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& key, int) { return key; },
       .idempotency_store = f.store});
  self = [&](std::string key, int depth) { return op(std::move(key), depth); };
  EXPECT_EQ(run(io, op("a", 0), kLimit).value, 0);
  EXPECT_EQ(nested, Nested::reentry);
}

TEST(AsyncReentry, OtherKeysInsideAnOwnerAndOtherCallersOfItsKeyAreNotReentries) {
  asio::io_context io;
  Fixture f;
  Self self;
  Nested inner = Nested::none;
  std::atomic<int> executions{0};
  auto op = idem::async::resilient(
      [&](std::string key, int depth) -> Task<int> {
        ++executions;
        if (key == "outer") {
          inner = co_await nested_outcome(self, "inner");
          co_await nap(20ms);  // an unrelated coroutine calls "outer" meanwhile: it joins
        }
        co_return depth;
      },
      {.name = "op",
       .idempotency_key = [](const std::string& key, int) { return key; },
       .idempotency_store = f.store});
  self = [&](std::string key, int depth) { return op(std::move(key), depth); };
  std::optional<std::string> joiner_status;
  auto joiner = [&]() -> Task<void> {
    co_await nap(5ms);
    auto r = co_await op("outer", 7);
    joiner_status = r.report.metadata.at("idempotency_status");
  };
  asio::co_spawn(io, joiner(), asio::detached);
  EXPECT_EQ(run(io, op("outer", 7), kLimit).value, 7);
  EXPECT_EQ(inner, Nested::value);
  EXPECT_EQ(joiner_status, std::optional<std::string>("joined"));
  EXPECT_EQ(executions.load(), 2) << "outer once, inner once";
}

}  // namespace
