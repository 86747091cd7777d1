// Fingerprints: a stable digest of an operation's arguments.
//
// An idempotency key says "this is the same request"; a fingerprint checks it. When a key comes
// back with arguments whose fingerprint differs from the first call's, the coordinator refuses
// with KeyReuseError instead of replaying a result that belongs to other arguments (IETF
// Idempotency-Key draft: 422).
//
//   std::string fp = idem::fingerprint(request_id, amount_cents, payload_json);
//
// The fingerprint is the lowercase hex SHA-256 (64 characters) of a canonical encoding of the
// arguments (version 1). It is the same in every process, build and platform: no std::hash, no
// pointer values, fixed (big-endian) byte order, fixed widths. Every argument is type-tagged
// and length-prefixed, so ("ab", "c") and ("a", "bc") differ, and so do 1 and "1".
//
// Arguments, by kind:
//   * strings (std::string, std::string_view, const char*, char arrays) and char — the bytes;
//   * bool;
//   * integers and enums — by value, 64 bits: 5, 5L and 5u agree (an unsigned value above
//     INT64_MAX is tagged apart from every signed one);
//   * float and double — the IEEE-754 double bits (every NaN encodes alike; -0.0 is not 0.0);
//   * nlohmann::json and nlohmann::ordered_json — canonicalised: object members in byte order
//     of their keys whatever order they were inserted in, integers by value (parsed 5 equals
//     json(5)); 5 and 5.0 stay different numbers;
//   * std::optional<T> — empty, or T;
//   * types with nlohmann to_json (found by ADL, containers of them too) — as their JSON,
//     canonicalised as above;
//   * any other type with an idem::Codec<T> — the codec's bytes (make sure the encoding is
//     deterministic).
// Anything else (pointers, long double, types without a codec) is a compile-time error.
//
// A fingerprint reveals nothing practical about the arguments, but it is not a secret either:
// arguments with little entropy can be found by trying them.
//
// Thread-safety: pure functions.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/codec.hpp"
#include "idem/error.hpp"

namespace idem {

namespace detail {

// SHA-256 of `data` as 64 lowercase hex characters (OpenSSL libcrypto).
std::string sha256_hex(std::string_view data);
// SHA-1 of `data` as 40 lowercase hex characters (OpenSSL libcrypto). Only for names other
// systems compute with SHA-1 (Redis's EVALSHA script digests); never for anything secret.
std::string sha1_hex(std::string_view data);

inline void append_u64(std::string& out, std::uint64_t value) {
  for (int shift = 56; shift >= 0; shift -= 8) {
    out.push_back(static_cast<char>((value >> shift) & 0xff));
  }
}

inline void append_tagged_bytes(std::string& out, char tag, std::string_view bytes) {
  out.push_back(tag);
  append_u64(out, bytes.size());
  out.append(bytes);
}

inline void append_signed(std::string& out, std::int64_t value) {
  out.push_back('i');
  append_u64(out, static_cast<std::uint64_t>(value));
}

inline void append_unsigned(std::string& out, std::uint64_t value) {
  // Integers that fit both ways are one value, however they were typed or parsed.
  if (value <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    append_signed(out, static_cast<std::int64_t>(value));
    return;
  }
  out.push_back('u');
  append_u64(out, value);
}

inline void append_double(std::string& out, double value) {
  static_assert(std::numeric_limits<double>::is_iec559, "idem needs IEEE-754 doubles");
  std::uint64_t bits = 0;
  if (value != value) {
    bits = 0x7ff8000000000000ULL;  // one quiet NaN for every NaN
  } else {
    std::memcpy(&bits, &value, sizeof bits);
  }
  out.push_back('f');
  append_u64(out, bits);
}

// Any nlohmann::basic_json instantiation (json, ordered_json, ...). nlohmann's own trait: the
// template's parameter list changed between releases (3.11.3 added one), so spelling it out here
// broke clang.
template <class T>
inline constexpr bool is_basic_json_v = nlohmann::detail::is_basic_json<T>::value;

template <class T>
inline constexpr bool is_optional_v = false;
template <class T>
inline constexpr bool is_optional_v<std::optional<T>> = true;

template <class T>
inline constexpr bool dependent_false_v = false;

template <class Json>
void append_json(std::string& out, const Json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      out.push_back('n');
      return;
    case nlohmann::json::value_t::boolean:
      out.push_back('b');
      out.push_back(value.template get<bool>() ? '\1' : '\0');
      return;
    case nlohmann::json::value_t::number_integer:
      append_signed(out, static_cast<std::int64_t>(value.template get<std::int64_t>()));
      return;
    case nlohmann::json::value_t::number_unsigned:
      append_unsigned(out, static_cast<std::uint64_t>(value.template get<std::uint64_t>()));
      return;
    case nlohmann::json::value_t::number_float:
      append_double(out, static_cast<double>(value.template get<double>()));
      return;
    case nlohmann::json::value_t::string: {
      const auto& text = value.template get_ref<const typename Json::string_t&>();
      append_tagged_bytes(out, 's', std::string_view(text.data(), text.size()));
      return;
    }
    case nlohmann::json::value_t::binary: {
      const auto& binary = value.get_binary();
      out.push_back('x');
      out.push_back(binary.has_subtype() ? '\1' : '\0');
      append_u64(out, binary.has_subtype() ? static_cast<std::uint64_t>(binary.subtype()) : 0);
      append_tagged_bytes(
          out, 's', std::string_view(reinterpret_cast<const char*>(binary.data()), binary.size()));
      return;
    }
    case nlohmann::json::value_t::array:
      out.push_back('a');
      append_u64(out, value.size());
      for (const auto& element : value)
        append_json(out, element);
      return;
    case nlohmann::json::value_t::object: {
      // Members in byte order of their keys, whatever order the object keeps them in.
      std::vector<std::pair<std::string_view, const Json*>> members;
      members.reserve(value.size());
      for (auto it = value.begin(); it != value.end(); ++it) {
        const auto& key = it.key();
        members.emplace_back(std::string_view(key.data(), key.size()), &it.value());
      }
      std::sort(members.begin(), members.end(),
                [](const auto& a, const auto& b) { return a.first < b.first; });
      out.push_back('o');
      append_u64(out, members.size());
      for (const auto& [key, member] : members) {
        append_tagged_bytes(out, 's', key);
        append_json(out, *member);
      }
      return;
    }
    case nlohmann::json::value_t::discarded:
      break;
  }
  throw InvalidArgument("idem::fingerprint: cannot fingerprint a discarded JSON value");
}

// Appends one argument's canonical encoding.
template <class T>
void append_argument(std::string& out, const T& value) {
  using U = std::remove_cvref_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out.push_back('b');
    out.push_back(value ? '\1' : '\0');
  } else if constexpr (std::is_same_v<U, char>) {
    append_tagged_bytes(out, 's', std::string_view(&value, 1));
  } else if constexpr (std::is_same_v<U, std::nullptr_t>) {
    static_assert(dependent_false_v<T>, "idem::fingerprint: nullptr is not an argument value");
  } else if constexpr (std::is_pointer_v<U> && !std::is_convertible_v<U, const char*>) {
    static_assert(dependent_false_v<T>,
                  "idem::fingerprint: pointer values differ between processes; pass the value");
  } else if constexpr (std::is_convertible_v<const U&, std::string_view>) {
    if constexpr (std::is_pointer_v<U>) {
      if (value == nullptr) throw InvalidArgument("idem::fingerprint: null const char* argument");
    }
    append_tagged_bytes(out, 's', std::string_view(value));
  } else if constexpr (std::is_enum_v<U>) {
    append_argument(out, static_cast<std::underlying_type_t<U>>(value));
  } else if constexpr (std::is_integral_v<U> && std::is_signed_v<U>) {
    append_signed(out, static_cast<std::int64_t>(value));
  } else if constexpr (std::is_integral_v<U>) {
    append_unsigned(out, static_cast<std::uint64_t>(value));
  } else if constexpr (std::is_same_v<U, long double>) {
    static_assert(dependent_false_v<T>,
                  "idem::fingerprint: long double has no portable encoding; pass a double");
  } else if constexpr (std::is_floating_point_v<U>) {
    append_double(out, static_cast<double>(value));
  } else if constexpr (is_basic_json_v<U>) {
    out.push_back('j');
    append_json(out, value);
  } else if constexpr (is_optional_v<U>) {
    if (value) {
      out.push_back('?');
      append_argument(out, *value);
    } else {
      out.push_back('N');
    }
  } else if constexpr (JsonConvertible<U>) {
    out.push_back('j');
    append_json(out, nlohmann::json(value));
  } else if constexpr (HasCodec<U>) {
    append_tagged_bytes(out, 'c', Codec<U>::encode(value));
  } else {
    static_assert(dependent_false_v<T>,
                  "idem::fingerprint: no canonical encoding for this argument type; give it an "
                  "idem::Codec<T> specialisation or nlohmann to_json/from_json");
  }
}

// The canonical encoding of an argument list (what fingerprint() hashes).
template <class... Args>
std::string canonical_arguments(const Args&... args) {
  std::string out = "idem.fingerprint.v1";
  append_u64(out, sizeof...(Args));
  (append_argument(out, args), ...);
  return out;
}

}  // namespace detail

// The fingerprint of `args`: lowercase hex SHA-256 of their canonical encoding (see above).
template <class... Args>
std::string fingerprint(const Args&... args) {
  return detail::sha256_hex(detail::canonical_arguments(args...));
}

}  // namespace idem
