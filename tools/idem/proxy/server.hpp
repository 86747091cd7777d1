// `idem proxy`: an HTTP/1.1 reverse proxy in front of one upstream that gives every route the
// Idempotency-Key rules of idem::http (docs/http.md).
//
// Each client connection is a coroutine on a strand of its own: it reads one request at a time
// (keep-alive, pipelined requests in order), asks the Guard, forwards to the upstream over a pool
// of keep-alive connections or answers itself, and writes the response. Timeouts bound every
// phase (a request's header and body, the idle time between requests, each write, each upstream
// read), so a slow or silent client loses its connection instead of holding a slot.
//
// A request whose client goes away while the upstream works is still finished: its response is
// kept or its key released as if the client were there, so the client's retry replays it. A
// claim is never left behind: every path ends in finish() or release(), or — when the process
// dies — lapses after its lease, after which a duplicate takes it over.
//
// SIGTERM (or SIGINT) drains: no new connections, idle ones closed, requests in flight answered
// (with Connection: close) for up to drain_timeout, then the rest cancelled (their claims
// released). A second signal stops at once.
//
// Thread-safety: run_proxy() owns everything it makes.
#pragma once

#include "config.hpp"

namespace idem::cli::proxy {

// Runs the proxy until it has drained; returns the exit code (docs/cli.md). Prints the
// addresses it listens on to stdout ("idem proxy: listening on http://127.0.0.1:8080").
int run_proxy(const ProxyOptions& options);

}  // namespace idem::cli::proxy
