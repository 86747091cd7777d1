#include "idem/codec.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <vector>

// Linked with other test files into one executable: file-local, like everything here.
namespace {
namespace shop {
struct Payment {
  std::string id;
  int amount = 0;
  bool operator==(const Payment&) const = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Payment, id, amount)

struct Reading {
  std::int64_t count = 0;
  double value = 0;
  bool operator==(const Reading&) const = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Reading, count, value)
}  // namespace shop
}  // namespace

namespace {

template <class T>
T round_trip(const T& value) {
  return idem::Codec<T>::decode(idem::Codec<T>::encode(value));
}

TEST(Codec, RoundTripsEveryBuiltInTypeExactly) {
  EXPECT_EQ(round_trip(std::string()), "");
  EXPECT_EQ(round_trip(std::string("a\0b", 3)), std::string("a\0b", 3));
  EXPECT_EQ(round_trip(0), 0);
  EXPECT_EQ(round_trip(false), false);
  EXPECT_EQ(round_trip(true), true);
  EXPECT_EQ(round_trip(std::numeric_limits<std::int64_t>::min()),
            std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(round_trip(std::numeric_limits<std::uint64_t>::max()),
            std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(round_trip(0.1), 0.1);
  EXPECT_EQ(round_trip(-0.0f), -0.0f);
  EXPECT_EQ(round_trip(std::vector<std::byte>{}), std::vector<std::byte>{});
  EXPECT_EQ(round_trip(std::vector<unsigned char>{0, 255, 7}),
            (std::vector<unsigned char>{0, 255, 7}));
  EXPECT_EQ(round_trip(nlohmann::json::object()), nlohmann::json::object());
  EXPECT_EQ(round_trip(shop::Payment{"p-1", 2499}), (shop::Payment{"p-1", 2499}));
  EXPECT_EQ(round_trip(std::vector<shop::Payment>{}), std::vector<shop::Payment>{});
  EXPECT_EQ(round_trip(std::map<std::string, int>{{"a", 1}}),
            (std::map<std::string, int>{{"a", 1}}));
}

TEST(Codec, BadBytesThrowDecodeError) {
  EXPECT_THROW(idem::Codec<int>::decode(""), idem::DecodeError);
  EXPECT_THROW(idem::Codec<int>::decode("12x"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<int>::decode("99999999999999999999"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<bool>::decode("yes"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<nlohmann::json>::decode("{"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<shop::Payment>::decode(R"({"id":1})"), idem::DecodeError);
}

// nlohmann-json casts a JSON float into an integer field; out of range that cast is undefined
// behaviour (the codec fuzzer's {"a":2e22}, fuzz/regressions/codec/). The typed codec checks
// numbers before from_json.
TEST(Codec, TypedJsonRefusesNumbersBeyondTheIntegerRangeInsteadOfCastingThem) {
  using Map = std::map<std::string, int>;
  EXPECT_THROW(idem::Codec<Map>::decode(R"({"a":2e22})"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<Map>::decode(R"({"a":-1e300})"), idem::DecodeError);
  EXPECT_THROW(idem::Codec<shop::Reading>::decode(R"({"count":1,"value":1.8446744073709552e19})"),
               idem::DecodeError);
  // 1e19 fits a uint64_t, -9.3e18 fits no 64-bit integer.
  EXPECT_THROW(idem::Codec<std::vector<std::vector<double>>>::decode("[[1e19],[-9.3e18]]"),
               idem::DecodeError);
}

TEST(Codec, TypedJsonHandsIntegralFloatsOverAsExactIntegers) {
  using Map = std::map<std::string, std::int64_t>;
  EXPECT_EQ(idem::Codec<Map>::decode(R"({"a":1e3,"b":-9.223372036854775808e18,"c":4.0})"),
            (Map{{"a", 1000}, {"b", std::numeric_limits<std::int64_t>::min()}, {"c", 4}}));
  using UnsignedMap = std::map<std::string, std::uint64_t>;
  EXPECT_EQ(idem::Codec<UnsignedMap>::decode(R"({"a":1.5e19})"),
            (UnsignedMap{{"a", 15000000000000000000ULL}}));
  EXPECT_EQ(idem::Codec<shop::Reading>::decode(R"({"count":2.0,"value":2.5})"),
            (shop::Reading{2, 2.5}));
  EXPECT_EQ(idem::Codec<shop::Reading>::decode(R"({"count":7,"value":1e18})"),
            (shop::Reading{7, 1e18}));
  const auto negative_zero = idem::Codec<shop::Reading>::decode(R"({"count":0,"value":-0.0})");
  EXPECT_TRUE(std::signbit(negative_zero.value));
  // A non-integral float in a 64-bit integer field is truncated (nlohmann's conversion; defined).
  EXPECT_EQ(idem::Codec<Map>::decode(R"({"a":-2.75})"), (Map{{"a", -2}}));
}

TEST(Codec, TypedJsonChecksNumbersInDeeplyNestedDocumentsWithoutRecursion) {
  constexpr int kDepth = 100000;
  const std::string deep = std::string(kDepth, '[') + "1e300" + std::string(kDepth, ']');
  EXPECT_THROW(idem::Codec<std::vector<nlohmann::json>>::decode(deep), idem::DecodeError);
}

}  // namespace
