// idem::rabbitmq against a real broker: events survive the trip, acks come after the handler,
// failures are redelivered and then dead-lettered with a reason, malformed messages never stop
// the consumer, duplicates run their side effect once, fanout gives each consumer name every
// event, follow-ups are published.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/open.hpp"
#include "idem/rabbitmq/admin.hpp"
#include "idem/rabbitmq/broker_error.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/testing/manual_clock.hpp"
#include "rabbitmq_names.hpp"
#include "rabbitmq_test_env.hpp"
#include "rabbitmq_test_handlers.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using namespace idem::test::rabbitmq_names;

// n "order.paid" events whose payloads are "0", "1", ... (their order, for tests that check it).
std::vector<Event> numbered_events(int n) {
  std::vector<Event> events;
  for (int i = 0; i < n; ++i)
    events.push_back(Event::make("order.paid", std::to_string(i)));
  return events;
}

class RabbitMqTransportTest : public idem::test::RabbitMqTopologyTest {};

TEST_F(RabbitMqTransportTest, EveryFieldOfAnEventSurvivesTheTrip) {
  const auto options = topology_.consumer_options("roundtrip");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();

  const Event sent = Event::make("order.created", std::string("bin\0ary\xff\x01\n payload", 19),
                                 {{"trace-id", "abc-123"},
                                  {"empty", ""},
                                  {"utf8", "h\xc3\xa9llo"},
                                  {"nul", std::string("a\0b", 3)}});
  publisher.publish(sent);
  EXPECT_EQ(publisher.stats().published, 1u);

  std::vector<Event> received;
  FnHandler handler(options.consumer_name, [&](const Event& event, BusProxy&) {
    received.push_back(event);
    return HandleResult::processed;
  });
  ASSERT_TRUE(consume_until(consumer, handler, [&] { return received.size() == 1; }));
  const Event& got = received.front();
  EXPECT_EQ(got.id, sent.id);
  EXPECT_EQ(got.type, sent.type);
  EXPECT_EQ(got.payload, sent.payload);
  EXPECT_EQ(got.payload.size(), 19u);
  EXPECT_EQ(got.headers, sent.headers);
  EXPECT_EQ(got.timestamp, std::chrono::floor<std::chrono::seconds>(sent.timestamp));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.delivered, 1u);
  EXPECT_EQ(stats.acked, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  // Acked: nothing is left in the queue, nothing was dead-lettered.
  EXPECT_FALSE(consumer.poll_once(handler, idem::Millis(50)));
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

TEST_F(RabbitMqTransportTest, AHandlerThatThrowsOnceIsRedeliveredAndMarkedOnce) {
  const auto options = topology_.consumer_options("flaky");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  SideEffects effects;
  int calls = 0;
  auto handler =
      idem::make_idempotent_handler(options.consumer_name, recorder,
                                    [&](const std::string&, BusProxy&, const Event& event) {
                                      if (++calls == 1)
                                        throw std::runtime_error("flaky dependency");
                                      effects.record(event.id);
                                    },
                                    {idem::HandlerMode::check_then_mark});

  const Event event = Event::make("order.paid", "{}");
  publisher.publish(event);
  ASSERT_TRUE(consume_until(consumer, *handler, [&] { return consumer.stats().acked == 1; }));
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(effects.counts(), (std::map<std::string, int>{{event.id, 1}}));
  EXPECT_TRUE(recorder->is_processed(options.consumer_name, event.id));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.delivered, 2u);
  EXPECT_EQ(stats.requeued, 1u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.dead_letter_queue()), 0u);
}

TEST_F(RabbitMqTransportTest, AHandlerThatAlwaysThrowsIsDeadLetteredAfterMaxDeliveries) {
  auto options = topology_.consumer_options("broken");
  options.max_deliveries = 3;
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  int calls = 0;
  auto handler =
      idem::make_idempotent_handler(options.consumer_name, recorder, [&](const std::string&) {
        ++calls;
        throw std::runtime_error("payment service down");
      });
  const Event event = Event::make("order.paid", "payload", {{"k", "v"}});
  publisher.publish(event);
  ASSERT_TRUE(
      consume_until(consumer, *handler, [&] { return consumer.stats().dead_lettered == 1; }));
  EXPECT_EQ(calls, 3);
  EXPECT_FALSE(recorder->is_processed(options.consumer_name, event.id));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.requeued, 2u);
  EXPECT_EQ(stats.malformed, 0u);

  const auto letters =
      idem::rabbitmq::take_dead_letters(connection_, consumer.dead_letter_queue(), 10);
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(letters[0].event.id, event.id);
  EXPECT_EQ(letters[0].event.type, event.type);
  EXPECT_EQ(letters[0].event.payload, event.payload);
  EXPECT_EQ(letters[0].event.headers, event.headers);
  EXPECT_EQ(letters[0].reason, "payment service down");
  EXPECT_EQ(letters[0].consumer, options.consumer_name);
  EXPECT_EQ(letters[0].routing_key, "order.paid");
  EXPECT_EQ(letters[0].deliveries, 3);
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

struct Order {
  int n = 0;
};
void to_json(nlohmann::json& j, const Order& o) {
  j = nlohmann::json{{"n", o.n}};
}
void from_json(const nlohmann::json& j, Order& o) {
  j.at("n").get_to(o.n);
}

TEST_F(RabbitMqTransportTest, MalformedMessagesAreDeadLetteredWithAReasonAndConsumingGoesOn) {
  const auto options = topology_.consumer_options("strict");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  SideEffects effects;
  auto handler = idem::make_idempotent_handler<Order>(
      options.consumer_name, std::make_shared<idem::InMemoryIdempotencyRecorder>(),
      [&](const Order&, BusProxy&, const Event& event) { effects.record(event.id); });

  idem::test::publish_raw(topology_.exchange(), "order.raw", std::nullopt, R"({"n":1})");
  idem::test::publish_raw(topology_.exchange(), "order.raw", std::string("bad\x01key"),
                          R"({"n":2})");
  idem::test::publish_raw(topology_.exchange(), "order.raw", std::string("   "), R"({"n":3})");
  const Event undecodable = Event::make("order.created", "this is not json");
  publisher.publish(undecodable);
  const Event good = Event::make("order.created", R"({"n":5})");
  publisher.publish(good);

  ASSERT_TRUE(consume_until(consumer, *handler, [&] {
    return consumer.stats().dead_lettered == 4 && effects.distinct() == 1;
  }));
  EXPECT_EQ(effects.counts(), (std::map<std::string, int>{{good.id, 1}}));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.malformed, 4u);
  EXPECT_EQ(stats.requeued, 0u);  // retrying cannot fix these: dead-lettered at once
  EXPECT_EQ(stats.acked, 1u);

  const auto letters =
      idem::rabbitmq::take_dead_letters(connection_, consumer.dead_letter_queue(), 10);
  ASSERT_EQ(letters.size(), 4u);
  int no_id = 0, bad_id = 0, undecoded = 0;
  for (const auto& letter : letters) {
    EXPECT_EQ(letter.reason.rfind("malformed: ", 0), 0u) << letter.reason;
    EXPECT_EQ(letter.consumer, options.consumer_name);
    if (letter.reason.find("no message_id") != std::string::npos) {
      ++no_id;
      EXPECT_EQ(letter.event.payload, R"({"n":1})");
    } else if (letter.reason.find("not a valid event id") != std::string::npos) {
      ++bad_id;
    } else if (letter.event.id == undecodable.id) {
      ++undecoded;
      EXPECT_EQ(letter.event.payload, "this is not json");
    }
  }
  EXPECT_EQ(no_id, 1);
  EXPECT_EQ(bad_id, 2);
  EXPECT_EQ(undecoded, 1);
}

TEST_F(RabbitMqTransportTest, AlreadyInProgressRequeuesAreNotCountedAsFailures) {
  auto options = topology_.consumer_options("claimed");
  options.max_deliveries = 2;
  options.in_progress_backoff = idem::Millis(0);
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  int calls = 0;
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) {
    if (++calls <= 3) throw idem::AlreadyInProgress("held by another delivery");
    return HandleResult::processed;
  });
  publisher.publish(Event::make("order.created", "x"));
  ASSERT_TRUE(consume_until(consumer, handler, [&] { return consumer.stats().acked == 1; }));
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.in_progress_requeued, 3u);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_EQ(calls, 4);
}

TEST_F(RabbitMqTransportTest, AClaimThatNeverFreesIsDeadLetteredAfterTheRequeueBound) {
  auto options = topology_.consumer_options("stuck");
  options.max_in_progress_requeues = 2;
  options.in_progress_backoff = idem::Millis(0);
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) -> HandleResult {
    throw idem::AlreadyInProgress("held forever");
  });
  publisher.publish(Event::make("order.created", "x"));
  ASSERT_TRUE(
      consume_until(consumer, handler, [&] { return consumer.stats().dead_lettered == 1; }));
  EXPECT_EQ(consumer.stats().in_progress_requeued, 2u);
  const auto letters =
      idem::rabbitmq::take_dead_letters(connection_, consumer.dead_letter_queue(), 10);
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_NE(letters[0].reason.find("still in progress after 2 requeues"), std::string::npos)
      << letters[0].reason;
}

struct DuplicateCase {
  std::string name;
  std::string backend;  // "memory" or "sqlite"
  idem::HandlerMode mode;
};

class RabbitMqDuplicateTest : public RabbitMqTransportTest,
                              public ::testing::WithParamInterface<DuplicateCase> {};

TEST_P(RabbitMqDuplicateTest, AnEventPublishedTwiceRunsItsSideEffectOnce) {
  const DuplicateCase& param = GetParam();
  const std::string path =
      (std::filesystem::temp_directory_path() / ("idem-rmq-" + idem::new_event_id() + ".db"))
          .string();
  std::shared_ptr<idem::IdempotencyRecorder> recorder;
  if (param.backend == "memory") {
    recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  } else {
    recorder = idem::open_recorder("sqlite://" + path);
  }
  idem::test::expect_events_published_twice_run_once(topology_, connection_, "dup-" + param.name,
                                                     recorder, param.mode);
  recorder.reset();
  for (const char* suffix : {"", "-wal", "-shm", "-journal"})
    std::remove((path + suffix).c_str());
}

INSTANTIATE_TEST_SUITE_P(
    Recorders, RabbitMqDuplicateTest,
    ::testing::Values(DuplicateCase{"memory_check", "memory", idem::HandlerMode::check_then_mark},
                      DuplicateCase{"memory_exclusive", "memory", idem::HandlerMode::exclusive},
                      DuplicateCase{"sqlite_check", "sqlite", idem::HandlerMode::check_then_mark},
                      DuplicateCase{"sqlite_exclusive", "sqlite", idem::HandlerMode::exclusive},
                      DuplicateCase{"sqlite_transactional", "sqlite",
                                    idem::HandlerMode::transactional}),
    [](const ::testing::TestParamInfo<DuplicateCase>& case_info) { return case_info.param.name; });

// A batch mixes every outcome: successes (acked together), a failure (requeued, then handled),
// duplicates of already-marked events and of events earlier in the same batch. Run with batches
// of one delivery and of many: the outcome must not depend on how deliveries were grouped.
class RabbitMqBatchTest : public RabbitMqTransportTest,
                          public ::testing::WithParamInterface<int> {};

TEST_P(RabbitMqBatchTest, EveryOutcomeInABatchIsSettledAsAloneAndEachSideEffectRunsOnce) {
  auto options = topology_.consumer_options("batch" + std::to_string(GetParam()));
  options.prefetch = 64;
  options.batch_size = GetParam();
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  SideEffects effects;
  std::map<std::string, int> attempts;
  auto handler =
      idem::make_idempotent_handler(options.consumer_name, recorder,
                                    [&](const std::string& payload, BusProxy&, const Event& event) {
                                      // Every event whose payload ends in 0 fails on its first
                                      // attempt.
                                      if (payload.back() == '0' && ++attempts[event.id] == 1)
                                        throw std::runtime_error("first attempt fails");
                                      effects.record(event.id);
                                    },
                                    {idem::HandlerMode::check_then_mark});

  const std::vector<Event> events = numbered_events(40);
  recorder->mark_processed(options.consumer_name, events[7].id);  // processed before
  std::vector<Event> sent;
  for (const Event& event : events) {
    sent.push_back(event);
    if (sent.size() % 5 == 0) sent.push_back(event);  // the same id again, right behind it
  }
  publisher.publish_batch(sent);

  ASSERT_TRUE(
      consume_until(consumer, *handler, [&] { return consumer.stats().acked == sent.size(); }));
  EXPECT_EQ(effects.distinct(), events.size() - 1);  // all but events[7], marked before
  EXPECT_TRUE(effects.doubled().empty());
  for (const Event& event : events)
    EXPECT_TRUE(recorder->is_processed(options.consumer_name, event.id)) << event.payload;
  const auto stats = consumer.stats();
  EXPECT_EQ(stats.requeued, 4u);  // payloads 0, 10, 20, 30
  EXPECT_EQ(stats.delivered, sent.size() + 4);
  EXPECT_EQ(stats.dead_lettered, 0u);
  EXPECT_EQ(stats.duplicates, sent.size() - events.size() + 1);
  EXPECT_FALSE(consumer.poll_once(*handler, idem::Millis(50)));
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

INSTANTIATE_TEST_SUITE_P(BatchSizes, RabbitMqBatchTest, ::testing::Values(1, 64),
                         [](const ::testing::TestParamInfo<int>& size) {
                           return "batch_size_" + std::to_string(size.param);
                         });

// rabbitmq-c sends heartbeats only between batches, so a batch of slow handlers must not outlast
// the heartbeat: with 3 s per delivery (a ManualClock the handler advances) and a 10 s heartbeat,
// half a heartbeat fits one delivery, so every batch holds one.
TEST_F(RabbitMqTransportTest, SlowHandlersGetBatchesThatFitInHalfAHeartbeat) {
  auto clock = std::make_shared<idem::testing::ManualClock>();
  auto connection = connection_;
  connection.clock = clock;
  connection.heartbeat = std::chrono::seconds(10);
  auto options = topology_.consumer_options("slow");
  options.prefetch = 64;
  options.batch_size = 64;
  Consumer consumer(connection, options);
  consumer.connect();
  Publisher publisher(connection_, topology_.publisher_options());
  const std::vector<Event> events = numbered_events(12);
  publisher.publish_batch(events);
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) {
    clock->advance(std::chrono::seconds(3));
    return HandleResult::processed;
  });

  ASSERT_TRUE(consume_until(consumer, handler, [&] { return consumer.stats().acked == 12; }));
  EXPECT_EQ(consumer.stats().batches, 12u);
  EXPECT_EQ(consumer.stats().delivered, 12u);
}

// The pipeline: while a batch runs on the consumer's own thread, the calling thread goes on
// talking to the broker, so a handler slower than the heartbeat timeout (the broker closes a
// connection after two missed heartbeats; here 1 s) keeps its connection: the delivery is acked
// once and never comes back. (Without the pipeline the same handler loses the connection, and
// the broker delivers the event again on the next one.)
TEST_F(RabbitMqTransportTest, AHandlerSlowerThanTheHeartbeatKeepsItsConnection) {
  auto connection = connection_;
  connection.heartbeat = std::chrono::seconds(1);
  const auto options = topology_.consumer_options("slowheart");
  ASSERT_TRUE(options.pipeline);  // the default
  Consumer consumer(connection, options);
  consumer.connect();
  Publisher publisher(connection_, topology_.publisher_options());
  publisher.publish(Event::make("order.paid", "slow"));
  std::atomic<int> runs{0};
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) {
    if (++runs == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    return HandleResult::processed;
  });

  ASSERT_TRUE(consume_until(consumer, handler, [&] { return consumer.stats().acked == 1; }));
  // Anything the broker would send again arrives well within this.
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  consumer.run_until(handler, [&] { return std::chrono::steady_clock::now() > until; });
  EXPECT_EQ(runs.load(), 1);
  EXPECT_EQ(consumer.stats().reconnects, 0u);
  EXPECT_EQ(consumer.stats().delivered, 1u);
}

// run() returns only after the batch in hand is settled, also when the handler itself stops it.
TEST_F(RabbitMqTransportTest, StopFromTheHandlerSettlesTheBatchBeforeRunReturns) {
  auto options = topology_.consumer_options("stopinside");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  publisher.publish(Event::make("order.paid", "1"));
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) {
    consumer.stop();
    return HandleResult::processed;
  });

  consumer.run(handler);
  EXPECT_EQ(consumer.stats().acked, 1u);
  EXPECT_FALSE(consumer.poll_once(handler, idem::Millis(100)));
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

// Where the handler runs: a thread of the consumer's with the pipeline (one at a time, in
// delivery order), the calling thread without it and in poll_once().
TEST_F(RabbitMqTransportTest, ThePipelineRunsTheHandlerOnItsOwnThreadInDeliveryOrder) {
  for (const bool pipeline : {true, false}) {
    SCOPED_TRACE(pipeline ? "pipeline" : "no pipeline");
    auto options = topology_.consumer_options(pipeline ? "threadpipe" : "threadsync");
    options.pipeline = pipeline;
    options.prefetch = 64;
    auto consumer = connected_consumer(options);
    auto publisher = topology_publisher();
    const std::vector<Event> events = numbered_events(40);
    publisher.publish_batch(events);
    std::vector<std::string> order;
    std::vector<std::thread::id> threads;
    FnHandler handler(options.consumer_name, [&](const Event& event, BusProxy&) {
      order.push_back(event.payload);
      threads.push_back(std::this_thread::get_id());
      return HandleResult::processed;
    });

    ASSERT_EQ(consumer.run_for(handler, 39), 39u);
    ASSERT_TRUE(consumer.poll_once(handler, std::chrono::seconds(5)));
    ASSERT_EQ(order.size(), 40u);
    for (int i = 0; i < 40; ++i)
      EXPECT_EQ(order[i], std::to_string(i));
    const std::thread::id caller = std::this_thread::get_id();
    for (std::size_t i = 0; i < 39; ++i)
      EXPECT_EQ(threads[i] != caller, pipeline) << i;
    EXPECT_EQ(threads[39], caller);  // poll_once
    EXPECT_EQ(consumer.stats().acked, 40u);
  }
}

TEST_F(RabbitMqTransportTest, RunForNeverTakesMoreDeliveriesThanAsked) {
  auto options = topology_.consumer_options("runfor");
  options.prefetch = 64;
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  const std::vector<Event> events = numbered_events(10);
  publisher.publish_batch(events);
  int handled = 0;
  FnHandler handler(options.consumer_name, [&](const Event&, BusProxy&) {
    ++handled;
    return HandleResult::processed;
  });

  EXPECT_EQ(consumer.run_for(handler, 3), 3u);
  EXPECT_EQ(handled, 3);
  EXPECT_EQ(consumer.stats().acked, 3u);
  EXPECT_EQ(consumer.run_for(handler, 7), 7u);
  EXPECT_EQ(handled, 10);
  EXPECT_EQ(idem::rabbitmq::queue_depth(connection_, consumer.queue_name()), 0u);
}

TEST_F(RabbitMqTransportTest, FanoutGivesEveryConsumerNameEveryEventOnce) {
  const auto billing_options = topology_.consumer_options("billing", ExchangeType::fanout);
  const auto shipping_options = topology_.consumer_options("shipping", ExchangeType::fanout);
  Consumer billing(connection_, billing_options);
  Consumer shipping(connection_, shipping_options);
  billing.connect();
  shipping.connect();
  Publisher publisher(connection_, topology_.publisher_options(ExchangeType::fanout));
  // One recorder for both: markers are per consumer name, so one never hides events from the
  // other.
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  SideEffects billed, shipped;
  auto bill = idem::make_idempotent_handler(
      billing_options.consumer_name, recorder,
      [&](const std::string&, BusProxy&, const Event& event) { billed.record(event.id); });
  auto ship = idem::make_idempotent_handler(
      shipping_options.consumer_name, recorder,
      [&](const std::string&, BusProxy&, const Event& event) { shipped.record(event.id); });

  constexpr std::size_t kEvents = 30;
  for (std::size_t i = 0; i < kEvents; ++i)
    publisher.publish(Event::make(i % 2 == 0 ? "order.created" : "refund.issued", "x"));
  ASSERT_TRUE(consume_until(billing, *bill, [&] { return billed.distinct() == kEvents; }));
  ASSERT_TRUE(consume_until(shipping, *ship, [&] { return shipped.distinct() == kEvents; }));
  EXPECT_EQ(billed.counts(), shipped.counts());
  EXPECT_TRUE(billed.doubled().empty());
  EXPECT_TRUE(shipped.doubled().empty());
}

TEST_F(RabbitMqTransportTest, CompetingConsumersAndASharedPublisherRunEachEventOnce) {
  // Two Consumer objects with one name share the queue, each on its own thread, with one
  // exclusive-mode handler; four threads publish every event twice through one Publisher.
  auto options = topology_.consumer_options("competing");
  options.in_progress_backoff = idem::Millis(1);
  options.prefetch = 4;
  Consumer first(connection_, options);
  Consumer second(connection_, options);
  first.connect();
  second.connect();
  Publisher publisher(connection_, topology_.publisher_options());
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  SideEffects effects;
  auto handler = idem::make_idempotent_handler(
      options.consumer_name, recorder,
      [&](const std::string&, BusProxy&, const Event& event) { effects.record(event.id); },
      {idem::HandlerMode::exclusive});

  constexpr std::size_t kThreads = 4;
  constexpr std::size_t kPerThread = 25;
  constexpr std::size_t kDeliveries = 2 * kThreads * kPerThread;
  const auto all_acked = [&] { return first.stats().acked + second.stats().acked >= kDeliveries; };
  std::thread run_first([&] { consume_until(first, *handler, all_acked); });
  std::thread run_second([&] { consume_until(second, *handler, all_acked); });
  std::vector<std::thread> publishers;
  for (std::size_t t = 0; t < kThreads; ++t) {
    publishers.emplace_back([&, t] {
      for (std::size_t i = 0; i < kPerThread; ++i) {
        const Event event =
            Event::make("order.created", std::to_string(t) + "/" + std::to_string(i));
        publisher.publish(event);
        publisher.publish(event);
      }
    });
  }
  for (auto& thread : publishers)
    thread.join();
  run_first.join();
  run_second.join();

  EXPECT_EQ(publisher.stats().published, kDeliveries);
  EXPECT_EQ(effects.distinct(), kThreads * kPerThread);
  EXPECT_TRUE(effects.doubled().empty());
  const auto a = first.stats();
  const auto b = second.stats();
  EXPECT_EQ(a.acked + b.acked, kDeliveries);
  EXPECT_EQ(a.duplicates + b.duplicates, kThreads * kPerThread);
  EXPECT_EQ(a.dead_lettered + b.dead_lettered, 0u);
}

TEST_F(RabbitMqTransportTest, FollowUpEventsArePublishedToTheExchange) {
  auto orders_options = topology_.consumer_options("orders");
  orders_options.binding_key = "order.#";
  auto audit_options = topology_.consumer_options("audit");
  audit_options.binding_key = "audit.#";
  Consumer orders(connection_, orders_options);
  Consumer audit(connection_, audit_options);
  orders.connect();
  audit.connect();
  Publisher publisher(connection_, topology_.publisher_options());
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto forward =
      idem::make_idempotent_handler(orders_options.consumer_name, recorder,
                                    [&](const std::string& payload, BusProxy& bus, const Event&) {
                                      bus.publish(Event::make("audit.order", "seen " + payload));
                                    });
  std::vector<Event> audited;
  FnHandler collect(audit_options.consumer_name, [&](const Event& event, BusProxy&) {
    audited.push_back(event);
    return HandleResult::processed;
  });
  for (int i = 0; i < 5; ++i)
    publisher.publish(Event::make("order.created", std::to_string(i)));
  ASSERT_TRUE(consume_until(orders, *forward, [&] { return orders.stats().acked == 5; }));
  EXPECT_EQ(orders.stats().follow_ups, 5u);
  ASSERT_TRUE(consume_until(audit, collect, [&] { return audited.size() == 5; }));
  for (const auto& event : audited) {
    EXPECT_EQ(event.type, "audit.order");
    EXPECT_EQ(event.payload.rfind("seen ", 0), 0u);
  }
}

TEST_F(RabbitMqTransportTest, PublishRefusesEventsItCannotSend) {
  Publisher publisher(connection_, topology_.publisher_options());
  Event event = Event::make("order.created", "x");
  event.id = "bad\nid";
  EXPECT_THROW(publisher.publish(event), idem::InvalidKey);
  event = Event::make("", "x");
  EXPECT_THROW(publisher.publish(event), idem::InvalidArgument);
  event = Event::make(std::string(256, 't'), "x");
  EXPECT_THROW(publisher.publish(event), idem::InvalidArgument);
  event = Event::make("order.created", "x", {{"", "empty name"}});
  EXPECT_THROW(publisher.publish(event), idem::InvalidArgument);
  publisher.publish(Event::make("order.created", "still fine"));
  EXPECT_EQ(publisher.stats().published, 1u);
}

TEST_F(RabbitMqTransportTest, ATopologyThatContradictsTheBrokerIsNotRetried) {
  Publisher publisher(connection_, topology_.publisher_options(ExchangeType::topic));
  auto options = topology_.consumer_options("mismatch", ExchangeType::fanout);
  Consumer consumer(connection_, options);
  try {
    consumer.connect();
    FAIL() << "declared a fanout exchange over a topic one";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(std::string(e.what()).find("406"), std::string::npos) << e.what();
  }
  FnHandler handler(options.consumer_name,
                    [](const Event&, BusProxy&) { return HandleResult::processed; });
  EXPECT_THROW(consumer.run(handler), idem::rabbitmq::BrokerError);
}

TEST_F(RabbitMqTransportTest, BadCredentialsAreReportedWithoutThePassword) {
  auto options = connection_;
  options.password = "wrong-password";
  try {
    Publisher publisher(options, topology_.publisher_options());
    FAIL() << "logged in with a wrong password";
  } catch (const idem::rabbitmq::BrokerError& e) {
    EXPECT_EQ(std::string(e.what()).find("wrong-password"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("login"), std::string::npos) << e.what();
  }
}

}  // namespace
