// The settings of `idem proxy`: command-line flags and a TOML file (examples/idem-proxy.toml),
// flags winning over the file. docs/http.md lists every key.
//
// Thread-safety: plain values; load_toml() and the parsers are pure.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/http/options.hpp"

namespace idem::cli::proxy {

struct HostPort {
  std::string host;  // a name, an IPv4 address, or an IPv6 address without brackets
  std::string port;
};

struct ProxyOptions {
  std::string listen = "127.0.0.1:8080";  // host:port; port 0 picks a free one (printed)
  std::string upstream;                   // host:port of the one upstream (plain HTTP/1.1)
  std::string store;                      // an idem store URL (docs/urls.md)
  std::string metrics_listen;             // host:port of /metrics and /healthz; "" = none
  int threads = 1;                        // threads running the event loop

  std::size_t max_connections = 1024;      // client connections at once (more wait in the backlog)
  std::size_t max_header = 16 * 1024;      // a request's or response's header, bytes (431)
  std::size_t max_request_body = 1 << 20;  // bytes (413)
  // Responses of unguarded requests larger than this are streamed rather than buffered.
  std::size_t max_buffered_response = 1 << 20;
  Millis header_timeout = std::chrono::seconds(10);  // a request's header, from its first byte
  Millis body_timeout = std::chrono::seconds(60);    // a request's body, from its header
  Millis idle_timeout = std::chrono::seconds(60);    // between requests of a connection
  Millis write_timeout = std::chrono::seconds(30);   // each write to the client
  Millis upstream_connect_timeout = std::chrono::seconds(5);
  Millis upstream_timeout = std::chrono::seconds(60);  // each read from the upstream
  Millis drain_timeout = std::chrono::seconds(30);     // SIGTERM: in-flight requests' grace
  std::size_t upstream_idle = 64;                      // idle upstream connections kept

  std::string tls_cert;       // PEM certificate chain: serve HTTPS (with tls_key)
  std::string tls_key;        // PEM private key
  std::string tls_client_ca;  // ask for client certificates and verify them against these CAs
  bool tls_require_client_cert = false;

  bool log_requests = false;  // one JSON line per request on stderr

  idem::http::GuardOptions guard;
};

// Reads a TOML file into `options` (keys it does not name keep their value). Throws
// idem::ConfigError naming the file, the key and, for syntax errors, the line.
void load_toml(const std::string& path, ProxyOptions& options);

// Checks what the guard's validate() does not: addresses, counts, TLS files given in pairs.
void validate(const ProxyOptions& options);

// "host:port" or "[v6]:port". Throws ConfigError naming `what`.
HostPort parse_host_port(std::string_view text, std::string_view what);

// Bytes: a whole number with an optional unit, "512", "64KiB", "1MiB", "2GiB". Throws
// ConfigError naming `what`.
std::size_t parse_size(std::string_view text, std::string_view what);

}  // namespace idem::cli::proxy
