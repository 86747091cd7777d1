// `idem proxy`: the HTTP idempotency sidecar (docs/http.md).
//
//   idem proxy --upstream HOST:PORT --store URL [--listen HOST:PORT] [--config FILE] ...
//       runs a reverse proxy in front of the upstream that gives its routes the Idempotency-Key
//       rules (400/409/422, replay with Idempotent-Replayed: true) until SIGTERM, then drains.
#pragma once

namespace CLI {
class App;
}

namespace idem::cli {

// Adds the subcommand `proxy` to `app` (run from its callback, as the store commands). In a
// build without the proxy (no idem::http, Boost.Beast or toml++) it says so and exits with 2.
void add_proxy_command(CLI::App& app);

}  // namespace idem::cli
