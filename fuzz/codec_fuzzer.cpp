// Codec<T>::decode on arbitrary bytes for the built-in codecs: it returns or throws DecodeError
// (an idem error), and what it decodes encodes back to bytes that decode to the same value.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "fuzz_support.hpp"
#include "idem/codec.hpp"

namespace fuzzed {
// A user type decoded through from_json. Its integer field is 64-bit: a non-integral float
// beyond a narrower field's range is a cast nlohmann-json leaves undefined and idem documents
// rather than guards (core/include/idem/codec.hpp), so an int32 field would only re-find that.
struct Record {
  std::int64_t count = 0;
  double value = 0;
  std::string name;
  std::vector<std::int64_t> items;
  bool operator==(const Record&) const = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Record, count, value, name, items)
}  // namespace fuzzed

namespace {

template <class T>
void round_trip(std::string_view bytes, const char* name) {
  idem::fuzz::expect_only_idem_errors(name, [&] {
    const T value = idem::Codec<T>::decode(bytes);
    const std::string encoded = idem::Codec<T>::encode(value);
    const T again = idem::Codec<T>::decode(encoded);
    if constexpr (std::is_floating_point_v<T>) {
      if (value == value && !(again == value)) idem::fuzz::fail(std::string(name) + " round trip");
    } else {
      if (!(again == value)) idem::fuzz::fail(std::string(name) + " round trip");
    }
  });
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  round_trip<bool>(bytes, "Codec<bool>");
  round_trip<int>(bytes, "Codec<int>");
  round_trip<std::int64_t>(bytes, "Codec<int64_t>");
  round_trip<std::uint64_t>(bytes, "Codec<uint64_t>");
  round_trip<std::uint8_t>(bytes, "Codec<uint8_t>");
  round_trip<double>(bytes, "Codec<double>");
  round_trip<float>(bytes, "Codec<float>");
  round_trip<std::string>(bytes, "Codec<string>");
  round_trip<std::vector<std::byte>>(bytes, "Codec<vector<byte>>");
  round_trip<nlohmann::json>(bytes, "Codec<json>");
  // Through from_json: {"a":2e22} into an int was a float-cast-overflow inside nlohmann-json
  // (fuzz/regressions/codec/); the typed codec now checks numbers first.
  round_trip<fuzzed::Record>(bytes, "Codec<Record>");
  round_trip<std::map<std::string, std::int64_t>>(bytes, "Codec<map<string,int64_t>>");
  round_trip<std::vector<double>>(bytes, "Codec<vector<double>>");
  return 0;
}
