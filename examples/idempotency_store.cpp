// The idempotency store protocol and its coordinator, seen from below.
//
// Most code uses idem::resilient / idem::operation and never touches these types. This program
// drives the coordinator directly over an InMemoryIdempotencyStore wrapped in a store that logs
// every protocol call, so you can watch what executed / joined / replayed mean for the store:
//
//   1. the first call claims the key, executes, completes it;
//   2. a second call replays (one claim, no execution);
//   3. four concurrent callers of a new key: one executes, three join (one claim in all);
//   4. a failure releases the key; the next call executes again;
//   5. the same key with other arguments (fingerprint) is refused;
//   6. "another process" (a second coordinator over the same store) is rejected while the
//      first one runs, then replays.
//
// Any store you write can be checked with the conformance suite:
//   INSTANTIATE_STORE_CONFORMANCE(MyStore, MyStoreFactory);   // idem/testing/store_conformance.hpp
#include <condition_variable>
#include <iostream>
#include <latch>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/error.hpp"
#include "idem/fingerprint.hpp"
#include "idem/idempotency.hpp"
#include "idem/memory_store.hpp"
#include "idem/wrapper.hpp"

namespace {

// Forwards every call to another store (a StoreWrapper) and prints the ones that matter.
class LoggingStore final : public idem::StoreWrapper {
 public:
  explicit LoggingStore(std::shared_ptr<idem::IdempotencyStore> inner)
      : StoreWrapper(std::move(inner)) {}

 private:
  idem::ClaimOutcome do_claim(std::string_view key, std::optional<std::string_view> fingerprint,
                              idem::Millis lease) override {
    auto outcome = StoreWrapper::do_claim(key, fingerprint, lease);
    log("claim(" + std::string(key) + ") -> " + std::string(idem::to_string(outcome.status)) +
        (outcome.status == idem::ClaimOutcome::Status::acquired
             ? " token " + std::to_string(outcome.token)
             : ""));
    return outcome;
  }
  bool do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                   const idem::ExecutionReport& report, idem::Millis ttl) override {
    const bool done = StoreWrapper::do_complete(key, token, std::move(value), report, ttl);
    log("complete(" + std::string(key) + ", token " + std::to_string(token) + ") -> " +
        (done ? "true" : "false (fenced off)"));
    return done;
  }
  bool do_release(std::string_view key, std::uint64_t token) override {
    const bool done = StoreWrapper::do_release(key, token);
    log("release(" + std::string(key) + ", token " + std::to_string(token) + ") -> " +
        (done ? "true" : "false"));
    return done;
  }
  // renew (every lease/3) is too chatty to print: the wrapper forwards it unchanged.
  std::optional<idem::IdempotencyRecord> do_wait(std::string_view key, idem::SteadyTime deadline,
                                                 std::stop_token stop) override {
    log("wait(" + std::string(key) + ")");
    return StoreWrapper::do_wait(key, deadline, std::move(stop));
  }

  void log(const std::string& line) {
    std::lock_guard lock(mutex_);
    std::cout << "    store: " << line << "\n";
  }

  std::mutex mutex_;
};

struct Receipt {
  std::string payment_id;
  int cents = 0;
};

idem::Execution receipt(const std::string& id, int cents) {
  idem::ExecutionReport report;
  report.operation = "create_payment";
  report.attempts.push_back(idem::AttemptRecord{});
  return idem::Execution{std::make_shared<const Receipt>(Receipt{id, cents}), report};
}

idem::IdempotentCall payment_call(const std::string& request_id, int cents) {
  idem::IdempotentCall call;
  call.key = "create-payment:" + request_id;
  call.fingerprint = idem::fingerprint(request_id, cents);
  call.type = std::type_index(typeid(Receipt));
  call.operation = "create_payment";
  return call;
}

void print(const std::string& who, const idem::CoordinatedResult& result) {
  const auto& value = *std::static_pointer_cast<const Receipt>(result.value);
  std::cout << "  " << who << ": " << idem::to_string(result.status) << ", receipt "
            << value.payment_id << " for " << value.cents << " cents (cache hit "
            << result.report.metadata.at("idempotency_cache_hit") << ")\n";
}

}  // namespace

int main() {
  auto store = std::make_shared<LoggingStore>(std::make_shared<idem::InMemoryIdempotencyStore>());
  auto coordinator = idem::IdempotencyCoordinator::for_store(store);
  idem::IdempotencyPolicy policy{.store = store};
  int gateway_calls = 0;
  auto pay = [&](const std::string& id, int cents) {
    return [&, id, cents](idem::ClaimHold&) {
      ++gateway_calls;
      return receipt("pay_" + id, cents);
    };
  };

  std::cout << "1. first call\n";
  print("caller", coordinator->run(policy, payment_call("r-1", 2499), pay("r-1", 2499)));

  std::cout << "2. the same request again\n";
  print("caller", coordinator->run(policy, payment_call("r-1", 2499), pay("r-1", 2499)));

  std::cout << "3. four concurrent callers of a new request\n";
  {
    std::mutex mutex;
    std::condition_variable cv;
    bool others_waiting = false;
    auto slow_pay = [&](idem::ClaimHold&) {
      ++gateway_calls;
      std::unique_lock lock(mutex);
      cv.wait(lock, [&] { return others_waiting; });  // hold the owner until the others joined
      return receipt("pay_r-2", 1000);
    };
    std::vector<idem::CoordinatedResult> results(4);
    std::vector<std::thread> callers;
    for (int i = 0; i < 4; ++i) {
      callers.emplace_back(
          [&, i] { results[i] = coordinator->run(policy, payment_call("r-2", 1000), slow_pay); });
    }
    while (coordinator->waiters("create-payment:r-2") < 3)
      std::this_thread::yield();
    {
      std::lock_guard lock(mutex);
      others_waiting = true;
    }
    cv.notify_all();
    for (auto& caller : callers)
      caller.join();
    for (int i = 0; i < 4; ++i)
      print("caller " + std::to_string(i + 1), results[i]);
  }

  std::cout << "4. a failure is not cached\n";
  try {
    coordinator->run(policy, payment_call("r-3", 500), [&](idem::ClaimHold&) -> idem::Execution {
      ++gateway_calls;
      throw std::runtime_error("gateway timeout");
    });
  } catch (const std::runtime_error& e) {
    std::cout << "  caller: failed: " << e.what() << "\n";
  }
  print("retry", coordinator->run(policy, payment_call("r-3", 500), pay("r-3", 500)));

  std::cout << "5. the same key with other arguments\n";
  try {
    auto other_amount = payment_call("r-1", 9999);
    coordinator->run(policy, other_amount, pay("r-1", 9999));
  } catch (const idem::KeyReuseError& e) {
    std::cout << "  caller: refused: " << e.what() << "\n";
  }

  std::cout << "6. another process while this one runs\n";
  {
    auto other_process = idem::make_idempotency_coordinator(store);
    auto rejecting = policy;
    rejecting.in_progress = idem::InProgressPolicy::reject;
    std::latch running(1);
    std::latch finish(1);
    std::thread owner([&] {
      coordinator->run(policy, payment_call("r-4", 700), [&](idem::ClaimHold&) {
        ++gateway_calls;
        running.count_down();
        finish.wait();
        return receipt("pay_r-4", 700);
      });
    });
    running.wait();
    try {
      other_process->run(rejecting, payment_call("r-4", 700), pay("r-4", 700));
    } catch (const idem::AlreadyInProgress& e) {
      std::cout << "  other process: " << e.what() << "\n";
    }
    finish.count_down();
    owner.join();
    print("other process, later",
          other_process->run(rejecting, payment_call("r-4", 700), pay("r-4", 700)));
  }

  std::cout << "\ngateway calls: " << gateway_calls << " (one per request: r-1, r-2, r-3 twice "
            << "because the first try failed, r-4)\n";
  return gateway_calls == 5 ? 0 : 1;
}
