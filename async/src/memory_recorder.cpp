#include "idem/async/memory_recorder.hpp"

#include <asio/error.hpp>
#include <asio/this_coro.hpp>
#include <system_error>
#include <utility>

#include "idem/error.hpp"

namespace idem::async {

namespace {

// operation_aborted when the awaiting coroutine was cancelled before the call started.
Task<void> stop_if_cancelled() {
  auto state = co_await asio::this_coro::cancellation_state;
  if (state.cancelled() != asio::cancellation_type::none)
    throw std::system_error(asio::error::operation_aborted);
}

}  // namespace

AsyncMemoryRecorder::AsyncMemoryRecorder(InMemoryRecorderOptions options)
    : recorder_(std::make_shared<InMemoryIdempotencyRecorder>(std::move(options))) {}

AsyncMemoryRecorder::AsyncMemoryRecorder(std::shared_ptr<InMemoryIdempotencyRecorder> recorder)
    : recorder_(std::move(recorder)) {
  if (!recorder_) throw InvalidArgument("AsyncMemoryRecorder: the recorder is null");
}

Task<bool> AsyncMemoryRecorder::do_is_processed(std::string_view consumer,
                                                std::string_view event_id) {
  co_await stop_if_cancelled();
  co_return recorder_->is_processed(consumer, event_id);
}

Task<void> AsyncMemoryRecorder::do_mark_processed(std::string_view consumer,
                                                  std::string_view event_id) {
  co_await stop_if_cancelled();
  recorder_->mark_processed(consumer, event_id);
}

Task<std::vector<bool>> AsyncMemoryRecorder::do_is_processed_many(
    std::string_view consumer, std::span<const std::string> event_ids) {
  co_await stop_if_cancelled();
  co_return recorder_->is_processed_many(consumer, event_ids);
}

Task<void> AsyncMemoryRecorder::do_mark_processed_many(std::string_view consumer,
                                                       std::span<const std::string> event_ids) {
  co_await stop_if_cancelled();
  recorder_->mark_processed_many(consumer, event_ids);
}

Task<Claim> AsyncMemoryRecorder::do_claim(std::string_view consumer, std::string_view event_id,
                                          Millis lease) {
  co_await stop_if_cancelled();
  co_return recorder_->claim(consumer, event_id, lease);
}

Task<bool> AsyncMemoryRecorder::do_complete(std::string_view consumer, std::string_view event_id,
                                            std::uint64_t token) {
  co_await stop_if_cancelled();
  co_return recorder_->complete(consumer, event_id, token);
}

Task<bool> AsyncMemoryRecorder::do_release(std::string_view consumer, std::string_view event_id,
                                           std::uint64_t token) {
  // A release gives a claim back; it runs even for a cancelled caller (the handler's cleanup
  // after a cancellation is exactly when it is needed).
  co_return recorder_->release(consumer, event_id, token);
}

Task<bool> AsyncMemoryRecorder::do_renew(std::string_view consumer, std::string_view event_id,
                                         std::uint64_t token, Millis lease) {
  co_await stop_if_cancelled();
  co_return recorder_->renew(consumer, event_id, token, lease);
}

}  // namespace idem::async
