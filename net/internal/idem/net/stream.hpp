// idem::net::Stream: one byte stream (TCP or a unix socket) over a non-blocking descriptor, for
// blocking and coroutine callers alike.
//
// A stream never blocks. read_some() and write_some() move what the kernel accepts now and say
// what they are waiting for when they cannot go on: IoStatus::want_read or want_write. A blocking
// caller waits for that with wait_ready() (poll() with a deadline); a coroutine waits for the same
// readiness on its event loop (idem::redis_async uses asio::posix::stream_descriptor::async_wait
// on fd()). A stream that will carry TLS reports the same two states for OpenSSL's WANT_READ and
// WANT_WRITE, which is why a read may ask for writability and a write for readability: after
// start_tls() (idem/net/tls.hpp) the same Stream carries TLS, read_some() and write_some() move
// plaintext through OpenSSL, and handshake() is the step in between.
//
// Connecting is two steps, so that either kind of caller can wait for it: start_connect() begins
// a non-blocking connect to one resolved address; once fd() is writable, finish_connect() reports
// whether it succeeded. connect() does both for a blocking caller, trying every address of a host
// in turn within one timeout.
//
// Errors are std::system_error with the errno of the failure (ECONNREFUSED, ETIMEDOUT,
// ECONNRESET, EPIPE, ...) and a message naming the step; a name that does not resolve is a
// ResolveError with getaddrinfo's text. Writes use MSG_NOSIGNAL: a peer
// that went away is EPIPE, never SIGPIPE.
//
// Thread safety: a Stream belongs to one thread (or one strand) at a time. resolve() may be
// called from any thread; it blocks while a host name is looked up (an IP address or "localhost"
// answers without a look-up).
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include <sys/socket.h>

namespace idem::net {

class TlsContext;
struct TlsSession;

// One address a stream can connect to.
struct Address {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;
  std::string text;  // "127.0.0.1:6379", "[::1]:6379" or the socket path, for messages
};

// A host name that does not resolve: "cannot resolve host 'x': Name or service not known".
class ResolveError : public std::runtime_error {
 public:
  ResolveError(const std::string& message, bool temporary)
      : std::runtime_error(message), temporary_(temporary) {}
  // The resolver could not answer now (EAI_AGAIN: no DNS server reachable, a timeout); asking
  // again later may succeed. False when the name does not exist (EAI_NONAME).
  bool temporary() const noexcept { return temporary_; }

 private:
  bool temporary_;
};

// The addresses of host:port (TCP), in the order getaddrinfo() gives them. Throws ResolveError
// when the name does not resolve.
std::vector<Address> resolve(const std::string& host, int port);
// The address of a unix socket at `path`. Throws std::system_error (ENAMETOOLONG) when the path
// does not fit a sockaddr_un.
Address unix_address(const std::string& path);

enum class IoStatus {
  done,        // some bytes were moved (IoResult::bytes > 0)
  want_read,   // nothing moved: wait until fd() is readable, then call again
  want_write,  // nothing moved: wait until fd() is writable, then call again
  closed,      // read_some only: the peer closed the stream (end of file)
};

struct IoResult {
  IoStatus status = IoStatus::done;
  std::size_t bytes = 0;
};

class Stream {
 public:
  Stream() noexcept;
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // A non-blocking socket connecting to `address`. The connect may already have succeeded
  // (connecting() false) or be in progress (connecting() true: wait for fd() to be writable, then
  // finish_connect()). Throws std::system_error when it failed at once (e.g. ECONNREFUSED on a
  // unix socket).
  static Stream start_connect(const Address& address);
  // After fd() became writable: throws std::system_error when the connect failed; else the stream
  // is connected (TCP_NODELAY and keep-alive are set on TCP streams).
  void finish_connect();
  bool connecting() const noexcept { return connecting_; }

  // Reads into `buffer` what is there now. Throws std::system_error on a failed stream (and
  // TlsError on a failed TLS session).
  IoResult read_some(std::span<char> buffer);
  // Writes what the kernel takes now of `data`. Throws std::system_error on a failed stream (and
  // TlsError on a failed TLS session). Under TLS, a call after want_read/want_write must pass at
  // least the bytes of the call that asked to wait (OpenSSL's retry rule); the buffer may move.
  IoResult write_some(std::span<const char> data);

  // TLS (idem/net/tls.hpp). start_tls() on a connected stream begins a client session of
  // `context` (kept alive by the stream) checking `host` (context's server_name when it has one);
  // handshake() then advances it: done once established, else the readiness to wait for. Throws
  // TlsError (handshake refused or certificate not accepted) or std::system_error (the socket).
  void start_tls(std::shared_ptr<const TlsContext> context, const std::string& host);
  IoStatus handshake();
  bool tls() const noexcept { return tls_ != nullptr; }
  // Bytes a TLS session has decrypted but not handed out yet (read_some() returns them without
  // the descriptor becoming readable); 0 for plaintext.
  std::size_t buffered() const noexcept;
  // For an idle stream (no request outstanding): true when the peer closed or reset it, or sent
  // bytes nobody asked for, so it must not be reused. Checked without blocking; under TLS, records
  // that carry no data (TLS 1.3 session tickets) are consumed and do not count.
  bool idle_peer_gone() noexcept;

  // The descriptor, for readiness waits; -1 when closed. The stream keeps owning it.
  int fd() const noexcept { return fd_; }
  bool is_open() const noexcept { return fd_ >= 0; }
  // Closes the descriptor (a waiter registered on it must have let go of it first); an
  // established TLS session sends its close_notify first, without waiting.
  void close() noexcept;
  // What start_connect() was given, for messages.
  const std::string& peer() const noexcept { return peer_; }

 private:
  int fd_ = -1;
  bool connecting_ = false;
  bool tcp_ = false;
  std::string peer_;
  std::unique_ptr<TlsSession> tls_;
};

// ---- blocking helpers ------------------------------------------------------------------------

using Deadline = std::chrono::steady_clock::time_point;

// Waits with poll() until fd is ready for `status` (want_read / want_write) or the deadline
// passes. False on timeout. A hang-up or error on fd counts as ready (the next read or write
// reports it).
bool wait_ready(int fd, IoStatus status, Deadline deadline);

// Connects to the first address of `addresses` that accepts within the deadline. Throws
// std::system_error: the last address's failure, or ETIMEDOUT when the deadline passed.
Stream connect(const std::vector<Address>& addresses, Deadline deadline);

// Writes all of `data`, waiting as needed. `sent` counts the bytes the kernel took, also when it
// throws, so a caller can tell a cut-off write from one that reached the kernel. Throws
// std::system_error (ETIMEDOUT at the deadline).
void write_all(Stream& stream, std::span<const char> data, Deadline deadline, std::size_t& sent);

// Reads at least one byte, waiting as needed. Returns 0 when the peer closed the stream. Throws
// std::system_error (ETIMEDOUT at the deadline).
std::size_t read_some_blocking(Stream& stream, std::span<char> buffer, Deadline deadline);

}  // namespace idem::net
