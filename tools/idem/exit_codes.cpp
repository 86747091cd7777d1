#include "exit_codes.hpp"

#include "idem/error.hpp"

namespace idem::cli {

int exit_code_of(const std::exception& error) noexcept {
  if (dynamic_cast<const InvalidArgument*>(&error) != nullptr) return kUsage;
  if (dynamic_cast<const NotSupported*>(&error) != nullptr) return kUsage;
  return kStoreFailure;
}

std::string describe(const std::exception& error) {
  const auto* e = dynamic_cast<const Error*>(&error);
  if (e == nullptr) return error.what();
  std::string text = std::string(e->code_name()) + ": " + e->message();
  if (e->retryable()) text += " (retryable)";
  return text;
}

}  // namespace idem::cli
