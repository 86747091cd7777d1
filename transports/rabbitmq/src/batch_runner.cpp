#include "batch_runner.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <system_error>

namespace idem::rabbitmq::detail {

BatchRunner::BatchRunner(std::shared_ptr<Clock> clock) : clock_(std::move(clock)) {
  ready_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (ready_fd_ < 0)
    throw std::system_error(errno, std::generic_category(), "idem rabbitmq: eventfd");
  try {
    thread_ = std::jthread([this](const std::stop_token& stop) { loop(stop); });
  } catch (...) {
    ::close(ready_fd_);
    throw;
  }
}

BatchRunner::~BatchRunner() {
  thread_.request_stop();
  thread_.join();  // loop() finishes a running batch before it looks at the stop request
  ::close(ready_fd_);
}

void BatchRunner::start(EventHandler& handler, std::span<const Event> events, BusProxy& bus) {
  {
    std::lock_guard lock(mutex_);
    handler_ = &handler;
    events_ = events;
    bus_ = &bus;
    state_ = State::running;
  }
  changed_.notify_all();
}

std::optional<BatchRunner::Done> BatchRunner::take(bool wait) {
  std::unique_lock lock(mutex_);
  if (wait) changed_.wait(lock, [&] { return state_ != State::running; });
  if (state_ != State::finished) return std::nullopt;
  state_ = State::idle;
  std::uint64_t count = 0;
  // Empties the eventfd (nonblocking; it was written when the batch finished).
  [[maybe_unused]] const ssize_t ignored = ::read(ready_fd_, &count, sizeof count);
  return std::move(done_);
}

void BatchRunner::loop(const std::stop_token& stop) {
  std::unique_lock lock(mutex_);
  for (;;) {
    if (!changed_.wait(lock, stop, [&] { return state_ == State::running; })) return;
    EventHandler& handler = *handler_;
    const std::span<const Event> events = events_;
    BusProxy& bus = *bus_;
    lock.unlock();

    Done done;
    const SteadyTime started = clock_->steady_now();
    try {
      done.outcomes = handler.handle_batch(events, bus);
    } catch (...) {
      done.outcomes.clear();  // the consumer fails the whole batch
    }
    done.elapsed = clock_->steady_now() - started;

    lock.lock();
    done_ = std::move(done);
    state_ = State::finished;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t ignored = ::write(ready_fd_, &one, sizeof one);
    changed_.notify_all();
  }
}

}  // namespace idem::rabbitmq::detail
