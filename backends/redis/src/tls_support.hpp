// TLS pieces both faces of the Redis backend share (not installed): the context of a pool, the
// classified error, and the probes that name the cause when one side does not speak TLS.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "idem/net/stream.hpp"
#include "idem/net/tls.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_options.hpp"

namespace idem::redis::detail {

// The TLS context of `options.tls` (null without TLS), built once per pool. Throws ConfigError
// naming the file that cannot be used.
std::shared_ptr<const net::TlsContext> make_tls_context(const RedisOptions& options);

// The non-retryable RedisError (RedisFailure::tls, store_open_failed) of a TLS failure; `cause`
// starts with "TLS: ".
RedisError tls_error(const std::string& endpoint, const std::string& cause);

// How long a probe below may take: what is left of connect_timeout, at most 1 s.
std::chrono::steady_clock::time_point probe_deadline(std::chrono::milliseconds connect_timeout);

// A plaintext connection to `addresses` was reset or closed before its first reply: the cause
// when the port speaks TLS ("TLS: the server speaks TLS on this port: use rediss://"), else empty.
std::string plaintext_to_tls_port(const std::vector<net::Address>& addresses,
                                  std::chrono::milliseconds connect_timeout);
// A TLS connection was reset or closed before its first reply: the server's refusal of the
// session when a second handshake meets one (see net::tls_refusal), else empty.
std::string tls_session_refused(const std::vector<net::Address>& addresses,
                                const std::shared_ptr<const net::TlsContext>& context,
                                const std::string& host, std::chrono::milliseconds connect_timeout);
// The cause for bytes a plaintext connection received first that are a TLS record.
std::string tls_record_on_plaintext();
// A TLS handshake to `addresses` got no answer: the cause when the port answers plaintext RESP
// ("TLS: the server answered in plaintext: ... use redis://"), else empty.
std::string tls_to_plaintext_port(const std::vector<net::Address>& addresses,
                                  std::chrono::milliseconds connect_timeout);

}  // namespace idem::redis::detail
