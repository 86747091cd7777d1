// Keys and event ids: validate_key, is_valid_key and is_uuid4_hex agree with each other.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_support.hpp"
#include "idem/event.hpp"
#include "idem/key.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const bool valid = idem::is_valid_key(input);
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
