#include "idem/redis/redis_options.hpp"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "idem/detail/printable.hpp"
#include "idem/detail/secret.hpp"
#include "idem/duration.hpp"
#include "idem/error.hpp"
#include "idem_url.hpp"

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

// How the URL toolkit's failures read here: "redis URL: <part> <problem>".
class RedisUrlErrors final : public ::idem::detail::UrlErrors {
 private:
  void throw_error(std::string_view part, std::string_view problem) const override {
    bad_url(std::string(part) + " " + std::string(problem));
  }
};

// A count whose range validate() checks (its message names the field).
std::size_t count_setting(const RedisUrlErrors& errors, std::string_view part,
                          std::string_view value) {
  return static_cast<std::size_t>(
      ::idem::detail::whole_number(errors, part, value, std::numeric_limits<std::size_t>::max()));
}

// The largest bare millisecond count of a duration's _ms alias.
constexpr auto kMaxMilliseconds =
    static_cast<std::uint64_t>(std::numeric_limits<std::chrono::milliseconds::rep>::max());

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
  bad_url(std::string(part) + " must be yes or no, got '" + ::idem::detail::printable(value, 64) +
          "'");
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
bool apply_duration_parameter(RedisOptions& options, const RedisUrlErrors& errors,
                              std::string_view name, const std::string& value,
                              const std::string& part) {
  const std::string_view setting = setting_of(name);
  if (std::find(kDurationSettings.begin(), kDurationSettings.end(), setting) ==
      kDurationSettings.end()) {
    return false;
  }
  std::chrono::milliseconds duration{};
  if (setting != name) {
    duration = std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(
        ::idem::detail::whole_number(errors, part, value, kMaxMilliseconds)));
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

void apply_parameter(RedisOptions& options, const RedisUrlErrors& errors,
                     const ::idem::detail::QueryParameter& parameter) {
  const std::string_view name = parameter.name;
  const std::string& value = parameter.value;
  const std::string part = ::idem::detail::parameter_part(parameter);
  if (apply_tls_parameter(options, name, value, part)) return;
  if (apply_duration_parameter(options, errors, name, value, part)) return;
  if (name == "prefix") {
    options.key_prefix = value;
  } else if (name == "pool_size") {
    options.pool_size = count_setting(errors, part, value);
  } else if (name == "async_connections") {
    options.async_connections = count_setting(errors, part, value);
  } else if (name == "scan_count") {
    options.scan_count = count_setting(errors, part, value);
  } else if (name == "min_replicas") {
    options.min_replicas = count_setting(errors, part, value);
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
    bad_url("unknown parameter '" + ::idem::detail::printable(name, 64) +
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
RedisNode parse_node(const RedisUrlErrors& errors, std::string_view text, int default_port) {
  ::idem::detail::HostPort node = ::idem::detail::parse_host_port(errors, text);
  return {std::move(node.host), node.port.value_or(default_port)};
}

}  // namespace

RedisOptions RedisOptions::from_url(std::string_view url) {
  constexpr std::array<std::string_view, 6> kSchemes{
      "redis", "rediss", "redis+cluster", "rediss+cluster", "redis+sentinel", "rediss+sentinel"};
  constexpr std::string_view kExpected =
      "redis://, rediss://, redis+cluster://, rediss+cluster://, redis+sentinel:// or "
      "rediss+sentinel://";
  const RedisUrlErrors errors{};
  const ::idem::detail::SplitUrl split = ::idem::detail::split_scheme(errors, url, kExpected);
  const auto found = std::find(kSchemes.begin(), kSchemes.end(), split.scheme);
  if (found == kSchemes.end()) {
    bad_url("scheme '" + ::idem::detail::printable(split.scheme, 32) +
            "' is not supported (expected " + std::string(kExpected) + ")");
  }
  const auto scheme = static_cast<std::size_t>(found - kSchemes.begin());
  const bool tls = scheme % 2 == 1;
  const bool cluster = scheme == 2 || scheme == 3;
  const bool sentinel = scheme == 4 || scheme == 5;
  RedisOptions options;
  if (tls) options.tls = RedisTlsOptions{};
  const ::idem::detail::UrlLocation location =
      ::idem::detail::split_location(errors, split.rest, "redis://localhost:6379/0");

  // user info: ":password" or "user:password"
  const ::idem::detail::Authority authority =
      ::idem::detail::split_authority(errors, location.authority);
  if (authority.user_info) {
    if (!authority.user_info->password) {
      bad_url("user info must be ':password' or 'user:password' (no ':' found before '@')");
    }
    options.password = *authority.user_info->password;
    if (!authority.user_info->user.empty()) options.username = authority.user_info->user;
  }

  // host[:port], or on a cluster or Sentinel group host[:port],host[:port],...
  std::string_view hosts = authority.hosts;
  if (!cluster && !sentinel) {
    if (hosts.find(',') != std::string_view::npos) {
      bad_url("several hosts are given ('" + ::idem::detail::printable(hosts, 256) +
              "'): a Redis Cluster is reached with redis+cluster://, a Sentinel group with "
              "redis+sentinel://");
    }
    RedisNode node = parse_node(errors, hosts, 6379);
    options.host = std::move(node.host);
    options.port = node.port;
  } else {
    std::vector<RedisNode>& nodes = cluster ? options.cluster_nodes : options.sentinel_nodes;
    while (true) {
      const std::size_t comma = hosts.find(',');
      nodes.push_back(parse_node(errors, hosts.substr(0, comma), cluster ? 6379 : 26379));
      if (comma == std::string_view::npos) break;
      hosts = hosts.substr(comma + 1);
    }
    options.host = nodes.front().host;
    options.port = nodes.front().port;
  }

  // /db, or with Sentinel /master-name[/db]
  std::string_view path = location.path.empty() ? location.path : location.path.substr(1);
  if (sentinel) {
    const std::size_t slash = path.find('/');
    options.sentinel_master =
        ::idem::detail::percent_decode(errors, path.substr(0, slash), "master name");
    path = slash == std::string_view::npos ? std::string_view() : path.substr(slash + 1);
  }
  if (!path.empty()) {
    const std::uint64_t db =
        ::idem::detail::whole_number(errors,
                                     sentinel ? "database (the path after the master name)"
                                              : "database (the path after the host)",
                                     path);
    if (db > static_cast<std::uint64_t>(std::numeric_limits<int>::max())) {
      bad_url("database '" + ::idem::detail::printable(path, 64) + "' is too large");
    }
    options.db = static_cast<int>(db);
    if (cluster && db != 0) {
      bad_url("a Redis Cluster has database 0 only, got '/" + ::idem::detail::printable(path, 64) +
              "'");
    }
  }
  if (sentinel && options.sentinel_master.empty()) {
    bad_url(
        "a Sentinel URL names the monitored primary after the hosts: "
        "redis+sentinel://host:26379,host:26379/<master-name>[/db]");
  }

  const std::vector<::idem::detail::QueryParameter> parameters =
      ::idem::detail::parse_query(errors, location.query);
  // A name given twice fails in parse_query; a setting given by both of its names fails here.
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const std::string_view name = parameters[i].name;
    for (std::size_t j = 0; j < i; ++j) {
      const std::string_view earlier = parameters[j].name;
      if (setting_of(earlier) == setting_of(name)) {
        bad_url("give " + ::idem::detail::printable(setting_of(name), 64) + " one way only: '" +
                ::idem::detail::printable(earlier, 64) + "' and '" +
                ::idem::detail::printable(name, 64) + "' are both given");
      }
    }
  }
  for (const ::idem::detail::QueryParameter& parameter : parameters) {
    apply_parameter(options, errors, parameter);
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
