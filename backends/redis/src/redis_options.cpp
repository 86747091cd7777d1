#include "idem/redis/redis_options.hpp"

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <string>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "idem/detail/secret.hpp"
#include "idem/duration.hpp"
#include "idem/error.hpp"

namespace idem::redis {
namespace {

constexpr std::size_t kMaxPrefixLength = 128;
constexpr std::size_t kMaxPoolSize = 10'000;
constexpr std::size_t kMaxAsyncConnections = 64;
constexpr std::size_t kMaxClusterNodes = 1000;
constexpr std::size_t kMaxSentinels = 100;
constexpr std::size_t kMaxMasterName = 256;

[[noreturn]] void bad_url(const std::string& message) {
  throw ConfigError("redis URL: " + message);
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX decoding; `part` names the URL part for the message. `secret` keeps the text out of it.
std::string percent_decode(std::string_view text, std::string_view part, bool secret = false) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const bool complete = i + 2 < text.size();
    const int high = complete ? hex_digit(text[i + 1]) : -1;
    const int low = complete ? hex_digit(text[i + 2]) : -1;
    if (high < 0 || low < 0) {
      bad_url(std::string(part) + (secret ? "" : " '" + std::string(text) + "'") +
              " has a malformed %-escape (expected %XX with two hex digits)");
    }
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

// A non-negative decimal integer that fits `T`, the whole text.
template <class T>
T parse_number(std::string_view text, std::string_view part) {
  T value{};
  const char* first = text.data();
  const char* last = text.data() + text.size();
  const auto [end, ec] = std::from_chars(first, last, value);
  bool negative = false;
  if constexpr (std::is_signed_v<T>) negative = value < 0;
  if (text.empty() || ec != std::errc() || end != last || negative) {
    bad_url(std::string(part) + " must be a non-negative integer, got '" + std::string(text) + "'");
  }
  return value;
}

void check_text(std::string_view value, std::string_view field) {
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) {
      throw ConfigError("RedisOptions::" + std::string(field) + " contains a control character");
    }
  }
}

bool parse_yes_no(std::string_view value, std::string_view part) {
  if (value == "yes" || value == "true" || value == "1") return true;
  if (value == "no" || value == "false" || value == "0") return false;
  bad_url(std::string(part) + " must be yes or no, got '" + std::string(value) + "'");
}

// tls_* parameters; false when `name` is not one.
bool apply_tls_parameter(RedisOptions& options, std::string_view name, const std::string& value,
                         const std::string& part) {
  if (name.substr(0, 4) != "tls_") return false;
  if (!options.tls)
    bad_url(part +
            " needs TLS: use a rediss:// URL (rediss+cluster:// on a cluster, "
            "rediss+sentinel:// with Sentinel)");
  RedisTlsOptions& tls = *options.tls;
  if (name == "tls_ca_file") {
    tls.ca_file = value;
  } else if (name == "tls_ca_dir") {
    tls.ca_dir = value;
  } else if (name == "tls_cert_file") {
    tls.cert_file = value;
  } else if (name == "tls_key_file") {
    tls.key_file = value;
  } else if (name == "tls_server_name") {
    tls.server_name = value;
  } else if (name == "tls_verify") {
    tls.verify_peer = parse_yes_no(value, part);
  } else if (name == "tls_key_password_file" || name == "tls_key_password_env") {
    if (tls.key_password) {
      bad_url(
          "give the key passphrase one way only: tls_key_password_file or "
          "tls_key_password_env");
    }
    tls.key_password =
        name == "tls_key_password_file"
            ? ::idem::detail::read_secret_file("RedisOptions tls_key_password_file", value)
            : ::idem::detail::read_secret_env("RedisOptions tls_key_password_env", value);
  } else {
    return false;
  }
  return true;
}

// The settings that are durations. Each takes the duration grammar of every idem URL
// (idem/duration.hpp: 500ms, 30s, 15m, 12h, 7d; at most 1000d) under its own name, and bare
// milliseconds under the older alias <name>_ms.
constexpr std::array<std::string_view, 6> kDurationSettings{"connect_timeout", "command_timeout",
                                                            "wait_timeout",    "marker_ttl",
                                                            "expiry_slack",    "replica_timeout"};
constexpr std::size_t kMaxMinReplicas = 100;

// The setting a parameter name sets: a duration's _ms alias names its duration, any other name
// itself. Two parameters that set one setting are an error.
std::string_view setting_of(std::string_view name) {
  constexpr std::string_view kMs = "_ms";
  if (name.size() > kMs.size() && name.substr(name.size() - kMs.size()) == kMs) {
    const std::string_view setting = name.substr(0, name.size() - kMs.size());
    if (std::find(kDurationSettings.begin(), kDurationSettings.end(), setting) !=
        kDurationSettings.end()) {
      return setting;
    }
  }
  return name;
}

// connect_timeout, command_timeout, wait_timeout, marker_ttl, expiry_slack and their _ms
// aliases; false when `name` is none of them.
bool apply_duration_parameter(RedisOptions& options, std::string_view name,
                              const std::string& value, const std::string& part) {
  const std::string_view setting = setting_of(name);
  if (std::find(kDurationSettings.begin(), kDurationSettings.end(), setting) ==
      kDurationSettings.end()) {
    return false;
  }
  std::chrono::milliseconds duration{};
  if (setting != name) {
    duration = std::chrono::milliseconds(parse_number<long long>(value, part));
  } else {
    const ::idem::detail::UrlDuration parsed = ::idem::detail::url_duration(value);
    if (!parsed.problem.empty()) bad_url(part + ": " + parsed.problem);
    duration = parsed.value;
  }
  if (setting == "connect_timeout") {
    options.connect_timeout = duration;
  } else if (setting == "command_timeout") {
    options.command_timeout = duration;
  } else if (setting == "wait_timeout") {
    options.wait_timeout = duration;
  } else if (setting == "marker_ttl") {
    options.marker_ttl = duration;
  } else if (setting == "replica_timeout") {
    options.replica_timeout = duration;
  } else {
    options.expiry_slack = duration;
  }
  return true;
}

void apply_parameter(RedisOptions& options, std::string_view name, std::string_view raw) {
  const std::string part = "parameter '" + std::string(name) + "'";
  const std::string value = percent_decode(raw, part);
  if (apply_tls_parameter(options, name, value, part)) return;
  if (apply_duration_parameter(options, name, value, part)) return;
  if (name == "prefix") {
    options.key_prefix = value;
  } else if (name == "pool_size") {
    options.pool_size = parse_number<std::size_t>(value, part);
  } else if (name == "async_connections") {
    options.async_connections = parse_number<std::size_t>(value, part);
  } else if (name == "scan_count") {
    options.scan_count = parse_number<std::size_t>(value, part);
  } else if (name == "min_replicas") {
    options.min_replicas = parse_number<std::size_t>(value, part);
  } else if (name == "password_file" || name == "password_env") {
    // The secret stays out of the URL; it is read here, once (RedisOptions holds the password).
    // An ACL user is written "user:@host" (an empty password in the user info).
    if (options.password && !options.password->empty()) {
      bad_url("give the password one way only: in the user info, password_file or password_env");
    }
    options.password = name == "password_file"
                           ? ::idem::detail::read_secret_file("RedisOptions password_file", value)
                           : ::idem::detail::read_secret_env("RedisOptions password_env", value);
  } else if (name == "sentinel_password_file" || name == "sentinel_password_env") {
    if (!options.is_sentinel()) bad_url(part + " is for redis+sentinel:// URLs");
    if (options.sentinel_password) {
      bad_url(
          "give the sentinels' password one way only: sentinel_password_file or "
          "sentinel_password_env");
    }
    options.sentinel_password =
        name == "sentinel_password_file"
            ? ::idem::detail::read_secret_file("RedisOptions sentinel_password_file", value)
            : ::idem::detail::read_secret_env("RedisOptions sentinel_password_env", value);
  } else if (name == "sentinel_user") {
    if (!options.is_sentinel()) bad_url(part + " is for redis+sentinel:// URLs");
    options.sentinel_username = value;
  } else {
    bad_url("unknown parameter '" + std::string(name) +
            "' (known: prefix, pool_size, async_connections, connect_timeout, "
            "command_timeout, wait_timeout, marker_ttl, expiry_slack, replica_timeout (each also "
            "as _ms in milliseconds), scan_count, min_replicas, password_file, password_env; with "
            "redis+sentinel://: "
            "sentinel_user, sentinel_password_file, sentinel_password_env; with rediss://: "
            "tls_ca_file, tls_ca_dir, "
            "tls_cert_file, tls_key_file, tls_key_password_file, tls_key_password_env, "
            "tls_server_name, tls_verify)");
  }
}

}  // namespace

namespace {

// "host[:port]" or "[ipv6][:port]": one node of the authority.
RedisNode parse_node(std::string_view authority, int default_port = 6379) {
  std::string_view host;
  std::string_view port;
  if (!authority.empty() && authority.front() == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string_view::npos)
      bad_url("host '" + std::string(authority) + "' misses ']'");
    host = authority.substr(1, close - 1);
    const std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad_url("unexpected '" + std::string(after) + "' after the host");
      port = after.substr(1);
      if (port.empty()) bad_url("port is empty");
    }
  } else {
    const std::size_t colon = authority.rfind(':');
    host = authority.substr(0, colon);
    if (colon != std::string_view::npos) {
      port = authority.substr(colon + 1);
      if (port.empty()) bad_url("port is empty");
    }
  }
  if (host.empty()) bad_url("host is missing");
  RedisNode node{percent_decode(host, "host"), default_port};
  if (!port.empty()) {
    const long long number = parse_number<long long>(port, "port");
    if (number < 1 || number > 65535) {
      bad_url("port must be 1..65535, got '" + std::string(port) + "'");
    }
    node.port = static_cast<int>(number);
  }
  return node;
}

}  // namespace

RedisOptions RedisOptions::from_url(std::string_view url) {
  constexpr std::array<std::string_view, 6> kSchemes{"redis://",          "rediss://",
                                                     "redis+cluster://",  "rediss+cluster://",
                                                     "redis+sentinel://", "rediss+sentinel://"};
  constexpr std::string_view kExpected =
      "redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or "
      "rediss+sentinel://";
  std::size_t scheme = kSchemes.size();
  for (std::size_t i = 0; i < kSchemes.size(); ++i) {
    if (url.substr(0, kSchemes[i].size()) == kSchemes[i]) scheme = i;
  }
  if (scheme == kSchemes.size()) {
    const auto colon = url.find("://");
    if (colon != std::string_view::npos) {
      bad_url("scheme '" + std::string(url.substr(0, std::min<std::size_t>(colon, 32))) +
              "' is not supported (expected " + std::string(kExpected) + ")");
    }
    bad_url("'" + std::string(url.substr(0, 64)) + "' does not start with " +
            std::string(kExpected));
  }
  const bool tls = scheme % 2 == 1;
  const bool cluster = scheme == 2 || scheme == 3;
  const bool sentinel = scheme == 4 || scheme == 5;
  RedisOptions options;
  if (tls) options.tls = RedisTlsOptions{};
  std::string_view rest = url.substr(kSchemes[scheme].size());

  const std::size_t authority_end = rest.find_first_of("/?#");
  std::string_view authority = rest.substr(0, authority_end);
  rest = authority_end == std::string_view::npos ? std::string_view() : rest.substr(authority_end);
  if (!rest.empty() && rest.front() == '#') bad_url("fragments (#...) are not allowed");

  // userinfo: ":password" or "user:password"
  const std::size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const std::size_t colon = userinfo.find(':');
    if (colon == std::string_view::npos) {
      bad_url("user info must be ':password' or 'user:password' (no ':' found before '@')");
    }
    const std::string user = percent_decode(userinfo.substr(0, colon), "user name");
    options.password = percent_decode(userinfo.substr(colon + 1), "password", /*secret=*/true);
    if (!user.empty()) options.username = user;
  }

  // host[:port], or on a cluster or Sentinel group host[:port],host[:port],...
  if (!cluster && !sentinel) {
    if (authority.find(',') != std::string_view::npos) {
      bad_url("several hosts are given ('" + std::string(authority) +
              "'): a Redis Cluster is reached with redis+cluster://, a Sentinel group with "
              "redis+sentinel://");
    }
    RedisNode node = parse_node(authority);
    options.host = std::move(node.host);
    options.port = node.port;
  } else {
    std::vector<RedisNode>& nodes = cluster ? options.cluster_nodes : options.sentinel_nodes;
    while (true) {
      const std::size_t comma = authority.find(',');
      nodes.push_back(parse_node(authority.substr(0, comma), cluster ? 6379 : 26379));
      if (comma == std::string_view::npos) break;
      authority = authority.substr(comma + 1);
    }
    options.host = nodes.front().host;
    options.port = nodes.front().port;
  }

  // /db, or with Sentinel /master-name[/db]
  std::string_view query;
  if (!rest.empty() && rest.front() == '/') {
    const std::size_t q = rest.find('?');
    std::string_view path = rest.substr(1, q == std::string_view::npos ? q : q - 1);
    query = q == std::string_view::npos ? std::string_view() : rest.substr(q + 1);
    if (sentinel) {
      const std::size_t slash = path.find('/');
      options.sentinel_master = percent_decode(path.substr(0, slash), "master name");
      path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
    }
    if (!path.empty()) {
      const long long db =
          parse_number<long long>(path, sentinel ? "database (the path after the master name)"
                                                 : "database (the path after the host)");
      if (db > std::numeric_limits<int>::max())
        bad_url("database '" + std::string(path) + "' is too large");
      options.db = static_cast<int>(db);
      if (cluster && db != 0)
        bad_url("a Redis Cluster has database 0 only, got '/" + std::string(path) + "'");
    }
  } else if (!rest.empty() && rest.front() == '?') {
    query = rest.substr(1);
  }
  if (sentinel && options.sentinel_master.empty()) {
    bad_url(
        "a Sentinel URL names the monitored primary after the hosts: "
        "redis+sentinel://host:26379,host:26379/<master-name>[/db]");
  }
  if (query.find('#') != std::string_view::npos) bad_url("fragments (#...) are not allowed");

  std::vector<std::string_view> given;  // the names so far
  while (!query.empty()) {
    const std::size_t amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    const std::size_t eq = pair.find('=');
    if (eq == std::string_view::npos) {
      bad_url("parameter '" + std::string(pair) + "' has no value (expected name=value)");
    }
    const std::string_view name = pair.substr(0, eq);
    for (const std::string_view earlier : given) {
      if (earlier == name) bad_url("parameter '" + std::string(name) + "' is given twice");
      if (setting_of(earlier) == setting_of(name)) {
        bad_url("give " + std::string(setting_of(name)) + " one way only: '" +
                std::string(earlier) + "' and '" + std::string(name) + "' are both given");
      }
    }
    given.push_back(name);
    apply_parameter(options, name, pair.substr(eq + 1));
  }
  options.validate();
  return options;
}

void RedisOptions::validate() const {
  if (host.empty()) throw ConfigError("RedisOptions::host must not be empty");
  check_text(host, "host");
  if (port < 1 || port > 65535) {
    throw ConfigError("RedisOptions::port must be 1..65535, got " + std::to_string(port));
  }
  if (db < 0) throw ConfigError("RedisOptions::db must be >= 0, got " + std::to_string(db));
  if (username && !password) {
    throw ConfigError("RedisOptions::username is set without a password");
  }
  if (connect_timeout <= std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::connect_timeout must be > 0 ms, got " +
                      std::to_string(connect_timeout.count()));
  }
  if (command_timeout <= std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::command_timeout must be > 0 ms, got " +
                      std::to_string(command_timeout.count()));
  }
  if (wait_timeout < std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::wait_timeout must be >= 0 ms, got " +
                      std::to_string(wait_timeout.count()));
  }
  if (pool_size < 1 || pool_size > kMaxPoolSize) {
    throw ConfigError("RedisOptions::pool_size must be 1.." + std::to_string(kMaxPoolSize) +
                      ", got " + std::to_string(pool_size));
  }
  if (async_connections < 1 || async_connections > kMaxAsyncConnections) {
    throw ConfigError("RedisOptions::async_connections must be 1.." +
                      std::to_string(kMaxAsyncConnections) + ", got " +
                      std::to_string(async_connections));
  }
  if (key_prefix.size() > kMaxPrefixLength) {
    throw ConfigError("RedisOptions::key_prefix is too long (" + std::to_string(key_prefix.size()) +
                      " bytes, at most " + std::to_string(kMaxPrefixLength) + ")");
  }
  check_text(key_prefix, "key_prefix");
  if (marker_ttl && *marker_ttl <= std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::marker_ttl must be > 0 ms when set, got " +
                      std::to_string(marker_ttl->count()));
  }
  if (expiry_slack < std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::expiry_slack must be >= 0 ms, got " +
                      std::to_string(expiry_slack.count()));
  }
  if (scan_count < 1) throw ConfigError("RedisOptions::scan_count must be >= 1");
  if (min_replicas > kMaxMinReplicas) {
    throw ConfigError("RedisOptions::min_replicas must be 0.." + std::to_string(kMaxMinReplicas) +
                      ", got " + std::to_string(min_replicas));
  }
  if (replica_timeout <= std::chrono::milliseconds::zero()) {
    throw ConfigError("RedisOptions::replica_timeout must be > 0 ms, got " +
                      std::to_string(replica_timeout.count()));
  }
  if (min_replicas > 0 && replica_timeout >= command_timeout) {
    throw ConfigError("RedisOptions::replica_timeout (" + std::to_string(replica_timeout.count()) +
                      " ms) must be shorter than command_timeout (" +
                      std::to_string(command_timeout.count()) +
                      " ms) with min_replicas: the reply to WAIT is read within command_timeout");
  }
  if (is_cluster()) {
    if (db != 0) {
      throw ConfigError(
          "RedisOptions::db must be 0 on a cluster (a Redis Cluster has database 0 "
          "only), got " +
          std::to_string(db));
    }
    if (cluster_nodes.size() > kMaxClusterNodes) {
      throw ConfigError("RedisOptions::cluster_nodes holds " +
                        std::to_string(cluster_nodes.size()) + " nodes (at most " +
                        std::to_string(kMaxClusterNodes) + ")");
    }
    for (const RedisNode& node : cluster_nodes) {
      if (node.host.empty()) throw ConfigError("RedisOptions::cluster_nodes has an empty host");
      check_text(node.host, "cluster_nodes host");
      if (node.port < 1 || node.port > 65535) {
        throw ConfigError("RedisOptions::cluster_nodes port must be 1..65535, got " +
                          std::to_string(node.port));
      }
    }
  }
  if (is_cluster() && is_sentinel()) {
    throw ConfigError(
        "RedisOptions: cluster_nodes and sentinel_nodes are both set (a Redis Cluster does not "
        "use Sentinel)");
  }
  if (is_sentinel()) {
    if (sentinel_nodes.size() > kMaxSentinels) {
      throw ConfigError("RedisOptions::sentinel_nodes holds " +
                        std::to_string(sentinel_nodes.size()) + " nodes (at most " +
                        std::to_string(kMaxSentinels) + ")");
    }
    for (const RedisNode& node : sentinel_nodes) {
      if (node.host.empty()) throw ConfigError("RedisOptions::sentinel_nodes has an empty host");
      check_text(node.host, "sentinel_nodes host");
      if (node.port < 1 || node.port > 65535) {
        throw ConfigError("RedisOptions::sentinel_nodes port must be 1..65535, got " +
                          std::to_string(node.port));
      }
    }
    if (sentinel_master.empty()) {
      throw ConfigError(
          "RedisOptions::sentinel_master must name the primary the sentinels "
          "monitor");
    }
    if (sentinel_master.size() > kMaxMasterName) {
      throw ConfigError("RedisOptions::sentinel_master is too long (at most " +
                        std::to_string(kMaxMasterName) + " bytes)");
    }
    check_text(sentinel_master, "sentinel_master");
    for (const unsigned char c : sentinel_master) {
      if (c == ' ') throw ConfigError("RedisOptions::sentinel_master contains a space");
    }
  } else if (!sentinel_master.empty()) {
    throw ConfigError("RedisOptions::sentinel_master is set without sentinel_nodes");
  }
  if (sentinel_username && !sentinel_password) {
    throw ConfigError("RedisOptions::sentinel_username is set without sentinel_password");
  }
  if (tls) {
    check_text(tls->ca_file, "tls.ca_file");
    check_text(tls->ca_dir, "tls.ca_dir");
    check_text(tls->cert_file, "tls.cert_file");
    check_text(tls->key_file, "tls.key_file");
    check_text(tls->server_name, "tls.server_name");
    if (!tls->key_file.empty() && tls->cert_file.empty()) {
      throw ConfigError("RedisOptions::tls.key_file is set without tls.cert_file");
    }
    if (tls->key_password && tls->cert_file.empty()) {
      throw ConfigError("RedisOptions::tls.key_password is set without tls.cert_file");
    }
  }
}

namespace {
std::string host_port(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}
}  // namespace

std::string RedisOptions::endpoint() const {
  if (is_sentinel()) {
    std::string out = "sentinel " + sentinel_master + "/" + std::to_string(db) + " via ";
    for (std::size_t i = 0; i < sentinel_nodes.size() && i < 3; ++i) {
      if (i > 0) out += ',';
      out += host_port(sentinel_nodes[i].host, sentinel_nodes[i].port);
    }
    if (sentinel_nodes.size() > 3) out += ",...";
    return out;
  }
  if (!is_cluster()) return host_port(host, port) + "/" + std::to_string(db);
  std::string out = "cluster ";
  for (std::size_t i = 0; i < cluster_nodes.size() && i < 3; ++i) {
    if (i > 0) out += ',';
    out += host_port(cluster_nodes[i].host, cluster_nodes[i].port);
  }
  if (cluster_nodes.size() > 3) out += ",...";
  return out;
}

}  // namespace idem::redis
