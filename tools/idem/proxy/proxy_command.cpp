#include "proxy_command.hpp"

#include <CLI/CLI.hpp>

#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "../exit_codes.hpp"
#if IDEM_HAVE_PROXY
#include "config.hpp"
#include "idem/duration.hpp"
#include "idem/error.hpp"
#include "server.hpp"
#endif

namespace idem::cli {

namespace {

// The flags as typed; each given one overrides the configuration file.
struct ProxyFlags {
  std::string config, listen, upstream, store, metrics_listen;
  int threads = 1;
  std::string tls_cert, tls_key, tls_client_ca;
  bool tls_require_client_cert = false;
  std::size_t max_connections = 0;
  std::string max_request_body, header_timeout, body_timeout, idle_timeout, upstream_timeout,
      drain_timeout;
  bool require_key = false;
  std::vector<std::string> principal_headers;
  std::string while_running, after_finished, ttl, max_wait, lease;
  std::size_t replay_cache = 0;
  std::string replay_cache_max_age;
  bool log_requests = false;
  bool check = false;
};

#if IDEM_HAVE_PROXY
int run(const ProxyFlags& flags, const CLI::App& command) {
  using proxy::ProxyOptions;
  ProxyOptions options;
  const auto given = [&](const char* name) { return command.get_option(name)->count() > 0; };
  try {
    if (!flags.config.empty()) proxy::load_toml(flags.config, options);
    if (given("--listen")) options.listen = flags.listen;
    if (given("--upstream")) options.upstream = flags.upstream;
    if (given("--store")) options.store = flags.store;
    if (given("--metrics-listen")) options.metrics_listen = flags.metrics_listen;
    if (given("--threads")) options.threads = flags.threads;
    if (given("--tls-cert")) options.tls_cert = flags.tls_cert;
    if (given("--tls-key")) options.tls_key = flags.tls_key;
    if (given("--tls-client-ca")) options.tls_client_ca = flags.tls_client_ca;
    if (flags.tls_require_client_cert) options.tls_require_client_cert = true;
    if (given("--max-connections")) options.max_connections = flags.max_connections;
    if (given("--max-request-body")) {
      options.max_request_body = proxy::parse_size(flags.max_request_body, "--max-request-body");
    }
    const auto duration = [&](const char* name, const std::string& text, Millis& out) {
      if (!given(name)) return;
      try {
        out = parse_duration(text);
      } catch (const ConfigError& e) {
        throw ConfigError(std::string(name) + ": " + e.message());
      }
    };
    duration("--header-timeout", flags.header_timeout, options.header_timeout);
    duration("--body-timeout", flags.body_timeout, options.body_timeout);
    duration("--idle-timeout", flags.idle_timeout, options.idle_timeout);
    duration("--upstream-timeout", flags.upstream_timeout, options.upstream_timeout);
    duration("--drain-timeout", flags.drain_timeout, options.drain_timeout);
    if (given("--principal-header")) options.guard.principal.headers = flags.principal_headers;
    if (given("--replay-cache")) options.guard.replay_cache.max_entries = flags.replay_cache;
    duration("--replay-cache-max-age", flags.replay_cache_max_age,
             options.guard.replay_cache.max_age);
    if (flags.log_requests) options.log_requests = true;
    // Route settings given as flags apply to every route (the default one without --config).
    if (options.guard.routes.empty()) options.guard.routes.emplace_back();
    for (idem::http::Route& route : options.guard.routes) {
      if (flags.require_key) route.required = true;
      if (given("--while-running")) {
        route.policy.while_running = parse_in_progress_policy(flags.while_running);
      }
      if (given("--after-finished")) {
        route.policy.after_finished = parse_reuse_policy(flags.after_finished);
      }
      duration("--ttl", flags.ttl, route.policy.ttl);
      duration("--max-wait", flags.max_wait, route.policy.max_wait);
      duration("--lease", flags.lease, route.policy.lease);
    }
    proxy::validate(options);
  } catch (const std::exception& e) {
    std::cerr << "idem proxy: " << describe(e) << "\n";
    return exit_code_of(e);
  }
  if (flags.check) {
    const auto guard = idem::http::normalized(options.guard);
    std::cout << "idem proxy: configuration ok: " << guard.routes.size() << " route(s)\n";
    for (const auto& route : guard.routes) {
      std::cout << "  " << route.name << ": ";
      for (const auto& method : route.methods)
        std::cout << method << " ";
      std::cout << route.path << (route.required ? " (key required)" : " (key optional)")
                << ", while running " << to_string(route.policy.while_running)
                << ", after finished " << to_string(route.policy.after_finished) << ", ttl "
                << route.policy.ttl.count() << " ms\n";
    }
    if (guard.replay_cache.max_entries > 0) {
      std::cout << "  replay cache: " << guard.replay_cache.max_entries << " entries, "
                << guard.replay_cache.max_bytes << " bytes, max age "
                << guard.replay_cache.max_age.count() << " ms\n";
    }
    return kOk;
  }
  return proxy::run_proxy(options);
}
#endif

}  // namespace

void add_proxy_command(CLI::App& app) {
  auto flags = std::make_shared<ProxyFlags>();
  auto* command = app.add_subcommand(
      "proxy",
      "HTTP idempotency sidecar: a reverse proxy in front of one upstream giving its routes the "
      "Idempotency-Key rules (400/409/422, replays with Idempotent-Replayed: true), on any store "
      "URL (docs/http.md)");
  command->add_option("--config", flags->config, "TOML file (examples/idem-proxy.toml)");
  command->add_option("--listen", flags->listen, "HOST:PORT to serve (default 127.0.0.1:8080)");
  command->add_option("--upstream", flags->upstream, "HOST:PORT of the upstream (plain HTTP/1.1)");
  command->add_option("--store", flags->store,
                      "Store URL: sqlite:///path.db, redis://host:6379/0, postgresql://..., "
                      "memory:// (docs/urls.md)");
  command->add_option("--metrics-listen", flags->metrics_listen,
                      "HOST:PORT serving GET /metrics (Prometheus) and /healthz");
  command->add_option("--threads", flags->threads, "Event-loop threads")->check(CLI::Range(1, 256));
  command->add_option("--tls-cert", flags->tls_cert, "PEM certificate chain: serve HTTPS");
  command->add_option("--tls-key", flags->tls_key, "PEM private key of --tls-cert");
  command->add_option("--tls-client-ca", flags->tls_client_ca,
                      "PEM CAs to verify client certificates with (the principal's subject)");
  command->add_flag("--tls-require-client-cert", flags->tls_require_client_cert,
                    "Refuse TLS clients without a valid certificate");
  command->add_option("--max-connections", flags->max_connections, "Client connections at once")
      ->check(CLI::Range(1, 1'000'000));
  command->add_option("--max-request-body", flags->max_request_body,
                      "Largest request body (413 above): 512KiB, 1MiB, ...");
  command->add_option("--header-timeout", flags->header_timeout, "A request's header (10s)");
  command->add_option("--body-timeout", flags->body_timeout, "A request's body (60s)");
  command->add_option("--idle-timeout", flags->idle_timeout, "Between requests (60s)");
  command->add_option("--upstream-timeout", flags->upstream_timeout, "Each upstream read (60s)");
  command->add_option("--drain-timeout", flags->drain_timeout,
                      "SIGTERM: grace for requests in flight (30s)");
  command->add_flag("--require-key", flags->require_key,
                    "Every route requires an Idempotency-Key (400 without)");
  command->add_option("--principal-header", flags->principal_headers,
                      "Request field naming the client, hashed into the key's scope (repeatable; "
                      "e.g. Authorization)");
  command->add_option("--while-running", flags->while_running,
                      "A duplicate of a running request: join (wait, then replay) or reject (409)");
  command->add_option("--after-finished", flags->after_finished,
                      "A duplicate of a finished request: replay, rerun_failed or reject (409)");
  command->add_option("--ttl", flags->ttl, "How long a kept response replays (24h)");
  command->add_option("--max-wait", flags->max_wait, "Longest join wait before 409 (30s)");
  command->add_option("--lease", flags->lease,
                      "Claim lease, renewed while the upstream works; a dead proxy's claim is "
                      "taken over after it (30s)");
  command
      ->add_option("--replay-cache", flags->replay_cache,
                   "Replays kept in the process, so that a duplicate of a completed key is "
                   "answered without the store (0, the default: off)")
      ->check(CLI::Range(0, 100'000'000));
  command->add_option("--replay-cache-max-age", flags->replay_cache_max_age,
                      "How long a cached replay answers before the store is asked again; a "
                      "record removed from the store may replay until then (1s)");
  command->add_flag("--log-requests", flags->log_requests, "One JSON line per request on stderr");
  command->add_flag("--check", flags->check, "Check the configuration, print the routes, exit");
  command->callback([flags, command] {
#if IDEM_HAVE_PROXY
    const int code = run(*flags, *command);
#else
    (void)command;
    std::cerr << "idem proxy: this idem was built without the HTTP proxy (it needs the coroutine "
                 "face, Boost.Beast from libboost-dev and toml++ from libtomlplusplus-dev)\n";
    const int code = kUsage;
#endif
    std::cout.flush();
    if (code != kOk) throw CLI::RuntimeError(code);
  });
}

}  // namespace idem::cli
