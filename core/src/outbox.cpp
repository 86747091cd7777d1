#include "idem/outbox.hpp"

#include <openssl/sha.h>

#include <array>
#include <thread>

#include "idem/bus.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "uuid_hex.hpp"

namespace idem {

namespace {

// idem's namespace UUID for follow-up ids (a fixed random UUIDv4:
// 6f1d2c3a-9b4e-4d7a-8e21-5c0b9a7d3e64).
constexpr std::array<unsigned char, 16> kFollowUpNamespace = {
    0x6f, 0x1d, 0x2c, 0x3a, 0x9b, 0x4e, 0x4d, 0x7a, 0x8e, 0x21, 0x5c, 0x0b, 0x9a, 0x7d, 0x3e, 0x64};

void append_part(std::string& name, std::string_view part) {
  name += std::to_string(part.size());
  name += ':';
  name += part;
}

}  // namespace

std::string follow_up_id(std::string_view consumer, std::string_view incoming_event_id,
                         std::uint64_t sequence) {
  // The name: each part length-prefixed, so ("a:b", "c") and ("a", "b:c") differ.
  std::string name(kFollowUpNamespace.begin(), kFollowUpNamespace.end());
  append_part(name, consumer);
  append_part(name, incoming_event_id);
  append_part(name, std::to_string(sequence));
  std::array<unsigned char, SHA_DIGEST_LENGTH> digest{};
  SHA1(reinterpret_cast<const unsigned char*>(name.data()), name.size(), digest.data());
  return detail::uuid_hex(digest.data(), 5);
}

std::vector<PublishVerdict> BusOutboxPublisher::publish(std::span<const OutboxRow> rows) {
  std::vector<PublishVerdict> verdicts(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    try {
      bus_.publish(rows[i].event);
      verdicts[i].confirmed = true;
    } catch (const InvalidArgument& e) {  // InvalidKey is one too: the event itself is refused
      verdicts[i].refusal = e.what();
    }
  }
  return verdicts;
}

// ---- Outbox: the contract, checked once; the relay pass, written once -------------------------

void Outbox::append(SqlTransaction& tx, std::string_view consumer, std::string_view source_event_id,
                    const Event& event) {
  validate_key("consumer", consumer);
  validate_key("source event id", source_event_id);
  validate_key("event id", event.id);
  if (event.type.empty()) {
    throw InvalidArgument("Outbox::append: event " + event.id + " has no type");
  }
  do_append(tx, consumer, source_event_id, event);
}

RelayBatchResult Outbox::relay_batch(OutboxPublisher& publisher, std::size_t max_rows,
                                     int max_attempts) {
  if (max_rows == 0) throw InvalidArgument("Outbox::relay_batch: max_rows must be >= 1 (got 0)");
  if (max_attempts < 1) {
    throw InvalidArgument("Outbox::relay_batch: max_attempts must be >= 1 (got " +
                          std::to_string(max_attempts) + ")");
  }
  RelayBatchResult result;
  const std::unique_ptr<OutboxBatch> batch = do_take(max_rows);
  if (!batch) return result;
  result.busy = batch->busy;
  result.taken = batch->rows.size();
  if (batch->rows.empty()) return result;

  // The broker is awaited while the batch holds the rows: no other relay publishes them, and a
  // throw below releases them unchanged (the batch is destroyed unsettled).
  const std::vector<PublishVerdict> verdicts = publisher.publish(batch->rows);
  if (verdicts.size() != batch->rows.size()) {
    throw InvalidArgument("OutboxPublisher::publish returned " + std::to_string(verdicts.size()) +
                          " verdicts for " + std::to_string(batch->rows.size()) + " rows");
  }
  std::vector<std::int64_t> confirmed;
  std::vector<OutboxBatch::Refusal> refused;
  for (std::size_t i = 0; i < verdicts.size(); ++i) {
    const OutboxRow& row = batch->rows[i];
    if (verdicts[i].confirmed) {
      confirmed.push_back(row.seq);
      ++result.published;
    } else if (!verdicts[i].refusal.empty()) {
      const bool park = row.attempts + 1 >= max_attempts;
      refused.push_back({row.seq, verdicts[i].refusal, park});
      ++(park ? result.parked : result.refused);
    } else {
      ++result.deferred;  // outcome unknown: it goes out again in a later pass
    }
  }
  if (!confirmed.empty() || !refused.empty()) batch->settle(confirmed, refused);
  return result;
}

bool Outbox::wait_for_rows(std::chrono::milliseconds timeout) {
  if (timeout < std::chrono::milliseconds::zero()) {
    throw InvalidArgument("Outbox::wait_for_rows: timeout must be >= 0 (got " +
                          std::to_string(timeout.count()) + " ms)");
  }
  return do_wait_for_rows(timeout);
}

std::vector<OutboxRow> Outbox::parked(std::size_t limit) {
  if (limit == 0) return {};
  return do_parked(limit);
}

std::size_t Outbox::unpark() {
  const std::size_t unparked = do_unpark();
  if (unparked > 0) notify_committed();
  return unparked;
}

void Outbox::notify_committed() {
  wake();
}

void Outbox::wake() {
  {
    std::lock_guard lock(wake_mutex_);
    woken_ = true;
  }
  wake_cv_.notify_all();
}

bool Outbox::do_wait_for_rows(std::chrono::milliseconds timeout) {
  std::unique_lock lock(wake_mutex_);
  const bool woken = wake_cv_.wait_for(lock, timeout, [this] { return woken_; });
  woken_ = false;
  return woken;
}

// ---- OutboxRelay ------------------------------------------------------------------------------

OutboxRelay::OutboxRelay(std::shared_ptr<Outbox> outbox, std::shared_ptr<OutboxPublisher> publisher,
                         OutboxRelayOptions options)
    : outbox_(std::move(outbox)), publisher_(std::move(publisher)), options_(std::move(options)) {
  if (!outbox_) throw InvalidArgument("OutboxRelay needs an outbox (got null)");
  if (!publisher_) throw InvalidArgument("OutboxRelay needs a publisher (got null)");
  if (options_.batch_size == 0) throw ConfigError("OutboxRelayOptions::batch_size must be >= 1");
  if (options_.poll_interval <= std::chrono::milliseconds::zero()) {
    throw ConfigError("OutboxRelayOptions::poll_interval must be positive (got " +
                      std::to_string(options_.poll_interval.count()) + " ms)");
  }
  if (options_.max_attempts < 1) {
    throw ConfigError("OutboxRelayOptions::max_attempts must be >= 1 (got " +
                      std::to_string(options_.max_attempts) + ")");
  }
  if (options_.failure_backoff < std::chrono::milliseconds::zero()) {
    throw ConfigError("OutboxRelayOptions::failure_backoff must be >= 0");
  }
}

OutboxRelay::~OutboxRelay() {
  stop();
}

void OutboxRelay::count(const RelayBatchResult& result) {
  std::lock_guard lock(mutex_);
  ++stats_.passes;
  stats_.published += result.published;
  stats_.refused += result.refused;
  stats_.parked += result.parked;
}

RelayBatchResult OutboxRelay::run_once() {
  {
    std::lock_guard lock(mutex_);
    if (thread_.joinable()) {
      throw InvalidArgument("OutboxRelay::run_once: the relay's background thread is running");
    }
  }
  try {
    auto result = outbox_->relay_batch(*publisher_, options_.batch_size, options_.max_attempts);
    count(result);
    return result;
  } catch (...) {
    std::lock_guard lock(mutex_);
    ++stats_.failures;
    throw;
  }
}

std::size_t OutboxRelay::drain(std::size_t max_passes) {
  std::size_t published = 0;
  for (std::size_t pass = 0; pass < max_passes; ++pass) {
    const RelayBatchResult result = run_once();
    published += result.published;
    if (result.taken == 0 || result.deferred > 0) break;
  }
  return published;
}

void OutboxRelay::start() {
  std::lock_guard lock(mutex_);
  if (thread_.joinable()) return;
  thread_ = std::jthread([this](std::stop_token stop) { loop(stop); });
}

void OutboxRelay::stop() {
  std::jthread thread;
  {
    std::lock_guard lock(mutex_);
    thread = std::move(thread_);
  }
  if (thread.joinable()) {
    thread.request_stop();
    outbox_->notify_committed();  // wake it from wait_for_rows
    thread.join();
  }
}

OutboxRelayStats OutboxRelay::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

void OutboxRelay::loop(std::stop_token stop) {
  while (!stop.stop_requested()) {
    bool more = false;
    try {
      const auto result =
          outbox_->relay_batch(*publisher_, options_.batch_size, options_.max_attempts);
      count(result);
      more = result.taken > 0 && !result.busy && result.deferred == 0;
    } catch (const std::exception& e) {
      {
        std::lock_guard lock(mutex_);
        ++stats_.failures;
      }
      if (options_.on_failure) {
        try {
          options_.on_failure(e);
        } catch (...) {
        }
      }
      if (stop.stop_requested()) break;
      // A wake (or stop) cuts the backoff short only for stop; a commit does not help a broker
      // that is down, so wait the backoff out in slices.
      const auto until = std::chrono::steady_clock::now() + options_.failure_backoff;
      while (!stop.stop_requested() && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(
            std::chrono::milliseconds(10), until - std::chrono::steady_clock::now()));
      }
      continue;
    }
    if (more || stop.stop_requested()) continue;
    try {
      outbox_->wait_for_rows(options_.poll_interval);
    } catch (...) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

}  // namespace idem
