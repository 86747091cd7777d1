// Keys and event ids: validate_key, is_valid_key and is_uuid4_hex agree with each other and with
// the rule key.hpp states, written here byte by byte (the library scans 16 bytes at a time).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"
#include "idem/event.hpp"
#include "idem/key.hpp"

namespace {

// key.hpp's rule: non-empty, at most `max_length` bytes, no byte below 0x20 and no 0x7f, not
// only spaces.
bool follows_the_rule(std::string_view key, std::size_t max_length) {
  if (key.empty() || key.size() > max_length) return false;
  bool only_spaces = true;
  for (const char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7f) return false;
    if (c != ' ') only_spaces = false;
  }
  return !only_spaces;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool valid = idem::is_valid_key(input);
  if (valid != follows_the_rule(input, idem::kMaxKeyLength)) {
    idem::fuzz::fail("is_valid_key breaks the rule of key.hpp");
  }
  // Every suffix too: the 16-byte steps and the overlapping tail meet every alignment.
  for (std::size_t skip = 1; skip < size && skip < 48; ++skip) {
    if (idem::is_valid_key(input.substr(skip)) !=
        follows_the_rule(input.substr(skip), idem::kMaxKeyLength)) {
      idem::fuzz::fail("is_valid_key breaks the rule of key.hpp on a suffix");
    }
  }
  bool threw = false;
  try {
    idem::validate_key("key", input);
  } catch (const idem::InvalidKey&) {
    threw = true;
  } catch (...) {
    idem::fuzz::fail("validate_key threw something other than InvalidKey");
  }
  if (valid == threw) idem::fuzz::fail("is_valid_key and validate_key disagree");
  if (idem::is_uuid4_hex(input) && !valid) {
    idem::fuzz::fail("a uuid4 event id is not a valid key");
  }
  // A tighter length bound only ever rejects more.
  if (idem::is_valid_key(input, 16) && !valid) idem::fuzz::fail("length bound widened the set");
  return 0;
}
