#include "idem/rabbitmq/options.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "idem/detail/printable.hpp"
#include "idem/detail/secret.hpp"
#include "idem/error.hpp"
#include "idem_url.hpp"

namespace idem::rabbitmq {
namespace {

// URLs are quoted redacted, control characters as \xNN, cut at 256 characters.
[[noreturn]] void bad_url(std::string_view url, const std::string& what) {
  throw ConfigError("idem rabbitmq: bad AMQP URL '" +
                    ::idem::detail::printable(redact_amqp_url(url)) + "': " + what);
}

// How the URL toolkit's failures read here: "idem rabbitmq: bad AMQP URL '<redacted>': <part>
// <problem>".
class AmqpUrlErrors final : public ::idem::detail::UrlErrors {
 public:
  explicit AmqpUrlErrors(std::string_view url) : url_(url) {}

 private:
  void throw_error(std::string_view part, std::string_view problem) const override {
    bad_url(url_, std::string(part) + " " + std::string(problem));
  }

  std::string_view url_;
};

void apply_query(const AmqpUrlErrors& errors, std::string_view url, std::string_view query,
                 ConnectionOptions& options) {
  for (const ::idem::detail::QueryParameter& parameter :
       ::idem::detail::parse_query(errors, query)) {
    const std::string& name = parameter.name;
    const std::string& value = parameter.value;
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
      ::idem::detail::unknown_parameter(errors, parameter, "an AMQP URL",
                                        "cacertfile, certfile, keyfile, verify, "
                                        "server_name_indication, password_file, password_env, "
                                        "key_password_file, key_password_env");
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

std::string redact_amqp_url(std::string_view url) {
  return ::idem::detail::redact_url_secrets(url);
}

ConnectionOptions ConnectionOptions::from_url(std::string_view url) {
  if (url.find('\0') != std::string_view::npos) bad_url(url, "contains a NUL byte");
  const AmqpUrlErrors errors(url);
  const ::idem::detail::SplitUrl split =
      ::idem::detail::split_scheme(errors, url, "amqp:// or amqps://");
  if (split.scheme != "amqp" && split.scheme != "amqps") {
    bad_url(url, "scheme '" + ::idem::detail::printable(split.scheme, 32) +
                     "' is not supported (expected amqp:// or amqps://)");
  }
  const ::idem::detail::UrlLocation location =
      ::idem::detail::split_location(errors, split.rest, "amqp://guest:guest@localhost:5672/");

  ConnectionOptions options;
  options.tls = split.scheme == "amqps";
  const ::idem::detail::Authority authority =
      ::idem::detail::split_authority(errors, location.authority);
  // user[:password]@: what is left out stays guest.
  if (authority.user_info) {
    options.user = authority.user_info->user;
    if (authority.user_info->password) options.password = *authority.user_info->password;
  }
  ::idem::detail::HostPort node = ::idem::detail::parse_host_port(errors, authority.hosts);
  options.host = std::move(node.host);
  options.port = node.port.value_or(options.tls ? 5671 : 5672);
  // The vhost is one path segment, %-decoded ("/%2f" is "/"); none or an empty one is "/".
  const std::string_view segment = location.path.empty() ? location.path : location.path.substr(1);
  if (segment.find('/') != std::string_view::npos) {
    errors.fail("vhost '" + ::idem::detail::printable(segment, 64) + "'",
                "has an unescaped '/' (escape it as %2F)");
  }
  options.vhost = segment.empty() ? "/" : ::idem::detail::percent_decode(errors, segment, "vhost");
  apply_query(errors, url, location.query, options);
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
