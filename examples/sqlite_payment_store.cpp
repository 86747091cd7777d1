// Idempotent payments that survive a restart: resilient() over a SqliteIdempotencyStore.
//
// The payment result is a struct with nlohmann-json to_json/from_json, so idem::Codec<Payment>
// turns it into bytes for the file. The program
//   1. creates a payment (executed: the gateway is called once);
//   2. calls again with the same request id (replayed: same payment, the original report);
//   3. opens a second store on the same file — another process, or this one after a restart —
//      and calls again (replayed from the file, the gateway is not called);
//   4. reuses the request id with another amount (KeyReuseError: nothing runs);
//   5. shows the record as it sits in the file.
//
//   ./example_sqlite_payment_store [path.db]     (default: a temporary file, removed at the end)
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "idem/error.hpp"
#include "idem/resilient.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

using namespace std::chrono_literals;

struct Payment {
  std::string id;
  std::string request_id;
  int amount_cents = 0;
};
void to_json(nlohmann::json& j, const Payment& p) {
  j = nlohmann::json{{"id", p.id}, {"request_id", p.request_id}, {"amount_cents", p.amount_cents}};
}
void from_json(const nlohmann::json& j, Payment& p) {
  j.at("id").get_to(p.id);
  j.at("request_id").get_to(p.request_id);
  j.at("amount_cents").get_to(p.amount_cents);
}

// A payment gateway that must not be called twice for one request.
class Gateway {
 public:
  Payment create(const std::string& request_id, int amount_cents) {
    const int n = ++calls_;
    std::cout << "    gateway: charging " << amount_cents << " cents for " << request_id
              << " (call #" << n << ")\n";
    return Payment{"pay_" + std::to_string(1000 + n), request_id, amount_cents};
  }
  int calls() const { return calls_.load(); }

 private:
  std::atomic<int> calls_{0};
};

// The same operation, as every process of the service builds it, over `store`.
auto make_create_payment(Gateway& gateway,
                         std::shared_ptr<idem::sqlite::SqliteIdempotencyStore> store) {
  return idem::resilient(
      [&gateway](const std::string& request_id, int amount_cents) {
        return gateway.create(request_id, amount_cents);
      },
      {.name = "create_payment",
       .retries = 2,
       .idempotency_key = [](const std::string& request_id,
                             int) { return "create-payment:" + request_id; },
       .idempotency_ttl = 24h,
       // The arguments are fingerprinted: the same request id with another amount is an error.
       .idempotency_store = std::move(store)});
}

void show(const idem::OperationResult<Payment>& result) {
  std::cout << "    -> " << result.value.id << " for " << result.value.amount_cents
            << " cents, status " << result.report.metadata.at("idempotency_status") << ", "
            << result.report.attempts.size() << " attempt(s) in the report\n";
}

}  // namespace

int main(int argc, char** argv) {
  const bool temporary = argc < 2;
  const std::string path = temporary ? (std::filesystem::temp_directory_path() /
                                        ("idem-payments-" + std::to_string(::getpid()) + ".db"))
                                           .string()
                                     : argv[1];
  int status = 0;
  try {
    Gateway gateway;
    {
      auto store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path);
      auto create_payment = make_create_payment(gateway, store);

      std::cout << "1. first call\n";
      show(create_payment("request-123", 2499));
      std::cout << "2. the client retries the same request\n";
      show(create_payment("request-123", 2499));
    }  // the store and its connections are gone: as after a restart

    std::cout << "3. another process (a new store on the same file)\n";
    auto store = std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path);
    auto create_payment = make_create_payment(gateway, store);
    show(create_payment("request-123", 2499));

    std::cout << "4. the same request id with another amount\n";
    try {
      create_payment("request-123", 9999);
    } catch (const idem::KeyReuseError& e) {
      std::cout << "    refused: " << e.what() << "\n";
    }

    std::cout << "5. the record in " << path << "\n";
    // The store holds the key scoped by the operation's name (docs/resilience.md, key scope).
    const std::string stored =
        idem::scoped_idempotency_key("create_payment", "create-payment:request-123");
    std::cout << "    key " << stored << "\n";
    if (auto record = store->lookup(stored)) {
      std::cout << "    state " << idem::to_string(record->state) << ", token " << record->token
                << ", value " << record->value.bytes.value_or("") << "\n";
    }
    std::cout << "gateway calls in all: " << gateway.calls() << "\n";
    status = gateway.calls() == 1 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    status = 1;
  }
  if (temporary) {
    for (const char* suffix : {"", "-wal", "-shm"}) {
      std::error_code ec;
      std::filesystem::remove(path + suffix, ec);
    }
  }
  return status;
}
