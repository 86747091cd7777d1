// Handlers and waiting helpers shared by idem's RabbitMQ tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "idem/handler.hpp"
#include "idem/rabbitmq/consumer.hpp"
#include "idem/rabbitmq/publisher.hpp"
#include "idem/recorder.hpp"
#include "rabbitmq_test_env.hpp"

namespace idem::test {

// A plain EventHandler (no idempotency) that calls fn.
class FnHandler final : public EventHandler {
 public:
  FnHandler(std::string consumer, std::function<HandleResult(const Event&, BusProxy&)> fn)
      : consumer_(std::move(consumer)), fn_(std::move(fn)) {}
  const std::string& consumer() const noexcept override { return consumer_; }
  HandleResult operator()(const Event& event, BusProxy& bus) override { return fn_(event, bus); }

 private:
  std::string consumer_;
  std::function<HandleResult(const Event&, BusProxy&)> fn_;
};

// Side effects per event id, thread-safe.
class SideEffects {
 public:
  void record(const std::string& id) {
    std::lock_guard lock(mutex_);
    ++counts_[id];
  }
  std::size_t distinct() const {
    std::lock_guard lock(mutex_);
    return counts_.size();
  }
  std::map<std::string, int> counts() const {
    std::lock_guard lock(mutex_);
    return counts_;
  }
  // Ids whose side effect ran more than once.
  std::vector<std::string> doubled() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [id, n] : counts_)
      if (n > 1) out.push_back(id);
    return out;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, int> counts_;
};

// Runs the consumer until done() holds. The 60 s bound is a safety net so a broken build fails
// instead of hanging; no assertion depends on it.
inline bool consume_until(rabbitmq::Consumer& consumer, EventHandler& handler,
                          const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  consumer.run_until(handler, [&] { return done() || std::chrono::steady_clock::now() > give_up; });
  return done();
}

// 20 events, each published twice on purpose (the same id again), consumed by an idempotent
// handler in `mode` on `recorder` for the consumer `name` of `topology`: every side effect runs
// once (in transactional mode inside the handler's transaction), the second copies are the
// consumer's duplicates, and every event is marked processed.
inline void expect_events_published_twice_run_once(
    TestTopology& topology, const rabbitmq::ConnectionOptions& connection, const std::string& name,
    const std::shared_ptr<IdempotencyRecorder>& recorder, HandlerMode mode) {
  const auto options = topology.consumer_options(name);
  rabbitmq::Consumer consumer(connection, options);
  consumer.connect();  // the queue exists before anything is published
  rabbitmq::Publisher publisher(connection, topology.publisher_options());
  SideEffects effects;
  auto handler =
      make_idempotent_handler(options.consumer_name, recorder,
                              [&](const std::string&, BusProxy& bus, const Event& event) {
                                if (mode == HandlerMode::transactional) {
                                  EXPECT_NE(bus.transaction(), nullptr);
                                }
                                effects.record(event.id);
                              },
                              {mode});
  constexpr std::size_t kEvents = 20;
  for (std::size_t i = 0; i < kEvents; ++i) {
    const Event event = Event::make("order.created", std::to_string(i));
    publisher.publish(event);
    publisher.publish(event);  // the same id again, on purpose
  }
  ASSERT_TRUE(
      consume_until(consumer, *handler, [&] { return consumer.stats().acked == 2 * kEvents; }));
  EXPECT_EQ(effects.distinct(), kEvents);
  EXPECT_TRUE(effects.doubled().empty());
  EXPECT_EQ(consumer.stats().duplicates, kEvents);
  for (const auto& [id, count] : effects.counts())
    EXPECT_TRUE(recorder->is_processed(options.consumer_name, id));
}

}  // namespace idem::test
