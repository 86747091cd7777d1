// resilient_payment: one "create payment" call behind the whole operation face of idem.
//
// A simulated payment gateway fails now and then, sometimes hangs, and once returns a receipt
// without an id. The call is wrapped with retries (exponential backoff, full jitter), a
// per-attempt timeout, result validation, a circuit breaker, a fallback and JSON-lines events —
// and with an idempotency key, so a client that sends the same request twice is charged once.
// A second operation, a refund, uses the same key text and still keeps its own results (keys are
// scoped by the operation's name), and talks to a rate-limited API whose Retry-After is honoured.
//
// Run: ./example_resilient_payment      (events go to stderr, the story to stdout)

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <iostream>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>

#include "idem/circuit_breaker.hpp"
#include "idem/events.hpp"
#include "idem/rate_limit.hpp"
#include "idem/resilient.hpp"

using namespace std::chrono_literals;

// A rate-limited answer (HTTP 429) with its Retry-After header.
struct TooManyRequests : std::runtime_error {
  explicit TooManyRequests(std::string header)
      : std::runtime_error("429 Too Many Requests"), retry_after(std::move(header)) {}
  std::string retry_after;
};

struct Receipt {
  std::string id;
  int amount = 0;
};

// The remote side. Misbehaves on purpose, by call number.
class Gateway {
 public:
  Receipt create(idem::AttemptContext& attempt, const std::string& request_id, int amount) {
    const int call = ++calls_;
    std::cout << "  gateway call #" << call << " (attempt " << attempt.attempt << ") for "
              << request_id << "\n";
    if (call == 1) throw std::runtime_error("503 Service Unavailable");
    if (call == 2) hang_until_stopped(attempt);  // the timeout ends this attempt
    if (call == 4) return Receipt{"", amount};   // fails validation
    return Receipt{"pay_" + std::to_string(call), amount};
  }
  int calls() const { return calls_.load(); }

 private:
  static void hang_until_stopped(idem::AttemptContext& attempt) {
    std::mutex mutex;
    std::condition_variable_any cv;
    std::unique_lock lock(mutex);
    cv.wait(lock, attempt.stop, [] { return false; });  // cooperative: returns at the deadline
    throw std::runtime_error("request abandoned");
  }

  std::atomic<int> calls_{0};
};

int main() {
  Gateway gateway;
  auto breaker = std::make_shared<idem::CircuitBreaker>(
      idem::CircuitBreakerOptions{.name = "gateway", .failure_threshold = 5});
  auto counters = std::make_shared<idem::CountingEventSink>();
  auto log = std::make_shared<idem::JsonLinesEventSink>(std::cerr);

  auto create_payment = idem::resilient(
      [&](idem::AttemptContext& attempt, const std::string& request_id, int amount) {
        return gateway.create(attempt, request_id, amount);
      },
      {.name = "create_payment",
       .retries = 3,
       .backoff = {.base = 10ms, .multiplier = 2.0, .cap = 200ms},
       .timeout = 100ms,
       .circuit_breaker = breaker,
       .validate = {{"has_id", [](const Receipt& r) { return !r.id.empty(); }},
                    {"positive_amount",
                     [](const Receipt& r) -> std::optional<std::string> {
                       if (r.amount > 0) return std::nullopt;
                       return "amount " + std::to_string(r.amount) + " is not positive";
                     }}},
       .fallback = {"queue_for_later",
                    [](const idem::FallbackContext& why, const std::string& request_id,
                       int amount) {
                      std::cout << "  fallback: queueing " << request_id << " because "
                                << why.error_message << "\n";
                      return Receipt{"queued_" + request_id, amount};
                    }},
       .events = {log, counters},
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; },
       .idempotency_ttl = 1h});  // the arguments are fingerprinted: see step 4

  auto show = [](const char* what, const idem::OperationResult<Receipt>& result) {
    std::cout << "   " << what << ": receipt " << result.value.id << ", status "
              << result.report.metadata.at("idempotency_status") << ", "
              << result.report.attempts.size() << " attempt(s)\n";
  };

  std::cout << "1. first request (a 503, then a hang cut short by the timeout):\n";
  show("result", create_payment("request-123", 2499));

  std::cout << "2. the client retries the same request:\n";
  show("duplicate", create_payment("request-123", 2499));

  std::cout << "3. another request (a receipt without id fails validation and is retried):\n";
  try {
    show("result", create_payment("request-456", 1000));
  } catch (const idem::OperationError& e) {
    std::cout << "   failed: " << e.what() << "\n";
  }

  std::cout << "4. the same key with another amount is refused:\n";
  try {
    create_payment("request-123", 1);
  } catch (const idem::KeyReuseError& e) {
    std::cout << "   " << e.what() << "\n";
  }

  std::cout << "5. an invalid request id (a control character) never reaches the gateway:\n";
  try {
    create_payment("request\n789", 10);
  } catch (const idem::InvalidKey& e) {
    std::cout << "   " << e.what() << "\n";
  }

  std::cout << "6. a refund API that rate-limits: its Retry-After replaces the backoff\n";
  std::atomic<int> refund_calls{0};
  auto refund = idem::resilient(
      [&](const std::string& request_id, int amount) {
        if (++refund_calls == 1) throw TooManyRequests("1");  // "retry after 1 second"
        return Receipt{"refund_" + request_id, -amount};
      },
      {.name = "refund",
       .retries = 2,
       .rate_limit_on = idem::failures_of<TooManyRequests>(),
       .retry_after =
           [](const std::exception& e) {
             return idem::parse_retry_after(static_cast<const TooManyRequests&>(e).retry_after,
                                            std::chrono::system_clock::now());
           },
       .max_rate_limit_wait = 5s,
       .events = {log, counters},
       // The same key text as create_payment's: the scope ("refund") keeps them apart.
       .idempotency_key = [](const std::string& id, int) { return "create-payment:" + id; }});
  const auto refunded = refund("request-123", 2499);
  std::cout << "   refund: receipt " << refunded.value.id << " after waiting "
            << refunded.report.metadata.at("rate_limit_wait_seconds") << " s ("
            << refunded.report.attempts[0].metadata.at("rate_limit_delay_source")
            << "), stored as key " << refunded.report.metadata.at("idempotency_stored_key") << "\n";
  std::cout << "   the payment's key is untouched: " << create_payment("request-123", 2499).value.id
            << "\n";

  std::cout << "\ngateway calls: " << gateway.calls() << "\n";
  std::cout << "breaker: " << idem::to_string(breaker->state()) << "\n";
  std::cout << "report of request-123 as JSON:\n"
            << create_payment("request-123", 2499).report.to_json() << "\n\n";
  std::cout << counters->scrape();
  return 0;
}
