// The recorder conformance suite run against InMemoryIdempotencyRecorder, with the default shard
// count and with a single shard (every key contends on one lock), and against a deliberately
// naive reference recorder (one mutex, std::map, transactions by serialisation) that checks the
// suite itself — including the transactional tests the in-memory recorder skips.
#include <algorithm>
#include <map>
#include <mutex>
#include <utility>

#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/testing/recorder_conformance.hpp"
#include "recorder_traits.hpp"

namespace {

class ReferenceRecorder final : public idem::IdempotencyRecorder {
 public:
  explicit ReferenceRecorder(std::shared_ptr<idem::Clock> clock) : clock_(std::move(clock)) {}

  bool do_is_processed(std::string_view consumer, std::string_view event_id) override {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    return markers_.count(key) != 0;
  }
  void do_mark_processed(std::string_view consumer, std::string_view event_id) override {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    markers_.emplace(key, clock_->wall_now());
  }
  idem::RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = true};
  }
  idem::Claim do_claim(std::string_view consumer, std::string_view event_id,
                       idem::Millis lease) override {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    const auto now = clock_->wall_now();
    idem::Claim result;
    if (markers_.count(key) != 0) {
      result.status = idem::Claim::Status::processed;
      return result;
    }
    auto it = claims_.find(key);
    if (it != claims_.end() && it->second.second > now) {
      result.status = idem::Claim::Status::in_progress;
      result.lease_until = it->second.second;
      return result;
    }
    result.took_over = it != claims_.end();
    result.token = ++last_token_;
    result.lease_until = now + lease;
    claims_[key] = {result.token, result.lease_until};
    return result;
  }
  bool do_complete(std::string_view consumer, std::string_view event_id,
                   std::uint64_t token) override {
    return end_claim(consumer, event_id, token, /*mark=*/true);
  }
  bool do_release(std::string_view consumer, std::string_view event_id,
                  std::uint64_t token) override {
    return end_claim(consumer, event_id, token, /*mark=*/false);
  }
  bool do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                idem::Millis lease) override {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    if (!owns(key, token)) return false;
    claims_[key].second = clock_->wall_now() + lease;
    return true;
  }
  bool do_run_transactional(std::string_view consumer, std::string_view event_id,
                            const std::function<void(idem::Transaction&)>& fn) override {
    const auto key = checked(consumer, event_id);
    // One transaction at a time, like a database's write lock.
    std::lock_guard tx_lock(tx_mutex_);
    {
      std::lock_guard lock(mutex_);
      if (markers_.count(key) != 0) return false;
    }
    idem::Transaction tx;
    fn(tx);  // a throw leaves no marker: "rollback"
    std::lock_guard lock(mutex_);
    markers_.emplace(key, clock_->wall_now());
    return true;
  }
  // One chunk: progress is called once, with the total, when anything went.
  std::size_t do_purge(std::chrono::system_clock::duration older_than,
                       const idem::PurgeProgress& progress) override {
    std::size_t purged = 0;
    {
      std::lock_guard lock(mutex_);
      const auto cutoff = clock_->wall_now() - older_than;
      purged = std::erase_if(markers_, [&](const auto& m) { return m.second < cutoff; });
    }
    if (purged > 0 && progress) progress(purged);
    return purged;
  }
  std::size_t do_count_purgeable(std::chrono::system_clock::duration older_than) override {
    if (older_than.count() < 0) throw idem::InvalidArgument("older_than must not be negative");
    std::lock_guard lock(mutex_);
    const auto cutoff = clock_->wall_now() - older_than;
    return static_cast<std::size_t>(std::count_if(
        markers_.begin(), markers_.end(), [&](const auto& m) { return m.second < cutoff; }));
  }
  std::vector<idem::ConsumerCounts> do_consumer_counts() override {
    std::lock_guard lock(mutex_);
    std::map<std::string, idem::ConsumerCounts> counts;
    for (const auto& [key, at] : markers_) {
      counts[key.first].consumer = key.first;
      ++counts[key.first].processed;
    }
    for (const auto& [key, claim] : claims_) {
      if (claim.second <= clock_->wall_now()) continue;
      counts[key.first].consumer = key.first;
      ++counts[key.first].in_progress;
    }
    std::vector<idem::ConsumerCounts> result;
    for (auto& [name, c] : counts)
      result.push_back(c);
    return result;
  }
  idem::MarkerInspection do_inspect(std::string_view consumer, std::string_view event_id) override {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    idem::MarkerInspection result;
    if (auto it = markers_.find(key); it != markers_.end()) {
      result.processed = true;
      result.processed_at = it->second;
    }
    if (auto it = claims_.find(key); it != claims_.end()) {
      result.claim = idem::MarkerInspection::OpenClaim{it->second.first, it->second.second,
                                                       it->second.second > clock_->wall_now()};
    }
    return result;
  }

 private:
  using Key = std::pair<std::string, std::string>;
  static Key checked(std::string_view consumer, std::string_view event_id) {
    idem::validate_key("consumer", consumer);
    idem::validate_key("event id", event_id);
    return {std::string(consumer), std::string(event_id)};
  }
  bool owns(const Key& key, std::uint64_t token) const {
    auto it = claims_.find(key);
    return it != claims_.end() && it->second.first == token;
  }

  // Ends the claim `token` holds on the event (marking it processed when `mark`); false when the
  // token does not hold it.
  bool end_claim(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                 bool mark) {
    const auto key = checked(consumer, event_id);
    std::lock_guard lock(mutex_);
    if (!owns(key, token)) return false;
    claims_.erase(key);
    if (mark) markers_.emplace(key, clock_->wall_now());
    return true;
  }

  std::shared_ptr<idem::Clock> clock_;
  std::mutex tx_mutex_;
  std::mutex mutex_;
  std::map<Key, idem::WallTime> markers_;
  std::map<Key, std::pair<std::uint64_t, idem::WallTime>> claims_;
  std::uint64_t last_token_ = 0;
};

struct ReferenceRecorderFactory : idem::test::RecorderTraits<true, 100> {
  std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<ReferenceRecorder>(std::move(clock));
  }
};

struct MemoryRecorderFactory : idem::test::RecorderTraits<false> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyRecorder>(
        idem::InMemoryRecorderOptions{.clock = std::move(clock)});
  }
};

struct SingleShardMemoryRecorderFactory : idem::test::RecorderTraits<false, 500> {
  static std::shared_ptr<idem::IdempotencyRecorder> make(
      std::shared_ptr<idem::testing::ManualClock> clock) {
    return std::make_shared<idem::InMemoryIdempotencyRecorder>(
        idem::InMemoryRecorderOptions{.clock = std::move(clock), .shards = 1});
  }
};

}  // namespace

INSTANTIATE_RECORDER_CONFORMANCE(Memory, MemoryRecorderFactory);
INSTANTIATE_RECORDER_CONFORMANCE(MemorySingleShard, SingleShardMemoryRecorderFactory);
INSTANTIATE_RECORDER_CONFORMANCE(Reference, ReferenceRecorderFactory);
