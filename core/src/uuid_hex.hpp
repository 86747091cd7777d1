// Internal: the text of the event ids idem makes (idem::new_event_id, idem::follow_up_id): an
// RFC 4122 UUID as its 32 lowercase hex digits, without dashes.
#pragma once

#include <cstddef>
#include <string>

namespace idem::detail {

// The first 16 of `bytes` as a UUID of `version` (4: random, 5: name-based SHA-1): its version
// nibble and its variant bits set, then written as 32 lowercase hex digits.
inline std::string uuid_hex(const unsigned char* bytes, unsigned version) {
  unsigned char uuid[16];
  for (std::size_t i = 0; i < 16; ++i)
    uuid[i] = bytes[i];
  uuid[6] = static_cast<unsigned char>((uuid[6] & 0x0f) | (version << 4));
  uuid[8] = static_cast<unsigned char>((uuid[8] & 0x3f) | 0x80);  // RFC 4122 variant
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  for (std::size_t i = 0; i < 16; ++i) {
    id[2 * i] = kHex[uuid[i] >> 4];
    id[2 * i + 1] = kHex[uuid[i] & 0x0f];
  }
  return id;
}

}  // namespace idem::detail
