#include "idem/recorder.hpp"

#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem {

std::string_view to_string(Claim::Status status) noexcept {
  switch (status) {
    case Claim::Status::acquired:
      return "acquired";
    case Claim::Status::processed:
      return "processed";
    case Claim::Status::in_progress:
      return "in_progress";
  }
  return "unknown";
}

std::vector<bool> IdempotencyRecorder::is_processed_many(std::string_view consumer,
                                                         std::span<const std::string> event_ids) {
  validate_key("consumer name", consumer);
  for (const auto& id : event_ids)
    validate_key("event id", id);
  std::vector<bool> processed;
  processed.reserve(event_ids.size());
  for (const auto& id : event_ids)
    processed.push_back(is_processed(consumer, id));
  return processed;
}

void IdempotencyRecorder::mark_processed_many(std::string_view consumer,
                                              std::span<const std::string> event_ids) {
  validate_key("consumer name", consumer);
  for (const auto& id : event_ids)
    validate_key("event id", id);
  for (const auto& id : event_ids)
    mark_processed(consumer, id);
}

Claim IdempotencyRecorder::claim(std::string_view, std::string_view, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::complete(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::release(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::renew(std::string_view, std::string_view, std::uint64_t, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

std::size_t IdempotencyRecorder::purge(std::chrono::system_clock::duration older_than,
                                       const PurgeProgress& progress) {
  const std::size_t purged = purge(older_than);
  if (purged > 0 && progress) progress(purged);
  return purged;
}

std::vector<ConsumerCounts> IdempotencyRecorder::consumer_counts() {
  throw NotSupported("this recorder cannot count its markers (consumer_counts)");
}

std::size_t IdempotencyRecorder::count_purgeable(std::chrono::system_clock::duration) {
  throw NotSupported("this recorder cannot count its markers (count_purgeable)");
}

MarkerInspection IdempotencyRecorder::inspect(std::string_view, std::string_view) {
  throw NotSupported("this recorder cannot inspect its markers (inspect)");
}

bool IdempotencyRecorder::run_transactional(std::string_view, std::string_view,
                                            const std::function<void(Transaction&)>&) {
  throw NotSupported("this recorder does not support transactions (transactional mode)");
}

}  // namespace idem
