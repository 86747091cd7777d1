#include "url.hpp"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <system_error>

#include "idem/duration.hpp"
#include "idem/error.hpp"
#include "idem/open.hpp"
#include "scheme.hpp"

namespace idem {
namespace detail {
namespace {

// Longer URLs are refused before any parsing: no legitimate store URL comes near it, and it
// keeps every message short.
constexpr std::size_t kMaxUrlLength = 4096;

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

// %-decodes without failing (a malformed escape is kept as written): for finding secrets.
std::string lenient_decode(std::string_view text) {
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

// Where the user info's password is in `url`: [first, last) offsets, or nullopt.
std::optional<std::pair<std::size_t, std::size_t>> password_span(std::string_view url) {
  // The user info follows "scheme://" — or, in a URL missing its "//" ("redis:u:pw@host"),
  // "scheme:": redacting too much is harmless, too little is not.
  const std::size_t scheme_end = url.find(':');
  if (scheme_end == std::string_view::npos) return std::nullopt;
  const std::size_t start = url.substr(scheme_end, 3) == "://" ? scheme_end + 3 : scheme_end + 1;
  const std::size_t end = std::min(url.find_first_of("?#", start), url.size());
  // The last '@' before the query: a password with an unescaped '/' or '@' is still covered.
  const std::string_view region = url.substr(start, end - start);
  const std::size_t at = region.rfind('@');
  if (at == std::string_view::npos) return std::nullopt;
  const std::size_t colon = region.find(':');
  if (colon == std::string_view::npos || colon > at) return std::nullopt;
  return std::make_pair(start + colon + 1, start + at);
}

// [first, last) offsets of the values of `password=` and `sslpassword=` query parameters.
std::vector<std::pair<std::size_t, std::size_t>> password_parameter_spans(std::string_view url) {
  std::vector<std::pair<std::size_t, std::size_t>> spans;
  const std::size_t question = url.find('?');
  if (question == std::string_view::npos) return spans;
  std::size_t position = question + 1;
  while (position <= url.size()) {
    const std::size_t end = std::min(url.find_first_of("&#", position), url.size());
    const std::string_view pair = url.substr(position, end - position);
    const std::size_t eq = pair.find('=');
    if (eq != std::string_view::npos &&
        (equals_ignoring_case(lenient_decode(pair.substr(0, eq)), "password") ||
         equals_ignoring_case(lenient_decode(pair.substr(0, eq)), "sslpassword"))) {
      spans.emplace_back(position + eq + 1, end);
    }
    if (end >= url.size() || url[end] == '#') break;
    position = end + 1;
  }
  return spans;
}

void replace_all(std::string& text, const std::string& secret) {
  if (secret.empty()) return;
  for (std::size_t at = text.find(secret); at != std::string::npos;
       at = text.find(secret, at + 3)) {
    text.replace(at, secret.size(), "***");
  }
}

}  // namespace

namespace {

// A backend's message in the words of a URL: the options struct is what the URL was turned into,
// which its reader never wrote ("PostgresOptions::url is not ..." -> "the URL is not ...",
// "RedisOptions::pool_size must ..." -> "pool_size must ...").
std::string in_url_terms(std::string text) {
  static constexpr std::string_view kSuffix = "Options::";
  for (std::size_t at = text.find(kSuffix); at != std::string::npos; at = text.find(kSuffix, at)) {
    std::size_t start = at;
    while (start > 0 && std::isalpha(static_cast<unsigned char>(text[start - 1])) != 0)
      --start;
    const std::size_t after = at + kSuffix.size();
    if (text.compare(after, 3, "url") == 0 &&
        (after + 3 == text.size() ||
         std::isalnum(static_cast<unsigned char>(text[after + 3])) == 0)) {
      text.replace(start, after + 3 - start, "the URL");
    } else {
      text.erase(start, after - start);
    }
    at = start;
  }
  return text;
}

}  // namespace

void UrlContext::fail(std::string_view part, std::string_view problem) const {
  throw ConfigError(std::string(part) + ": " + std::string(problem) + " (URL '" + redact_url(url_) +
                    "')");
}

void UrlContext::not_built(std::string_view scheme, std::string_view backend,
                           std::string_view cmake_option, std::string_view package) const {
  throw NotSupported("scheme '" + std::string(scheme) + "': this idem was built without the " +
                     std::string(backend) + " backend (configure with -D" +
                     std::string(cmake_option) + "=ON; it needs " + std::string(package) +
                     ") (URL '" + redact_url(url_) + "')");
}

void UrlContext::rethrow_backend_config_error(std::string_view message) const {
  std::string text(message);
  // idem::Error's what() starts with "idem: <code>: "; the new error adds its own.
  constexpr std::string_view kPrefix = "idem: config_error: ";
  if (text.rfind(kPrefix, 0) == 0) text.erase(0, kPrefix.size());
  std::vector<std::string> secrets;
  if (const auto span = password_span(url_)) {
    secrets.emplace_back(url_.substr(span->first, span->second - span->first));
  }
  for (const auto& [first, last] : password_parameter_spans(url_)) {
    secrets.emplace_back(url_.substr(first, last - first));
  }
  for (const std::string& secret : secrets) {
    replace_all(text, secret);
    replace_all(text, lenient_decode(secret));
  }
  throw ConfigError(printable(in_url_terms(text), 1024) + " (URL '" + redact_url(url_) + "')");
}

SplitUrl split_scheme(const UrlContext& context) {
  const std::string_view url = context.url();
  if (url.empty()) context.fail("URL", "is empty (expected e.g. sqlite:///var/lib/app/idem.db)");
  if (url.size() > kMaxUrlLength) {
    context.fail("URL", "is " + std::to_string(url.size()) + " bytes long (at most " +
                            std::to_string(kMaxUrlLength) + ")");
  }
  for (std::size_t i = 0; i < url.size(); ++i) {
    const auto c = static_cast<unsigned char>(url[i]);
    if (c < 0x20 || c == 0x7f) {
      context.fail(
          "URL", "has a control character at offset " + std::to_string(i) + " (escape it as %XX)");
    }
    if (c == ' ') {
      context.fail("URL", "has a space at offset " + std::to_string(i) + " (escape it as %20)");
    }
  }
  if (url.find('#') != std::string_view::npos) {
    context.fail("fragment", "a URL of a store takes no fragment (#...); escape '#' as %23");
  }
  const std::size_t colon = url.find(':');
  if (colon == std::string_view::npos || colon == 0) {
    context.fail("scheme", "is missing (expected " + known_schemes() + ")");
  }
  const std::string_view scheme = url.substr(0, colon);
  const auto valid = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '+' ||
           c == '-' || c == '.';
  };
  const bool letter_first =
      (scheme[0] >= 'a' && scheme[0] <= 'z') || (scheme[0] >= 'A' && scheme[0] <= 'Z');
  if (!letter_first || !std::all_of(scheme.begin(), scheme.end(), valid)) {
    context.fail("scheme", "'" + printable(scheme, 32) + "' is not a URL scheme (expected " +
                               known_schemes() + ")");
  }
  SplitUrl split;
  split.scheme.reserve(scheme.size());
  for (char c : scheme)
    split.scheme += lower(c);
  split.rest = url.substr(colon + 1);
  return split;
}

std::string percent_decode(const UrlContext& context, std::string_view text,
                           std::string_view part) {
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
      context.fail(part, "has a malformed %-escape at offset " + std::to_string(i) +
                             " (expected % and two hex digits)");
    }
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  if (out.find('\0') != std::string::npos) context.fail(part, "contains a NUL byte (%00)");
  return out;
}

std::vector<QueryParameter> parse_query(const UrlContext& context, std::string_view query) {
  std::vector<QueryParameter> parameters;
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      context.fail("query parameter '" + printable(pair, 64) + "'",
                   "has no value (expected name=value)");
    }
    QueryParameter parameter;
    parameter.raw = pair;
    parameter.name = percent_decode(context, pair.substr(0, eq), "query parameter name");
    if (parameter.name.empty())
      context.fail("query",
                   "a parameter has no name ('=" + printable(pair.substr(eq + 1), 64) + "')");
    parameter.value = percent_decode(context, pair.substr(eq + 1),
                                     "query parameter '" + printable(parameter.name, 64) + "'");
    for (const QueryParameter& earlier : parameters) {
      if (earlier.name == parameter.name) {
        context.fail("query parameter '" + printable(parameter.name, 64) + "'", "is given twice");
      }
    }
    parameters.push_back(std::move(parameter));
  }
  return parameters;
}

namespace {
std::string parameter_part(const QueryParameter& parameter) {
  return "query parameter '" + printable(parameter.name, 64) + "'";
}
}  // namespace

std::size_t count_value(const UrlContext& context, const QueryParameter& parameter,
                        std::size_t minimum, std::size_t maximum) {
  const std::string& text = parameter.value;
  std::uint64_t value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || value < minimum ||
      value > maximum) {
    context.fail(parameter_part(parameter),
                 "must be a whole number from " + std::to_string(minimum) + " to " +
                     std::to_string(maximum) + ", got '" + printable(text, 64) + "'");
  }
  return static_cast<std::size_t>(value);
}

bool bool_value(const UrlContext& context, const QueryParameter& parameter) {
  if (parameter.value == "true" || parameter.value == "1") return true;
  if (parameter.value == "false" || parameter.value == "0") return false;
  context.fail(parameter_part(parameter),
               "must be true or false (or 1 or 0), got '" + printable(parameter.value, 64) + "'");
}

std::chrono::milliseconds duration_value(const UrlContext& context,
                                         const QueryParameter& parameter) {
  const UrlDuration duration = url_duration(parameter.value);
  if (!duration.problem.empty()) context.fail(parameter_part(parameter), duration.problem);
  return duration.value;
}

void unknown_parameter(const UrlContext& context, const QueryParameter& parameter,
                       std::string_view where, std::string_view known) {
  context.fail(parameter_part(parameter),
               "is not known for " + std::string(where) + " (known: " + std::string(known) + ")");
}

}  // namespace detail

std::string redact_url(std::string_view url) {
  std::string out(url);
  // Replace from the back, so earlier offsets stay valid.
  auto spans = detail::password_parameter_spans(url);
  if (const auto span = detail::password_span(url)) spans.insert(spans.begin(), *span);
  std::sort(spans.begin(), spans.end());
  for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
    out.replace(it->first, it->second - it->first, "***");
  }
  return detail::printable(out);
}

}  // namespace idem
