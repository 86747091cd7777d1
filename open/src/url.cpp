#include "url.hpp"

#include <cctype>
#include <string>
#include <vector>

#include "idem/error.hpp"
#include "idem/open.hpp"
#include "scheme.hpp"

namespace idem {
namespace detail {
namespace {

// Longer URLs are refused before any parsing: no legitimate store URL comes near it, and it
// keeps every message short.
constexpr std::size_t kMaxUrlLength = 4096;

void replace_all(std::string& text, const std::string& secret) {
  if (secret.empty()) return;
  for (std::size_t at = text.find(secret); at != std::string::npos;
       at = text.find(secret, at + 3)) {
    text.replace(at, secret.size(), "***");
  }
}

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

void UrlContext::throw_error(std::string_view part, std::string_view problem) const {
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
  for (const auto& [first, last] : url_secret_spans(url_)) {
    const std::string secret(url_.substr(first, last - first));
    replace_all(text, secret);
    replace_all(text, lenient_percent_decode(secret));
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
  return split_scheme(context, url, known_schemes());
}

}  // namespace detail

std::string redact_url(std::string_view url) {
  return detail::printable(detail::redact_url_secrets(url));
}

}  // namespace idem
