#include "metrics.hpp"

#include <cstdio>

namespace idem::cli::proxy {

namespace {

constexpr std::array<std::string_view, 4> kDecisionNames = {"passed", "forwarded", "replayed",
                                                            "refused"};
constexpr std::array<std::string_view, 6> kRejectionNames = {
    "bad-request", "header-too-large", "body-too-large", "not-supported", "timeout", "upstream"};
constexpr std::array<std::string_view, 4> kUpstreamErrorNames = {"connect", "timeout", "reset",
                                                                 "malformed"};

std::size_t decision_index(std::string_view decision) noexcept {
  for (std::size_t i = 0; i < kDecisionNames.size(); ++i) {
    if (kDecisionNames[i] == decision) return i;
  }
  return 0;
}

// A label value escaped for the text format (backslash, double quote, newline).
std::string escape(std::string_view value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void line(std::string& out, std::string_view name, std::string_view labels, double value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  char number[64];
  std::snprintf(number, sizeof number, " %.17g\n", value);
  out += number;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

}  // namespace

void Histogram::observe(std::chrono::nanoseconds duration) noexcept {
  const double seconds = std::chrono::duration<double>(duration).count();
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i])
    ++i;
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(duration.count() < 0 ? 0 : duration.count()),
                    std::memory_order_relaxed);
  count_.fetch_add(1, std::memory_order_relaxed);
}

void Histogram::render(std::string& out, std::string_view name, std::string_view labels) const {
  std::uint64_t cumulative = 0;
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  for (std::size_t i = 0; i <= kBounds.size(); ++i) {
    cumulative += buckets_[i].load(std::memory_order_relaxed);
    char bound[32];
    if (i < kBounds.size()) {
      std::snprintf(bound, sizeof bound, "%g", kBounds[i]);
    } else {
      std::snprintf(bound, sizeof bound, "+Inf");
    }
    line(out, std::string(name) + "_bucket", prefix + "le=\"" + bound + "\"",
         static_cast<double>(cumulative));
  }
  line(out, std::string(name) + "_sum", labels,
       static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9);
  line(out, std::string(name) + "_count", labels,
       static_cast<double>(count_.load(std::memory_order_relaxed)));
}

Metrics::Metrics(std::vector<std::string> routes) {
  routes_.push_back(std::make_unique<PerRoute>());
  for (std::string& name : routes) {
    routes_.push_back(std::make_unique<PerRoute>());
    routes_.back()->name = std::move(name);
  }
}

Metrics::PerRoute& Metrics::route(std::string_view name) noexcept {
  for (const auto& route : routes_) {
    if (route->name == name) return *route;
  }
  return *routes_.front();
}

void Metrics::on_guard_event(const idem::http::GuardEvent& event) noexcept {
  using Kind = idem::http::GuardEvent::Kind;
  PerRoute& r = route(event.route);
  switch (event.kind) {
    case Kind::passed:
      r.decisions[0].fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::claimed:
      r.decisions[1].fetch_add(1, std::memory_order_relaxed);
      if (event.took_over) r.takeovers.fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::waiting:
      r.waits.fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::replayed:
      r.decisions[2].fetch_add(1, std::memory_order_relaxed);
      if (event.waited) r.joins.fetch_add(1, std::memory_order_relaxed);
      if (event.cached) r.cache_hits.fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::refused:
      r.decisions[3].fetch_add(1, std::memory_order_relaxed);
      if (event.cached) r.cache_hits.fetch_add(1, std::memory_order_relaxed);
      if (event.refusal == idem::http::Refusal::in_progress) {
        r.conflicts.fetch_add(1, std::memory_order_relaxed);
      }
      refusals_[static_cast<std::size_t>(event.refusal) % kRefusals].fetch_add(
          1, std::memory_order_relaxed);
      break;
    case Kind::kept:
      r.kept.fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::released:
      r.released.fetch_add(1, std::memory_order_relaxed);
      break;
    case Kind::fenced:
      r.fenced.fetch_add(1, std::memory_order_relaxed);
      break;
  }
}

void Metrics::on_rejection(ProxyRejection rejection) noexcept {
  rejections_[static_cast<std::size_t>(rejection)].fetch_add(1, std::memory_order_relaxed);
}

void Metrics::on_upstream_error(UpstreamError error) noexcept {
  upstream_errors_[static_cast<std::size_t>(error)].fetch_add(1, std::memory_order_relaxed);
}

void Metrics::on_upstream_duration(std::string_view name, std::chrono::nanoseconds d) noexcept {
  route(name).upstream.observe(d);
}

void Metrics::on_request_duration(std::string_view decision, std::chrono::nanoseconds d) noexcept {
  request_durations_[decision_index(decision)].observe(d);
}

std::string Metrics::render() const {
  std::string out;
  out.reserve(8192);
  const auto each_route = [&](std::string_view name, std::string_view type, std::string_view help,
                              const auto& value_of) {
    header(out, name, type, help);
    for (const auto& r : routes_) {
      line(out, name, "route=\"" + escape(r->name) + "\"", static_cast<double>(value_of(*r)));
    }
  };
  header(out, "idem_proxy_requests_total", "counter", "Requests by route and decision.");
  for (const auto& r : routes_) {
    for (std::size_t i = 0; i < kDecisions; ++i) {
      line(out, "idem_proxy_requests_total",
           "route=\"" + escape(r->name) + "\",decision=\"" + std::string(kDecisionNames[i]) + "\"",
           static_cast<double>(r->decisions[i].load(std::memory_order_relaxed)));
    }
  }
  each_route("idem_proxy_replays_total", "counter", "Responses replayed from the store.",
             [](const PerRoute& r) { return r.decisions[2].load(std::memory_order_relaxed); });
  each_route("idem_proxy_replay_cache_hits_total", "counter",
             "Replays and fingerprint-mismatch answers from the in-process replay cache.",
             [](const PerRoute& r) { return r.cache_hits.load(std::memory_order_relaxed); });
  each_route("idem_proxy_waits_total", "counter",
             "Requests that found their key's request running and waited for it.",
             [](const PerRoute& r) { return r.waits.load(std::memory_order_relaxed); });
  each_route("idem_proxy_joins_total", "counter",
             "Replays after waiting for the key's running request.",
             [](const PerRoute& r) { return r.joins.load(std::memory_order_relaxed); });
  each_route("idem_proxy_conflicts_total", "counter", "409 answers while the key's request ran.",
             [](const PerRoute& r) { return r.conflicts.load(std::memory_order_relaxed); });
  each_route("idem_proxy_takeovers_total", "counter",
             "Claims taken over after a dead owner's lease.",
             [](const PerRoute& r) { return r.takeovers.load(std::memory_order_relaxed); });
  header(out, "idem_proxy_outcomes_total", "counter",
         "Upstream outcomes kept in the store, released, or fenced off by a takeover.");
  for (const auto& r : routes_) {
    const std::string route = "route=\"" + escape(r->name) + "\",result=";
    line(out, "idem_proxy_outcomes_total", route + "\"kept\"",
         static_cast<double>(r->kept.load(std::memory_order_relaxed)));
    line(out, "idem_proxy_outcomes_total", route + "\"released\"",
         static_cast<double>(r->released.load(std::memory_order_relaxed)));
    line(out, "idem_proxy_outcomes_total", route + "\"fenced\"",
         static_cast<double>(r->fenced.load(std::memory_order_relaxed)));
  }
  header(out, "idem_proxy_rejections_total", "counter",
         "Responses the proxy made itself, by reason.");
  for (std::size_t i = 0; i < kRefusals; ++i) {
    line(out, "idem_proxy_rejections_total",
         "reason=\"" + std::string(idem::http::to_string(static_cast<idem::http::Refusal>(i))) +
             "\"",
         static_cast<double>(refusals_[i].load(std::memory_order_relaxed)));
  }
  for (std::size_t i = 0; i < rejections_.size(); ++i) {
    line(out, "idem_proxy_rejections_total", "reason=\"" + std::string(kRejectionNames[i]) + "\"",
         static_cast<double>(rejections_[i].load(std::memory_order_relaxed)));
  }
  header(out, "idem_proxy_upstream_errors_total", "counter", "Upstream failures by kind.");
  for (std::size_t i = 0; i < upstream_errors_.size(); ++i) {
    line(out, "idem_proxy_upstream_errors_total",
         "kind=\"" + std::string(kUpstreamErrorNames[i]) + "\"",
         static_cast<double>(upstream_errors_[i].load(std::memory_order_relaxed)));
  }
  header(out, "idem_proxy_upstream_duration_seconds", "histogram",
         "Upstream latency: request sent to response read.");
  for (const auto& r : routes_) {
    r->upstream.render(out, "idem_proxy_upstream_duration_seconds",
                       "route=\"" + escape(r->name) + "\"");
  }
  header(out, "idem_proxy_request_duration_seconds", "histogram",
         "Whole requests: read to response written, by decision.");
  for (std::size_t i = 0; i < kDecisions; ++i) {
    request_durations_[i].render(out, "idem_proxy_request_duration_seconds",
                                 "decision=\"" + std::string(kDecisionNames[i]) + "\"");
  }
  header(out, "idem_proxy_connections", "gauge", "Open client connections.");
  line(out, "idem_proxy_connections", "", static_cast<double>(connections.load()));
  header(out, "idem_proxy_connections_total", "counter", "Client connections accepted.");
  line(out, "idem_proxy_connections_total", "", static_cast<double>(connections_total.load()));
  header(out, "idem_proxy_requests_in_flight", "gauge", "Requests being handled.");
  line(out, "idem_proxy_requests_in_flight", "", static_cast<double>(in_flight.load()));
  header(out, "idem_proxy_draining", "gauge", "1 while the proxy drains after SIGTERM.");
  line(out, "idem_proxy_draining", "", static_cast<double>(draining.load()));
  return out;
}

}  // namespace idem::cli::proxy
