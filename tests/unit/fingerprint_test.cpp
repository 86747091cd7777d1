#include "idem/fingerprint.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

// Linked with other test files into one executable: file-local, like everything here.
namespace {
namespace shop {
struct Payment {
  std::string id;
  int amount = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Payment, id, amount)

// A type with only a Codec: its bytes are what gets fingerprinted.
struct Sku {
  std::string code;
};
enum class Currency : std::uint8_t { eur = 1, usd = 2 };
}  // namespace shop
}  // namespace

template <>
struct idem::Codec<shop::Sku> {
  static std::string encode(const shop::Sku& sku) { return "sku:" + sku.code; }
  static shop::Sku decode(std::string_view bytes) { return {std::string(bytes.substr(4))}; }
};

namespace {

using idem::fingerprint;
using nlohmann::json;
using nlohmann::ordered_json;

std::string hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out.push_back(kHex[c >> 4]);
    out.push_back(kHex[c & 0x0f]);
  }
  return out;
}

TEST(Fingerprint, Sha256MatchesTheStandardVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(idem::detail::sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(idem::detail::sha256_hex(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

TEST(Fingerprint, Sha1MatchesTheStandardVectors) {
  // FIPS 180-1 examples (Redis names scripts by this digest).
  EXPECT_EQ(idem::detail::sha1_hex("abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
  EXPECT_EQ(idem::detail::sha1_hex(""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
}

TEST(Fingerprint, CanonicalEncodingIsPinned) {
  // The documented version-1 layout: prefix, argument count, then tag + fixed-width big-endian
  // payloads. Changing it changes every stored fingerprint, so it must stay exactly this.
  EXPECT_EQ(hex(idem::detail::canonical_arguments(std::string("ab"), -2, true, 1.5)),
            hex(std::string("idem.fingerprint.v1") +    // prefix
                std::string("\0\0\0\0\0\0\0\x04", 8) +  // 4 args
                std::string("s\0\0\0\0\0\0\0\x02"
                            "ab",
                            11) +                                      // string
                std::string("i\xff\xff\xff\xff\xff\xff\xff\xfe", 9) +  // int -2
                std::string("b\x01", 2) +                              // true
                std::string("f\x3f\xf8\0\0\0\0\0\0", 9)));             // 1.5
}

TEST(Fingerprint, FixedInputsGiveFixedDigests) {
  // Computed once (and cross-checked with an independent script of the documented encoding),
  // then pinned: a fingerprint must be the same in every process and build.
  EXPECT_EQ(fingerprint(), "23715299d34c6ea5f37eb76a2c47f3b89de51bae036ed2e38a24c77286322159");
  EXPECT_EQ(fingerprint(std::string("create-payment"), 2499, true),
            "556ed07770e91880b84a40308ae12c269d3ba71220794557471a78e39c1892d7");
  EXPECT_EQ(
      fingerprint(json::parse(R"({"items": [1, 2.5, null], "currency": "EUR", "amount": 2499})")),
      "aefe05ba9f1816bd1424cd18691c2d5bba796bea8571ef53657946575cf533fd");
}

TEST(Fingerprint, IsLowercaseHexSha256) {
  const std::string fp = fingerprint("request-123", 2499);
  ASSERT_EQ(fp.size(), 64u);
  for (char c : fp)
    EXPECT_TRUE((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f')) << c;
  EXPECT_EQ(fp, fingerprint("request-123", 2499)) << "deterministic";
}

TEST(Fingerprint, BoundariesBetweenArgumentsCount) {
  EXPECT_NE(fingerprint("ab", "c"), fingerprint("a", "bc"));
  EXPECT_NE(fingerprint("abc"), fingerprint("ab", "c"));
  EXPECT_NE(fingerprint("a"), fingerprint("a", ""));
  EXPECT_NE(fingerprint(std::string("a\0b", 3)), fingerprint("a"));
  EXPECT_NE(fingerprint(1, 2), fingerprint(2, 1));
}

TEST(Fingerprint, KindsAreTaggedApart) {
  EXPECT_NE(fingerprint(1), fingerprint("1"));
  EXPECT_NE(fingerprint(true), fingerprint(1));
  EXPECT_NE(fingerprint(1), fingerprint(1.0));
  EXPECT_NE(fingerprint(std::string("x")), fingerprint(json("x")));
  EXPECT_NE(fingerprint(std::optional<int>(5)), fingerprint(5));
  EXPECT_NE(fingerprint(std::optional<int>()), fingerprint(std::optional<std::string>("")));
  EXPECT_EQ(fingerprint(std::optional<int>()), fingerprint(std::optional<std::string>()));
}

TEST(Fingerprint, StringFormsAgree) {
  const std::string s = "payment";
  const std::string_view v = s;
  const char* c = "payment";
  EXPECT_EQ(fingerprint(s), fingerprint(v));
  EXPECT_EQ(fingerprint(s), fingerprint(c));
  EXPECT_EQ(fingerprint(s), fingerprint("payment"));
  EXPECT_EQ(fingerprint('x'), fingerprint("x"));
  const char* null_text = nullptr;
  EXPECT_THROW(fingerprint(null_text), idem::InvalidArgument);
}

TEST(Fingerprint, IntegersAreEncodedByValue) {
  EXPECT_EQ(fingerprint(5), fingerprint(5L));
  EXPECT_EQ(fingerprint(5), fingerprint(static_cast<short>(5)));
  EXPECT_EQ(fingerprint(5), fingerprint(5u));
  EXPECT_EQ(fingerprint(5), fingerprint(std::uint64_t{5}));
  EXPECT_NE(fingerprint(-1), fingerprint(std::numeric_limits<std::uint64_t>::max()));
  EXPECT_NE(fingerprint(std::numeric_limits<std::int64_t>::min()),
            fingerprint(std::numeric_limits<std::int64_t>::max()));
  EXPECT_EQ(fingerprint(shop::Currency::usd), fingerprint(2));
}

TEST(Fingerprint, FloatingPointUsesTheDoubleBits) {
  EXPECT_EQ(fingerprint(0.5f), fingerprint(0.5));
  EXPECT_NE(fingerprint(0.1f), fingerprint(0.1)) << "0.1f is a different number than 0.1";
  EXPECT_NE(fingerprint(0.0), fingerprint(-0.0));
  EXPECT_EQ(fingerprint(std::nan("1")), fingerprint(std::numeric_limits<double>::quiet_NaN()));
  EXPECT_EQ(fingerprint(-std::numeric_limits<double>::quiet_NaN()), fingerprint(std::nan("")));
}

TEST(Fingerprint, JsonObjectKeyOrderDoesNotMatter) {
  const json parsed_ab = json::parse(R"({"a": 1, "b": {"y": [1, {"q": 1, "p": 2}], "x": null}})");
  const json parsed_ba = json::parse(R"({"b": {"x": null, "y": [1, {"p": 2, "q": 1}]}, "a": 1})");
  ordered_json inserted_ba;
  inserted_ba["b"]["y"] = ordered_json::array({1, ordered_json{{"q", 1}, {"p", 2}}});
  inserted_ba["b"]["x"] = nullptr;
  inserted_ba["a"] = 1;
  ASSERT_EQ(inserted_ba.begin().key(), "b") << "ordered_json keeps insertion order";

  EXPECT_EQ(fingerprint(parsed_ab), fingerprint(parsed_ba));
  EXPECT_EQ(fingerprint(parsed_ab), fingerprint(inserted_ba));
  EXPECT_EQ(fingerprint(ordered_json::parse(R"({"z": 1, "a": 2})")),
            fingerprint(json::parse(R"({"a": 2, "z": 1})")));
}

TEST(Fingerprint, JsonValuesStillDistinguishContent) {
  EXPECT_NE(fingerprint(json::parse(R"({"a": 1})")), fingerprint(json::parse(R"({"a": 2})")));
  EXPECT_NE(fingerprint(json::parse(R"({"a": 1})")), fingerprint(json::parse(R"({"b": 1})")));
  EXPECT_NE(fingerprint(json::parse("[1, 2]")), fingerprint(json::parse("[2, 1]")))
      << "array order matters";
  EXPECT_NE(fingerprint(json::parse(R"({"a": [1]})")), fingerprint(json::parse(R"({"a": 1})")));
  EXPECT_NE(fingerprint(json::parse(R"(["ab", "c"])")), fingerprint(json::parse(R"(["a", "bc"])")));
  EXPECT_NE(fingerprint(json::parse("5")), fingerprint(json::parse("5.0")));
  EXPECT_EQ(fingerprint(json::parse("5")), fingerprint(json(5))) << "parsed unsigned == int";
  EXPECT_EQ(fingerprint(json::parse("-5")), fingerprint(json(-5)));
  EXPECT_NE(fingerprint(json(nullptr)), fingerprint(json(false)));
  EXPECT_NE(fingerprint(json::object()), fingerprint(json::array()));
}

TEST(Fingerprint, JsonConvertibleTypesAreFingerprintedAsTheirJson) {
  const shop::Payment payment{"p-1", 2499};
  EXPECT_EQ(fingerprint(payment), fingerprint(json{{"amount", 2499}, {"id", "p-1"}}));
  EXPECT_EQ(fingerprint(payment), fingerprint(ordered_json{{"id", "p-1"}, {"amount", 2499}}));
  EXPECT_NE(fingerprint(payment), fingerprint(shop::Payment{"p-1", 2500}));
  EXPECT_EQ(fingerprint(std::vector<shop::Payment>{payment}),
            fingerprint(json::array({json{{"id", "p-1"}, {"amount", 2499}}})));
  EXPECT_EQ(fingerprint(std::map<std::string, int>{{"b", 2}, {"a", 1}}),
            fingerprint(json{{"a", 1}, {"b", 2}}));
}

TEST(Fingerprint, CodecTypesAreFingerprintedByTheirBytes) {
  EXPECT_EQ(fingerprint(shop::Sku{"A-1"}), fingerprint(shop::Sku{"A-1"}));
  EXPECT_NE(fingerprint(shop::Sku{"A-1"}), fingerprint(shop::Sku{"A-2"}));
  EXPECT_NE(fingerprint(shop::Sku{"A-1"}), fingerprint("sku:A-1")) << "codec bytes are tagged";
  EXPECT_EQ(fingerprint(std::vector<unsigned char>{0, 255}),
            fingerprint(std::vector<std::byte>{std::byte{0}, std::byte{255}}));
}

}  // namespace
