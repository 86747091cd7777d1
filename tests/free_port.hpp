// Loopback sockets for tests that need a port: one nothing listens on, or a listener that never
// speaks (a server that accepts TCP connections, or lets the kernel do it, and then hangs), or
// one that answers as a web server does (something that is not the server a client expects).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <stdexcept>
#include <thread>

namespace idem::test {

namespace detail {

// Binds `fd` to 127.0.0.1 on a port the kernel picks, optionally listens, and returns the port;
// throws (closing fd) on failure.
inline int bind_loopback(int fd, int backlog) {
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  socklen_t length = sizeof address;
  const bool ok = fd >= 0 &&
                  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0 &&
                  (backlog < 0 || ::listen(fd, backlog) == 0) &&
                  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  if (!ok) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error("cannot bind a socket on 127.0.0.1");
  }
  return ntohs(address.sin_port);
}

}  // namespace detail

// A TCP port on 127.0.0.1 that nothing listens on at the moment of the call: bound to port 0
// (the kernel picks a free one), read back, then released. A test either connects to it to get
// "connection refused" at once, or hands it to a server it starts itself (which may, rarely,
// race another process for it).
inline int unused_loopback_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  const int port = detail::bind_loopback(fd, -1);
  ::close(fd);
  return port;
}

// A listening TCP socket on 127.0.0.1 that never accepts by itself: the kernel completes up to
// `backlog` connections, and the peer then waits for an answer that never comes. Closed on
// destruction.
class LoopbackListener {
 public:
  explicit LoopbackListener(int backlog)
      : fd_(::socket(AF_INET, SOCK_STREAM, 0)), port_(detail::bind_loopback(fd_, backlog)) {}
  ~LoopbackListener() { ::close(fd_); }
  LoopbackListener(const LoopbackListener&) = delete;
  LoopbackListener& operator=(const LoopbackListener&) = delete;

  int fd() const { return fd_; }
  int port() const { return port_; }

 private:
  int fd_;
  int port_;
};

// A listener on 127.0.0.1 that answers whatever arrives first with an HTTP error and closes, as
// a web server does with a request it cannot parse.
class HttpListener {
 public:
  HttpListener()
      : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)),
        port_(detail::bind_loopback(fd_, 16)),
        thread_([this] { serve(); }) {}
  ~HttpListener() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);  // wakes accept()
    thread_.join();
    ::close(fd_);
  }
  HttpListener(const HttpListener&) = delete;
  HttpListener& operator=(const HttpListener&) = delete;

  int port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      const int client = ::accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      char buffer[512];
      (void)::recv(client, buffer, sizeof buffer, 0);
      static constexpr char kReply[] =
          "HTTP/1.1 400 Bad Request\r\nContent-Type: text/html\r\nContent-Length: 11\r\n"
          "Connection: close\r\n\r\n<html></html>";
      (void)::send(client, kReply, sizeof kReply - 1, MSG_NOSIGNAL);
      ::close(client);
    }
  }

  int fd_;
  int port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace idem::test
