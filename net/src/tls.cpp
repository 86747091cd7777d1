// OpenSSL for idem::net streams: one SSL_CTX per TlsContext, one SSL per stream, and a socket BIO
// of idem's own that writes with MSG_NOSIGNAL (OpenSSL's socket BIO uses write(), which raises
// SIGPIPE when the peer has gone).
#include "idem/net/tls.hpp"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <system_error>
#include <utility>

#include "tls_session.hpp"

namespace idem::net {
namespace {

SSL_CTX* as_ctx(void* p) {
  return static_cast<SSL_CTX*>(p);
}
SSL* as_ssl(void* p) {
  return static_cast<SSL*>(p);
}

// ---- the socket BIO -------------------------------------------------------------------------

int bio_fd(BIO* bio) {
  int fd = -1;
  BIO_get_fd(bio, &fd);
  return fd;
}

int bio_write(BIO* bio, const char* data, int length) {
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t n = ::send(bio_fd(bio), data, static_cast<std::size_t>(length), MSG_NOSIGNAL);
    if (n >= 0) return static_cast<int>(n);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(bio);
    return -1;
  }
}

int bio_read(BIO* bio, char* data, int length) {
  BIO_clear_retry_flags(bio);
  for (;;) {
    const ssize_t n = ::recv(bio_fd(bio), data, static_cast<std::size_t>(length), 0);
    if (n > 0) return static_cast<int>(n);
    if (n == 0) {
      BIO_set_flags(bio, BIO_FLAGS_IN_EOF);
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(bio);
    return -1;
  }
}

// OpenSSL's socket BIO with read and write replaced; made once, kept for the process.
BIO_METHOD* socket_method() {
  static BIO_METHOD* const method = [] {
    BIO_METHOD* m =
        BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK | BIO_TYPE_DESCRIPTOR, "idem");
    const BIO_METHOD* base = BIO_s_socket();
    if (m == nullptr) return m;
    BIO_meth_set_write(m, bio_write);
    BIO_meth_set_read(m, bio_read);
    BIO_meth_set_ctrl(m, BIO_meth_get_ctrl(base));
    BIO_meth_set_create(m, BIO_meth_get_create(base));
    BIO_meth_set_destroy(m, BIO_meth_get_destroy(base));
    return m;
  }();
  return method;
}

// ---- error text -----------------------------------------------------------------------------

// The reasons in OpenSSL's error queue of this thread ("wrong version number; ..."), emptied.
std::string openssl_reasons() {
  std::string text;
  int count = 0;
  while (const unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    std::string item = reason != nullptr ? reason : "error " + std::to_string(ERR_GET_REASON(e));
    if (count++ < 3 && text.find(item) == std::string::npos) {
      text += (text.empty() ? "" : "; ") + item;
    }
  }
  return text.empty() ? "no reason given" : text;
}

bool contains(const std::string& text, const char* part) {
  return text.find(part) != std::string::npos;
}

bool is_ip_address(const std::string& host) {
  unsigned char buffer[sizeof(in6_addr)];
  return ::inet_pton(AF_INET, host.c_str(), buffer) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buffer) == 1;
}

void check_readable(const std::string& what, const std::string& path) {
  if (::access(path.c_str(), R_OK) != 0) {
    const int error = errno;
    throw TlsError("TLS: cannot read " + what + " '" + path + "': " + std::strerror(error),
                   /*setup=*/true);
  }
}

// The passphrase callback: the key's passphrase, or none (never the terminal prompt).
int passphrase(char* buffer, int size, int /*rwflag*/, void* userdata) {
  const auto* secret = static_cast<const std::string*>(userdata);
  if (secret == nullptr || size <= 0) return 0;
  const int n =
      static_cast<int>(std::min<std::size_t>(secret->size(), static_cast<std::size_t>(size)));
  std::memcpy(buffer, secret->data(), static_cast<std::size_t>(n));
  return n;
}

}  // namespace

// ---- TlsContext -----------------------------------------------------------------------------

TlsContext::TlsContext(const TlsOptions& options)
    : verify_peer_(options.verify_peer), server_name_(options.server_name) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  if (ctx == nullptr) throw TlsError("TLS: cannot create a context: " + openssl_reasons(), true);
  ctx_ = ctx;
  struct Guard {  // frees the context when the constructor throws
    TlsContext* self;
    bool armed = true;
    ~Guard() {
      if (armed) {
        SSL_CTX_free(as_ctx(self->ctx_));
        self->ctx_ = nullptr;
      }
    }
  } guard{this};

  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // RESP frames its replies, so an EOF without close_notify cannot truncate one unnoticed: it is
  // an ordinary close.
  SSL_CTX_set_options(ctx, SSL_OP_IGNORE_UNEXPECTED_EOF | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_default_passwd_cb(ctx, passphrase);
  SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);

  if (options.verify_peer) {
    if (!options.ca_file.empty()) check_readable("ca_file", options.ca_file);
    if (!options.ca_dir.empty()) check_readable("ca_dir", options.ca_dir);
    if (options.ca_file.empty() && options.ca_dir.empty()) {
      if (SSL_CTX_set_default_verify_paths(ctx) != 1) {
        throw TlsError("TLS: cannot load the system's CA certificates: " + openssl_reasons(), true);
      }
    } else if (SSL_CTX_load_verify_locations(
                   ctx, options.ca_file.empty() ? nullptr : options.ca_file.c_str(),
                   options.ca_dir.empty() ? nullptr : options.ca_dir.c_str()) != 1) {
      throw TlsError("TLS: cannot use ca_file '" + options.ca_file + "'" +
                         (options.ca_dir.empty() ? "" : " / ca_dir '" + options.ca_dir + "'") +
                         ": " + openssl_reasons(),
                     true);
    }
  }
  SSL_CTX_set_verify(ctx, options.verify_peer ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, nullptr);

  if (options.cert_file.empty() && !options.key_file.empty()) {
    throw TlsError("TLS: key_file is set without cert_file", true);
  }
  if (!options.cert_file.empty()) {
    const std::string& key_file = options.key_file.empty() ? options.cert_file : options.key_file;
    check_readable("cert_file", options.cert_file);
    check_readable("key_file", key_file);
    if (SSL_CTX_use_certificate_chain_file(ctx, options.cert_file.c_str()) != 1) {
      throw TlsError("TLS: cannot use cert_file '" + options.cert_file + "': " + openssl_reasons(),
                     true);
    }
    SSL_CTX_set_default_passwd_cb_userdata(
        ctx, options.key_password ? const_cast<std::string*>(&*options.key_password) : nullptr);
    const int loaded = SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_set_default_passwd_cb_userdata(ctx, nullptr);  // the passphrase is not kept
    if (loaded != 1) {
      std::string reasons = openssl_reasons();
      if (contains(reasons, "key values mismatch")) {
        throw TlsError(
            "TLS: key_file '" + key_file + "' does not match cert_file '" + options.cert_file + "'",
            true);
      }
      if (contains(reasons, "bad decrypt") || contains(reasons, "problems getting password") ||
          contains(reasons, "interrupted or cancelled")) {
        reasons += options.key_password ? " (the key passphrase is wrong)"
                                        : " (the key is encrypted: give its passphrase)";
      }
      throw TlsError("TLS: cannot use key_file '" + key_file + "': " + reasons, true);
    }
    if (SSL_CTX_check_private_key(ctx) != 1) {
      throw TlsError("TLS: key_file '" + key_file + "' does not match cert_file '" +
                         options.cert_file + "': " + openssl_reasons(),
                     true);
    }
  }
  ERR_clear_error();
  guard.armed = false;
}

TlsContext::~TlsContext() {
  SSL_CTX_free(as_ctx(ctx_));
}

// ---- TlsSession -----------------------------------------------------------------------------

TlsSession::TlsSession(std::shared_ptr<const TlsContext> ctx, int fd, const std::string& name,
                       const std::string& peer_text)
    : context(std::move(ctx)), peer(peer_text) {
  host = context->server_name().empty() ? name : context->server_name();
  ERR_clear_error();
  SSL* s = SSL_new(as_ctx(context->native()));
  if (s == nullptr) throw TlsError("TLS: cannot create a session: " + openssl_reasons(), true);
  ssl = s;
  BIO* bio = BIO_new(socket_method());
  if (bio == nullptr) {
    SSL_free(s);
    ssl = nullptr;
    throw TlsError("TLS: cannot create a socket BIO: " + openssl_reasons(), true);
  }
  BIO_set_fd(bio, fd, BIO_NOCLOSE);
  SSL_set_bio(s, bio, bio);  // the session owns the BIO now
  SSL_set_connect_state(s);
  const bool ip = is_ip_address(host);
  bool ok = true;
  if (!host.empty() && !ip) ok = SSL_set_tlsext_host_name(s, host.c_str()) == 1;
  if (ok && context->verify_peer() && !host.empty()) {
    if (ip) {
      ok = X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), host.c_str()) == 1;
    } else {
      SSL_set_hostflags(s, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      ok = SSL_set1_host(s, host.c_str()) == 1;
    }
  }
  if (!ok) {
    SSL_free(s);
    ssl = nullptr;
    throw TlsError("TLS: cannot check the server name '" + host + "': " + openssl_reasons(), true);
  }
}

TlsSession::~TlsSession() {
  SSL_free(as_ssl(ssl));
}

void TlsSession::shutdown() noexcept {
  if (ssl == nullptr || !established || failed) return;
  failed = true;  // once
  ERR_clear_error();
  (void)SSL_shutdown(as_ssl(ssl));  // sends close_notify; the answer is not waited for
  ERR_clear_error();
}

namespace {

// Why a handshake (or the first read, under TLS 1.3) failed, as "TLS: <cause>".
std::string handshake_failure(SSL* ssl, const std::string& host) {
  const long verify = SSL_get_verify_result(ssl);
  std::string reasons = openssl_reasons();
  if (verify != X509_V_OK && contains(reasons, "certificate verify failed")) {
    if (verify == X509_V_ERR_HOSTNAME_MISMATCH || verify == X509_V_ERR_IP_ADDRESS_MISMATCH) {
      return "TLS: certificate verify failed: host name mismatch: the server's certificate does "
             "not name '" +
             host + "'";
    }
    return std::string("TLS: certificate verify failed: ") + X509_verify_cert_error_string(verify);
  }
  if (contains(reasons, "wrong version number") || contains(reasons, "packet length too long") ||
      contains(reasons, "record layer failure") || contains(reasons, "http request")) {
    return "TLS: the server did not answer in TLS (" + reasons + "): is this a plaintext port?";
  }
  if (contains(reasons, "alert")) return "TLS: the server refused the handshake: " + reasons;
  return "TLS: handshake failed: " + reasons;
}

}  // namespace

IoStatus TlsSession::handshake() {
  if (established) return IoStatus::done;
  ERR_clear_error();
  errno = 0;
  const int rc = SSL_connect(as_ssl(ssl));
  const int saved_errno = errno;
  if (rc == 1) {
    established = true;
    return IoStatus::done;
  }
  switch (SSL_get_error(as_ssl(ssl), rc)) {
    case SSL_ERROR_WANT_READ:
      return IoStatus::want_read;
    case SSL_ERROR_WANT_WRITE:
      return IoStatus::want_write;
    case SSL_ERROR_SYSCALL:
      failed = true;
      if (saved_errno != 0 && ERR_peek_error() == 0) {
        throw std::system_error(saved_errno, std::generic_category(), "TLS handshake with " + peer);
      }
      if (ERR_peek_error() == 0) {
        throw TlsError("TLS: the server closed the connection during the handshake", true);
      }
      throw TlsError(handshake_failure(as_ssl(ssl), host), true);
    case SSL_ERROR_ZERO_RETURN:
      failed = true;
      ERR_clear_error();
      throw TlsError("TLS: the server closed the connection during the handshake", true);
    default:
      failed = true;
      throw TlsError(handshake_failure(as_ssl(ssl), host), true);
  }
}

IoResult TlsSession::read(std::span<char> buffer) {
  if (buffer.empty()) return {IoStatus::done, 0};
  ERR_clear_error();
  errno = 0;
  const int n = SSL_read(as_ssl(ssl), buffer.data(),
                         static_cast<int>(std::min<std::size_t>(buffer.size(), INT_MAX)));
  const int saved_errno = errno;
  if (n > 0) {
    confirmed = true;
    return {IoStatus::done, static_cast<std::size_t>(n)};
  }
  switch (SSL_get_error(as_ssl(ssl), n)) {
    case SSL_ERROR_WANT_READ:
      return {IoStatus::want_read, 0};
    case SSL_ERROR_WANT_WRITE:
      return {IoStatus::want_write, 0};
    case SSL_ERROR_ZERO_RETURN:
      return {IoStatus::closed, 0};  // close_notify
    case SSL_ERROR_SYSCALL:
      failed = true;
      if (ERR_peek_error() == 0) {
        if (saved_errno != 0) {
          throw std::system_error(saved_errno, std::generic_category(), "read from " + peer);
        }
        return {IoStatus::closed, 0};
      }
      break;
    default:
      failed = true;
      break;
  }
  if (!confirmed) throw TlsError(handshake_failure(as_ssl(ssl), host), true);
  throw TlsError("TLS: read from " + peer + ": " + openssl_reasons(), false);
}

IoResult TlsSession::write(std::span<const char> data) {
  if (data.empty()) return {IoStatus::done, 0};
  ERR_clear_error();
  errno = 0;
  const int n = SSL_write(as_ssl(ssl), data.data(),
                          static_cast<int>(std::min<std::size_t>(data.size(), INT_MAX)));
  const int saved_errno = errno;
  if (n > 0) return {IoStatus::done, static_cast<std::size_t>(n)};
  switch (SSL_get_error(as_ssl(ssl), n)) {
    case SSL_ERROR_WANT_READ:
      return {IoStatus::want_read, 0};
    case SSL_ERROR_WANT_WRITE:
      return {IoStatus::want_write, 0};
    case SSL_ERROR_SYSCALL:
      failed = true;
      if (ERR_peek_error() == 0) {
        throw std::system_error(saved_errno != 0 ? saved_errno : EPIPE, std::generic_category(),
                                "write to " + peer);
      }
      break;
    case SSL_ERROR_ZERO_RETURN:
      failed = true;
      throw std::system_error(EPIPE, std::generic_category(), "write to " + peer);
    default:
      failed = true;
      break;
  }
  if (!confirmed) throw TlsError(handshake_failure(as_ssl(ssl), host), true);
  throw TlsError("TLS: write to " + peer + ": " + openssl_reasons(), false);
}

std::size_t TlsSession::buffered() const noexcept {
  const int n = SSL_pending(as_ssl(ssl));
  return n > 0 ? static_cast<std::size_t>(n) : 0;
}

// ---- Stream's TLS members -------------------------------------------------------------------

void Stream::start_tls(std::shared_ptr<const TlsContext> context, const std::string& host) {
  if (fd_ < 0 || connecting_) {
    throw std::system_error(ENOTCONN, std::generic_category(), "TLS on " + peer_);
  }
  if (!context) throw TlsError("TLS: no context", true);
  tls_ = std::make_unique<TlsSession>(std::move(context), fd_, host, peer_);
}

IoStatus Stream::handshake() {
  return tls_ ? tls_->handshake() : IoStatus::done;
}

std::size_t Stream::buffered() const noexcept {
  return tls_ ? tls_->buffered() : 0;
}

bool Stream::idle_peer_gone() noexcept {
  if (fd_ < 0) return true;
  for (int round = 0; round < 16; ++round) {
    pollfd p{};
    p.fd = fd_;
    p.events = POLLIN | POLLRDHUP;
    const int ready = ::poll(&p, 1, 0);
    if (ready == 0) return false;
    if (ready < 0) {
      if (errno == EINTR) continue;
      return true;
    }
    // Readable: EOF, a reset, or bytes. Plaintext bytes nobody asked for mean a confused stream.
    if (!tls_ || (p.revents & (POLLHUP | POLLERR | POLLRDHUP)) != 0) return true;
    char scratch[512];
    try {
      const IoResult r = tls_->read(scratch);
      if (r.status != IoStatus::want_read) return true;  // data, close_notify, or want_write
    } catch (...) {
      return true;
    }
    // Records without data (session tickets) were consumed: look again.
  }
  return false;
}

// ---- helpers --------------------------------------------------------------------------------

void handshake(Stream& stream, Deadline deadline) {
  for (;;) {
    const IoStatus status = stream.handshake();
    if (status == IoStatus::done) return;
    if (!wait_ready(stream.fd(), status, deadline)) {
      throw std::system_error(ETIMEDOUT, std::generic_category(),
                              "TLS handshake with " + stream.peer());
    }
  }
}

bool speaks_tls(const std::vector<Address>& addresses, Deadline deadline) noexcept {
  try {
    TlsOptions options;
    options.verify_peer = false;
    auto context = std::make_shared<const TlsContext>(options);
    Stream stream = connect(addresses, deadline);
    stream.start_tls(context, "");
    handshake(stream, deadline);
    return true;
  } catch (const TlsError& e) {
    // An alert is a TLS answer; a record that is not TLS is not.
    return contains(e.what(), "alert");
  } catch (...) {
    return false;
  }
}

std::string tls_refusal(const std::vector<Address>& addresses,
                        std::shared_ptr<const TlsContext> context, const std::string& host,
                        Deadline deadline) noexcept {
  try {
    Stream stream = connect(addresses, deadline);
    stream.start_tls(std::move(context), host);
    handshake(stream, deadline);
    char scratch[512];
    for (;;) {
      const IoResult r = stream.read_some(scratch);
      if (r.status == IoStatus::done) return {};  // data nobody asked for: not a refusal
      if (r.status == IoStatus::closed) return {};
      if (!wait_ready(stream.fd(), r.status, deadline)) return {};  // accepted, quiet
    }
  } catch (const TlsError& e) {
    return e.what();
  } catch (...) {
    return {};
  }
}

bool looks_like_tls_record(std::span<const char> data) noexcept {
  if (data.size() < 3) return false;
  const auto type = static_cast<unsigned char>(data[0]);
  const auto major = static_cast<unsigned char>(data[1]);
  const auto minor = static_cast<unsigned char>(data[2]);
  return (type == 0x15 || type == 0x16) && major == 3 && minor <= 4;
}

}  // namespace idem::net
