#include "idem/recorder.hpp"

#include "idem/detail/contract.hpp"
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

namespace {

void check_batch(std::string_view consumer, std::span<const std::string> event_ids) {
  validate_key("consumer", consumer);
  for (const auto& id : event_ids)
    validate_key("event id", id);
}

}  // namespace

// ---- the contract: every public call checks its arguments, then asks the backend -------------

bool IdempotencyRecorder::is_processed(std::string_view consumer, std::string_view event_id) {
  detail::check_marker_key(consumer, event_id);
  return do_is_processed(consumer, event_id);
}

void IdempotencyRecorder::mark_processed(std::string_view consumer, std::string_view event_id) {
  detail::check_marker_key(consumer, event_id);
  do_mark_processed(consumer, event_id);
}

std::vector<bool> IdempotencyRecorder::is_processed_many(std::string_view consumer,
                                                         std::span<const std::string> event_ids) {
  check_batch(consumer, event_ids);
  if (event_ids.empty()) return {};
  return do_is_processed_many(consumer, event_ids);
}

void IdempotencyRecorder::mark_processed_many(std::string_view consumer,
                                              std::span<const std::string> event_ids) {
  check_batch(consumer, event_ids);
  if (event_ids.empty()) return;
  do_mark_processed_many(consumer, event_ids);
}

Claim IdempotencyRecorder::claim(std::string_view consumer, std::string_view event_id,
                                 Millis lease) {
  detail::check_marker_key(consumer, event_id);
  detail::check_lease(lease);
  return do_claim(consumer, event_id, lease);
}

bool IdempotencyRecorder::complete(std::string_view consumer, std::string_view event_id,
                                   std::uint64_t token) {
  detail::check_marker_key(consumer, event_id);
  return do_complete(consumer, event_id, token);
}

bool IdempotencyRecorder::release(std::string_view consumer, std::string_view event_id,
                                  std::uint64_t token) {
  detail::check_marker_key(consumer, event_id);
  return do_release(consumer, event_id, token);
}

bool IdempotencyRecorder::renew(std::string_view consumer, std::string_view event_id,
                                std::uint64_t token, Millis lease) {
  detail::check_marker_key(consumer, event_id);
  detail::check_lease(lease);
  return do_renew(consumer, event_id, token, lease);
}

bool IdempotencyRecorder::run_transactional(std::string_view consumer, std::string_view event_id,
                                            const std::function<void(Transaction&)>& fn) {
  detail::check_marker_key(consumer, event_id);
  if (!fn) throw InvalidArgument("run_transactional: the callback is empty");
  return do_run_transactional(consumer, event_id, fn);
}

std::size_t IdempotencyRecorder::purge(std::chrono::system_clock::duration older_than,
                                       const PurgeProgress& progress) {
  detail::check_older_than(older_than);
  return do_purge(older_than, progress);
}

std::size_t IdempotencyRecorder::count_purgeable(std::chrono::system_clock::duration older_than) {
  detail::check_older_than(older_than);
  return do_count_purgeable(older_than);
}

PurgeableMarkers IdempotencyRecorder::purgeable_markers(
    std::chrono::system_clock::duration older_than) {
  detail::check_older_than(older_than);
  return do_purgeable_markers(older_than);
}

MarkerInspection IdempotencyRecorder::inspect(std::string_view consumer,
                                              std::string_view event_id) {
  detail::check_marker_key(consumer, event_id);
  return do_inspect(consumer, event_id);
}

// ---- defaults -----------------------------------------------------------------------------------

std::vector<bool> IdempotencyRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  std::vector<bool> processed;
  processed.reserve(event_ids.size());
  for (const auto& id : event_ids)
    processed.push_back(do_is_processed(consumer, id));
  return processed;
}

void IdempotencyRecorder::do_mark_processed_many(std::string_view consumer,
                                                 std::span<const std::string> event_ids) {
  for (const auto& id : event_ids)
    do_mark_processed(consumer, id);
}

Claim IdempotencyRecorder::do_claim(std::string_view, std::string_view, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::do_complete(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::do_release(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::do_renew(std::string_view, std::string_view, std::uint64_t, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
}

bool IdempotencyRecorder::do_run_transactional(std::string_view, std::string_view,
                                               const std::function<void(Transaction&)>&) {
  throw NotSupported("this recorder does not support transactions (transactional mode)");
}

std::vector<ConsumerCounts> IdempotencyRecorder::do_consumer_counts() {
  throw NotSupported("this recorder cannot count its markers (consumer_counts)");
}

std::size_t IdempotencyRecorder::do_count_purgeable(std::chrono::system_clock::duration) {
  throw NotSupported("this recorder cannot count its markers (count_purgeable)");
}

PurgeableMarkers IdempotencyRecorder::do_purgeable_markers(
    std::chrono::system_clock::duration older_than) {
  PurgeableMarkers markers;
  markers.old = do_count_purgeable(older_than);
  return markers;
}

MarkerInspection IdempotencyRecorder::do_inspect(std::string_view, std::string_view) {
  throw NotSupported("this recorder cannot inspect its markers (inspect)");
}

}  // namespace idem
