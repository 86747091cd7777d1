#include "idem/codec.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <map>
#include <vector>

namespace shop {
struct Payment {
  std::string id;
  int amount = 0;
  bool operator==(const Payment&) const = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Payment, id, amount)
}  // namespace shop

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

}  // namespace
