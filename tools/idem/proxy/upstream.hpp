// The upstream of `idem proxy`: a pool of keep-alive HTTP/1.1 connections to one host:port.
//
// A connection is reused only when its last response was complete and allowed keep-alive, and
// only after a check that the upstream has not closed it meanwhile (a closed idle connection is
// dropped, never written to). A request is never sent twice: a failure after it was written
// (reset, timeout) is the caller's to report, because the upstream may have acted on it.
//
// Thread-safety: acquire() and give_back() may be called from any coroutine on any thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <asio/any_io_executor.hpp>
#include <asio/ip/tcp.hpp>

#include "config.hpp"
#include "idem/async/task.hpp"

namespace idem::cli::proxy {

struct UpstreamConnection {
  explicit UpstreamConnection(const asio::any_io_executor& executor) : socket(executor) {}
  asio::ip::tcp::socket socket;
  std::string buffer;   // bytes read and not yet parsed
  bool reused = false;  // it served a request before
  bool broken = false;  // closed by the upstream, or in an unknown state: never reused
};

// Why an upstream call failed.
enum class UpstreamFailure { connect, timeout, reset, malformed };

class UpstreamPool {
 public:
  UpstreamPool(asio::any_io_executor executor, HostPort target, Millis connect_timeout,
               std::size_t max_idle);

  // An idle connection, or a new one (resolved and connected within connect_timeout). nullopt
  // when the upstream cannot be reached.
  idem::async::Task<std::shared_ptr<UpstreamConnection>> acquire();
  // Keeps `connection` for reuse (up to max_idle; the rest are closed).
  void give_back(std::shared_ptr<UpstreamConnection> connection);
  // Closes every idle connection (the drain).
  void close_idle();

  const HostPort& target() const noexcept { return target_; }

 private:
  asio::any_io_executor executor_;
  HostPort target_;
  Millis connect_timeout_;
  std::size_t max_idle_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<UpstreamConnection>> idle_;
  std::optional<std::vector<asio::ip::tcp::endpoint>> endpoints_;  // resolved once
};

}  // namespace idem::cli::proxy
