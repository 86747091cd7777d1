// http_middleware: idem::http as middleware of a C++ HTTP server (cpp-httplib, Debian's
// libcpp-httplib-dev): POST /payments gets the Idempotency-Key rules — a retry replays the first
// response (Idempotent-Replayed: true), a key reused with another body is 422, a request
// without a key is 400 — and the handler runs once per key.
//
//   ./example_http_middleware              serves on a free port, calls itself, prints, exits
//   ./example_http_middleware --serve 8080 serves until killed; try
//       curl -i -X POST localhost:8080/payments -H 'Idempotency-Key: "k1"' -d '{"cents":500}'
//
// cpp-httplib runs each request on a thread of its pool; idem::http decides on an Asio event loop
// of its own (one thread here), so the wrapper hands it the request and waits for the decision.
// The store is in memory (one process); for several server processes give the Guard a shared
// one, e.g. std::make_shared<idem::sqlite::AsyncSqliteStore>("/var/lib/app/idem.db") or an
// AsyncRedisStore (docs/http.md).
#include <httplib.h>

#include <asio/co_spawn.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>
#include <asio/use_future.hpp>
#include <atomic>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "idem/async/memory_store.hpp"
#include "idem/http/guard.hpp"

namespace {

idem::http::Request to_idem(const httplib::Request& in) {
  idem::http::Request out;
  out.method = in.method;
  out.target = in.target;
  for (const auto& [name, value] : in.headers)
    out.headers.push_back({name, value});
  out.body = in.body;
  return out;
}

idem::http::Response from_httplib(const httplib::Response& in) {
  idem::http::Response out;
  out.status = in.status;
  for (const auto& [name, value] : in.headers) {
    if (!idem::http::is_connection_field(name)) out.headers.push_back({name, value});
  }
  out.body = in.body;
  return out;
}

void to_httplib(const idem::http::Response& in, httplib::Response& out) {
  out.status = in.status;
  out.headers.clear();
  std::string content_type = "text/plain";
  for (const auto& header : in.headers) {
    if (idem::http::iequals(header.name, "Content-Type")) {
      content_type = header.value;
    } else {
      out.set_header(header.name, header.value);
    }
  }
  out.set_content(in.body, content_type);
}

// Runs `task` on the Guard's event loop and waits for it on this (a cpp-httplib) thread.
template <class T>
T on_loop(asio::io_context& io, idem::async::Task<T> task) {
  return asio::co_spawn(io, std::move(task), asio::use_future).get();
}

// `handler`, guarded: it runs only for a request the Guard forwards.
httplib::Server::Handler idempotent(idem::http::Guard& guard, asio::io_context& io,
                                    httplib::Server::Handler handler) {
  return [&guard, &io, handler = std::move(handler)](const httplib::Request& in,
                                                     httplib::Response& out) {
    const idem::http::Request request = to_idem(in);
    idem::http::Decision decision = on_loop(io, guard.begin(request));
    if (decision.action() == idem::http::Decision::Action::respond) {
      to_httplib(decision.response(), out);  // a replay or a problem+json refusal
      return;
    }
    try {
      handler(in, out);
    } catch (...) {
      on_loop(io, decision.release());  // no response: the retry runs again
      throw;
    }
    to_httplib(on_loop(io, decision.finish(from_httplib(out))), out);
  };
}

}  // namespace

int main(int argc, char** argv) {
  const bool serve = argc > 2 && std::string(argv[1]) == "--serve";

  asio::io_context io;
  auto work = asio::make_work_guard(io);
  std::thread loop([&io] { io.run(); });

  idem::http::GuardOptions options;
  idem::http::Route payments;
  payments.name = "payments";
  payments.methods = {"POST"};
  payments.path = "/payments";
  payments.required = true;
  payments.fingerprint.body = idem::http::BodyFingerprint::json;
  options.routes.push_back(payments);
  options.principal.headers = {"Authorization"};
  idem::http::Guard guard(std::make_shared<idem::async::AsyncMemoryStore>(), options);

  std::atomic<int> charges{0};
  httplib::Server server;
  server.Post(
      "/payments",
      idempotent(guard, io, [&](const httplib::Request& request, httplib::Response& response) {
        const int charge = ++charges;  // the side effect: once per key
        response.status = 201;
        response.set_header("Location", "/payments/" + std::to_string(charge));
        response.set_content(
            R"({"charge":)" + std::to_string(charge) + R"(,"request":)" + request.body + "}",
            "application/json");
      }));

  int port = serve ? std::atoi(argv[2]) : 0;
  if (serve) {
    if (!server.bind_to_port("127.0.0.1", port)) {
      std::cerr << "cannot listen on 127.0.0.1:" << port << "\n";
      return 1;
    }
  } else {
    port = server.bind_to_any_port("127.0.0.1");
  }
  std::thread listener([&server] { server.listen_after_bind(); });
  if (serve) {
    std::cout << "serving http://127.0.0.1:" << port << "/payments\n";
    listener.join();
  } else {
    httplib::Client client("127.0.0.1", port);
    const httplib::Headers keyed = {{"Idempotency-Key", "\"order-1\""}};
    const auto show = [](const char* what, const httplib::Result& result) {
      std::cout << what << ": " << result->status << " "
                << (result->has_header("Idempotent-Replayed") ? "(replayed) " : "") << result->body
                << "\n";
    };
    show("first  ", client.Post("/payments", keyed, R"({"cents":500})", "application/json"));
    show("retry  ", client.Post("/payments", keyed, R"({ "cents": 500 })", "application/json"));
    show("reused ", client.Post("/payments", keyed, R"({"cents":900})", "application/json"));
    show("no key ", client.Post("/payments", R"({"cents":500})", "application/json"));
    std::cout << "charges: " << charges.load() << "\n";
    server.stop();
    listener.join();
  }
  work.reset();
  loop.join();
  return charges.load() == 1 || serve ? 0 : 1;
}
