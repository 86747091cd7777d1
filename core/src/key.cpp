#include "idem/key.hpp"

#include <string>

#include "idem/error.hpp"

namespace idem {
namespace {

// Returns nullptr when valid, else the reason.
const char* key_problem(std::string_view value, std::size_t max_length) noexcept {
  if (value.empty()) return "is empty";
  if (value.size() > max_length) return "is too long";
  // The common case in one branch-free pass the compiler vectorizes (every call of every
  // backend checks its keys here, and a 255-byte id is scanned on each); the loop below runs
  // only to name what is wrong.
  unsigned bad = 0;
  unsigned printable = 0;
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    bad |= static_cast<unsigned>(c < 0x20) | static_cast<unsigned>(c == 0x7f);
    printable |= static_cast<unsigned>(c != ' ');
  }
  if (bad == 0 && printable != 0) return nullptr;
  bool all_space = true;
  for (unsigned char c : value) {
    if (c == 0) return "contains a NUL byte";
    if (c < 0x20 || c == 0x7f) return "contains a control character";
    if (c != ' ') all_space = false;
  }
  if (all_space) return "is only whitespace";
  return nullptr;
}

}  // namespace

bool is_valid_key(std::string_view value, std::size_t max_length) noexcept {
  return key_problem(value, max_length) == nullptr;
}

void validate_key(std::string_view what, std::string_view value, std::size_t max_length) {
  const char* problem = key_problem(value, max_length);
  if (problem == nullptr) return;
  std::string message = std::string(what) + " " + problem;
  if (value.size() > max_length) {
    message +=
        " (" + std::to_string(value.size()) + " bytes, at most " + std::to_string(max_length) + ")";
  }
  throw InvalidKey(message);
}

}  // namespace idem
