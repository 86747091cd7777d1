#include "exit_codes.hpp"

#include <filesystem>

#include "idem/error.hpp"

namespace idem::cli {

int exit_code_of(const std::exception& error) noexcept {
  if (dynamic_cast<const InvalidArgument*>(&error) != nullptr) return kUsage;
  // A path the user gave that is not what it must be (a file where a directory belongs).
  if (dynamic_cast<const std::filesystem::filesystem_error*>(&error) != nullptr) return kUsage;
  if (dynamic_cast<const NotSupported*>(&error) != nullptr) return kUsage;
  return kStoreFailure;
}

std::string describe(const std::exception& error) {
  if (const auto* fs = dynamic_cast<const std::filesystem::filesystem_error*>(&error)) {
    // "filesystem error: cannot create directories: Not a directory [p]": as an idem error,
    // with the path the step failed on.
    std::string text =
        std::string(code_name(ErrorCode::invalid_argument)) + ": " + fs->code().message();
    if (!fs->path1().empty()) text += ": '" + fs->path1().string() + "'";
    if (!fs->path2().empty()) text += " and '" + fs->path2().string() + "'";
    return text;
  }
  const auto* e = dynamic_cast<const Error*>(&error);
  if (e == nullptr) return error.what();
  std::string text = std::string(e->code_name()) + ": " + e->message();
  if (e->retryable()) text += " (retryable)";
  return text;
}

}  // namespace idem::cli
