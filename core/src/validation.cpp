#include "idem/validation.hpp"

namespace idem {

ValidationError::ValidationError(std::string validator, std::string reason, bool retryable)
    : Error(ErrorCode::validation_failed,
            "validator '" + validator + "' rejected the result: " + reason, retryable),
      validator_(std::move(validator)),
      reason_(std::move(reason)) {}

}  // namespace idem
