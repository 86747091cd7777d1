// Codec<T>: how a value becomes bytes and back.
//
// Durable stores keep operation results as bytes, and typed event handlers decode payloads, both
// through Codec<T>. Built in:
//   * std::string               — the bytes themselves;
//   * byte vectors              — std::vector<std::byte> / std::vector<unsigned char>, raw;
//   * bool                      — "true" / "false";
//   * integers, floating point  — shortest decimal text that round-trips exactly;
//   * nlohmann::json            — compact JSON text;
//   * any T with nlohmann-json to_json/from_json (found by ADL) — its JSON text.
// Specialise idem::Codec<T> for anything else:
//
//   template <> struct idem::Codec<Money> {
//     static std::string encode(const Money& m);
//     static Money decode(std::string_view bytes);   // throws idem::DecodeError on bad input
//   };
//
// decode() of the codecs above never has undefined behaviour on bad input: it throws DecodeError
// naming the type. For types decoded through from_json, numbers are checked first, because
// nlohmann-json converts a JSON float into an integer field with a plain cast (undefined
// behaviour when the value does not fit — found by fuzz/codec_fuzzer.cpp with {"a":2e22}):
//   * a float with an integral value that fits a 64-bit integer is handed over as that integer
//     (exact: 1e3 decodes into an int field as 1000, into a double field as 1000.0);
//   * a float beyond the 64-bit range (|x| >= 2^63, or >= 2^64 if positive) is refused with
//     DecodeError, since no integer field could hold it: decode such documents as nlohmann::json;
//   * a non-integral float (2.5) is handed over unchanged. Into a 64-bit integer field nlohmann
//     truncates it (defined); into a narrower or unsigned field whose range it exceeds
//     (3000000000.5 into an int, -1.5 into an unsigned) nlohmann's cast is still undefined, so
//     range-check such fields in your from_json when the bytes come from outside.
//
// Thread-safety: stateless.
#pragma once

#include <charconv>
#include <cstddef>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"

namespace idem {

template <class T, class Enable = void>
struct Codec;  // no codec for T: specialise idem::Codec<T> or give T to_json/from_json

template <class T>
concept HasCodec = requires(const T& value, std::string_view bytes) {
  { Codec<T>::encode(value) } -> std::convertible_to<std::string>;
  { Codec<T>::decode(bytes) } -> std::convertible_to<T>;
};

template <>
struct Codec<std::string> {
  static std::string encode(const std::string& value) { return value; }
  static std::string decode(std::string_view bytes) { return std::string(bytes); }
};

template <class Byte>
struct Codec<std::vector<Byte>, std::enable_if_t<std::is_same_v<Byte, std::byte> ||
                                                 std::is_same_v<Byte, unsigned char>>> {
  static std::string encode(const std::vector<Byte>& value) {
    return std::string(reinterpret_cast<const char*>(value.data()), value.size());
  }
  static std::vector<Byte> decode(std::string_view bytes) {
    const auto* begin = reinterpret_cast<const Byte*>(bytes.data());
    return std::vector<Byte>(begin, begin + bytes.size());
  }
};

template <>
struct Codec<bool> {
  static std::string encode(bool value) { return value ? "true" : "false"; }
  static bool decode(std::string_view bytes) {
    if (bytes == "true") return true;
    if (bytes == "false") return false;
    throw DecodeError("cannot decode bool from stored bytes");
  }
};

template <class T>
struct Codec<T, std::enable_if_t<std::is_arithmetic_v<T> && !std::is_same_v<T, bool>>> {
  static std::string encode(T value) {
    char buffer[64];
    auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
    if (ec != std::errc()) throw InvalidArgument("cannot encode number");
    return std::string(buffer, end);
  }
  static T decode(std::string_view bytes) {
    T value{};
    const char* first = bytes.data();
    const char* last = bytes.data() + bytes.size();
    auto [end, ec] = std::from_chars(first, last, value);
    if (ec != std::errc() || end != last || bytes.empty()) {
      throw DecodeError("cannot decode number from stored bytes '" +
                        std::string(bytes.substr(0, 32)) + "'");
    }
    return value;
  }
};

template <>
struct Codec<nlohmann::json> {
  static std::string encode(const nlohmann::json& value) { return value.dump(); }
  static nlohmann::json decode(std::string_view bytes) {
    try {
      return nlohmann::json::parse(bytes);
    } catch (const nlohmann::json::exception& e) {
      throw DecodeError(std::string("cannot decode JSON: ") + e.what());
    }
  }
};

namespace detail {
template <class T>
inline constexpr bool is_byte_vector_v = false;
template <>
inline constexpr bool is_byte_vector_v<std::vector<std::byte>> = true;
template <>
inline constexpr bool is_byte_vector_v<std::vector<unsigned char>> = true;

// T converts to and from JSON through nlohmann's adl_serializer (user to_json/from_json found by
// ADL, or nlohmann's own support for standard containers of such types).
template <class T>
concept JsonConvertible = !std::is_arithmetic_v<T> && !std::is_same_v<T, std::string> &&
                          !std::is_same_v<T, nlohmann::json> && !is_byte_vector_v<T> &&
                          requires(nlohmann::json & j, const T& value, T& out) {
  nlohmann::adl_serializer<T>::to_json(j, value);
  nlohmann::adl_serializer<T>::from_json(std::as_const(j), out);
};

// Rewrites every JSON float in `document` with an integral value that fits a 64-bit integer
// as that integer, and throws DecodeError for a float beyond the 64-bit range (see the comment
// at the top). Iterative: a deeply nested document cannot overflow the stack.
void normalise_json_numbers(nlohmann::json& document);
}  // namespace detail

template <class T>
struct Codec<T, std::enable_if_t<detail::JsonConvertible<T>>> {
  static std::string encode(const T& value) { return nlohmann::json(value).dump(); }
  static T decode(std::string_view bytes) {
    try {
      nlohmann::json document = nlohmann::json::parse(bytes);
      detail::normalise_json_numbers(document);
      return document.get<T>();
    } catch (const nlohmann::json::exception& e) {
      throw DecodeError(std::string("cannot decode a JSON value: ") + e.what());
    }
  }
};

}  // namespace idem
