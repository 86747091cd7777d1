// The Idempotency-Key request field: its syntax (an RFC 8941 sf-string) and the key rules a
// deployment publishes (length, characters, optionally a UUID).
//
//   Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//
// The draft (draft-ietf-httpapi-idempotency-key-header) makes the field an Item Structured
// Field whose value is a String, and allows one field per request. parse_key() applies both and
// then the KeyRules; each refusal has its own KeyStatus, which idem::http answers with 400.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "idem/http/message.hpp"

namespace idem::http {

// The characters a key may hold beyond what an sf-string allows (printable ASCII).
enum class KeyCharset {
  printable,  // any sf-string character: 0x20-0x7E (Stripe accepts any)
  token,      // ALPHA / DIGIT / "-" / "_" / "." / ":" / "~" / "+" / "/" / "="
  uuid,       // a UUID, 8-4-4-4-12 hex digits (any version; either case)
  uuid_v4,    // a UUID of version 4 (random), RFC 9562
  uuid_v7,    // a UUID of version 7 (time-ordered), RFC 9562
};

struct KeyRules {
  std::string field = "Idempotency-Key";  // the request field that carries the key
  std::size_t min_length = 1;             // characters of the key (after unquoting)
  std::size_t max_length = 255;           // Stripe's limit; at most 4096
  KeyCharset charset = KeyCharset::printable;
  // Also accept a bare value (Idempotency-Key: abc-123, as Stripe's clients send it): a field
  // value that is not an sf-string but holds only key characters with no DQUOTE, backslash or
  // separator. Off: the draft's syntax only.
  bool accept_bare = false;
};

enum class KeyStatus {
  absent,     // no field
  ok,         // `key` holds the key
  repeated,   // more than one field line (the draft allows one)
  malformed,  // not an sf-string Item (nor, with accept_bare, a bare key)
  length,     // shorter than min_length or longer than max_length
  charset,    // a character or a format the rules do not allow
};

struct KeyParse {
  KeyStatus status = KeyStatus::absent;
  std::string key;     // ok: the unquoted key
  std::string detail;  // otherwise: what is wrong, for the problem's `detail` (no key bytes)
};

// Parses the key field of `headers` by `rules`. Never throws.
KeyParse parse_key(const Headers& headers, const KeyRules& rules);

// RFC 8941 §4.2 parsing of an Item field value whose bare item must be a String (§4.2.5):
// surrounding spaces are dropped, parameters (";name=value") are parsed and ignored. nullopt
// when the value is anything else (a Token, a List, trailing text, a bad escape, a non-ASCII
// byte). Never throws.
std::optional<std::string> parse_sf_string_item(std::string_view field_value);

// The rules' description for docs and errors: "1-255 printable ASCII characters".
std::string describe(const KeyRules& rules);

// "absent", "ok", "repeated", "malformed", "length", "charset".
std::string_view to_string(KeyStatus status) noexcept;

}  // namespace idem::http
