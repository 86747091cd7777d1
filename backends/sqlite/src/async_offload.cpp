#include "async_offload.hpp"

namespace idem::sqlite::detail {

namespace {
thread_local const WorkerPool* current_pool = nullptr;
}

WorkerPool::WorkerPool(std::size_t threads) {
  threads_.reserve(threads);
  for (std::size_t i = 0; i < threads; ++i)
    threads_.emplace_back([this] { loop(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& thread : threads_)
    thread.join();
}

void WorkerPool::submit(std::function<void()> job) {
  {
    std::lock_guard lock(mutex_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

bool WorkerPool::on_worker_thread() const noexcept {
  return current_pool == this;
}

void WorkerPool::loop() {
  current_pool = this;
  std::unique_lock lock(mutex_);
  for (;;) {
    cv_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and everything queued has run
    auto job = std::move(jobs_.front());
    jobs_.pop_front();
    lock.unlock();
    job();  // jobs catch their own exceptions (offload hands them to the awaiting coroutine)
    lock.lock();
  }
}

}  // namespace idem::sqlite::detail
