#include "idem/http/key.hpp"

#include <string>

namespace idem::http {

namespace {

bool is_digit(char c) noexcept {
  return c >= '0' && c <= '9';
}
bool is_lcalpha(char c) noexcept {
  return c >= 'a' && c <= 'z';
}
bool is_alpha(char c) noexcept {
  return is_lcalpha(c) || (c >= 'A' && c <= 'Z');
}
bool is_hex(char c) noexcept {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

// RFC 9110 tchar.
bool is_tchar(char c) noexcept {
  if (is_alpha(c) || is_digit(c)) return true;
  switch (c) {
    case '!':
    case '#':
    case '$':
    case '%':
    case '&':
    case '\'':
    case '*':
    case '+':
    case '-':
    case '.':
    case '^':
    case '_':
    case '`':
    case '|':
    case '~':
      return true;
    default:
      return false;
  }
}

// A cursor over a field value, parsing RFC 8941 §4.2 pieces.
class Cursor {
 public:
  explicit Cursor(std::string_view text) : text_(text) {}

  bool done() const noexcept { return pos_ >= text_.size(); }
  char peek() const noexcept { return done() ? '\0' : text_[pos_]; }
  void skip_spaces() noexcept {
    while (!done() && text_[pos_] == ' ')
      ++pos_;
  }

  // §4.2.5: DQUOTE already current.
  bool string(std::string* out) {
    ++pos_;
    while (!done()) {
      const char c = text_[pos_++];
      if (c == '\\') {
        if (done()) return false;
        const char next = text_[pos_++];
        if (next != '"' && next != '\\') return false;
        if (out != nullptr) out->push_back(next);
      } else if (c == '"') {
        return true;
      } else if (c < 0x20 || c > 0x7e) {
        return false;
      } else if (out != nullptr) {
        out->push_back(c);
      }
    }
    return false;  // no closing DQUOTE
  }

  // §4.2.4 Integer or Decimal.
  bool number() {
    if (peek() == '-') ++pos_;
    std::size_t digits = 0;
    bool decimal = false;
    std::size_t fraction = 0;
    if (!is_digit(peek())) return false;
    while (!done()) {
      const char c = text_[pos_];
      if (is_digit(c)) {
        ++pos_;
        if (decimal) {
          if (++fraction > 3) return false;
        } else if (++digits > 15) {
          return false;
        }
      } else if (c == '.' && !decimal) {
        if (digits > 12) return false;
        decimal = true;
        ++pos_;
      } else {
        break;
      }
    }
    return !decimal || fraction > 0;
  }

  // §4.2.6 Token.
  bool token() {
    if (!is_alpha(peek()) && peek() != '*') return false;
    ++pos_;
    while (!done() && (is_tchar(text_[pos_]) || text_[pos_] == ':' || text_[pos_] == '/'))
      ++pos_;
    return true;
  }

  // §4.2.7 Byte Sequence: ':' base64 ':'.
  bool bytes() {
    ++pos_;
    while (!done()) {
      const char c = text_[pos_++];
      if (c == ':') return true;
      if (!is_alpha(c) && !is_digit(c) && c != '+' && c != '/' && c != '=') return false;
    }
    return false;
  }

  // §4.2.8 Boolean.
  bool boolean() {
    ++pos_;
    if (peek() != '0' && peek() != '1') return false;
    ++pos_;
    return true;
  }

  // §4.2.3.1 Bare Item of a parameter (any type; the value is not kept).
  bool bare_item() {
    const char c = peek();
    if (c == '-' || is_digit(c)) return number();
    if (c == '"') return string(nullptr);
    if (c == '*' || is_alpha(c)) return token();
    if (c == ':') return bytes();
    if (c == '?') return boolean();
    return false;
  }

  // §4.2.3.2 Parameters.
  bool parameters() {
    while (peek() == ';') {
      ++pos_;
      skip_spaces();
      if (!is_lcalpha(peek()) && peek() != '*') return false;
      ++pos_;
      while (!done()) {
        const char c = text_[pos_];
        if (!is_lcalpha(c) && !is_digit(c) && c != '_' && c != '-' && c != '.' && c != '*') break;
        ++pos_;
      }
      if (peek() == '=') {
        ++pos_;
        if (!bare_item()) return false;
      }
    }
    return true;
  }

 private:
  std::string_view text_;
  std::size_t pos_ = 0;
};

bool is_bare_key_char(char c) noexcept {
  return c > 0x20 && c < 0x7f && c != '"' && c != '\\' && c != ',' && c != ';';
}

bool is_token_key_char(char c) noexcept {
  if (is_alpha(c) || is_digit(c)) return true;
  switch (c) {
    case '-':
    case '_':
    case '.':
    case ':':
    case '~':
    case '+':
    case '/':
    case '=':
      return true;
    default:
      return false;
  }
}

bool is_uuid(std::string_view key) noexcept {
  if (key.size() != 36) return false;
  for (std::size_t i = 0; i < key.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? key[i] != '-' : !is_hex(key[i])) return false;
  }
  return true;
}

bool has_rfc9562_variant(std::string_view uuid) noexcept {
  const char v = uuid[19];
  return v == '8' || v == '9' || v == 'a' || v == 'b' || v == 'A' || v == 'B';
}

bool charset_ok(std::string_view key, KeyCharset charset) noexcept {
  switch (charset) {
    case KeyCharset::printable:
      for (char c : key) {
        if (c < 0x20 || c > 0x7e) return false;
      }
      return true;
    case KeyCharset::token:
      for (char c : key) {
        if (!is_token_key_char(c)) return false;
      }
      return true;
    case KeyCharset::uuid:
      return is_uuid(key);
    case KeyCharset::uuid_v4:
      return is_uuid(key) && key[14] == '4' && has_rfc9562_variant(key);
    case KeyCharset::uuid_v7:
      return is_uuid(key) && key[14] == '7' && has_rfc9562_variant(key);
  }
  return false;
}

std::string_view charset_words(KeyCharset charset) noexcept {
  switch (charset) {
    case KeyCharset::printable:
      return "printable ASCII characters";
    case KeyCharset::token:
      return "characters of A-Z a-z 0-9 - _ . : ~ + / =";
    case KeyCharset::uuid:
      return "a UUID (8-4-4-4-12 hex digits)";
    case KeyCharset::uuid_v4:
      return "a version 4 UUID";
    case KeyCharset::uuid_v7:
      return "a version 7 UUID";
  }
  return "";
}

}  // namespace

std::optional<std::string> parse_sf_string_item(std::string_view field_value) {
  Cursor cursor(field_value);
  cursor.skip_spaces();
  if (cursor.peek() != '"') return std::nullopt;
  std::string value;
  if (!cursor.string(&value)) return std::nullopt;
  if (!cursor.parameters()) return std::nullopt;
  cursor.skip_spaces();
  if (!cursor.done()) return std::nullopt;
  return value;
}

std::string describe(const KeyRules& rules) {
  std::string text;
  if (rules.charset == KeyCharset::printable || rules.charset == KeyCharset::token) {
    text = std::to_string(rules.min_length) + "-" + std::to_string(rules.max_length) + " " +
           std::string(charset_words(rules.charset));
  } else {
    text = std::string(charset_words(rules.charset));
  }
  text += rules.accept_bare ? ", quoted (an sf-string) or bare" : ", as an sf-string (quoted)";
  return text;
}

KeyParse parse_key(const Headers& headers, const KeyRules& rules) {
  KeyParse result;
  const Header* field = nullptr;
  for (const Header& header : headers) {
    if (!iequals(header.name, rules.field)) continue;
    if (field != nullptr) {
      result.status = KeyStatus::repeated;
      result.detail = "the request has more than one " + rules.field + " field";
      return result;
    }
    field = &header;
  }
  if (field == nullptr) return result;  // absent
  std::optional<std::string> key = parse_sf_string_item(field->value);
  if (!key && rules.accept_bare && !field->value.empty()) {
    bool bare = true;
    for (char c : field->value)
      bare = bare && is_bare_key_char(c);
    if (bare) key = field->value;
  }
  if (!key) {
    result.status = KeyStatus::malformed;
    result.detail = rules.field + " must be " + describe(rules);
    return result;
  }
  if (key->size() < rules.min_length || key->size() > rules.max_length) {
    result.status = KeyStatus::length;
    result.detail = rules.field + " must be " + describe(rules) + " (got " +
                    std::to_string(key->size()) + " characters)";
    return result;
  }
  if (!charset_ok(*key, rules.charset)) {
    result.status = KeyStatus::charset;
    result.detail = rules.field + " must be " + describe(rules);
    return result;
  }
  result.status = KeyStatus::ok;
  result.key = std::move(*key);
  return result;
}

std::string_view to_string(KeyStatus status) noexcept {
  switch (status) {
    case KeyStatus::absent:
      return "absent";
    case KeyStatus::ok:
      return "ok";
    case KeyStatus::repeated:
      return "repeated";
    case KeyStatus::malformed:
      return "malformed";
    case KeyStatus::length:
      return "length";
    case KeyStatus::charset:
      return "charset";
  }
  return "unknown";
}

}  // namespace idem::http
