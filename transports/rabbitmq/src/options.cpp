#include "idem/rabbitmq/options.hpp"

#include <amqp.h>

#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "idem/detail/secret.hpp"
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

namespace {

// "%41" -> "A" for a query value; a malformed escape or a NUL byte is a bad URL.
std::string decode_query_value(std::string_view url, std::string_view name, std::string_view text) {
  const auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int high = i + 1 < text.size() ? hex(text[i + 1]) : -1;
    const int low = i + 2 < text.size() ? hex(text[i + 2]) : -1;
    if (high < 0 || low < 0)
      bad_url(url, "query parameter '" + std::string(name) + "': bad %-escape");
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  if (out.find('\0') != std::string::npos)
    bad_url(url, "query parameter '" + std::string(name) + "' contains a NUL byte");
  return out;
}

void apply_query(std::string_view url, std::string_view query, ConnectionOptions& options) {
  std::vector<std::string> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const auto eq = pair.find('=');
    if (eq == std::string_view::npos)
      bad_url(url, "query parameter '" + printable(pair.substr(0, 64)) + "' has no value");
    const std::string name(pair.substr(0, eq));
    for (const std::string& earlier : seen) {
      if (earlier == name) bad_url(url, "query parameter '" + printable(name) + "' is given twice");
    }
    seen.push_back(name);
    const std::string value = decode_query_value(url, name, pair.substr(eq + 1));
    if (name == "cacertfile") {
      options.ca_cert_file = value;
    } else if (name == "certfile") {
      options.cert_file = value;
    } else if (name == "keyfile") {
      options.key_file = value;
    } else if (name == "verify") {
      if (value == "verify_peer") {
        options.verify_peer = true;
      } else if (value == "verify_none") {
        options.verify_peer = false;
      } else {
        bad_url(url, "query parameter 'verify' must be verify_peer or verify_none");
      }
    } else if (name == "server_name_indication") {
      if (value != "disable") {
        bad_url(url,
                "query parameter 'server_name_indication' takes only 'disable' (the host "
                "name checked is the URL's host)");
      }
      options.verify_hostname = false;
    } else if (name == "password_file") {
      options.password_file = value;
    } else if (name == "password_env") {
      options.password_env = value;
    } else if (name == "key_password_file") {
      options.key_password_file = value;
    } else if (name == "key_password_env") {
      options.key_password_env = value;
    } else {
      bad_url(url, "query parameter '" + printable(name.substr(0, 64)) +
                       "' is not known (known: cacertfile, certfile, keyfile, verify, "
                       "server_name_indication, password_file, password_env, "
                       "key_password_file, key_password_env)");
    }
  }
  const bool tls_parameter = !options.ca_cert_file.empty() || !options.cert_file.empty() ||
                             !options.key_file.empty() || !options.verify_peer ||
                             !options.verify_hostname || !options.key_password_file.empty() ||
                             !options.key_password_env.empty();
  if (tls_parameter && !options.tls)
    bad_url(url, "TLS parameters (cacertfile, certfile, ...) need the amqps:// scheme");
}

}  // namespace

ConnectionOptions ConnectionOptions::from_url(std::string_view url) {
  if (url.find('\0') != std::string_view::npos) bad_url(url, "contains a NUL byte");
  const bool tls = starts_with_nocase(url, "amqps://");
  if (!tls && !starts_with_nocase(url, "amqp://"))
    bad_url(url, "scheme must be amqp:// or amqps://");
  const std::size_t start = tls ? 8 : 7;
  const auto question = url.find('?');
  const std::string_view query =
      question == std::string_view::npos ? std::string_view() : url.substr(question + 1);
  const std::string_view location = url.substr(0, question);
  auto end = location.find('/', start);
  if (end == std::string_view::npos) end = location.size();
  check_authority(url, location.substr(start, end - start));

  std::vector<char> buffer(location.begin(), location.end());
  buffer.push_back('\0');
  for (std::size_t i = 0; i < start - 3; ++i)  // rabbitmq-c only knows the lowercase scheme
    buffer[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(buffer[i])));
  amqp_connection_info info;
  amqp_default_connection_info(&info);
  if (amqp_parse_url(buffer.data(), &info) != AMQP_STATUS_OK)
    bad_url(url, "user info, host, port or vhost is malformed (bad %-escape or character)");

  ConnectionOptions options;
  options.tls = info.ssl != 0;
  options.host = info.host != nullptr ? info.host : "";
  if (options.host.empty()) bad_url(url, "host is empty");
  options.port = info.port;
  options.user = info.user != nullptr ? info.user : "guest";
  options.password = info.password != nullptr ? info.password : "guest";
  options.vhost = info.vhost != nullptr && info.vhost[0] != '\0' ? info.vhost : "/";
  apply_query(url, query, options);
  return options;
}

void ConnectionOptions::validate() const {
  const auto bad = [](const std::string& what) {
    throw ConfigError("idem rabbitmq: ConnectionOptions: " + what);
  };
  if (!password_file.empty() && !password_env.empty())
    bad("give the password one way only: password_file or password_env");
  (void)resolved_password();
  (void)resolved_key_password();
  if (!tls) {
    if (!ca_cert_file.empty() || !cert_file.empty() || !key_file.empty())
      bad("ca_cert_file, cert_file and key_file need tls = true (amqps://)");
    return;
  }
  if (verify_peer && ca_cert_file.empty())
    bad("tls with verify_peer needs ca_cert_file (the CA the broker's certificate must lead to)");
  if (cert_file.empty() != key_file.empty())
    bad("cert_file and key_file go together (a client certificate needs its key)");
  for (const auto& [name, path] :
       {std::pair<const char*, const std::string&>{"ca_cert_file", ca_cert_file},
        {"cert_file", cert_file},
        {"key_file", key_file}}) {
    if (path.empty()) continue;
    if (path.find('\0') != std::string::npos) bad(std::string(name) + " contains a NUL byte");
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) bad(std::string(name) + ": cannot read '" + path + "'");
    std::fclose(file);
  }
}

std::string ConnectionOptions::resolved_password() const {
  const auto secret = ::idem::detail::resolve_secret("idem rabbitmq: ConnectionOptions::password",
                                                     "", password_file, password_env);
  return secret ? *secret : password;
}

std::string ConnectionOptions::resolved_key_password() const {
  return ::idem::detail::resolve_secret("idem rabbitmq: ConnectionOptions::key_password",
                                        key_password, key_password_file, key_password_env)
      .value_or("");
}

std::string ConnectionOptions::describe() const {
  return std::string(tls ? "amqps://" : "amqp://") + user + "@" + host + ":" +
         std::to_string(port) + (vhost.size() > 0 && vhost.front() == '/' ? vhost : "/" + vhost);
}

}  // namespace idem::rabbitmq
