#include "idem_url.hpp"

#include <algorithm>
#include <charconv>
#include <system_error>

#include "idem/detail/printable.hpp"
#include "idem/duration.hpp"

namespace idem::detail {
namespace {

int hex_digit(char c) noexcept {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

char lower(char c) noexcept {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

// The whole of `text` as a number written in digits (no sign, no space), or nullopt.
std::optional<std::uint64_t> digits_value(std::string_view text) {
  std::uint64_t value = 0;
  const char* const last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(text.data(), last, value);
  if (text.empty() || ec != std::errc() || end != last) return std::nullopt;
  return value;
}

// The user info's password in `url` as [first, last) offsets, reading the user info from
// `start`: the last '@' before the query, and the first ':' before it.
std::optional<std::pair<std::size_t, std::size_t>> password_span_from(std::string_view url,
                                                                      std::size_t start) {
  const std::size_t end = std::min(url.find_first_of("?#", start), url.size());
  // The last '@' before the query: a password with an unescaped '/' or '@' is still covered.
  const std::string_view region = url.substr(start, end - start);
  const std::size_t at = region.rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t colon = region.find(':');
  if (colon == std::string_view::npos || colon > at) return std::nullopt;
  return std::make_pair(start + colon + 1, start + at);
}

std::optional<std::pair<std::size_t, std::size_t>> password_span(std::string_view url) {
  // The user info follows "scheme://" — or, in a URL missing its "//" ("redis:u:pw@host"),
  // "scheme:", or in one without a scheme ("user:pw@host"), the start.
  const std::size_t scheme_end = url.find(':');
  if (scheme_end == std::string_view::npos) return std::nullopt;
  if (url.substr(scheme_end, 3) == "://") return password_span_from(url, scheme_end + 3);
  if (auto span = password_span_from(url, scheme_end + 1)) return span;
  return password_span_from(url, 0);
}

// [first, last) offsets of the values of `password=` and `sslpassword=` query parameters.
void add_password_parameter_spans(std::string_view url,
                                  std::vector<std::pair<std::size_t, std::size_t>>& spans) {
  const std::size_t question = url.find('?');
  if (question == std::string_view::npos) return;
  std::size_t position = question + 1;
  while (position <= url.size()) {
    const std::size_t end = std::min(url.find_first_of("&#", position), url.size());
    const std::string_view pair = url.substr(position, end - position);
    const std::size_t eq = pair.find('=');
    if (eq != std::string_view::npos) {
      const std::string name = lenient_percent_decode(pair.substr(0, eq));
      if (equals_ignoring_case(name, "password") || equals_ignoring_case(name, "sslpassword")) {
        spans.emplace_back(position + eq + 1, end);
      }
    }
    if (end >= url.size() || url[end] == '#') break;
    position = end + 1;
  }
}

}  // namespace

// ---- scheme ------------------------------------------------------------------------------------

SplitUrl split_scheme(const UrlErrors& errors, std::string_view url, std::string_view expected) {
  const std::size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    errors.fail("scheme", "is missing (expected " + std::string(expected) + ")");
  }
  const std::string_view scheme = url.substr(0, colon);
  const auto valid = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '-' || c == '.';
  };
  const bool letter_first =
      (scheme[0] >= 'a' && scheme[0] <= 'z') || (scheme[0] >= 'A' && scheme[0] <= 'Z');
  if (!letter_first || !std::all_of(scheme.begin(), scheme.end(), valid)) {
    errors.fail("scheme", "'" + printable(scheme, 32) + "' is not a URL scheme (expected " +
                              std::string(expected) + ")");
  }
  SplitUrl split;
  split.scheme.reserve(scheme.size());
  for (char c : scheme)
    split.scheme += lower(c);
  split.rest = url.substr(colon + 1);
  return split;
}

// ---- "//authority/path?query" ------------------------------------------------------------------

UrlLocation split_location(const UrlErrors& errors, std::string_view rest,
                           std::string_view example) {
  if (rest.substr(0, 2) != "//") {
    errors.fail("authority", "is missing: the URL must start with scheme:// (e.g. " +
                                 std::string(example) + ")");
  }
  if (rest.find('#') != std::string_view::npos) {
    errors.fail("fragment", "is not allowed: a URL here takes no #...; escape '#' as %23");
  }
  rest.remove_prefix(2);
  UrlLocation location;
  const std::size_t question = rest.find('?');
  if (question != std::string_view::npos) {
    location.query = rest.substr(question + 1);
    rest = rest.substr(0, question);
  }
  const std::size_t slash = rest.find('/');
  location.authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) location.path = rest.substr(slash);
  return location;
}

Authority split_authority(const UrlErrors& errors, std::string_view authority) {
  Authority split;
  const std::size_t at = authority.rfind('@');
  if (at == std::string_view::npos) {
    split.hosts = authority;
    return split;
  }
  const std::string_view user_info = authority.substr(0, at);
  split.hosts = authority.substr(at + 1);
  UserInfo info;
  const std::size_t colon = user_info.find(':');
  info.user = percent_decode(errors, user_info.substr(0, colon), "user name");
  if (colon != std::string_view::npos) {
    info.password = percent_decode(errors, user_info.substr(colon + 1), "password");
  }
  split.user_info = std::move(info);
  return split;
}

HostPort parse_host_port(const UrlErrors& errors, std::string_view text) {
  std::string_view host;
  std::optional<std::string_view> port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) {
      errors.fail("host '" + printable(text, 64) + "'", "misses ']'");
    }
    host = text.substr(1, close - 1);
    const std::string_view after = text.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') {
        errors.fail(
            "host '" + printable(text.substr(0, close + 1), 64) + "'",
            "is followed by '" + printable(after, 64) + "' (only :port may come after the host)");
      }
      port = after.substr(1);
    }
    if (host.find_first_of("[]") != std::string_view::npos) {
      errors.fail("host '" + printable(text, 64) + "'", "has a '[' inside its brackets");
    }
  } else {
    const std::size_t colon = text.find(':');
    host = text.substr(0, colon);
    if (colon != std::string_view::npos) port = text.substr(colon + 1);
    if (host.find_first_of("[]") != std::string_view::npos) {
      errors.fail("host '" + printable(host, 64) + "'",
                  "has a '[' or ']' outside an IPv6 address (write [address]:port)");
    }
  }
  if (host.empty()) errors.fail("host", "is missing");
  HostPort result;
  result.host = percent_decode(errors, host, "host");
  if (port) {
    if (port->empty()) errors.fail("port", "is empty");
    if (!std::all_of(port->begin(), port->end(), [](char c) { return c >= '0' && c <= '9'; })) {
      errors.fail("port '" + printable(*port, 64) + "'", "is not a number (expected 1..65535)");
    }
    const std::optional<std::uint64_t> number = digits_value(*port);  // nullopt: too large
    if (!number || *number < 1 || *number > 65535) {
      errors.fail("port", "must be 1..65535, got '" + printable(*port, 64) + "'");
    }
    result.port = static_cast<int>(*number);
  }
  return result;
}

// ---- %-decoding --------------------------------------------------------------------------------

std::string percent_decode(const UrlErrors& errors, std::string_view text, std::string_view part) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int high = i + 1 < text.size() ? hex_digit(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? hex_digit(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      errors.fail(part, "has a malformed %-escape at offset " + std::to_string(i) +
                            " (expected % and two hex digits)");
    }
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  if (out.find('\0') != std::string::npos) errors.fail(part, "contains a NUL byte (%00)");
  return out;
}

std::string lenient_percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() && hex_digit(text[i + 1]) >= 0 &&
        hex_digit(text[i + 2]) >= 0) {
      out += static_cast<char>(hex_digit(text[i + 1]) * 16 + hex_digit(text[i + 2]));
      i += 2;
    } else {
      out += text[i];
    }
  }
  return out;
}

// ---- query -------------------------------------------------------------------------------------

std::vector<QueryParameter> parse_query(const UrlErrors& errors, std::string_view query) {
  std::vector<QueryParameter> parameters;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      errors.fail("query parameter '" + printable(pair, 64) + "'",
                  "has no value (expected name=value)");
    }
    QueryParameter parameter;
    parameter.raw = pair;
    parameter.name = percent_decode(errors, pair.substr(0, eq), "query parameter name");
    if (parameter.name.empty()) {
      errors.fail("query",
                  "a parameter has no name ('=" + printable(pair.substr(eq + 1), 64) + "')");
    }
    parameter.value = percent_decode(errors, pair.substr(eq + 1), parameter_part(parameter));
    for (const QueryParameter& earlier : parameters) {
      if (earlier.name == parameter.name) errors.fail(parameter_part(parameter), "is given twice");
    }
    parameters.push_back(std::move(parameter));
  }
  return parameters;
}

std::string parameter_part(const QueryParameter& parameter) {
  return "query parameter '" + printable(parameter.name, 64) + "'";
}

std::size_t count_value(const UrlErrors& errors, const QueryParameter& parameter,
                        std::size_t minimum, std::size_t maximum) {
  const std::optional<std::uint64_t> value = digits_value(parameter.value);
  if (!value || *value < minimum || *value > maximum) {
    errors.fail(parameter_part(parameter),
                "must be a whole number from " + std::to_string(minimum) + " to " +
                    std::to_string(maximum) + ", got '" + printable(parameter.value, 64) + "'");
  }
  return static_cast<std::size_t>(*value);
}

std::uint64_t whole_number(const UrlErrors& errors, std::string_view part, std::string_view text,
                           std::uint64_t maximum) {
  const std::optional<std::uint64_t> value = digits_value(text);
  if (!value || *value > maximum) {
    errors.fail(part, "must be a non-negative integer, got '" + printable(text, 64) + "'");
  }
  return *value;
}

bool bool_value(const UrlErrors& errors, const QueryParameter& parameter) {
  if (parameter.value == "true" || parameter.value == "1") return true;
  if (parameter.value == "false" || parameter.value == "0") return false;
  errors.fail(parameter_part(parameter),
              "must be true or false (or 1 or 0), got '" + printable(parameter.value, 64) + "'");
}

void not_a_choice(const UrlErrors& errors, const QueryParameter& parameter,
                  const std::vector<std::string_view>& names) {
  std::string list;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) list += i + 1 == names.size() ? " or " : ", ";
    list += names[i];
  }
  errors.fail(parameter_part(parameter),
              "must be " + list + ", got '" + printable(parameter.value, 64) + "'");
}

std::chrono::milliseconds duration_value(const UrlErrors& errors, const QueryParameter& parameter) {
  const UrlDuration duration = url_duration(parameter.value);
  if (!duration.problem.empty()) errors.fail(parameter_part(parameter), duration.problem);
  return duration.value;
}

void unknown_parameter(const UrlErrors& errors, const QueryParameter& parameter,
                       std::string_view where, std::string_view known) {
  errors.fail(parameter_part(parameter),
              "is not known for " + std::string(where) + " (known: " + std::string(known) + ")");
}

// ---- secrets -----------------------------------------------------------------------------------

std::vector<std::pair<std::size_t, std::size_t>> url_secret_spans(std::string_view url) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  if (const auto span = password_span(url)) spans.push_back(*span);
  add_password_parameter_spans(url, spans);
  std::sort(spans.begin(), spans.end());
  return spans;
}

std::string redact_url_secrets(std::string_view url) {
  std::string out(url);
  const auto spans = url_secret_spans(url);
  // Replace from the back, so earlier offsets stay valid.
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    out.replace(it->first, it->second - it->first, "***");
  }
  return out;
}

}  // namespace idem::detail
