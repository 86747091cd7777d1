#include "idem/codec.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

namespace idem::detail {

namespace {

// 2^63 and 2^64 are exact doubles; every double below them in magnitude truncates to a value
// int64_t (or uint64_t) can hold.
constexpr double kTwoTo63 = 9223372036854775808.0;
constexpr double kTwoTo64 = 18446744073709551616.0;

void normalise_float(nlohmann::json& number) {
  const double value = number.get<double>();
  if (!std::isfinite(value) || value < -kTwoTo63 || value >= kTwoTo64) {
    throw DecodeError("cannot decode a JSON value: the number " + number.dump() +
                      " is beyond the 64-bit integer range, which the typed JSON codec refuses "
                      "(decode it as nlohmann::json)");
  }
  if (std::trunc(value) != value) return;         // 2.5 stays a float
  if (value == 0 && std::signbit(value)) return;  // -0.0 too: it truncates to 0 in any field
  if (value < kTwoTo63) {
    number = static_cast<std::int64_t>(value);
  } else {
    number = static_cast<std::uint64_t>(value);
  }
}

}  // namespace

void normalise_json_numbers(nlohmann::json& document) {
  std::vector<nlohmann::json*> pending{&document};
  while (!pending.empty()) {
    nlohmann::json* node = pending.back();
    pending.pop_back();
    if (node->is_number_float()) {
      normalise_float(*node);
    } else if (node->is_structured()) {
      for (auto& child : *node)
        pending.push_back(&child);
    }
  }
}

}  // namespace idem::detail
