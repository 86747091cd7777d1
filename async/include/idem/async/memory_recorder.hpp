// AsyncMemoryRecorder: an AsyncRecorder over idem::InMemoryIdempotencyRecorder.
//
// It shares the markers and claims of the blocking recorder it wraps: a blocking handler and a
// coroutine handler over one InMemoryIdempotencyRecorder see each other's markers and contend
// for the same claims. Every call completes inline on the awaiting coroutine's thread (the
// in-memory recorder only takes a short shard lock), so there is no thread hop and nothing to
// suspend for.
//
// Guarantees: those of InMemoryIdempotencyRecorder (memory_recorder.hpp), call for call; claims
// yes, transactions no (capabilities() == {.claims = true, .transactions = false}).
//
// Cancellation: a call whose awaiting coroutine has already been cancelled ends with
// asio::system_error(operation_aborted) and does nothing (Asio's throw_if_cancelled; a caller
// that must still clean up — AsyncIdempotentHandler releasing its claim — first resets its
// cancellation state); once started, a call finishes (it never suspends, so there is no point
// at which it could stop half-way).
//
// Thread safety: any number of coroutines on any executors (and blocking users of the wrapped
// recorder) may use one AsyncMemoryRecorder at once.
#pragma once

#include <memory>

#include "idem/async/recorder.hpp"
#include "idem/memory_recorder.hpp"

namespace idem::async {

class AsyncMemoryRecorder final : public AsyncRecorder {
 public:
  // A fresh in-memory recorder of its own.
  explicit AsyncMemoryRecorder(InMemoryRecorderOptions options = {});
  // Shares `recorder`'s markers (not null: InvalidArgument).
  explicit AsyncMemoryRecorder(std::shared_ptr<InMemoryIdempotencyRecorder> recorder);

  // The blocking recorder that holds the markers.
  [[nodiscard]] const std::shared_ptr<InMemoryIdempotencyRecorder>& blocking() const noexcept {
    return recorder_;
  }

 private:
  Task<bool> do_is_processed(std::string_view consumer, std::string_view event_id) override;
  Task<void> do_mark_processed(std::string_view consumer, std::string_view event_id) override;
  Task<std::vector<bool>> do_is_processed_many(std::string_view consumer,
                                               std::span<const std::string> event_ids) override;
  Task<void> do_mark_processed_many(std::string_view consumer,
                                    std::span<const std::string> event_ids) override;
  RecorderCapabilities do_capabilities() const noexcept override {
    return {.claims = true, .transactions = false};
  }
  Task<Claim> do_claim(std::string_view consumer, std::string_view event_id, Millis lease) override;
  Task<bool> do_complete(std::string_view consumer, std::string_view event_id,
                         std::uint64_t token) override;
  Task<bool> do_release(std::string_view consumer, std::string_view event_id,
                        std::uint64_t token) override;
  Task<bool> do_renew(std::string_view consumer, std::string_view event_id, std::uint64_t token,
                      Millis lease) override;

  std::shared_ptr<InMemoryIdempotencyRecorder> recorder_;
};

}  // namespace idem::async
