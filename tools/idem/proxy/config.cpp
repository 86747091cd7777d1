#include "config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "idem/detail/printable.hpp"
#include "idem/duration.hpp"
#include "idem/error.hpp"

namespace idem::cli::proxy {

namespace {

using idem::detail::printable;

// Reads one TOML table, knowing which keys it allows: an unknown key (a typo) is an error.
class Section {
 public:
  Section(const toml::table& table, std::string where, std::string file)
      : table_(table), where_(std::move(where)), file_(std::move(file)) {}

  void allow(std::initializer_list<std::string_view> keys) const {
    for (const auto& [key, node] : table_) {
      const std::string_view name = key.str();
      if (std::find(keys.begin(), keys.end(), name) == keys.end()) {
        fail(name, "is not a setting here (see docs/http.md)");
      }
    }
  }

  [[noreturn]] void fail(std::string_view key, const std::string& problem) const {
    throw ConfigError(file_ + ": " + where_ + printable(key, 64) + " " + problem);
  }

  const toml::node* node(std::string_view key) const { return table_.get(key); }

  void string(std::string_view key, std::string& out) const {
    if (const toml::node* n = node(key)) {
      const auto value = n->value<std::string>();
      if (!value) fail(key, "must be a string");
      out = *value;
    }
  }
  void boolean(std::string_view key, bool& out) const {
    if (const toml::node* n = node(key)) {
      if (!n->is_boolean()) fail(key, "must be true or false");
      out = *n->value<bool>();
    }
  }
  template <class Int>
  void count(std::string_view key, Int& out, std::int64_t low, std::int64_t high) const {
    if (const toml::node* n = node(key)) {
      if (!n->is_integer()) fail(key, "must be a whole number");
      const std::int64_t value = *n->value<std::int64_t>();
      if (value < low || value > high) {
        fail(key, "must be between " + std::to_string(low) + " and " + std::to_string(high));
      }
      out = static_cast<Int>(value);
    }
  }
  void size(std::string_view key, std::size_t& out) const {
    if (const toml::node* n = node(key)) {
      if (n->is_integer()) {
        const std::int64_t value = *n->value<std::int64_t>();
        if (value < 0) fail(key, "must not be negative");
        out = static_cast<std::size_t>(value);
      } else if (const auto text = n->value<std::string>()) {
        try {
          out = parse_size(*text, key);
        } catch (const ConfigError& e) {
          fail(key, "is not a size: " + e.message());
        }
      } else {
        fail(key, "must be a number of bytes or a string such as \"1MiB\"");
      }
    }
  }
  void duration(std::string_view key, Millis& out) const {
    if (const toml::node* n = node(key)) {
      const auto text = n->value<std::string>();
      if (!text) fail(key, "must be a duration string such as \"30s\"");
      try {
        out = parse_duration(*text);
      } catch (const ConfigError& e) {
        fail(key, e.message());
      }
    }
  }
  void strings(std::string_view key, std::vector<std::string>& out) const {
    if (const toml::node* n = node(key)) {
      const toml::array* array = n->as_array();
      if (array == nullptr) fail(key, "must be an array of strings");
      out.clear();
      for (const toml::node& element : *array) {
        const auto value = element.value<std::string>();
        if (!value) fail(key, "must be an array of strings");
        out.push_back(*value);
      }
    }
  }
  const toml::table* table(std::string_view key) const {
    const toml::node* n = node(key);
    if (n == nullptr) return nullptr;
    if (!n->is_table()) fail(key, "must be a table");
    return n->as_table();
  }

  const std::string& file() const noexcept { return file_; }

 private:
  const toml::table& table_;
  std::string where_;
  std::string file_;
};

idem::http::KeyCharset parse_charset(const Section& section, std::string_view text) {
  using idem::http::KeyCharset;
  if (text == "printable") return KeyCharset::printable;
  if (text == "token") return KeyCharset::token;
  if (text == "uuid") return KeyCharset::uuid;
  if (text == "uuid_v4") return KeyCharset::uuid_v4;
  if (text == "uuid_v7") return KeyCharset::uuid_v7;
  section.fail("charset", "must be printable, token, uuid, uuid_v4 or uuid_v7");
}

idem::http::BodyFingerprint parse_body(const Section& section, std::string_view text) {
  using idem::http::BodyFingerprint;
  if (text == "raw") return BodyFingerprint::raw;
  if (text == "json") return BodyFingerprint::json;
  if (text == "none") return BodyFingerprint::none;
  section.fail("body", "must be raw, json or none");
}

void load_route(const Section& section, idem::http::Route& route) {
  section.allow({"name", "methods", "path", "required", "while_running", "max_wait",
                 "after_finished", "ttl", "lease", "keep_failures", "keep_transient",
                 "transient_statuses", "stored_headers", "max_stored_body", "fingerprint"});
  section.string("name", route.name);
  section.strings("methods", route.methods);
  section.string("path", route.path);
  section.boolean("required", route.required);
  std::string word;
  try {
    if (section.node("while_running") != nullptr) {
      section.string("while_running", word);
      route.policy.while_running = parse_in_progress_policy(word);
    }
    if (section.node("after_finished") != nullptr) {
      section.string("after_finished", word);
      route.policy.after_finished = parse_reuse_policy(word);
    }
  } catch (const ConfigError& e) {
    section.fail("", e.message());
  }
  section.duration("max_wait", route.policy.max_wait);
  section.duration("ttl", route.policy.ttl);
  section.duration("lease", route.policy.lease);
  section.boolean("keep_failures", route.policy.keep_failures);
  section.boolean("keep_transient", route.policy.keep_transient);
  if (section.node("transient_statuses") != nullptr) {
    std::vector<std::string> items;
    section.strings("transient_statuses", items);
    try {
      route.transient_statuses = idem::http::StatusSet::parse(items);
    } catch (const ConfigError& e) {
      section.fail("transient_statuses", e.message());
    }
  }
  section.strings("stored_headers", route.stored_headers);
  section.size("max_stored_body", route.max_stored_body);
  if (const toml::table* fingerprint = section.table("fingerprint")) {
    const Section sub(*fingerprint, "route.fingerprint.", section.file());
    sub.allow({"body", "json_pointers", "query", "headers"});
    if (sub.node("body") != nullptr) {
      sub.string("body", word);
      route.fingerprint.body = parse_body(sub, word);
    }
    sub.strings("json_pointers", route.fingerprint.json_pointers);
    sub.boolean("query", route.fingerprint.query);
    sub.strings("headers", route.fingerprint.headers);
  }
}

}  // namespace

HostPort parse_host_port(std::string_view text, std::string_view what) {
  HostPort out;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw ConfigError(std::string(what) + " must be host:port or [v6]:port (got '" +
                        printable(text, 128) + "')");
    }
    out.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 ||
        text.substr(0, colon).find(':') != std::string_view::npos) {
      throw ConfigError(std::string(what) + " must be host:port or [v6]:port (got '" +
                        printable(text, 128) + "')");
    }
    out.host = std::string(text.substr(0, colon));
    port = text.substr(colon + 1);
  }
  unsigned value = 0;
  const auto [end, error] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || error != std::errc() || end != port.data() + port.size() || value > 65535) {
    throw ConfigError(std::string(what) + ": '" + printable(port, 16) + "' is not a port");
  }
  out.port = std::string(port);
  return out;
}

std::size_t parse_size(std::string_view text, std::string_view what) {
  std::size_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  const std::string_view unit(end, static_cast<std::size_t>(text.data() + text.size() - end));
  std::size_t scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB") {
    scale = std::size_t{1} << 10;
  } else if (unit == "MiB") {
    scale = std::size_t{1} << 20;
  } else if (unit == "GiB") {
    scale = std::size_t{1} << 30;
  }
  if (error != std::errc() || end == text.data() || scale == 0 ||
      value > (std::size_t{1} << 40) / scale) {
    throw ConfigError(std::string(what) + ": '" + printable(text, 32) +
                      "' is not a size (bytes, or a whole number of KiB, MiB or GiB, up to 1TiB)");
  }
  return value * scale;
}

void load_toml(const std::string& path, ProxyOptions& options) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(path + ":" + std::to_string(e.source().begin.line) + ": " +
                      std::string(e.description()));
  }
  const Section top(root, "", path);
  top.allow({"listen", "upstream", "store", "metrics_listen", "threads", "problem_base",
             "key_prefix", "log_requests", "limits", "tls", "key", "principal", "replay_cache",
             "route"});
  top.string("listen", options.listen);
  top.string("upstream", options.upstream);
  top.string("store", options.store);
  top.string("metrics_listen", options.metrics_listen);
  top.count("threads", options.threads, 1, 256);
  top.string("problem_base", options.guard.problem_base);
  top.string("key_prefix", options.guard.key_prefix);
  top.boolean("log_requests", options.log_requests);
  if (const toml::table* limits = top.table("limits")) {
    const Section s(*limits, "limits.", path);
    s.allow({"max_connections", "max_header", "max_request_body", "max_buffered_response",
             "header_timeout", "body_timeout", "idle_timeout", "write_timeout",
             "upstream_connect_timeout", "upstream_timeout", "drain_timeout", "upstream_idle"});
    s.count("max_connections", options.max_connections, 1, 1'000'000);
    s.size("max_header", options.max_header);
    s.size("max_request_body", options.max_request_body);
    s.size("max_buffered_response", options.max_buffered_response);
    s.duration("header_timeout", options.header_timeout);
    s.duration("body_timeout", options.body_timeout);
    s.duration("idle_timeout", options.idle_timeout);
    s.duration("write_timeout", options.write_timeout);
    s.duration("upstream_connect_timeout", options.upstream_connect_timeout);
    s.duration("upstream_timeout", options.upstream_timeout);
    s.duration("drain_timeout", options.drain_timeout);
    s.count("upstream_idle", options.upstream_idle, 0, 100'000);
  }
  if (const toml::table* tls = top.table("tls")) {
    const Section s(*tls, "tls.", path);
    s.allow({"cert", "key", "client_ca", "require_client_cert"});
    s.string("cert", options.tls_cert);
    s.string("key", options.tls_key);
    s.string("client_ca", options.tls_client_ca);
    s.boolean("require_client_cert", options.tls_require_client_cert);
  }
  if (const toml::table* key = top.table("key")) {
    const Section s(*key, "key.", path);
    s.allow({"field", "min_length", "max_length", "charset", "accept_bare"});
    s.string("field", options.guard.key.field);
    s.count("min_length", options.guard.key.min_length, 0, 4096);
    s.count("max_length", options.guard.key.max_length, 1, 4096);
    if (s.node("charset") != nullptr) {
      std::string word;
      s.string("charset", word);
      options.guard.key.charset = parse_charset(s, word);
    }
    s.boolean("accept_bare", options.guard.key.accept_bare);
  }
  if (const toml::table* principal = top.table("principal")) {
    const Section s(*principal, "principal.", path);
    s.allow({"headers", "client_certificate", "required"});
    s.strings("headers", options.guard.principal.headers);
    s.boolean("client_certificate", options.guard.principal.client_certificate);
    s.boolean("required", options.guard.principal.required);
  }
  if (const toml::table* cache = top.table("replay_cache")) {
    const Section s(*cache, "replay_cache.", path);
    s.allow({"max_entries", "max_bytes", "max_age"});
    s.count("max_entries", options.guard.replay_cache.max_entries, 0, 100'000'000);
    s.size("max_bytes", options.guard.replay_cache.max_bytes);
    s.duration("max_age", options.guard.replay_cache.max_age);
  }
  if (const toml::node* routes = top.node("route")) {
    const toml::array* array = routes->as_array();
    if (array == nullptr) top.fail("route", "must be [[route]] tables");
    options.guard.routes.clear();
    std::size_t index = 0;
    for (const toml::node& element : *array) {
      ++index;
      const toml::table* table = element.as_table();
      if (table == nullptr) top.fail("route", "must be [[route]] tables");
      idem::http::Route route;
      load_route(Section(*table, "route #" + std::to_string(index) + ": ", path), route);
      options.guard.routes.push_back(std::move(route));
    }
  }
}

void validate(const ProxyOptions& options) {
  (void)parse_host_port(options.listen, "--listen");
  if (options.upstream.empty()) throw ConfigError("--upstream is required (host:port)");
  (void)parse_host_port(options.upstream, "--upstream");
  if (options.store.empty()) throw ConfigError("--store is required (an idem store URL)");
  if (!options.metrics_listen.empty())
    (void)parse_host_port(options.metrics_listen, "--metrics-listen");
  if (options.threads < 1 || options.threads > 256) {
    throw ConfigError("--threads must be between 1 and 256");
  }
  if (options.max_connections == 0) throw ConfigError("max_connections must be positive");
  if (options.max_header < 1024) throw ConfigError("max_header must be at least 1KiB");
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    throw ConfigError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)");
  }
  if (!options.tls_client_ca.empty() && options.tls_cert.empty()) {
    throw ConfigError("--tls-client-ca needs TLS (--tls-cert and --tls-key)");
  }
  if (options.tls_require_client_cert && options.tls_client_ca.empty()) {
    throw ConfigError("requiring client certificates needs --tls-client-ca");
  }
  for (const Millis timeout :
       {options.header_timeout, options.body_timeout, options.idle_timeout, options.write_timeout,
        options.upstream_connect_timeout, options.upstream_timeout}) {
    if (timeout <= Millis::zero()) throw ConfigError("every timeout must be positive");
  }
  idem::http::validate(idem::http::normalized(options.guard));
}

}  // namespace idem::cli::proxy
