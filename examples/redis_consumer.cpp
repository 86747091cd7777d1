// redis_consumer: markers and results in Redis, shared by every process that reaches the server.
//
//   * A "shipping" consumer handles "order.paid" events through an exclusive-mode
//     IdempotentHandler on a RedisIdempotencyRecorder. The same event delivered three times
//     ships once — and would ship once across processes and machines too, since the claim and
//     the marker live in Redis.
//   * An operation made idempotent with idem::resilient() keeps its result in a
//     RedisIdempotencyStore: the second call with the same key replays the stored receipt and
//     the original report instead of charging again.
// Both share one connection pool and the key prefix "example:<pid>:", deleted at the end.
//
// Run: ./example_redis_consumer redis://127.0.0.1:6379/0   (or set IDEM_REDIS_URL)
#include <unistd.h>

#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>

#include "idem/bus.hpp"
#include "idem/handler.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_error.hpp"
#include "idem/redis/redis_recorder.hpp"
#include "idem/redis/redis_store.hpp"
#include "idem/resilient.hpp"

namespace {

struct Receipt {
  std::string order;
  int cents = 0;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Receipt, order, cents)

// Removes the example's keys (SCAN + UNLINK under the prefix).
void delete_prefix(idem::redis::ConnectionPool& pool) {
  auto connection = pool.lease();
  const std::string pattern = pool.options().key_prefix + "*";
  std::string cursor = "0";
  do {
    const auto page = connection->command({"SCAN", cursor, "MATCH", pattern, "COUNT", "1000"});
    cursor = page.elements.at(0).str;
    for (const auto& key : page.elements.at(1).elements)
      connection->append({"UNLINK", key.str});
    if (connection->pending() > 0) (void)connection->read_replies();
  } while (cursor != "0");
}

}  // namespace

int main(int argc, char** argv) {
  const char* url = argc > 1 ? argv[1] : std::getenv("IDEM_REDIS_URL");
  if (url == nullptr) {
    std::cerr << "usage: example_redis_consumer redis://HOST:PORT/DB (or set IDEM_REDIS_URL)\n";
    return 2;
  }
  try {
    // Options from a URL; the prefix keeps this run's keys apart from everything else.
    auto options = idem::redis::RedisOptions::from_url(url);
    options.key_prefix = "example:" + std::to_string(::getpid()) + ":";
    auto pool = std::make_shared<idem::redis::ConnectionPool>(options);
    auto recorder = std::make_shared<idem::redis::RedisIdempotencyRecorder>(pool);
    auto store = std::make_shared<idem::redis::RedisIdempotencyStore>(pool);

    // ---- consumer face ----------------------------------------------------------------------
    int shipments = 0;
    idem::Bus bus;
    bus.subscribe("order.paid", idem::make_idempotent_handler<std::string>(
                                    "shipping", recorder, [&](const std::string& order) {
                                      ++shipments;
                                      std::cout << "  shipping: parcel for " << order
                                                << " handed to courier\n";
                                    }));
    const idem::Event paid = idem::Event::make("order.paid", "order-1001");
    std::cout << "delivering " << paid.id << " three times\n";
    for (int i = 0; i < 3; ++i)
      bus.publish(paid);
    bus.wait_idle();
    std::cout << "  marker " << recorder->marker_key("shipping", paid.id)
              << " = processed: " << std::boolalpha << recorder->is_processed("shipping", paid.id)
              << "\n";

    // ---- operation face ---------------------------------------------------------------------
    int charges = 0;
    using Charge = Receipt(const std::string&, int);
    idem::ResilientOptions<Charge> charge_options;
    charge_options.name = "charge";
    charge_options.idempotency_key = [](const std::string& order, int) {
      return "charge:" + order;
    };
    charge_options.idempotency_store = store;  // results as JSON bytes (idem::Codec<Receipt>)
    charge_options.idempotency_ttl = std::chrono::hours(24);
    auto charge = idem::resilient<Charge>(
        [&](const std::string& order, int cents) {
          ++charges;
          return Receipt{order, cents};
        },
        charge_options);
    for (int i = 0; i < 2; ++i) {
      const auto result = charge("order-1001", 2499);
      std::cout << "  charge: " << result.value.cents << " cents for " << result.value.order << " ("
                << result.report.metadata.at("idempotency_status") << ")\n";
    }

    delete_prefix(*pool);
    const bool ok = shipments == 1 && charges == 1;
    std::cout << (ok ? "each side effect ran once\n" : "UNEXPECTED: a side effect repeated\n");
    return ok ? 0 : 1;
  } catch (const idem::redis::RedisError& e) {
    std::cerr << "Redis is not usable (" << idem::redis::to_string(e.failure())
              << (e.retryable() ? ", retryable" : "") << "): " << e.what() << "\n";
    return 1;
  }
}
