#include "tls_support.hpp"

#include <algorithm>
#include <string_view>

#include "idem/error.hpp"

namespace idem::redis::detail {

std::shared_ptr<const net::TlsContext> make_tls_context(const RedisOptions& options) {
  if (!options.tls) return nullptr;
  try {
    return std::make_shared<const net::TlsContext>(*options.tls);  // one TlsOptions struct
  } catch (const net::TlsError& e) {
    throw ConfigError("RedisOptions::tls: " + std::string(e.what()));
  }
}

RedisError tls_error(const std::string& endpoint, const std::string& cause) {
  return RedisError(RedisFailure::tls, "idem redis: connect to " + endpoint + ": " + cause,
                    /*retryable=*/false, /*in_doubt=*/false, /*timed_out=*/false,
                    ErrorCode::store_open_failed);
}

std::chrono::steady_clock::time_point probe_deadline(std::chrono::milliseconds connect_timeout) {
  return std::chrono::steady_clock::now() +
         std::min<std::chrono::milliseconds>(connect_timeout, std::chrono::seconds(1));
}

std::string plaintext_to_tls_port(const std::vector<net::Address>& addresses,
                                  std::chrono::milliseconds connect_timeout) {
  if (!net::speaks_tls(addresses, probe_deadline(connect_timeout))) return {};
  return "TLS: the server speaks TLS on this port and reset the plaintext connection: use "
         "rediss://";
}

std::string tls_session_refused(const std::vector<net::Address>& addresses,
                                const std::shared_ptr<const net::TlsContext>& context,
                                const std::string& host,
                                std::chrono::milliseconds connect_timeout) {
  return net::tls_refusal(addresses, context, host, probe_deadline(connect_timeout));
}

std::string tls_record_on_plaintext() {
  return "TLS: the server answered the plaintext connection with a TLS record: use rediss://";
}

std::string tls_to_plaintext_port(const std::vector<net::Address>& addresses,
                                  std::chrono::milliseconds connect_timeout) {
  try {
    const auto deadline = probe_deadline(connect_timeout);
    net::Stream stream = net::connect(addresses, deadline);
    constexpr std::string_view ping = "PING\r\n";
    std::size_t sent = 0;
    net::write_all(stream, std::span<const char>(ping.data(), ping.size()), deadline, sent);
    char reply[64];
    const std::size_t n = net::read_some_blocking(stream, reply, deadline);
    if (n > 0 && (reply[0] == '+' || reply[0] == '-')) {
      return "TLS: the server answered in plaintext (RESP) and not the TLS handshake: is this a "
             "plaintext port? use redis://";
    }
  } catch (...) {
  }
  return {};
}

}  // namespace idem::redis::detail
