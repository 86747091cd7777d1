#include "idem/rabbitmq/options.hpp"

#include <amqp.h>

#include <cctype>
#include <string>
#include <vector>

#include "idem/error.hpp"

namespace idem::rabbitmq {
namespace {

// Control characters (a NUL would cut what() short) are shown as \xNN; long URLs are cut.
std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (char c : text.substr(0, 256)) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  if (text.size() > 256) out += "...";
  return out;
}

[[noreturn]] void bad_url(std::string_view url, const std::string& what) {
  throw ConfigError("idem rabbitmq: bad AMQP URL '" + printable(redact_amqp_url(url)) +
                    "': " + what);
}

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) return false;
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) return false;
  }
  return true;
}

// The checks rabbitmq-c's parser does not explain: it only says "bad URL".
void check_authority(std::string_view url, std::string_view authority) {
  const auto at = authority.rfind('@');
  std::string_view host_port = at == std::string_view::npos ? authority : authority.substr(at + 1);
  std::string_view port;
  if (!host_port.empty() && host_port.front() == '[') {
    const auto close = host_port.find(']');
    if (close == std::string_view::npos) bad_url(url, "host: '[' without ']'");
    if (close == 1) bad_url(url, "host is empty");
    const std::string_view rest = host_port.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') bad_url(url, "host: unexpected text after ']'");
      port = rest.substr(1);
      if (port.empty()) bad_url(url, "port is empty");
    }
  } else {
    const auto colon = host_port.find(':');
    const std::string_view host = host_port.substr(0, colon);
    if (host.empty()) bad_url(url, "host is empty");
    if (colon != std::string_view::npos) {
      port = host_port.substr(colon + 1);
      if (port.empty()) bad_url(url, "port is empty");
    }
  }
  if (!port.empty()) {
    if (port.size() > 5) bad_url(url, "port '" + std::string(port) + "' is not in 1..65535");
    long value = 0;
    for (char c : port) {
      if (c < '0' || c > '9') bad_url(url, "port '" + std::string(port) + "' is not a number");
      value = value * 10 + (c - '0');
    }
    if (value < 1 || value > 65535)
      bad_url(url, "port '" + std::string(port) + "' is not in 1..65535");
  }
}

}  // namespace

std::string redact_amqp_url(std::string_view url) {
  const auto scheme_end = url.find("://");
  const std::size_t start = scheme_end == std::string_view::npos ? 0 : scheme_end + 3;
  auto end = url.find_first_of("/?#", start);
  if (end == std::string_view::npos) end = url.size();
  const std::string_view authority = url.substr(start, end - start);
  const auto at = authority.rfind('@');
  if (at == std::string_view::npos) return std::string(url);
  const auto colon = authority.substr(0, at).find(':');
  if (colon == std::string_view::npos) return std::string(url);
  return std::string(url.substr(0, start + colon + 1)) + "***" +
         std::string(url.substr(start + at));
}

ConnectionOptions ConnectionOptions::from_url(std::string_view url) {
  if (url.find('\0') != std::string_view::npos) bad_url(url, "contains a NUL byte");
  if (starts_with_nocase(url, "amqps://"))
    bad_url(url, "scheme amqps (TLS) is not supported; use amqp://");
  if (!starts_with_nocase(url, "amqp://")) bad_url(url, "scheme must be amqp://");
  const std::size_t start = 7;
  auto end = url.find('/', start);
  if (end == std::string_view::npos) end = url.size();
  check_authority(url, url.substr(start, end - start));

  std::vector<char> buffer(url.begin(), url.end());
  buffer.push_back('\0');
  for (std::size_t i = 0; i < 4; ++i)  // rabbitmq-c only knows the lowercase scheme
    buffer[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(buffer[i])));
  amqp_connection_info info;
  amqp_default_connection_info(&info);
  if (amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK)
    bad_url(url, "user info, host, port or vhost is malformed (bad %-escape or character)");
  if (info.ssl != 0) bad_url(url, "scheme amqps (TLS) is not supported; use amqp://");

  ConnectionOptions options;
  options.host = info.host != nullptr ? info.host : "";
  if (options.host.empty()) bad_url(url, "host is empty");
  options.port = info.port;
  options.user = info.user != nullptr ? info.user : "guest";
  options.password = info.password != nullptr ? info.password : "guest";
  options.vhost = info.vhost != nullptr && info.vhost[0] != '\0' ? info.vhost : "/";
  return options;
}

std::string ConnectionOptions::describe() const {
  return "amqp://" + user + "@" + host + ":" + std::to_string(port) +
         (vhost.size() > 0 && vhost.front() == '/' ? vhost : "/" + vhost);
}

}  // namespace idem::rabbitmq
