#include "idem/error.hpp"

namespace idem {

std::string_view code_name(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::invalid_argument:
      return "invalid_argument";
    case ErrorCode::invalid_key:
      return "invalid_key";
    case ErrorCode::config_error:
      return "config_error";
    case ErrorCode::store_error:
      return "store_error";
    case ErrorCode::store_open_failed:
      return "store_open_failed";
    case ErrorCode::store_not_a_database:
      return "store_not_a_database";
    case ErrorCode::store_read_only:
      return "store_read_only";
    case ErrorCode::store_busy:
      return "store_busy";
    case ErrorCode::store_corrupt_record:
      return "store_corrupt_record";
    case ErrorCode::already_in_progress:
      return "already_in_progress";
    case ErrorCode::reentry:
      return "reentry";
    case ErrorCode::key_reuse:
      return "key_reuse";
    case ErrorCode::timeout:
      return "timeout";
    case ErrorCode::circuit_open:
      return "circuit_open";
    case ErrorCode::validation_failed:
      return "validation_failed";
    case ErrorCode::fallback_chain_failed:
      return "fallback_chain_failed";
    case ErrorCode::operation_failed:
      return "operation_failed";
    case ErrorCode::cancelled:
      return "cancelled";
    case ErrorCode::decode_error:
      return "decode_error";
    case ErrorCode::not_supported:
      return "not_supported";
    case ErrorCode::rate_limit_wait_exceeded:
      return "rate_limit_wait_exceeded";
    case ErrorCode::retry_after_extraction_failed:
      return "retry_after_extraction_failed";
    case ErrorCode::store_replaced:
      return "store_replaced";
    case ErrorCode::store_corrupt:
      return "store_corrupt";
    case ErrorCode::host_not_found:
      return "host_not_found";
    case ErrorCode::connection_refused:
      return "connection_refused";
    case ErrorCode::connect_timeout:
      return "connect_timeout";
    case ErrorCode::wrong_protocol:
      return "wrong_protocol";
    case ErrorCode::broker_error:
      return "broker_error";
  }
  return "unknown";
}

Error::Error(ErrorCode code, const std::string& message, bool retryable, bool in_doubt)
    : std::runtime_error("idem: " + std::string(idem::code_name(code)) + ": " + message),
      message_(message),
      code_(code),
      retryable_(retryable),
      in_doubt_(in_doubt) {}

}  // namespace idem
