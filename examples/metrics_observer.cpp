// metrics_observer: one idem::Metrics watching a consumer and an operation, written in the
// Prometheus text format — printed, or served on /metrics for a Prometheus server to scrape.
//
// A billing consumer gets 6 deliveries (2 of them redelivered, 1 failing); a create_payment
// operation gets 5 calls (a retry, a replay, a key reused with another amount). The metrics say
// so: idem_consumer_deliveries_total{consumer="billing",outcome="duplicate"} 2, and so on.
//
// Run: ./example_metrics_observer            prints the text and exits
//      ./example_metrics_observer 9464       also serves it on http://127.0.0.1:9464/metrics
//                                            until Ctrl-C (scrape_configs: 127.0.0.1:9464)
//
// docs/observability.md explains the families and how to feed an OpenTelemetry meter instead.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <stdexcept>
#include <string>

#include "idem/handler.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/metrics.hpp"
#include "idem/resilient.hpp"

namespace {

struct Receipt {
  std::string id;
  int amount = 0;
};

void run_the_consumer(const std::shared_ptr<idem::Metrics>& metrics) {
  auto recorder = std::make_shared<idem::InMemoryIdempotencyRecorder>();
  auto billing = idem::make_idempotent_handler(
      "billing", recorder,
      [](const std::string& order) {
        if (order == "card-expired") throw std::runtime_error("card expired");
      },
      idem::HandlerOptions{.observer = metrics});
  idem::CollectingBusProxy bus("billing");
  const char* orders[] = {"o-1", "o-2", "o-1", "card-expired", "o-3", "o-2"};
  const char* ids[] = {"evt-1", "evt-2", "evt-1", "evt-4", "evt-5", "evt-2"};  // 2 redeliveries
  for (int i = 0; i < 6; ++i) {
    idem::Event event = idem::Event::make("order.placed", orders[i]);
    event.id = ids[i];
    try {
      (*billing)(event, bus);
    } catch (const std::exception&) {
      // Not marked: the transport would redeliver it.
    }
  }
}

void run_the_operation(const std::shared_ptr<idem::Metrics>& metrics) {
  int gateway_calls = 0;
  auto create_payment = idem::resilient(
      [&gateway_calls](const std::string& request_id, int amount) {
        if (++gateway_calls == 1) throw std::runtime_error("gateway timeout");  // retried
        return Receipt{"rcpt-" + request_id, amount};
      },
      {.name = "create_payment",
       .retries = 2,
       .backoff = {.base = std::chrono::milliseconds(1)},
       .observer = metrics,
       .idempotency_key = [](const std::string& id, int) { return id; }});
  create_payment("request-1", 2499);
  create_payment("request-1", 2499);  // replayed
  create_payment("request-2", 100);
  try {
    create_payment("request-1", 1);  // the same key with another amount
  } catch (const idem::KeyReuseError& e) {
    std::cerr << e.what() << "\n";
  }
}

volatile std::sig_atomic_t g_stop = 0;

// A minimal HTTP/1.0 server: every request gets the current text. Enough for a scrape; a real
// service would answer from the HTTP server it already has.
void serve(const idem::Metrics& metrics, int port) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  const int yes = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(listener, 8) != 0) {
    throw std::runtime_error("cannot listen on 127.0.0.1:" + std::to_string(port));
  }
  std::cerr << "serving http://127.0.0.1:" << port << "/metrics (Ctrl-C stops)\n";
  std::signal(SIGINT, [](int) { g_stop = 1; });
  while (g_stop == 0) {
    const int client = ::accept(listener, nullptr, nullptr);
    if (client < 0) continue;  // EINTR after Ctrl-C
    char request[1024];
    static_cast<void>(::read(client, request, sizeof request));
    const std::string body = metrics.prometheus();
    const std::string response =
        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\n\r\n" + body;
    static_cast<void>(::write(client, response.data(), response.size()));
    ::close(client);
  }
  ::close(listener);
}

}  // namespace

int main(int argc, char** argv) {
  auto metrics = std::make_shared<idem::Metrics>();
  run_the_consumer(metrics);
  run_the_operation(metrics);
  std::cout << metrics->prometheus();
  if (argc > 1) serve(*metrics, std::atoi(argv[1]));
  return 0;
}
