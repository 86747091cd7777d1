// The counters and histograms `idem proxy` serves as Prometheus text on its metrics listener.
//
//   idem_proxy_requests_total{route,decision}      passed, forwarded, replayed, refused
//   idem_proxy_replays_total{route}                 answered from the store
//   idem_proxy_replay_cache_hits_total{route}       replays and 422s from the replay cache
//   idem_proxy_waits_total{route}                   requests that found their key running and
//   waited idem_proxy_joins_total{route}                   replays after waiting for the running
//   request idem_proxy_conflicts_total{route}               409 while the key's request ran
//   idem_proxy_rejections_total{reason}             every response the proxy made itself, by code
//   idem_proxy_outcomes_total{route,result}         kept, released, fenced
//   idem_proxy_takeovers_total{route}               claims taken over after a dead owner's lease
//   idem_proxy_upstream_errors_total{kind}          connect, timeout, reset, malformed
//   idem_proxy_upstream_duration_seconds{route}     histogram: request sent to response complete
//   idem_proxy_request_duration_seconds{decision}   histogram: request read to response written
//   idem_proxy_connections / _total, idem_proxy_requests_in_flight, idem_proxy_draining
//
// Routes are the configured ones (plus "" for requests no route matches), so label values are
// bounded by the configuration.
//
// Thread-safety: every method may be called from any thread (relaxed atomics; a scrape sees each
// counter at some recent value).
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/http/guard.hpp"

namespace idem::cli::proxy {

class Histogram {
 public:
  static constexpr std::array<double, 14> kBounds = {
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0};
  void observe(std::chrono::nanoseconds duration) noexcept;
  // Appends the _bucket, _sum and _count lines with `labels` ("route=\"x\"").
  void render(std::string& out, std::string_view name, std::string_view labels) const;

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
  std::atomic<std::uint64_t> count_{0};
};

// Outcomes of the proxy itself, beside the guard's refusals.
enum class ProxyRejection {
  bad_request,       // 400: the request could not be parsed or is not allowed
  header_too_large,  // 431
  body_too_large,    // 413
  not_supported,     // 501/505
  timeout,           // the client was too slow (the connection was closed)
  upstream,          // 502/504: the upstream failed
  count_
};

enum class UpstreamError { connect, timeout, reset, malformed, count_ };

class Metrics {
 public:
  explicit Metrics(std::vector<std::string> routes);

  // The guard's events (GuardHooks::observer).
  void on_guard_event(const idem::http::GuardEvent& event) noexcept;
  void on_rejection(ProxyRejection rejection) noexcept;
  void on_upstream_error(UpstreamError error) noexcept;
  void on_upstream_duration(std::string_view route, std::chrono::nanoseconds d) noexcept;
  void on_request_duration(std::string_view decision, std::chrono::nanoseconds d) noexcept;

  std::atomic<std::int64_t> connections{0};
  std::atomic<std::uint64_t> connections_total{0};
  std::atomic<std::int64_t> in_flight{0};
  std::atomic<int> draining{0};

  std::string render() const;

 private:
  static constexpr std::size_t kRefusals = 8;   // idem::http::Refusal values
  static constexpr std::size_t kDecisions = 4;  // passed, forwarded, replayed, refused
  struct PerRoute {
    std::string name;
    std::array<std::atomic<std::uint64_t>, kDecisions> decisions{};
    std::atomic<std::uint64_t> waits{0};
    std::atomic<std::uint64_t> joins{0};
    std::atomic<std::uint64_t> conflicts{0};
    std::atomic<std::uint64_t> kept{0};
    std::atomic<std::uint64_t> released{0};
    std::atomic<std::uint64_t> fenced{0};
    std::atomic<std::uint64_t> takeovers{0};
    std::atomic<std::uint64_t> cache_hits{0};
    Histogram upstream;
  };
  PerRoute& route(std::string_view name) noexcept;

  std::vector<std::unique_ptr<PerRoute>> routes_;  // [0] is "" (no route)
  std::array<std::atomic<std::uint64_t>, kRefusals> refusals_{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(ProxyRejection::count_)>
      rejections_{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(UpstreamError::count_)>
      upstream_errors_{};
  std::array<Histogram, kDecisions> request_durations_;
};

}  // namespace idem::cli::proxy
