// RecorderWrapper and StoreWrapper for the coroutine face: an AsyncRecorder or AsyncStore that
// forwards every call to another one, as idem/wrapper.hpp's classes do on the blocking face
// (leveldb's EnvWrapper). A decorator — crash points (idem/testing/async_crash_points.hpp),
// metrics, tracing, a fault injector — derives from one and overrides only the do_* coroutines it
// changes; everything else reaches the wrapped backend unchanged, the batch calls, the
// capabilities, the store's wait and its blocking twin included.
//
//   class CountingMarks final : public idem::async::RecorderWrapper {
//    public:
//     using RecorderWrapper::RecorderWrapper;
//     std::atomic<int> marks{0};
//    private:
//     idem::async::Task<void> do_mark_processed(std::string_view consumer,
//                                               std::string_view event_id) override {
//       co_await RecorderWrapper::do_mark_processed(consumer, event_id);
//       ++marks;  // counted once the marker is durable
//     }
//   };
//
// Arguments are checked once, by the public call of the outermost wrapper; the forwarding goes
// to the wrapped object's do_* directly, so nothing is validated twice however deep the
// wrapping. A forwarding call hands back the wrapped object's coroutine unstarted: the public
// call awaits it at once, while its arguments live.
//
// Thread safety: a wrapper adds no state, so it is as safe to share as the object it wraps; a
// decorator that adds state says what it guarantees.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <stop_token>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/async/recorder.hpp"
#include "idem/async/store.hpp"
#include "idem/async/task.hpp"
#include "idem/error.hpp"

namespace idem::async {

class RecorderWrapper : public AsyncRecorder {
 public:
  // Throws InvalidArgument for a null target.
  explicit RecorderWrapper(std::shared_ptr<AsyncRecorder> target)
      : target_(require(std::move(target))) {}

  // The wrapped recorder.
  [[nodiscard]] AsyncRecorder& target() const noexcept { return *target_; }

 protected:
  Task<bool> do_is_processed(std::string_view consumer, std::string_view event_id) override {
    return target_->do_is_processed(consumer, event_id);
  }
  Task<void> do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    return target_->do_mark_processed(consumer, event_id);
  }
  Task<std::vector<bool>> do_is_processed_many(std::string_view consumer,
                                               std::span<const std::string> event_ids) override {
    return target_->do_is_processed_many(consumer, event_ids);
  }
  Task<void> do_mark_processed_many(std::string_view consumer,
                                    std::span<const std::string> event_ids) override {
    return target_->do_mark_processed_many(consumer, event_ids);
  }
  RecorderCapabilities do_capabilities() const noexcept override {
    return target_->do_capabilities();
  }
  Task<Claim> do_claim(std::string_view consumer, std::string_view event_id,
                       Millis lease) override {
    return target_->do_claim(consumer, event_id, lease);
  }
  Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                         std::uint64_t token) override {
    return target_->do_complete(consumer, event_id, token);
  }
  Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                        std::uint64_t token) override {
    return target_->do_release(consumer, event_id, token);
  }
  Task<bool> do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                      Millis lease) override {
    return target_->do_renew(consumer, event_id, token, lease);
  }
  Task<bool> do_run_transactional(std::string_view consumer, std::string_view event_id,
                                  TransactionalFn fn) override {
    return target_->do_run_transactional(consumer, event_id, std::move(fn));
  }

 private:
  static std::shared_ptr<AsyncRecorder> require(std::shared_ptr<AsyncRecorder> target) {
    if (!target) throw InvalidArgument("async::RecorderWrapper: the wrapped recorder is null");
    return target;
  }

  std::shared_ptr<AsyncRecorder> target_;
};

class StoreWrapper : public AsyncStore {
 public:
  // Throws InvalidArgument for a null target.
  explicit StoreWrapper(std::shared_ptr<AsyncStore> target) : target_(require(std::move(target))) {}

  // The wrapped store.
  [[nodiscard]] AsyncStore& target() const noexcept { return *target_; }

 protected:
  bool do_needs_bytes() const noexcept override { return target_->do_needs_bytes(); }
  std::shared_ptr<IdempotencyStore> do_blocking_store() const noexcept override {
    return target_->do_blocking_store();
  }
  Task<ClaimOutcome> do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              Millis lease) override {
    return target_->do_claim(key, fingerprint, lease);
  }
  Task<ClaimOutcome> do_claim_without_report(std::string_view key,
                                             std::optional<std::string_view> fingerprint,
                                             Millis lease) override {
    return target_->do_claim_without_report(key, fingerprint, lease);
  }
  Task<bool> do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                         const ExecutionReport& report, Millis ttl) override {
    return target_->do_complete(key, token, std::move(value), report, ttl);
  }
  Task<bool> do_release(std::string_view key, std::uint64_t token) override {
    return target_->do_release(key, token);
  }
  Task<bool> do_renew(std::string_view key, std::uint64_t token, Millis lease) override {
    return target_->do_renew(key, token, lease);
  }
  Task<std::optional<IdempotencyRecord>> do_lookup(std::string_view key) override {
    return target_->do_lookup(key);
  }
  Task<std::optional<IdempotencyRecord>> do_wait(std::string_view key, SteadyTime deadline,
                                                 std::stop_token stop) override {
    return target_->do_wait(key, deadline, std::move(stop));
  }

 private:
  static std::shared_ptr<AsyncStore> require(std::shared_ptr<AsyncStore> target) {
    if (!target) throw InvalidArgument("async::StoreWrapper: the wrapped store is null");
    return target;
  }

  std::shared_ptr<AsyncStore> target_;
};

}  // namespace idem::async
