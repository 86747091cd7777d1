#include "idem/http/options.hpp"

#include <charconv>
#include <string>

#include "idem/detail/printable.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"

namespace idem::http {

namespace {

std::optional<int> parse_status(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || text.size() != 3) {
    return std::nullopt;
  }
  if (value < 100 || value > 599) return std::nullopt;
  return value;
}

bool is_method_char(char c) noexcept {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_' || c == '.' || c == '!' || c == '#' || c == '$' || c == '%' || c == '&' ||
         c == '\'' || c == '*' || c == '+' || c == '^' || c == '`' || c == '|' || c == '~';
}

bool is_field_name(std::string_view name) noexcept {
  if (name.empty()) return false;
  for (char c : name) {
    if (!is_method_char(c)) return false;  // a field name is a token too
  }
  return true;
}

// Path patterns: "/" then segments; "{name}" is a whole segment; "*" only as the last.
std::string check_path_pattern(std::string_view pattern) {
  if (pattern.empty() || pattern.front() != '/') return "must start with '/'";
  std::size_t start = 1;
  while (start <= pattern.size()) {
    std::size_t end = pattern.find('/', start);
    if (end == std::string_view::npos) end = pattern.size();
    const std::string_view segment = pattern.substr(start, end - start);
    if (segment == "*") {
      if (end != pattern.size()) return "'*' may only be the last segment";
    } else if (!segment.empty() && segment.front() == '{') {
      if (segment.size() < 3 || segment.back() != '}') return "a '{name}' segment is malformed";
    } else {
      for (char c : segment) {
        if (c == '{' || c == '}' || c == '*' || c == '?' || c == '#' || c <= 0x20 || c >= 0x7f) {
          return "segment '" + detail::printable(segment, 64) +
                 "' has a character patterns do not allow";
        }
      }
    }
    start = end + 1;
  }
  return {};
}

bool is_json_pointer(std::string_view pointer) noexcept {
  if (pointer.empty()) return true;  // the whole document
  if (pointer.front() != '/') return false;
  for (std::size_t i = 0; i < pointer.size(); ++i) {
    if (pointer[i] == '~') {
      if (i + 1 >= pointer.size() || (pointer[i + 1] != '0' && pointer[i + 1] != '1')) return false;
    }
  }
  return true;
}

}  // namespace

StatusSet::StatusSet(std::initializer_list<std::string_view> items) {
  for (std::string_view item : items)
    add(item);
}

StatusSet StatusSet::parse(const std::vector<std::string>& items) {
  StatusSet set;
  for (const std::string& item : items)
    set.add(item);
  return set;
}

void StatusSet::add(std::string_view item) {
  if (item.size() == 3 && item[0] >= '1' && item[0] <= '5' && (item[1] == 'x' || item[1] == 'X') &&
      (item[2] == 'x' || item[2] == 'X')) {
    const int base = (item[0] - '0') * 100;
    for (int s = base; s < base + 100; ++s)
      bits_.set(static_cast<std::size_t>(s));
    return;
  }
  const std::size_t dash = item.find('-');
  if (dash != std::string_view::npos) {
    const auto low = parse_status(item.substr(0, dash));
    const auto high = parse_status(item.substr(dash + 1));
    if (low && high && *low <= *high) {
      for (int s = *low; s <= *high; ++s)
        bits_.set(static_cast<std::size_t>(s));
      return;
    }
  } else if (const auto status = parse_status(item)) {
    bits_.set(static_cast<std::size_t>(*status));
    return;
  }
  throw ConfigError("'" + detail::printable(item, 32) +
                    "' is not a status (100-599), a class (4xx) or a range (500-504)");
}

void validate(const GuardOptions& options) {
  const KeyRules& key = options.key;
  if (!is_field_name(key.field)) {
    throw ConfigError("key.field '" + detail::printable(key.field, 64) + "' is not a field name");
  }
  if (key.max_length == 0 || key.max_length > 4096 || key.min_length > key.max_length) {
    throw ConfigError("key lengths must satisfy 0 <= min_length <= max_length <= 4096 (got " +
                      std::to_string(key.min_length) + " and " + std::to_string(key.max_length) +
                      ")");
  }
  if (options.key_prefix.size() > 128 || !is_valid_key(options.key_prefix + "0")) {
    throw ConfigError("key_prefix must be at most 128 characters without control characters");
  }
  for (const std::string& header : options.principal.headers) {
    if (!is_field_name(header)) {
      throw ConfigError("principal.headers: '" + detail::printable(header, 64) +
                        "' is not a field name");
    }
  }
  if (options.principal.required && options.principal.headers.empty() &&
      !options.principal.client_certificate) {
    throw ConfigError("principal.required needs principal.headers or client_certificate");
  }
  const ReplayCacheOptions& cache = options.replay_cache;
  if (cache.max_entries > 0) {
    if (cache.max_bytes == 0) {
      throw ConfigError("replay_cache.max_bytes must be positive when the replay cache is on");
    }
    if (cache.max_age <= Millis::zero() || cache.max_age > std::chrono::hours(1)) {
      throw ConfigError("replay_cache.max_age must be between 1ms and 1h (got " +
                        std::to_string(cache.max_age.count()) + " ms)");
    }
  }
  for (std::size_t i = 0; i < options.routes.size(); ++i) {
    const Route& route = options.routes[i];
    const std::string what =
        "route " + (route.name.empty() ? "#" + std::to_string(i + 1)
                                       : "'" + detail::printable(route.name, 64) + "'");
    if (const std::string problem = check_path_pattern(route.path); !problem.empty()) {
      throw ConfigError(what + ": path '" + detail::printable(route.path, 128) + "' " + problem);
    }
    if (route.methods.empty()) throw ConfigError(what + ": methods must not be empty");
    for (const std::string& method : route.methods) {
      bool token = !method.empty();
      for (char c : method)
        token = token && is_method_char(c);
      if (!token) {
        throw ConfigError(what + ": '" + detail::printable(method, 32) + "' is not a method");
      }
    }
    for (const std::string& pointer : route.fingerprint.json_pointers) {
      if (!is_json_pointer(pointer)) {
        throw ConfigError(what + ": '" + detail::printable(pointer, 64) +
                          "' is not a JSON pointer (RFC 6901)");
      }
    }
    if (!route.fingerprint.json_pointers.empty() &&
        route.fingerprint.body != BodyFingerprint::json) {
      throw ConfigError(what + ": fingerprint.json_pointers needs fingerprint.body = json");
    }
    for (const std::string& header : route.fingerprint.headers) {
      if (!is_field_name(header)) {
        throw ConfigError(what + ": fingerprint.headers: '" + detail::printable(header, 64) +
                          "' is not a field name");
      }
    }
    for (const std::string& header : route.stored_headers) {
      if (!is_field_name(header)) {
        throw ConfigError(what + ": stored_headers: '" + detail::printable(header, 64) +
                          "' is not a field name");
      }
    }
    idem::validate(route.policy, what);
  }
}

GuardOptions normalized(GuardOptions options) {
  if (options.routes.empty()) options.routes.emplace_back();
  for (Route& route : options.routes) {
    if (route.name.empty()) route.name = route.path;
  }
  validate(options);
  return options;
}

}  // namespace idem::http
