#include "idem/recorder.hpp"

#include "idem/error.hpp"

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

bool IdempotencyRecorder::run_transactional(std::string_view, std::string_view,
                                            const std::function<void(Transaction&)>&) {
  throw NotSupported("this recorder does not support transactions (transactional mode)");
}

}  // namespace idem
