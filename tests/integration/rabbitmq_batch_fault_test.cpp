// Publisher::publish_batch against a live broker: empty and single-event batches, a large batch
// consumed exactly once, whole-batch validation before anything is sent, and a broker stopped
// while batches are in flight (PublishBatchError, then re-publishing every batch is safe because
// an IdempotentHandler drops what was already delivered).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <latch>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "rabbitmq_names.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::rabbitmq_names;

std::vector<Event> make_events(std::size_t count, const std::string& prefix = "") {
  std::vector<Event> events;
  events.reserve(count);
  for (std::size_t i = 0; i < count; ++i)
    events.push_back(Event::make("order.created", prefix + std::to_string(i)));
  return events;
}

class RabbitMqBatchTest : public idem::test::RabbitMqTopologyTest {};

TEST_F(RabbitMqBatchTest, AnEmptyBatchSendsNothingAndReturnsZero) {
  auto publisher = topology_publisher();
  EXPECT_EQ(publisher.publish_batch({}), 0u);
  EXPECT_EQ(publisher.stats().published, 0u);
  EXPECT_EQ(publisher.stats().failed, 0u);
}

TEST_F(RabbitMqBatchTest, BatchesOfOneAndOfFiveThousandAreEachConsumedOnce) {
  auto options = topology_.consumer_options("batch");
  options.prefetch = 64;
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  const auto one = make_events(1, "one-");
  const auto many = make_events(5000, "many-");
  EXPECT_EQ(publisher.publish_batch(one), 1u);
  EXPECT_EQ(publisher.publish_batch(many), 5000u);
  EXPECT_EQ(publisher.stats().published, 5001u);

  SideEffects effects;
  FnHandler handler(options.consumer_name, [&](const Event& event, BusProxy&) {
    effects.record(event.id);
    return HandleResult::processed;
  });
  ASSERT_TRUE(
      idem::test::consume_until(consumer, handler, [&] { return effects.distinct() >= 5001; }));
  const auto counts = effects.counts();
  EXPECT_EQ(counts.size(), 5001u);
  EXPECT_EQ(counts.count(one[0].id), 1u);
  for (const Event& event : many)
    EXPECT_EQ(counts.count(event.id), 1u);
  // No plain handler ran twice: the broker delivered each confirmed message once.
  EXPECT_TRUE(effects.doubled().empty());
}

TEST_F(RabbitMqBatchTest, AnInvalidEventAnywhereInTheBatchSendsNothing) {
  auto options = topology_.consumer_options("invalid");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  auto bad_id = make_events(10, "bad-id-");
  bad_id[5].id = "";  // not a valid key
  try {
    publisher.publish_batch(bad_id);
    FAIL() << "an empty id was accepted";
  } catch (const idem::InvalidKey& e) {
    EXPECT_NE(std::string(e.what()).find("event 5 of 10"), std::string::npos) << e.what();
  }
  auto bad_type = make_events(10, "bad-type-");
  bad_type[9].type.clear();
  EXPECT_THROW(publisher.publish_batch(bad_type), idem::InvalidArgument);
  auto long_type = make_events(3, "long-type-");
  long_type[1].type.assign(256, 't');
  EXPECT_THROW(publisher.publish_batch(long_type), idem::InvalidArgument);
  EXPECT_EQ(publisher.stats().published, 0u);

  // A sentinel published after the rejected batches: once it is consumed, anything the rejected
  // batches had sent would have been consumed before it (one connection, one queue, in order).
  const auto sentinel = make_events(1, "sentinel-");
  ASSERT_EQ(publisher.publish_batch(sentinel), 1u);
  SideEffects effects;
  FnHandler handler(options.consumer_name, [&](const Event& event, BusProxy&) {
    effects.record(event.id);
    return HandleResult::processed;
  });
  ASSERT_TRUE(idem::test::consume_until(
      consumer, handler, [&] { return effects.counts().count(sentinel[0].id) > 0; }));
  EXPECT_EQ(effects.distinct(), 1u);
}

using idem::test::broker_command;
using idem::test::BrokerGuard;
using idem::test::rabbitmqctl;

TEST_F(RabbitMqBatchTest, ABrokerStoppedMidBatchThrowsAndRepublishingEveryBatchDeliversEachOnce) {
  if (rabbitmqctl().empty()) IDEM_SERVER_MISSING("IDEM_TEST_RABBITMQCTL is not set");
  auto options = topology_.consumer_options("stop");
  options.prefetch = 64;
  (void)connected_consumer(options);  // declares the queue
  auto publisher = topology_publisher();

  // The publishing thread publishes batch after batch until one fails; the test thread stops the
  // broker once the first batch is confirmed, so a later batch fails — while in flight, or at its
  // reconnect. kMaxBatches only bounds a broken build.
  constexpr std::size_t kBatchSize = 500;
  constexpr std::size_t kMaxBatches = 2000;
  std::vector<std::vector<Event>> batches;  // every batch tried, the failed one last
  std::latch first_confirmed(1);
  std::atomic<bool> failed{false};
  std::string failure;
  bool failure_in_doubt = false;
  std::size_t failure_confirmed = 0;
  std::thread publishing([&] {
    for (std::size_t b = 0; b < kMaxBatches; ++b) {
      batches.push_back(make_events(kBatchSize, std::to_string(b) + "-"));
      try {
        publisher.publish_batch(batches.back());
      } catch (const idem::rabbitmq::PublishBatchError& e) {
        failure = e.what();
        failure_in_doubt = e.in_doubt();
        failure_confirmed = e.confirmed();
        failed = true;
        break;
      } catch (const idem::rabbitmq::BrokerError& e) {
        failure = std::string("not a PublishBatchError: ") + e.what();
        failed = true;
        break;
      }
      if (b == 0) first_confirmed.count_down();
    }
    if (!failed) first_confirmed.count_down();
  });
  BrokerGuard guard;
  first_confirmed.wait();
  guard.stopped = broker_command("stop_app");
  publishing.join();
  ASSERT_TRUE(guard.stopped);
  ASSERT_TRUE(failed.load()) << "no batch failed while the broker was stopped";
  EXPECT_EQ(failure.find("not a PublishBatchError"), std::string::npos) << failure;
  EXPECT_LT(failure_confirmed, kBatchSize);
  // Which way it failed (mid-batch or at the reconnect) depends on the broker's timing.
  std::cout << "publish_batch failure (in_doubt=" << failure_in_doubt << "): " << failure << "\n";
  if (failure_in_doubt) {
    EXPECT_NE(failure.find("in doubt"), std::string::npos) << failure;
  }
  ASSERT_TRUE(broker_command("start_app"));
  guard.stopped = false;

  // Re-publish every batch (the broker may still be recovering its queues: retry, bounded).
  for (const auto& batch : batches) {
    for (int attempt = 1;; ++attempt) {
      try {
        ASSERT_EQ(publisher.publish_batch(batch), kBatchSize);
        break;
      } catch (const idem::rabbitmq::BrokerError& e) {
        ASSERT_TRUE(e.retryable()) << e.what();
        ASSERT_LT(attempt, 200) << e.what();
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // backoff, not sync
      }
    }
  }

  SideEffects effects;
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto handler = idem::make_idempotent_handler(
      options.consumer_name, recorder,
      [&](const std::string&, BusProxy&, const Event& event) { effects.record(event.id); });
  idem::rabbitmq::Consumer consumer(connection_, options);
  const std::size_t total = batches.size() * kBatchSize;
  ASSERT_TRUE(
      idem::test::consume_until(consumer, *handler, [&] { return effects.distinct() >= total; }));
  EXPECT_EQ(effects.distinct(), total);
  EXPECT_TRUE(effects.doubled().empty());
}

}  // namespace
