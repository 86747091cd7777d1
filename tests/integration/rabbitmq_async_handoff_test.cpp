// The RabbitMQ hand-off of the coroutine face against the real broker (IDEM_TEST_AMQP_URL), the
// way docs/async.md bridges them: a blocking rabbitmq::Consumer delivers through
// idem::async::on_executor(handler, executor) to an AsyncIdempotentHandler whose coroutines run
// on an io_context of their own thread. Each distinct event is handled once (a republished id is
// acked as a duplicate), the coroutine never runs on the consumer's thread, and a coroutine that
// throws is nacked and redelivered, then handled once.
//
// (Named without "async": the file-name rule would look for an idem::rabbitmq_async target; the
// registration in tests/CMakeLists.txt links idem::async.)
#include <gtest/gtest.h>

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/async/bus.hpp"
#include "idem/async/handler.hpp"
#include "idem/async/memory_recorder.hpp"
#include "idem/event.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_names.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::rabbitmq_names;
using idem::async::Task;

// The coroutines' io_context, run by a thread of its own for the whole test.
class Loop {
 public:
  Loop() : work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~Loop() {
    work_.reset();
    thread_.join();
  }
  asio::any_io_executor executor() { return io_.get_executor(); }
  std::thread::id thread_id() const { return thread_.get_id(); }

 private:
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;
};

class RabbitMqCoroutineHandoff : public idem::test::RabbitMqTopologyTest {};

TEST_F(RabbitMqCoroutineHandoff, EachEventIsHandledOnceOnTheExecutorAndAcked) {
  const auto options = topology_.consumer_options("coro");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  Loop loop;
  const auto consumer_thread = std::this_thread::get_id();
  std::mutex mutex;
  std::map<std::string, int> effects;
  std::atomic<int> off_executor{0};
  const auto loop_thread = loop.thread_id();
  auto recorder = std::make_shared<idem::async::AsyncMemoryRecorder>();
  auto handler = idem::async::make_async_idempotent_handler<std::string>(
      options.consumer_name, recorder,
      [&](const std::string&, idem::BusProxy&, const Event& event) -> Task<void> {
        // A real suspension: the delivery waits for the coroutine, not for the call.
        asio::steady_timer timer(co_await asio::this_coro::executor, 5ms);
        co_await timer.async_wait(asio::use_awaitable);
        if (std::this_thread::get_id() != loop_thread ||
            std::this_thread::get_id() == consumer_thread)
          off_executor.fetch_add(1);
        std::lock_guard lock(mutex);
        ++effects[event.id];
      },
      idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
  auto adapted = idem::async::on_executor(handler, loop.executor());

  std::vector<Event> sent;
  for (int i = 0; i < 5; ++i)
    sent.push_back(Event::make("order.paid", std::to_string(i)));
  for (const auto& event : sent)
    publisher.publish(event);
  publisher.publish(sent[2]);  // the same id again: a redelivery
  ASSERT_TRUE(
      idem::test::consume_until(consumer, *adapted, [&] { return consumer.stats().acked == 6; }));

  std::map<std::string, int> expected;
  for (const auto& event : sent)
    expected[event.id] = 1;
  {
    std::lock_guard lock(mutex);
    EXPECT_EQ(effects, expected);
  }
  EXPECT_EQ(off_executor.load(), 0) << "a coroutine ran off the executor's thread";
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.duplicates, 1u);
  EXPECT_EQ(stats.requeued, 0u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

TEST_F(RabbitMqCoroutineHandoff, AThrowingCoroutineIsNackedRedeliveredAndHandledOnce) {
  const auto options = topology_.consumer_options("coro-flaky");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  Loop loop;
  std::atomic<int> calls{0};
  std::atomic<int> effects{0};
  auto recorder = std::make_shared<idem::async::AsyncMemoryRecorder>();
  auto handler = idem::async::make_async_idempotent_handler<std::string>(
      options.consumer_name, recorder,
      [&](const std::string&) -> Task<void> {
        asio::steady_timer timer(co_await asio::this_coro::executor, 1ms);
        co_await timer.async_wait(asio::use_awaitable);
        if (calls.fetch_add(1) == 0) throw std::runtime_error("flaky dependency");
        effects.fetch_add(1);
      },
      idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
  auto adapted = idem::async::on_executor(handler, loop.executor());

  const Event event = Event::make("order.paid", "{}");
  publisher.publish(event);
  ASSERT_TRUE(
      idem::test::consume_until(consumer, *adapted, [&] { return consumer.stats().acked == 1; }));
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(effects.load(), 1);
  EXPECT_TRUE(recorder->blocking()->is_processed(options.consumer_name, event.id));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.delivered, 2u);
  EXPECT_EQ(stats.requeued, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
}

}  // namespace
