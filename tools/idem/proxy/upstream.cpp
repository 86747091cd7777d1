#include "upstream.hpp"

#include <sys/socket.h>

#include <asio/connect.hpp>
#include <asio/redirect_error.hpp>
#include <asio/steady_timer.hpp>
#include <asio/this_coro.hpp>
#include <asio/use_awaitable.hpp>
#include <cerrno>
#include <utility>

namespace idem::cli::proxy {

UpstreamPool::UpstreamPool(asio::any_io_executor executor, HostPort target, Millis connect_timeout,
                           std::size_t max_idle)
    : executor_(std::move(executor)),
      target_(std::move(target)),
      connect_timeout_(connect_timeout),
      max_idle_(max_idle) {}

idem::async::Task<std::shared_ptr<UpstreamConnection>> UpstreamPool::acquire() {
  for (;;) {
    std::shared_ptr<UpstreamConnection> idle;
    {
      std::lock_guard lock(mutex_);
      if (idle_.empty()) break;
      idle = std::move(idle_.back());
      idle_.pop_back();
    }
    // A connection the upstream closed while it was idle reads as EOF (or has stray bytes):
    // drop it rather than send a request into it. One non-blocking peek (MSG_DONTWAIT: no
    // ioctl to switch the socket's mode first).
    char probe = 0;
    const ssize_t n = ::recv(idle->socket.native_handle(), &probe, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      idle->reused = true;
      co_return idle;
    }
    asio::error_code ec;
    idle->socket.close(ec);
  }
  auto connection = std::make_shared<UpstreamConnection>(executor_);
  asio::error_code ec;
  if (!endpoints_) {
    asio::ip::tcp::resolver resolver(co_await asio::this_coro::executor);
    const auto results = co_await resolver.async_resolve(
        target_.host, target_.port, asio::redirect_error(asio::use_awaitable, ec));
    if (ec || results.empty()) co_return nullptr;
    std::vector<asio::ip::tcp::endpoint> endpoints;
    for (const auto& entry : results)
      endpoints.push_back(entry.endpoint());
    std::lock_guard lock(mutex_);
    endpoints_ = std::move(endpoints);
  }
  std::vector<asio::ip::tcp::endpoint> endpoints;
  {
    std::lock_guard lock(mutex_);
    endpoints = *endpoints_;
  }
  asio::steady_timer timer(co_await asio::this_coro::executor);
  timer.expires_after(connect_timeout_);
  std::weak_ptr<UpstreamConnection> weak = connection;
  timer.async_wait([weak](const asio::error_code& wait_ec) {
    if (wait_ec) return;
    if (auto c = weak.lock()) {
      asio::error_code ignored;
      c->socket.close(ignored);
    }
  });
  co_await asio::async_connect(connection->socket, endpoints,
                               asio::redirect_error(asio::use_awaitable, ec));
  timer.cancel();
  if (ec) co_return nullptr;
  connection->socket.set_option(asio::ip::tcp::no_delay(true), ec);
  co_return connection;
}

void UpstreamPool::give_back(std::shared_ptr<UpstreamConnection> connection) {
  if (!connection || connection->broken || !connection->buffer.empty()) return;
  std::lock_guard lock(mutex_);
  if (idle_.size() < max_idle_) idle_.push_back(std::move(connection));
}

void UpstreamPool::close_idle() {
  std::vector<std::shared_ptr<UpstreamConnection>> idle;
  {
    std::lock_guard lock(mutex_);
    idle.swap(idle_);
  }
  for (auto& connection : idle) {
    asio::error_code ignored;
    connection->socket.close(ignored);
  }
}

}  // namespace idem::cli::proxy
