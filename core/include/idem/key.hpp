// Validation of keys, event ids and consumer names.
//
// Every string idem stores as part of a key goes through validate_key() first, so a bad value is
// rejected with a clear InvalidKey error before anything is written. A valid key is
//   * non-empty and not only whitespace,
//   * at most kMaxKeyLength bytes (so a client cannot blow up storage),
//   * free of control characters (bytes < 0x20 and 0x7f), NUL included.
// Any other bytes (UTF-8, quotes, semicolons, ...) are allowed: backends pass keys as bound
// parameters, never as code.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <string_view>

namespace idem {

inline constexpr std::size_t kMaxKeyLength = 255;

// Throws InvalidKey naming `what` ("consumer", "event id", "idempotency key") and the reason.
void validate_key(std::string_view what, std::string_view value,
                  std::size_t max_length = kMaxKeyLength);

// The same check without throwing.
bool is_valid_key(std::string_view value, std::size_t max_length = kMaxKeyLength) noexcept;

}  // namespace idem
