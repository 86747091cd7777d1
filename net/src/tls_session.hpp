// The TLS state of one idem::net::Stream (not installed). Defined here so that stream.cpp can
// destroy it and route reads and writes through it; tls.cpp does the OpenSSL work.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "idem/net/stream.hpp"
#include "idem/net/tls.hpp"

namespace idem::net {

struct TlsSession {
  TlsSession(std::shared_ptr<const TlsContext> context, int fd, const std::string& host,
             const std::string& peer);
  ~TlsSession();
  TlsSession(const TlsSession&) = delete;
  TlsSession& operator=(const TlsSession&) = delete;

  IoStatus handshake();
  IoResult read(std::span<char> buffer);
  IoResult write(std::span<const char> data);
  std::size_t buffered() const noexcept;
  // Sends close_notify once when the session is healthy (no wait for the answer).
  void shutdown() noexcept;

  std::shared_ptr<const TlsContext> context;
  void* ssl = nullptr;  // SSL*
  std::string host;     // the name checked, for messages
  std::string peer;
  bool established = false;  // the handshake finished
  bool confirmed = false;    // application data was read: the server accepted the session
  bool failed = false;       // a fatal error: no close_notify, no further use
};

}  // namespace idem::net
