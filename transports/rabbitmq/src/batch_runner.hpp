// BatchRunner: runs EventHandler::handle_batch on a thread of its own, one batch at a time, so
// the consumer's thread can receive the next deliveries (and answer heartbeats) while a batch
// runs (internal; DESIGN-NOTES §28).
//
// Protocol, all from the consumer's thread: start() a batch, then take() it once it is finished
// (ready_fd() turns readable then, for poll()), then start() the next. The handler is called by
// one thread at a time, in the order the batches were started; start() and take() go through a
// mutex, so whatever the handler wrote is visible to the consumer's thread after take() and
// whatever that thread wrote before start() is visible to the handler.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stop_token>
#include <thread>
#include <vector>

#include "idem/clock.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"

namespace idem::rabbitmq::detail {

class BatchRunner {
 public:
  struct Done {
    std::vector<HandleOutcome> outcomes;  // empty when handle_batch threw
    SteadyTime::duration elapsed{};       // on the clock given to the constructor
  };

  // Starts the thread. Throws std::system_error when no eventfd or thread can be had.
  explicit BatchRunner(std::shared_ptr<Clock> clock);
  // Lets the batch in hand finish, then ends the thread.
  ~BatchRunner();
  BatchRunner(const BatchRunner&) = delete;
  BatchRunner& operator=(const BatchRunner&) = delete;

  // Readable from the moment a batch finishes until take() returns it.
  int ready_fd() const noexcept { return ready_fd_; }

  // Hands a batch over. `handler`, `events` and `bus` must stay alive, and `events` unchanged,
  // until take() returned the batch. Precondition: no batch started and not yet taken.
  void start(EventHandler& handler, std::span<const Event> events, BusProxy& bus);

  // The started batch once it has finished (nullopt before that, or when none was started);
  // with wait, blocks until it has finished.
  std::optional<Done> take(bool wait);

 private:
  enum class State { idle, running, finished };

  void loop(const std::stop_token& stop);

  const std::shared_ptr<Clock> clock_;
  int ready_fd_ = -1;  // an eventfd
  std::mutex mutex_;
  std::condition_variable_any changed_;
  State state_ = State::idle;
  EventHandler* handler_ = nullptr;
  std::span<const Event> events_;
  BusProxy* bus_ = nullptr;
  Done done_;
  std::jthread thread_;  // last: starts once everything above exists, stops first
};

}  // namespace idem::rabbitmq::detail
