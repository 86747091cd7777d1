// open_from_url: the backend chosen by configuration — one URL for the consumer's recorder, one
// for the operation's idempotency store (see docs/urls.md).
//
//   ./example_open_from_url                                   (memory:// for both)
//   ./example_open_from_url sqlite:///tmp/idem-example.db     (both in one SQLite file)
//   ./example_open_from_url redis://127.0.0.1:6379/0?prefix=example:
//   ./example_open_from_url 'postgresql://idem@127.0.0.1:5432/idem_test?schema=example'
//   ./example_open_from_url RECORDER_URL STORE_URL
//
// A bad URL is refused with a message naming the wrong part (and never a password):
//   ./example_open_from_url 'redis://:secret@localhost:99999/0'
#include <chrono>
#include <iostream>
#include <string>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/handler.hpp"
#include "idem/open.hpp"
#include "idem/resilient.hpp"

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  const std::string recorder_url = argc > 1 ? argv[1] : "memory://";
  const std::string store_url = argc > 2 ? argv[2] : recorder_url;
  try {
    // 1. An idempotent consumer on the recorder the URL names.
    auto recorder = idem::open_recorder(recorder_url);
    std::cout << "recorder: " << idem::redact_url(recorder_url) << "\n";
    int shipped = 0;
    auto ship = idem::make_idempotent_handler<nlohmann::json>(
        "shipping", recorder, [&](const nlohmann::json& order) {
          ++shipped;
          std::cout << "  shipping order " << order.at("order") << "\n";
        });
    const idem::Event event = idem::Event::make("order.paid", R"({"order": 1001})");
    idem::CollectingBusProxy bus("shipping");
    for (int delivery = 1; delivery <= 3; ++delivery) {
      const auto result = (*ship)(event, bus);
      std::cout << "  delivery " << delivery << ": "
                << (result == idem::HandleResult::processed ? "processed" : "duplicate dropped")
                << "\n";
    }

    // 2. An idempotent operation on the store the URL names.
    auto store = idem::open_store(store_url);
    std::cout << "store:    " << idem::redact_url(store_url) << "\n";
    int charges = 0;
    auto charge = idem::resilient(
        [&](const std::string& request_id, int cents) {
          ++charges;
          return "charged " + std::to_string(cents) + " cents for " + request_id;
        },
        {.name = "charge",
         .idempotency_key = [](const std::string& request_id,
                               int) { return "charge:" + request_id; },
         .idempotency_ttl = 1h,
         .idempotency_store = store});
    // A request id of its own per run, so runs against one durable store stay independent.
    const std::string request = "r-" + idem::new_event_id().substr(0, 8);
    for (int call = 1; call <= 2; ++call) {
      const auto result = charge(request, 2499);
      std::cout << "  call " << call << ": " << result.value << " ("
                << result.report.metadata.at("idempotency_status") << ")\n";
    }
    std::cout << "shipped " << shipped << " time(s), charged " << charges << " time(s)\n";
    return shipped == 1 && charges == 1 ? 0 : 1;
  } catch (const idem::ConfigError& e) {
    std::cerr << "bad URL: " << e.what() << "\n";
  } catch (const idem::NotSupported& e) {
    std::cerr << "not available in this build: " << e.what() << "\n";
  } catch (const idem::StoreError& e) {
    std::cerr << "the store cannot be used" << (e.retryable() ? " (try again later)" : "") << ": "
              << e.what() << "\n";
  }
  return 2;
}
