// fork() in a process that has used the RabbitMQ transport (the case's child: fork_case.hpp).
// The transport has no process-wide state of its own; what a child must not touch is the
// parent's connections and the consumer's batch-runner thread.
//
//   * the parent publishes and consumes (an exclusive handler on an in-memory recorder, so the
//     pipeline's thread, the claim and its lease renewer run), destroys everything and forks; the
//     child does the same with a new publisher, consumer and recorder, and exits 0 within a bound;
//   * a publisher and a consumer alive at the fork are refused in the child (ConfigError), a new
//     pair works beside them, and the parent goes on consuming with its own.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "../integration/rabbitmq_test_env.hpp"
#include "../integration/rabbitmq_test_handlers.hpp"
#include "fork_case.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/memory_store.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"

IDEM_RABBITMQ_TEST_ENVIRONMENT();

namespace {

using idem::test::fork::expect_refused;
using idem::test::fork::Findings;
using idem::test::fork::in_child;

class ForkRabbitMq : public idem::test::RabbitMqTopologyTest {
 protected:
  // Publishes two events (one of them twice) and consumes them through an exclusive handler;
  // "" when each ran once.
  std::string publish_and_consume(const idem::rabbitmq::ConsumerOptions& options) {
    Findings findings;
    try {
      auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
      std::atomic<int> runs{0};
      auto handler = idem::make_idempotent_handler(
          options.consumer_name, recorder, [&runs](const std::string&) { ++runs; },
          idem::HandlerOptions{.mode = idem::HandlerMode::exclusive});
      auto consumer = connected_consumer(options);
      auto publisher = topology_publisher();
      const idem::Event event = idem::Event::make("order.paid", "1");
      publisher.publish(event);
      publisher.publish(event);  // a duplicate
      publisher.publish(idem::Event::make("order.paid", "2"));
      findings.expect(idem::test::consume_until(consumer, *handler,
                                                [&] { return consumer.stats().acked == 3; }),
                      "the consumer did not ack 3 deliveries");
      findings.expect(runs.load() == 2,
                      "the handler ran " + std::to_string(runs.load()) + " times for 2 events");
    } catch (const std::exception& e) {
      findings.add(std::string("threw: ") + e.what());
    }
    return findings.text();
  }
};

TEST_F(ForkRabbitMq, AChildUsesNewObjectsAfterTheParentDestroyedItsOwn) {
  // The child's queue is declared (and later deleted) by the parent's topology.
  const auto parent_options = topology_.consumer_options("parent");
  const auto child_options = topology_.consumer_options("child");
  ASSERT_EQ(publish_and_consume(parent_options), "");
  EXPECT_EQ(in_child([&] {
              std::string report = publish_and_consume(child_options);
              // Both faces beside the transport.
              const idem::test::fork::Backend backend{
                  [] { return std::make_shared<idem::InMemoryIdempotencyRecorder>(); },
                  [] { return std::make_shared<idem::InMemoryIdempotencyStore>(); }};
              report += idem::test::fork::use_idem(backend, "child");
              return report;
            }),
            "");
}

TEST_F(ForkRabbitMq, APublisherAndAConsumerAliveAtForkAreRefusedInTheChild) {
  const auto options = topology_.consumer_options("alive");
  const auto child_options = topology_.consumer_options("beside");
  auto consumer = connected_consumer(options);
  auto publisher = topology_publisher();
  std::vector<std::string> payloads;  // what the parent's consumer received, in order
  idem::test::FnHandler handler(options.consumer_name,
                                [&](const idem::Event& event, idem::BusProxy&) {
                                  payloads.push_back(event.payload);
                                  return idem::HandleResult::processed;
                                });
  const auto received = [&](const std::string& payload) {
    return std::find(payloads.begin(), payloads.end(), payload) != payloads.end();
  };
  publisher.publish(idem::Event::make("order.paid", "before"));
  ASSERT_TRUE(idem::test::consume_until(consumer, handler, [&] { return received("before"); }));

  EXPECT_EQ(in_child([&] {
              Findings findings;
              expect_refused(findings, "publish",
                             [&] { publisher.publish(idem::Event::make("order.paid", "child")); });
              expect_refused(findings, "poll_once",
                             [&] { consumer.poll_once(handler, idem::Millis(10)); });
              expect_refused(findings, "run_until",
                             [&] { consumer.run_until(handler, [] { return true; }); });
              const std::string beside = publish_and_consume(child_options);
              if (!beside.empty()) findings.add("a new pair in the child: " + beside);
              return findings.text();  // the parent's pair is leaked: the child ends with _exit
            }),
            "");
  // The parent's connections are untouched. (Its queue also got the events the child's new
  // publisher sent: both queues are bound to the same exchange and key.)
  publisher.publish(idem::Event::make("order.paid", "after"));
  EXPECT_TRUE(idem::test::consume_until(consumer, handler, [&] { return received("after"); }));
  EXPECT_FALSE(received("child"));  // the refused publish sent nothing
}

}  // namespace
