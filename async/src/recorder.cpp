#include "idem/async/recorder.hpp"

#include <utility>

#include "idem/detail/contract.hpp"
#include "idem/error.hpp"

namespace idem::async {

namespace {

void check_ids(std::string_view consumer, std::span<const std::string> event_ids) {
  for (const auto& id : event_ids)
    detail::check_marker_key(consumer, id);
  if (event_ids.empty()) detail::check_marker_key(consumer, "x");  // the consumer alone
}

}  // namespace

Task<bool> AsyncRecorder::is_processed(std::string_view consumer, std::string_view event_id) {
  detail::check_marker_key(consumer, event_id);
  co_return co_await do_is_processed(consumer, event_id);
}

Task<void> AsyncRecorder::mark_processed(std::string_view consumer, std::string_view event_id) {
  detail::check_marker_key(consumer, event_id);
  co_await do_mark_processed(consumer, event_id);
}

Task<std::vector<bool>> AsyncRecorder::is_processed_many(std::string_view consumer,
                                                         std::span<const std::string> event_ids) {
  check_ids(consumer, event_ids);
  if (event_ids.empty()) co_return std::vector<bool>{};
  co_return co_await do_is_processed_many(consumer, event_ids);
}

Task<void> AsyncRecorder::mark_processed_many(std::string_view consumer,
                                              std::span<const std::string> event_ids) {
  check_ids(consumer, event_ids);
  if (event_ids.empty()) co_return;
  co_await do_mark_processed_many(consumer, event_ids);
}

Task<Claim> AsyncRecorder::claim(std::string_view consumer, std::string_view event_id,
                                 Millis lease) {
  detail::check_marker_key(consumer, event_id);
  detail::check_lease(lease);
  co_return co_await do_claim(consumer, event_id, lease);
}

Task<bool> AsyncRecorder::complete(std::string_view consumer, std::string_view event_id,
                                   std::uint64_t token) {
  detail::check_marker_key(consumer, event_id);
  co_return co_await do_complete(consumer, event_id, token);
}

Task<bool> AsyncRecorder::release(std::string_view consumer, std::string_view event_id,
                                  std::uint64_t token) {
  detail::check_marker_key(consumer, event_id);
  co_return co_await do_release(consumer, event_id, token);
}

Task<bool> AsyncRecorder::renew(std::string_view consumer, std::string_view event_id,
                                std::uint64_t token, Millis lease) {
  detail::check_marker_key(consumer, event_id);
  detail::check_lease(lease);
  co_return co_await do_renew(consumer, event_id, token, lease);
}

Task<bool> AsyncRecorder::run_transactional(std::string_view consumer, std::string_view event_id,
                                            TransactionalFn fn) {
  detail::check_marker_key(consumer, event_id);
  if (!fn) throw InvalidArgument("run_transactional: the callback is empty");
  co_return co_await do_run_transactional(consumer, event_id, std::move(fn));
}

// ---- defaults ---------------------------------------------------------------------------------

Task<std::vector<bool>> AsyncRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  std::vector<bool> result;
  result.reserve(event_ids.size());
  for (const auto& id : event_ids)
    result.push_back(co_await do_is_processed(consumer, id));
  co_return result;
}

Task<void> AsyncRecorder::do_mark_processed_many(std::string_view consumer,
                                                 std::span<const std::string> event_ids) {
  for (const auto& id : event_ids)
    co_await do_mark_processed(consumer, id);
}

Task<Claim> AsyncRecorder::do_claim(std::string_view, std::string_view, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
  co_return Claim{};
}

Task<bool> AsyncRecorder::do_complete(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
  co_return false;
}

Task<bool> AsyncRecorder::do_release(std::string_view, std::string_view, std::uint64_t) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
  co_return false;
}

Task<bool> AsyncRecorder::do_renew(std::string_view, std::string_view, std::uint64_t, Millis) {
  throw NotSupported("this recorder does not support claims (exclusive mode)");
  co_return false;
}

Task<bool> AsyncRecorder::do_run_transactional(std::string_view, std::string_view,
                                               TransactionalFn) {
  throw NotSupported("this recorder does not support transactions (transactional mode)");
  co_return false;
}

}  // namespace idem::async
