// AsyncRedisStore::wait() is woken by the owner's completion, not by polling, as the blocking
// store's is (redis_wait_test.cpp): the waiter subscribes on a connection of its own (SUBSCRIBE;
// SSUBSCRIBE on the node of the record's slot on a cluster) before it reads the record, and
// complete(), release() and remove() publish to the record's channel. Two stores on one server
// stand for two processes; the waiter's coroutines run on an io_context thread of their own.
// What is asserted is behaviour: the waiter is subscribed while it waits (PUBSUB NUMSUB /
// SHARDNUMSUB), returns what ended the claim after reading the record no more than twice (a
// poll would read it again and again), lets go of its subscription, and still returns when the
// owner dies silently (its lease ends), when the caller stops or cancels it, and when a
// coroutine caller of idem::async::resilient waits for a key another process holds.
#include <gtest/gtest.h>

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <chrono>
#include <future>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <vector>

#include "idem/async/resilient.hpp"
#include "idem/event.hpp"
#include "idem/operation_idempotency.hpp"
#include "idem/redis/async_redis_store.hpp"
#include "idem/redis/redis_store.hpp"
#include "redis_async_names.hpp"
#include "redis_nodes_env.hpp"
#include "redis_test_env.hpp"
#include "redis_wait_cases.hpp"

IDEM_REDIS_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::redis_async_names;
using idem::test::redis_nodes::ask;
using idem::test::redis_nodes::poll_until;
using idem::test::redis_nodes::subscribers;
using Clock = std::chrono::steady_clock;
namespace wait_cases = idem::test::redis_wait;

// How `task` ended, decided on the I/O thread: an exception thrown there is not caught on the
// test's thread (its object would be released by either thread, which ThreadSanitizer cannot
// see ordered inside libstdc++).
template <class T>
idem::async::Task<std::string> ending_of(idem::async::Task<T> task) {
  try {
    (void)co_await std::move(task);
    co_return "returned";
  } catch (const asio::system_error& e) {
    co_return e.code() == asio::error::operation_aborted ? "aborted" : e.what();
  } catch (const idem::redis::RedisError&) {
    co_return "RedisError";
  } catch (const idem::InvalidKey&) {
    co_return "InvalidKey";
  } catch (const idem::InvalidArgument&) {
    co_return "InvalidArgument";
  } catch (const std::exception& e) {
    co_return e.what();
  }
}

class RedisAsyncWait : public ::testing::Test {
 protected:
  void SetUp() override {
    runner_ = std::thread([this] { io_.run(); });
  }
  void TearDown() override {
    waiter_.reset();  // before its executor stops
    work_.reset();
    io_.stop();
    runner_.join();
  }

  AsyncRedisStore& waiter(const RedisOptions& options) {
    waiter_ = std::make_shared<AsyncRedisStore>(io_.get_executor(), options);
    return *waiter_;
  }
  // The coroutine owns the key: the store's calls take views.
  static idem::async::Task<wait_cases::Waited> owned_wait(std::shared_ptr<AsyncRedisStore> store,
                                                          std::string key,
                                                          Clock::time_point deadline,
                                                          std::stop_token stop) {
    co_return co_await store->wait(key, deadline, std::move(stop));
  }
  std::future<wait_cases::Waited> wait(const std::string& key, std::chrono::seconds limit,
                                       std::stop_token stop = {}) {
    return asio::co_spawn(io_, owned_wait(waiter_, key, Clock::now() + limit, std::move(stop)),
                          asio::use_future);
  }
  wait_cases::StartWait waits() {
    return [this](const std::string& key, std::chrono::seconds limit, std::stop_token stop) {
      return wait(key, limit, std::move(stop));
    };
  }
  template <class T>
  std::string ending(idem::async::Task<T> task) {
    return asio::co_spawn(io_, ending_of(std::move(task)), asio::use_future).get();
  }
  std::string channel(const std::string& key) const { return wait_cases::done_channel(keys, key); }
  int port() const { return keys.options().port; }
  // The record reads (GET) the waiter's pool has sent so far.
  std::uint64_t reads() const { return waiter_->pool()->stats().commands; }

  idem::test::RedisTestPrefix keys{"await"};
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_{io_.get_executor()};
  std::thread runner_;
  std::shared_ptr<AsyncRedisStore> waiter_;
};

TEST_F(RedisAsyncWait, AWaiterIsWokenByTheCompletionInAnotherProcess) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  wait_cases::expect_completion_wakes(
      owner, keys, waits(),
      [&] {
        // Subscribed, it read the record once and waits: it does not poll.
        std::this_thread::sleep_for(300ms);
        EXPECT_EQ(reads(), 1u) << "the waiter polled while subscribed";
      },
      [&] { EXPECT_EQ(reads(), 2u) << "one read before the wait, one after the message"; });
}

TEST_F(RedisAsyncWait, AReleaseOrARemoveWakesItToo) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  wait_cases::expect_release_and_remove_wake(owner, keys, waits());
}

TEST_F(RedisAsyncWait, AbsentAndCompletedKeysReturnAtOnce) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  auto absent = wait("absent", 30s);
  ASSERT_EQ(absent.wait_for(10s), std::future_status::ready);
  EXPECT_FALSE(absent.get().has_value());
  const auto claim = owner.claim("done", std::nullopt, 60s);
  ASSERT_TRUE(owner.complete("done", claim.token, wait_cases::bytes("v"), {}, 60s));
  auto done = wait("done", 30s);
  ASSERT_EQ(done.wait_for(10s), std::future_status::ready);
  const auto record = done.get();
  ASSERT_TRUE(record.has_value());
  EXPECT_EQ(record->state, IdempotencyRecord::State::completed);
  EXPECT_EQ(ending(owned_wait(waiter_, "", Clock::now() + 1s, {})), "InvalidKey");
}

// An owner that dies publishes nothing: the waiter looks again when the lease ends.
TEST_F(RedisAsyncWait, ASilentOwnerIsNoticedWhenItsLeaseEnds) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  wait_cases::expect_silent_owner_noticed(owner, waits());
}

TEST_F(RedisAsyncWait, AStoppedOrCancelledWaiterEndsAndLetsGo) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  wait_cases::expect_stopped_waiter_returns(owner, keys, waits());
  if (HasFatalFailure()) return;

  asio::cancellation_signal cancel;
  auto cancelled =
      asio::co_spawn(io_, ending_of(owned_wait(waiter_, "held", Clock::now() + 30s, {})),
                     asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  ASSERT_TRUE(poll_until([&] { return subscribers(port(), channel("held"), false) == 1; }));
  asio::post(io_, [&] { cancel.emit(asio::cancellation_type::terminal); });
  ASSERT_EQ(cancelled.wait_for(10s), std::future_status::ready) << "cancel did not end the wait";
  const std::string ended = cancelled.get();
  // Returning what it saw is as good as operation_aborted.
  EXPECT_TRUE(ended == "aborted" || ended == "returned") << ended;
  EXPECT_TRUE(poll_until([&] { return subscribers(port(), channel("held"), false) == 0; }))
      << "the cancelled waiter kept its subscription";
}

// idem::async::resilient waits through the store: a coroutine caller of a key that a blocking
// caller in another process holds replays that caller's result as soon as it is stored, and never
// runs the function itself.
TEST_F(RedisAsyncWait, AResilientCoroutineJoinsAnotherProcessesExecution) {
  RedisIdempotencyStore owner(keys.options());
  waiter(keys.options());
  std::atomic<int> calls{0};
  auto charge = idem::async::resilient(
      [&calls](std::string order) -> idem::async::Task<std::string> {
        calls.fetch_add(1);
        co_return "receipt-" + order;
      },
      {.name = "charge",
       .idempotency_key = [](const std::string& order) { return order; },
       .idempotency_store = waiter_,
       .idempotency_max_wait = idem::Millis(60'000)});
  const std::string stored = idem::scoped_idempotency_key("charge", "order-7");
  const auto claim = owner.claim(stored, std::nullopt, 60s);
  ASSERT_EQ(claim.status, idem::ClaimOutcome::Status::acquired);
  auto joined = asio::co_spawn(io_, charge("order-7"), asio::use_future);
  ASSERT_TRUE(poll_until([&] { return subscribers(port(), channel(stored), false) == 1; }))
      << "the coroutine caller does not wait through the store's subscription";
  // The owner stores its result as the blocking face does (the value encoded by the codec).
  auto codec = idem::Codec<std::string>{};
  idem::StoredValue value = wait_cases::bytes(codec.encode(std::string("receipt-from-owner")));
  ASSERT_TRUE(owner.complete(stored, claim.token, std::move(value), {}, 60s));
  ASSERT_EQ(joined.wait_for(10s), std::future_status::ready) << "the completion did not wake it";
  const auto result = joined.get();
  EXPECT_EQ(result.value, "receipt-from-owner");
  EXPECT_EQ(calls.load(), 0) << "the joiner ran the function itself";
}

// ---- AsyncConnection::subscribe() / next_message(), which the wait stands on ------------------

idem::async::Task<std::vector<std::string>> three_messages(idem::redis::AsyncConnection& c) {
  std::vector<std::string> payloads;
  for (int i = 0; i < 3; ++i) {
    auto message = co_await c.next_message(Clock::now() + 10s);
    payloads.push_back(message && message->elements.size() == 3 ? message->elements[2].str
                                                                : std::string("(none)"));
  }
  co_return payloads;
}

idem::async::Task<std::optional<idem::redis::RedisReply>> next_message(
    idem::redis::AsyncConnection& c, std::chrono::milliseconds within) {
  co_return co_await c.next_message(Clock::now() + within);
}

TEST_F(RedisAsyncWait, ASubscriberKeepsMessagesAndCancellingLosesNone) {
  waiter(keys.options());
  auto subscriber = waiter_->pool()->open_dedicated();
  auto unsubscribed = waiter_->pool()->open_dedicated();
  const std::string topic = keys.prefix() + "topic";
  EXPECT_EQ(ending(next_message(*unsubscribed, 10ms)), "InvalidArgument");
  const auto confirmed = asio::co_spawn(io_, subscriber->subscribe(topic), asio::use_future).get();
  ASSERT_FALSE(confirmed.is_error()) << confirmed.str;
  ASSERT_EQ(confirmed.elements.size(), 3u);
  EXPECT_EQ(confirmed.elements[0].str, "subscribe");
  // Published while nobody listens: kept, and handed out in order.
  for (const char* payload : {"one", "two", "three"})
    ASSERT_TRUE(ask(port(), {"PUBLISH", topic, payload}).has_value());
  const auto payloads = asio::co_spawn(io_, three_messages(*subscriber), asio::use_future).get();
  EXPECT_EQ(payloads, (std::vector<std::string>{"one", "two", "three"}));
  // Nothing more: the deadline ends the call with nullopt.
  EXPECT_FALSE(
      asio::co_spawn(io_, next_message(*subscriber, 50ms), asio::use_future).get().has_value());
  // A cancelled listener takes no message with it.
  asio::cancellation_signal cancel;
  auto abandoned = asio::co_spawn(io_, ending_of(next_message(*subscriber, 30'000ms)),
                                  asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  asio::post(io_, [&] { cancel.emit(asio::cancellation_type::terminal); });
  EXPECT_EQ(abandoned.get(), "aborted");
  ASSERT_TRUE(ask(port(), {"PUBLISH", topic, "after"}).has_value());
  const auto after =
      asio::co_spawn(io_, next_message(*subscriber, 10'000ms), asio::use_future).get();
  ASSERT_TRUE(after.has_value());
  ASSERT_EQ(after->elements.size(), 3u);
  EXPECT_EQ(after->elements[0].str, "message");
  EXPECT_EQ(after->elements[2].str, "after");
}

TEST_F(RedisAsyncWait, ASubscriptionLostWithItsConnectionIsReported) {
  // The subscriber logs in as a user of its own, so that CLIENT KILL USER drops its connection
  // and no other test's.
  const std::string user = "idem-wait-" + idem::new_event_id().substr(0, 12);
  ASSERT_TRUE(ask(port(), {"ACL", "SETUSER", user, "on", ">secret", "~*", "&*", "+@all"}));
  struct DropUser {
    int port;
    std::string user;
    ~DropUser() { (void)ask(port, {"ACL", "DELUSER", user}); }
  } drop_user{port(), user};
  RedisOptions options = keys.options();
  options.username = user;
  options.password = "secret";
  waiter(options);
  auto subscriber = waiter_->pool()->open_dedicated();
  const std::string topic = keys.prefix() + "lost";
  ASSERT_FALSE(
      asio::co_spawn(io_, subscriber->subscribe(topic), asio::use_future).get().is_error());
  auto listening =
      asio::co_spawn(io_, ending_of(next_message(*subscriber, 30'000ms)), asio::use_future);
  ASSERT_TRUE(poll_until([&] { return subscribers(port(), topic, false) == 1; }));
  ASSERT_TRUE(ask(port(), {"CLIENT", "KILL", "USER", user}).has_value());
  ASSERT_EQ(listening.wait_for(10s), std::future_status::ready) << "the drop went unnoticed";
  EXPECT_EQ(listening.get(), "RedisError");
  // Nothing reconnects a subscription: later calls fail at once.
  EXPECT_EQ(ending(next_message(*subscriber, 30'000ms)), "RedisError");
}

// On a cluster the channel lives on the node of the record's slot (SSUBSCRIBE / SPUBLISH).
TEST_F(RedisAsyncWait, OnAClusterTheWaiterSubscribesOnTheRecordsNode) {
  const auto options = wait_cases::cluster_options(keys);
  if (!options) GTEST_SKIP() << "no IDEM_TEST_REDIS_CLUSTER_URL";
  RedisIdempotencyStore owner(*options);
  waiter(*options);
  wait_cases::expect_cluster_waiter_on_the_records_node(owner, keys, waits());
}

}  // namespace
