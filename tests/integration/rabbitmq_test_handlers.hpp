// Handlers and waiting helpers shared by idem's RabbitMQ tests.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "idem/handler.hpp"
#include "idem/rabbitmq/consumer.hpp"

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

}  // namespace idem::test
