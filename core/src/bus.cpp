#include "idem/bus.hpp"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>
#include <unordered_map>
#include <vector>

#include "idem/detail/fork.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem {
namespace {

// subscribe(type, consumer, fn): every delivery runs fn.
class PlainHandler final : public EventHandler {
 public:
  PlainHandler(std::string consumer, std::function<void(const Event&, BusProxy&)> fn)
      : consumer_(std::move(consumer)), fn_(std::move(fn)) {}
  const std::string& consumer() const noexcept override { return consumer_; }
  HandleResult operator()(const Event& event, BusProxy& bus) override {
    fn_(event, bus);
    return HandleResult::processed;
  }

 private:
  std::string consumer_;
  std::function<void(const Event&, BusProxy&)> fn_;
};

std::string describe(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception (not derived from std::exception)";
  }
}

struct Delivery {
  std::shared_ptr<const Event> event;
  std::shared_ptr<EventHandler> handler;
  int attempts = 0;     // failed deliveries so far
  int in_progress = 0;  // AlreadyInProgress requeues so far
};

}  // namespace

struct Bus::State {
  explicit State(BusOptions opts)
      : options(std::move(opts)), clock(options.clock ? options.clock : system_clock()) {}

  BusOptions options;
  std::shared_ptr<Clock> clock;
  Bus* owner = nullptr;  // handed to handlers' proxies, whose publish() goes through it

  mutable std::mutex mutex;
  std::condition_variable work_cv;   // workers: a ready delivery, or stopping
  std::condition_variable timer_cv;  // timer: a delayed delivery, or stopping
  std::condition_variable idle_cv;   // wait_idle: pending reached 0, or stopping
  std::unordered_map<std::string, std::vector<std::shared_ptr<EventHandler>>> routes;
  std::deque<Delivery> ready;
  std::multimap<SteadyTime, Delivery> delayed;  // by due time; equal times keep FIFO order
  std::size_t pending = 0;                      // ready + delayed + running
  bool stopping = false;
  std::stop_source timer_sleep;  // interrupts the timer's current clock->sleep_for
  SteadyTime timer_wakes_at = SteadyTime::max();
  BusStats stats;

  std::vector<std::thread> workers;
  std::thread timer;
  detail::ForkOwner process;  // the threads above exist only in the process that made the bus

  // ConfigError in a child of fork().
  void check_process() const { process.use("this idem::Bus"); }

  // The wait before the n-th retry (n >= 1).
  std::chrono::nanoseconds backoff(int n) const {
    using Ms = std::chrono::duration<double, std::milli>;
    const double initial = Ms(options.initial_backoff).count();
    const double cap = Ms(options.max_backoff).count();
    const double wait = std::min(cap, initial * std::pow(options.backoff_multiplier, n - 1));
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Ms(std::max(0.0, wait)));
  }

  // Called with the mutex held.
  void schedule(Delivery delivery, std::chrono::nanoseconds wait) {
    if (wait <= std::chrono::nanoseconds::zero()) {
      ready.push_back(std::move(delivery));
      work_cv.notify_one();
      return;
    }
    const SteadyTime due = clock->steady_now() + wait;
    delayed.emplace(due, std::move(delivery));
    if (due < timer_wakes_at) timer_sleep.request_stop();  // the timer sleeps too long
    timer_cv.notify_one();
  }

  // Called with the mutex held, when a delivery leaves the bus for good.
  void finish_one() {
    if (--pending == 0) idle_cv.notify_all();
  }

  void timer_loop() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      if (delayed.empty()) {
        timer_cv.wait(lock, [this] { return stopping || !delayed.empty(); });
        continue;
      }
      const SteadyTime now = clock->steady_now();
      while (!delayed.empty() && delayed.begin()->first <= now) {
        ready.push_back(std::move(delayed.begin()->second));
        delayed.erase(delayed.begin());
        work_cv.notify_one();
      }
      if (delayed.empty()) continue;
      const SteadyTime due = delayed.begin()->first;
      // Sleep through the clock, so that a ManualClock makes (and records) the wait instantly.
      std::stop_source sleep;
      timer_sleep = sleep;
      timer_wakes_at = due;
      lock.unlock();
      clock->sleep_for(due - now, sleep.get_token());
      lock.lock();
      timer_wakes_at = SteadyTime::max();
    }
  }

  void worker_loop();
  void dead_letter(std::unique_lock<std::mutex>& lock, Delivery& delivery,
                   const std::exception_ptr& error);
};

namespace {

// The bus a worker thread serves (so wait_idle() from a handler can be refused).
thread_local const void* t_serving = nullptr;

class DeliveryProxy final : public BusProxy {
 public:
  DeliveryProxy(Bus& bus, const std::string& consumer) : bus_(bus), consumer_(consumer) {}
  void publish(Event event) override { bus_.publish(std::move(event)); }
  std::string_view consumer() const override { return consumer_; }

 private:
  Bus& bus_;
  const std::string& consumer_;
};

}  // namespace

void Bus::State::dead_letter(std::unique_lock<std::mutex>& lock, Delivery& delivery,
                             const std::exception_ptr& error) {
  ++stats.dead_lettered;
  if (options.on_dead_letter) {
    DeadLetter letter{*delivery.event, delivery.handler->consumer(), delivery.attempts, error,
                      describe(error)};
    lock.unlock();
    try {
      options.on_dead_letter(letter);
    } catch (...) {
      // A failing dead-letter sink must not take the worker down.
    }
    lock.lock();
  }
  finish_one();
}

Bus::Bus(BusOptions options) {
  if (options.max_attempts < 1) throw ConfigError("BusOptions::max_attempts must be at least 1");
  if (options.initial_backoff < Millis::zero() || options.max_backoff < Millis::zero()) {
    throw ConfigError("BusOptions backoff durations must not be negative");
  }
  if (!(options.backoff_multiplier >= 1.0) || !std::isfinite(options.backoff_multiplier)) {
    throw ConfigError("BusOptions::backoff_multiplier must be a finite number >= 1.0");
  }
  if (options.max_in_progress_requeues < 0) {
    throw ConfigError("BusOptions::max_in_progress_requeues must not be negative");
  }
  if (options.worker_threads < 1) throw ConfigError("BusOptions::worker_threads must be >= 1");

  state_ = std::make_unique<State>(std::move(options));
  State& s = *state_;
  s.owner = this;
  try {
    s.timer = std::thread([&s] { s.timer_loop(); });
    for (std::size_t i = 0; i < s.options.worker_threads; ++i) {
      s.workers.emplace_back([&s] { s.worker_loop(); });
    }
  } catch (...) {
    {
      std::lock_guard lock(s.mutex);
      s.stopping = true;
    }
    s.work_cv.notify_all();
    s.timer_cv.notify_all();
    s.timer_sleep.request_stop();
    if (s.timer.joinable()) s.timer.join();
    for (auto& w : s.workers)
      w.join();
    throw;
  }
}

Bus::~Bus() {
  if (state_->process.forked()) {
    // A child of fork(): the threads are the parent's. Joining them would wait forever, and the
    // condition variables they waited on cannot be destroyed either; abandon the whole state.
    detail::abandon(std::shared_ptr<const void>(std::move(state_)));
    return;
  }
  State& s = *state_;
  {
    std::lock_guard lock(s.mutex);
    s.stopping = true;
    s.timer_sleep.request_stop();
  }
  s.work_cv.notify_all();
  s.timer_cv.notify_all();
  s.idle_cv.notify_all();
  for (auto& w : s.workers)
    w.join();
  s.timer.join();
}

void Bus::State::worker_loop() {
  std::unique_lock lock(mutex);
  while (true) {
    work_cv.wait(lock, [this] { return stopping || !ready.empty(); });
    if (stopping) return;
    Delivery delivery = std::move(ready.front());
    ready.pop_front();
    lock.unlock();

    enum class Outcome { acked, failed, in_progress } outcome = Outcome::acked;
    HandleResult result = HandleResult::processed;
    std::exception_ptr error;
    t_serving = this;
    try {
      DeliveryProxy proxy(*owner, delivery.handler->consumer());
      result = (*delivery.handler)(*delivery.event, proxy);
    } catch (const AlreadyInProgress&) {
      outcome = Outcome::in_progress;
      error = std::current_exception();
    } catch (...) {
      outcome = Outcome::failed;
      error = std::current_exception();
    }
    t_serving = nullptr;

    lock.lock();
    switch (outcome) {
      case Outcome::acked:
        ++stats.delivered;
        if (result == HandleResult::duplicate) ++stats.duplicates;
        finish_one();
        break;
      case Outcome::failed:
        ++delivery.attempts;
        if (delivery.attempts >= options.max_attempts) {
          dead_letter(lock, delivery, error);
        } else {
          ++stats.redeliveries;
          schedule(std::move(delivery), backoff(delivery.attempts));
        }
        break;
      case Outcome::in_progress:
        ++delivery.in_progress;
        if (delivery.in_progress > options.max_in_progress_requeues) {
          dead_letter(lock, delivery, error);
        } else {
          ++stats.in_progress_requeued;
          schedule(std::move(delivery), backoff(delivery.in_progress));
        }
        break;
    }
  }
}

void Bus::subscribe(std::string event_type, std::shared_ptr<EventHandler> handler) {
  if (event_type.empty()) throw InvalidArgument("subscribe: event type is empty");
  if (!handler) throw InvalidArgument("subscribe: handler is null");
  validate_key("consumer", handler->consumer());
  state_->check_process();
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  auto& handlers = s.routes[event_type];
  for (const auto& existing : handlers) {
    if (existing->consumer() == handler->consumer()) {
      throw InvalidArgument("subscribe: consumer '" + handler->consumer() +
                            "' is already subscribed to '" + event_type + "'");
    }
  }
  handlers.push_back(std::move(handler));
}

void Bus::subscribe(std::string event_type, std::string consumer,
                    std::function<void(const Event&, BusProxy&)> fn) {
  if (!fn) throw InvalidArgument("subscribe: handler function is empty");
  validate_key("consumer", consumer);
  subscribe(std::move(event_type),
            std::make_shared<PlainHandler>(std::move(consumer), std::move(fn)));
}

void Bus::publish(Event event) {
  validate_key("event id", event.id);
  if (event.type.empty()) throw InvalidArgument("publish: event " + event.id + " has no type");
  state_->check_process();
  State& s = *state_;
  auto shared = std::make_shared<const Event>(std::move(event));
  std::lock_guard lock(s.mutex);
  if (s.stopping) return;
  ++s.stats.published;
  auto route = s.routes.find(shared->type);
  if (route == s.routes.end() || route->second.empty()) {
    ++s.stats.unrouted;
    return;
  }
  for (const auto& handler : route->second) {
    s.ready.push_back(Delivery{shared, handler});
    ++s.pending;
  }
  if (route->second.size() == 1) {
    s.work_cv.notify_one();
  } else {
    s.work_cv.notify_all();
  }
}

void Bus::wait_idle() {
  state_->check_process();
  State& s = *state_;
  if (t_serving == &s) {
    throw InvalidArgument("Bus::wait_idle called from a handler: it would wait for itself");
  }
  std::unique_lock lock(s.mutex);
  s.idle_cv.wait(lock, [&s] { return s.pending == 0 || s.stopping; });
}

BusStats Bus::stats() const {
  std::lock_guard lock(state_->mutex);
  return state_->stats;
}

}  // namespace idem
