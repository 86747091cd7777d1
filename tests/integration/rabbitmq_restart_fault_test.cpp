// Broker restart mid-stream. 2000 events are published (half before, half after the restart);
// the consumer runs on its own thread with an idempotent handler. Inside the handler of the
// 300th event — so with that event and up to a prefetch of others delivered but not acked — the
// test thread stops the broker application (`rabbitmqctl stop_app`); the handler then returns
// (its ack goes nowhere) and the broker is started again. The
// consumer must reconnect and resume, the publisher must reconnect on its next publish, and in
// the end every event has run its side effect exactly once: none lost (publisher confirms,
// durable quorum queue, ack after the handler), none doubled (the recorder drops the deliveries
// the broker repeats because their acks were lost).
//
// Named *_fault_test: it restarts the shared broker, so ctest runs it alone.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_names.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::rabbitmq_names;
using idem::test::broker_command;
using idem::test::BrokerGuard;
using idem::test::rabbitmqctl;

// Publishes, retrying retryable failures: right after start_app the broker may still be
// recovering its queues. Bounded; the retries are the publisher's reconnects, no timing.
void publish_with_retries(idem::rabbitmq::Publisher& publisher, const Event& event) {
  for (int attempt = 1;; ++attempt) {
    try {
      publisher.publish(event);
      return;
    } catch (const idem::rabbitmq::BrokerError& e) {
      if (!e.retryable() || attempt >= 200) throw;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));  // backoff, not sync
    }
  }
}

class RabbitMqRestartTest : public idem::test::RabbitMqTopologyTest {};

TEST_F(RabbitMqRestartTest, ConsumerAndPublisherSurviveABrokerRestartWithNothingLostOrDoubled) {
  if (rabbitmqctl().empty()) IDEM_SERVER_MISSING("IDEM_TEST_RABBITMQCTL is not set");
  auto options = topology_.consumer_options("restart");
  options.prefetch = 32;
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  constexpr std::size_t kEvents = 2000;
  constexpr std::size_t kStopAfter = 300;  // distinct events handled before the restart
  std::vector<Event> events;
  for (std::size_t i = 0; i < kEvents; ++i)
    events.push_back(Event::make("order.created", std::to_string(i)));
  for (std::size_t i = 0; i < kEvents / 2; ++i)
    publisher.publish(events[i]);

  idem::test::SideEffects effects;
  std::latch seen_some(1);       // the handler is inside the 300th event
  std::latch broker_stopped(1);  // the test thread has stopped the broker
  std::atomic<bool> signalled{false};
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto handler = idem::make_idempotent_handler(
      options.consumer_name, recorder,
      [&](const std::string&, BusProxy&, const Event& event) {
        effects.record(event.id);
        if (effects.distinct() >= kStopAfter && !signalled.exchange(true)) {
          seen_some.count_down();
          broker_stopped.wait();
        }
      },
      {idem::HandlerMode::exclusive});

  std::atomic<bool> consumer_done{false};
  std::thread consuming([&] {
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    try {
      consumer.run_until(*handler, [&] {
        return effects.distinct() >= kEvents || std::chrono::steady_clock::now() > give_up;
      });
    } catch (const std::exception& e) {
      ADD_FAILURE() << "consumer: " << e.what();
    }
    if (!signalled.exchange(true)) seen_some.count_down();  // never leave the test thread waiting
    consumer_done = true;
  });

  // On a failed assertion below: stop the consumer and join it before anything is destroyed.
  struct Joiner {
    idem::rabbitmq::Consumer& consumer;
    std::thread& thread;
    ~Joiner() {
      consumer.stop();
      if (thread.joinable()) thread.join();
    }
  } joiner{consumer, consuming};

  seen_some.wait();
  BrokerGuard guard;
  const bool stopped = broker_command("stop_app");
  guard.stopped = stopped;
  broker_stopped.count_down();
  ASSERT_TRUE(stopped);
  // While the broker is down a publish fails, retryably, and says so.
  const Event probe = Event::make("order.probe", "while down");
  try {
    publisher.publish(probe);
    ADD_FAILURE() << "published while the broker was stopped";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_TRUE(e.retryable()) << e.what();
    // The broker closed the publisher's connection while stopping (stop_app returns after
    // that); publish() notices before sending, so the probe was never sent: not in doubt.
    EXPECT_FALSE(e.in_doubt()) << e.what();
  }
  ASSERT_TRUE(broker_command("start_app"));
  guard.stopped = false;

  for (std::size_t i = kEvents / 2; i < kEvents; ++i)
    publish_with_retries(publisher, events[i]);
  consuming.join();

  EXPECT_EQ(effects.distinct() - (effects.counts().count(probe.id) != 0 ? 1 : 0), kEvents);
  for (const auto& event : events)
    EXPECT_EQ(effects.counts()[event.id], 1) << "event " << event.payload;
  EXPECT_TRUE(effects.doubled().empty());
  const auto stats = consumer.stats();
  EXPECT_GE(stats.reconnects, 1u);
  // At least the event whose handler spanned the stop came back, and was dropped as processed.
  EXPECT_GE(stats.duplicates, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_GE(publisher.stats().reconnects, 1u);
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.dead_letter_queue()), 0u);
  std::printf(
      "restart: delivered %llu, acked %llu (duplicates %llu), requeued %llu, reconnects %llu\n",
      static_cast<unsigned long long>(stats.delivered),
      static_cast<unsigned long long>(stats.acked),
      static_cast<unsigned long long>(stats.duplicates),
      static_cast<unsigned long long>(stats.requeued),
      static_cast<unsigned long long>(stats.reconnects));
}

}  // namespace
