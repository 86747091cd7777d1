// RecorderWrapper and StoreWrapper: a recorder or store that forwards every call to another one
// (leveldb's EnvWrapper). A decorator — crash points, metrics, tracing, a fault injector —
// derives from one and overrides only the do_* calls it changes; everything else reaches the
// wrapped backend unchanged, including the batch calls and the capabilities.
//
// Arguments are checked once, by the public call of the wrapper; the forwarding goes to the
// wrapped object's do_* directly, so nothing is validated twice however deep the wrapping.
//
// Thread safety: a wrapper adds no state, so it is as safe to share as the object it wraps;
// a decorator that adds state says what it guarantees.
#pragma once

#include <memory>
#include <utility>

#include "idem/error.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"

namespace idem {

class RecorderWrapper : public IdempotencyRecorder {
 public:
  // Throws InvalidArgument for a null target.
  explicit RecorderWrapper(std::shared_ptr<IdempotencyRecorder> target)
      : target_(require(std::move(target))) {}

  // The wrapped recorder.
  [[nodiscard]] IdempotencyRecorder& target() const noexcept { return *target_; }

 protected:
  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    return target_->do_is_processed(consumer, event_id);
  }
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    target_->do_mark_processed(consumer, event_id);
  }
  std::vector<bool> do_is_processed_many(std::string_view consumer,
                                         std::span<const std::string> event_ids) override {
    return target_->do_is_processed_many(consumer, event_ids);
  }
  void do_mark_processed_many(std::string_view consumer,
                              std::span<const std::string> event_ids) override {
    target_->do_mark_processed_many(consumer, event_ids);
  }
  RecorderCapabilities do_capabilities() const noexcept override {
    return target_->do_capabilities();
  }
  Claim do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override {
    return target_->do_claim(consumer, event_id, lease);
  }
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override {
    return target_->do_complete(consumer, event_id, token);
  }
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override {
    return target_->do_release(consumer, event_id, token);
  }
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                Millis lease) override {
    return target_->do_renew(consumer, event_id, token, lease);
  }
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(Transaction&)>& fn) override {
    return target_->do_run_transactional(consumer, event_id, fn);
  }
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const PurgeProgress& progress) override {
    return target_->do_purge(older_than, progress);
  }
  std::vector<ConsumerCounts> do_consumer_counts() override {
    return target_->do_consumer_counts();
  }
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override {
    return target_->do_count_purgeable(older_than);
  }
  PurgeableMarkers do_purgeable_markers(std::chrono::system_clock::duration older_than) override {
    return target_->do_purgeable_markers(older_than);
  }
  MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override {
    return target_->do_inspect(consumer, event_id);
  }

 private:
  static std::shared_ptr<IdempotencyRecorder> require(std::shared_ptr<IdempotencyRecorder> t) {
    if (!t) throw InvalidArgument("RecorderWrapper: the wrapped recorder is null");
    return t;
  }

  std::shared_ptr<IdempotencyRecorder> target_;
};

class StoreWrapper : public IdempotencyStore {
 public:
  // Throws InvalidArgument for a null target.
  explicit StoreWrapper(std::shared_ptr<IdempotencyStore> target)
      : target_(require(std::move(target))) {}

  // The wrapped store.
  [[nodiscard]] IdempotencyStore& target() const noexcept { return *target_; }

 protected:
  bool do_needs_bytes() const noexcept override { return target_->do_needs_bytes(); }
  ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                        Millis lease) override {
    return target_->do_claim(key, fingerprint, lease);
  }
  bool do_complete(std::string_view key, std::uint64_t token, StoredValue value,
                   const ExecutionReport& report, Millis ttl) override {
    return target_->do_complete(key, token, std::move(value), report, ttl);
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    return target_->do_release(key, token);
  }
  bool do_renew(std::string_view key, std::uint64_t token, Millis lease) override {
    return target_->do_renew(key, token, lease);
  }
  std::optional<IdempotencyRecord> do_lookup(std::string_view key) override {
    return target_->do_lookup(key);
  }
  std::size_t do_purge_expired(const PurgeProgress& progress) override {
    return target_->do_purge_expired(progress);
  }
  StoreCounts do_counts() override { return target_->do_counts(); }
  std::size_t do_entry_count() override { return target_->do_entry_count(); }
  RecordPage do_list(std::string_view prefix, std::size_t limit, std::string_view cursor) override {
    return target_->do_list(prefix, limit, cursor);
  }
  bool do_remove(std::string_view key, std::uint64_t token) override {
    return target_->do_remove(key, token);
  }
  std::optional<IdempotencyRecord> do_wait(std::string_view key, SteadyTime deadline,
                                           std::stop_token stop) override {
    return target_->do_wait(key, deadline, std::move(stop));
  }

 private:
  static std::shared_ptr<IdempotencyStore> require(std::shared_ptr<IdempotencyStore> t) {
    if (!t) throw InvalidArgument("StoreWrapper: the wrapped store is null");
    return t;
  }

  std::shared_ptr<IdempotencyStore> target_;
};

}  // namespace idem
