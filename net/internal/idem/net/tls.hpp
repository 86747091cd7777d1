// idem::net TLS: OpenSSL on an idem::net::Stream, for blocking and coroutine callers alike.
//
// A TlsContext is built once from TlsOptions (the CA to trust, an optional client certificate
// and key, whether to verify the server) and shared by every connection of a pool: it holds one
// SSL_CTX, so certificates and keys are read once. Stream::start_tls() puts a TLS session on a
// connected stream; Stream::handshake() then advances the handshake without blocking and says
// which readiness it waits for (want_read / want_write), exactly as read_some() and write_some()
// do afterwards, so a blocking caller waits with wait_ready() (or net::handshake()) and a
// coroutine on its event loop.
//
// Verification: with verify_peer (the default) the server's chain must lead to a trusted CA
// (ca_file and/or ca_dir; the system's default paths when both are empty) and its certificate
// must name server_name (a DNS name, or an IP address compared with the certificate's IP
// entries). server_name is also sent as SNI when it is a DNS name.
//
// Errors:
//  * a TlsOptions that cannot be used (an unreadable CA, certificate or key, a key that does not
//    match its certificate or needs another passphrase) throws TlsError from TlsContext's
//    constructor, its message naming the file and OpenSSL's reason — never the passphrase;
//  * a handshake that fails throws TlsError "TLS: <cause>", e.g. "TLS: certificate verify failed:
//    certificate has expired", "TLS: certificate verify failed: host name mismatch: the server's
//    certificate does not name '127.0.0.1'", "TLS: the server refused the handshake: tlsv13 alert
//    certificate required". Under TLS 1.3 a server judges the client certificate after the
//    client's handshake has finished, so its refusal arrives with the first read: a TLS error
//    before the first application byte was read is a TlsError with setup() true as well;
//  * a TLS error on an established session throws TlsError with setup() false (the caller treats
//    it like a reset); a reset or an error of the socket is std::system_error with its errno, as
//    for a plaintext stream. The peer's close_notify, or an EOF without it, is IoStatus::closed.
// The socket is written with MSG_NOSIGNAL under TLS too (idem's own BIO): never SIGPIPE.
//
// Thread safety: a TlsContext is immutable after construction and may be shared by any number of
// streams on any threads (OpenSSL's SSL_CTX is thread-safe for this use). A stream's TLS session
// belongs to its stream (one thread at a time). OpenSSL's error queue is per thread; idem clears
// it around every call.
#pragma once

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/net/stream.hpp"
#include "idem/tls_options.hpp"

namespace idem::net {

// The TLS settings (idem/tls_options.hpp: CA, client certificate and key, server name,
// verify_peer), under the name idem::net has always used.
using TlsOptions = ::idem::TlsOptions;

// A TLS set-up or handshake failure (see above). what() starts with "TLS: ".
class TlsError : public std::runtime_error {
 public:
  TlsError(const std::string& message, bool setup) : std::runtime_error(message), setup_(setup) {}
  // True when the session never carried data: configuration, certificates, the handshake (the
  // same failure on every try). False for an established session that failed.
  bool setup() const noexcept { return setup_; }

 private:
  bool setup_;
};

class TlsContext {
 public:
  // Reads the CA, certificate and key. Throws TlsError naming the file that cannot be used.
  explicit TlsContext(const TlsOptions& options);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  bool verify_peer() const noexcept { return verify_peer_; }
  const std::string& server_name() const noexcept { return server_name_; }
  // The SSL_CTX* (an opaque pointer so that this header does not include OpenSSL).
  void* native() const noexcept { return ctx_; }

 private:
  void* ctx_ = nullptr;
  bool verify_peer_ = true;
  std::string server_name_;
};

// Runs the handshake of a stream after start_tls(), waiting with poll(). Throws TlsError, or
// std::system_error (ETIMEDOUT at the deadline, or the socket's errno).
void handshake(Stream& stream, Deadline deadline);

// True when the server at `addresses` completes a TLS handshake's first flight (answers a
// ClientHello with a ServerHello), checked with a throwaway connection that verifies nothing and
// sends no data; false when it does not, or not before the deadline. For naming the cause of a
// failure only ("this port speaks TLS").
bool speaks_tls(const std::vector<Address>& addresses, Deadline deadline) noexcept;

// A TLS session was reset or closed before its first application byte: the server may have
// refused the client certificate after the handshake (TLS 1.3), its alert lost to the reset.
// Repeats the handshake with `context` on a throwaway connection that sends no data and reads
// until the deadline: the refusal it meets as "TLS: ..." (a TlsError's message), or empty when
// the server accepts the session. For naming the cause of a failure only.
std::string tls_refusal(const std::vector<Address>& addresses,
                        std::shared_ptr<const TlsContext> context, const std::string& host,
                        Deadline deadline) noexcept;

// True when `data` starts like a TLS record (a handshake or an alert, TLS 1.0..1.3), e.g. the
// answer of a TLS server to a plaintext request.
bool looks_like_tls_record(std::span<const char> data) noexcept;

}  // namespace idem::net
