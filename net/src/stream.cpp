#include "idem/net/stream.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <system_error>
#include <utility>

#include "tls_session.hpp"

namespace idem::net {
namespace {

[[noreturn]] void throw_errno(int error_number, const std::string& what) {
  throw std::system_error(error_number, std::generic_category(), what);
}

std::string address_text(const sockaddr* address, int port) {
  char buffer[INET6_ADDRSTRLEN] = {};
  if (address->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(address)->sin_addr, buffer,
                sizeof buffer);
    return std::string(buffer) + ":" + std::to_string(port);
  }
  ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(address)->sin6_addr, buffer,
              sizeof buffer);
  return "[" + std::string(buffer) + "]:" + std::to_string(port);
}

int poll_events(IoStatus status) {
  return status == IoStatus::want_write ? POLLOUT : POLLIN;
}

}  // namespace

std::vector<Address> resolve(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | AI_ADDRCONFIG;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.c_str(), service.c_str(), &hints, &found);
  if (rc != 0) {
    // EAI_SYSTEM: the reason is in errno.
    const std::string reason = rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc);
    throw ResolveError("cannot resolve host '" + host + "': " + reason, rc == EAI_AGAIN);
  }
  std::vector<Address> addresses;
  for (const addrinfo* entry = found; entry != nullptr; entry = entry->ai_next) {
    if (entry->ai_family != AF_INET && entry->ai_family != AF_INET6) continue;
    Address address;
    std::memcpy(&address.storage, entry->ai_addr, entry->ai_addrlen);
    address.length = entry->ai_addrlen;
    address.family = entry->ai_family;
    address.text = address_text(entry->ai_addr, port);
    addresses.push_back(std::move(address));
  }
  ::freeaddrinfo(found);
  if (addresses.empty()) {
    throw ResolveError("cannot resolve host '" + host + "': it has no IPv4 or IPv6 address", false);
  }
  return addresses;
}

Address unix_address(const std::string& path) {
  sockaddr_un un{};
  if (path.empty() || path.size() >= sizeof un.sun_path) {
    throw_errno(ENAMETOOLONG, "unix socket path '" + path + "' is empty or longer than " +
                                  std::to_string(sizeof un.sun_path - 1) + " bytes");
  }
  un.sun_family = AF_UNIX;
  std::memcpy(un.sun_path, path.data(), path.size());
  Address address;
  std::memcpy(&address.storage, &un, sizeof un);
  address.length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + path.size() + 1);
  address.family = AF_UNIX;
  address.text = path;
  return address;
}

Stream::Stream() noexcept = default;

Stream::~Stream() {
  close();
}

Stream::Stream(Stream&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)),
      connecting_(std::exchange(other.connecting_, false)),
      tcp_(other.tcp_),
      peer_(std::move(other.peer_)),
      tls_(std::move(other.tls_)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    close();
    fd_ = std::exchange(other.fd_, -1);
    connecting_ = std::exchange(other.connecting_, false);
    tcp_ = other.tcp_;
    peer_ = std::move(other.peer_);
    tls_ = std::move(other.tls_);
  }
  return *this;
}

void Stream::close() noexcept {
  if (tls_) {
    if (fd_ >= 0) tls_->shutdown();
    tls_.reset();
  }
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  connecting_ = false;
}

Stream Stream::start_connect(const Address& address) {
  Stream stream;
  stream.peer_ = address.text;
  stream.tcp_ = address.family != AF_UNIX;
  stream.fd_ = ::socket(address.family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (stream.fd_ < 0) throw_errno(errno, "socket for " + address.text);
  int rc;
  do {
    rc = ::connect(stream.fd_, reinterpret_cast<const sockaddr*>(&address.storage), address.length);
  } while (rc < 0 && errno == EINTR);
  if (rc == 0) {
    stream.finish_connect();
  } else if (errno == EINPROGRESS || errno == EAGAIN) {
    stream.connecting_ = true;
  } else {
    throw_errno(errno, "connect to " + address.text);
  }
  return stream;
}

void Stream::finish_connect() {
  int error_number = 0;
  socklen_t length = sizeof error_number;
  if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &error_number, &length) < 0) error_number = errno;
  if (error_number != 0) throw_errno(error_number, "connect to " + peer_);
  connecting_ = false;
  if (tcp_) {
    const int on = 1;
    // Small requests must not wait for Nagle; keep-alive only helps notice a dead peer.
    (void)::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &on, sizeof on);
    (void)::setsockopt(fd_, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
  }
}

IoResult Stream::read_some(std::span<char> buffer) {
  if (tls_) return tls_->read(buffer);
  for (;;) {
    const ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
    if (n > 0) return {IoStatus::done, static_cast<std::size_t>(n)};
    if (n == 0) return {IoStatus::closed, 0};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {IoStatus::want_read, 0};
    throw_errno(errno, "read from " + peer_);
  }
}

IoResult Stream::write_some(std::span<const char> data) {
  if (tls_) return tls_->write(data);
  for (;;) {
    const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
    if (n >= 0) return {IoStatus::done, static_cast<std::size_t>(n)};
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return {IoStatus::want_write, 0};
    throw_errno(errno, "write to " + peer_);
  }
}

bool wait_ready(int fd, IoStatus status, Deadline deadline) {
  for (;;) {
    const auto left =
        std::chrono::ceil<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{};
    p.fd = fd;
    p.events = static_cast<short>(poll_events(status));
    const int rc = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    if (rc > 0) return true;  // ready, or POLLHUP/POLLERR: the next call reports it
    if (rc < 0 && errno != EINTR) throw_errno(errno, "poll");
  }
}

Stream connect(const std::vector<Address>& addresses, Deadline deadline) {
  int last_error = EHOSTUNREACH;
  std::string last_what = "connect: no address";
  for (const Address& address : addresses) {
    try {
      Stream stream = Stream::start_connect(address);
      if (stream.connecting()) {
        if (!wait_ready(stream.fd(), IoStatus::want_write, deadline)) {
          throw_errno(ETIMEDOUT, "connect to " + address.text);
        }
        stream.finish_connect();
      }
      return stream;
    } catch (const std::system_error& e) {
      last_error = e.code().value();
      last_what = e.what();
      if (last_error == ETIMEDOUT) break;  // the deadline is shared: no time for the next one
    }
  }
  throw std::system_error(last_error, std::generic_category(), last_what);
}

void write_all(Stream& stream, std::span<const char> data, Deadline deadline, std::size_t& sent) {
  sent = 0;
  while (sent < data.size()) {
    const IoResult r = stream.write_some(data.subspan(sent));
    if (r.status == IoStatus::done) {
      sent += r.bytes;
      continue;
    }
    if (!wait_ready(stream.fd(), r.status, deadline)) {
      throw_errno(ETIMEDOUT, "write to " + stream.peer());
    }
  }
}

std::size_t read_some_blocking(Stream& stream, std::span<char> buffer, Deadline deadline) {
  for (;;) {
    const IoResult r = stream.read_some(buffer);
    if (r.status == IoStatus::done) return r.bytes;
    if (r.status == IoStatus::closed) return 0;
    if (!wait_ready(stream.fd(), r.status, deadline)) {
      throw_errno(ETIMEDOUT, "read from " + stream.peer());
    }
  }
}

}  // namespace idem::net
