// idem::http::Guard over the in-memory AsyncStore, no sockets: every decision of the rules
// (forward, replay, 400/409/422/503), the policy matrix, scoping, leases and takeover, and the
// fingerprint check on every path a duplicate can take.
#include "idem/http/guard.hpp"

#include <gtest/gtest.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <typeindex>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/async/memory_store.hpp"
#include "idem/error.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

using idem::async::Task;
using idem::http::Decision;
using idem::http::GuardEvent;
using idem::http::GuardOptions;
using idem::http::Request;
using idem::http::Response;
using idem::http::Route;
using namespace std::chrono_literals;

// An AsyncStore around the in-memory one that reports each claim's outcome and can fail calls.
class ObservedStore final : public idem::async::AsyncStore {
 public:
  explicit ObservedStore(std::shared_ptr<idem::Clock> clock = nullptr) {
    idem::InMemoryStoreOptions options;
    options.clock = std::move(clock);
    memory_ = std::make_shared<idem::InMemoryIdempotencyStore>(options);
    inner_ = std::make_shared<idem::async::AsyncMemoryStore>(memory_);
  }
  std::function<void(const idem::ClaimOutcome&)> on_claim;
  bool fail = false;
  std::atomic<int> claims{0};
  std::atomic<int> releases{0};
  std::atomic<int> renewals{0};
  const std::shared_ptr<idem::InMemoryIdempotencyStore>& memory() const { return memory_; }

 private:
  bool do_needs_bytes() const noexcept override { return false; }
  Task<idem::ClaimOutcome> do_claim(std::string_view key, std::optional<std::string_view> fp,
                                    idem::Millis lease) override {
    if (fail) throw idem::StoreError("down", /*retryable=*/true);
    ++claims;
    idem::ClaimOutcome outcome = co_await inner_->claim(key, fp, lease);
    if (on_claim) on_claim(outcome);
    co_return outcome;
  }
  Task<bool> do_complete(std::string_view key, std::uint64_t token, idem::StoredValue value,
                         const idem::ExecutionReport& report, idem::Millis ttl) override {
    if (fail) throw idem::StoreError("down", /*retryable=*/true);
    co_return co_await inner_->complete(key, token, std::move(value), report, ttl);
  }
  Task<bool> do_release(std::string_view key, std::uint64_t token) override {
    ++releases;
    if (fail) throw idem::StoreError("down", /*retryable=*/true);
    co_return co_await inner_->release(key, token);
  }
  Task<bool> do_renew(std::string_view key, std::uint64_t token, idem::Millis lease) override {
    ++renewals;
    co_return co_await inner_->renew(key, token, lease);
  }
  Task<std::optional<idem::IdempotencyRecord>> do_lookup(std::string_view key) override {
    co_return co_await inner_->lookup(key);
  }

  std::shared_ptr<idem::InMemoryIdempotencyStore> memory_;
  std::shared_ptr<idem::async::AsyncMemoryStore> inner_;
};

Request post(std::string key, std::string body = R"({"amount":5})", std::string target = "/pay") {
  Request request;
  request.method = "POST";
  request.target = std::move(target);
  if (!key.empty()) request.headers.push_back({"Idempotency-Key", "\"" + key + "\""});
  request.body = std::move(body);
  return request;
}

Response created(std::string body = R"({"id":1})") {
  Response response;
  response.status = 201;
  response.headers = {{"Content-Type", "application/json"}, {"X-Trace", "t1"}};
  response.body = std::move(body);
  return response;
}

// A response's fields as (name, value) pairs, in order.
std::vector<std::pair<std::string, std::string>> fields(const Response& response) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const idem::http::Header& header : response.headers)
    out.emplace_back(header.name, header.value);
  return out;
}

nlohmann::json problem_body(const Decision& decision) {
  return nlohmann::json::parse(const_cast<Decision&>(decision).response().body);
}

class HttpGuard : public ::testing::Test {
 protected:
  ~HttpGuard() override {
    // Let detached releases and stopped renewals end before the store goes.
    io_.restart();
    io_.run_for(5s);
  }

  // A guard whose events go to events_; `clock` is its clock (renewals), when given.
  void make_guard(GuardOptions options = {}, std::shared_ptr<idem::Clock> clock = nullptr) {
    idem::http::GuardHooks hooks;
    hooks.observer = [this](const GuardEvent& event) { events_.push_back(event); };
    hooks.clock = std::move(clock);
    guard_ = std::make_unique<idem::http::Guard>(store_, std::move(options), hooks);
  }
  static GuardOptions with_route(const std::function<void(Route&)>& adjust) {
    GuardOptions options;
    Route route;
    route.name = "pay";
    route.path = "/pay";
    adjust(route);
    options.routes.push_back(route);
    return options;
  }

  // Runs `task` until it completes (renewal timers of held claims keep the loop busy, so this
  // does not wait for the loop to run dry).
  template <class T>
  T drive(Task<T> task) {
    std::optional<T> value;
    std::exception_ptr error;
    bool done = false;
    asio::co_spawn(io_, std::move(task), [&](std::exception_ptr e, T v) {
      error = e;
      if (!e) value.emplace(std::move(v));
      done = true;
    });
    io_.restart();
    const auto until = std::chrono::steady_clock::now() + 60s;
    while (!done && std::chrono::steady_clock::now() < until)
      io_.run_one_for(100ms);
    if (!done) throw std::runtime_error("the coroutine did not finish");
    if (error) std::rethrow_exception(error);
    return std::move(*value);
  }
  Decision begin(const Request& request) { return drive(guard_->begin(request)); }
  Response finish(Decision& decision, Response response) {
    return drive(decision.finish(std::move(response)));
  }
  void release(Decision& decision) {
    drive([&]() -> Task<bool> {
      co_await decision.release();
      co_return true;
    }());
  }
  // Runs what is ready (a detached release) without waiting for timers.
  void settle() {
    io_.restart();
    io_.poll();
  }

  std::size_t count(GuardEvent::Kind kind) const {
    std::size_t n = 0;
    for (const GuardEvent& event : events_)
      n += event.kind == kind ? 1 : 0;
    return n;
  }

  asio::io_context io_;
  std::shared_ptr<ObservedStore> store_ = std::make_shared<ObservedStore>();
  std::unique_ptr<idem::http::Guard> guard_;
  std::vector<GuardEvent> events_;
};

TEST_F(HttpGuard, UnguardedRequestsPassWithoutAClaim) {
  make_guard();
  Request get = post("k");
  get.method = "GET";
  Decision decision = begin(get);
  EXPECT_EQ(decision.action(), Decision::Action::forward);
  EXPECT_FALSE(decision.holds_claim());
  EXPECT_EQ(finish(decision, created()).status, 201);
  Decision no_key = begin(post(""));
  EXPECT_EQ(no_key.action(), Decision::Action::forward);
  EXPECT_FALSE(no_key.holds_claim());
  EXPECT_EQ(store_->claims, 0);
  EXPECT_EQ(count(GuardEvent::Kind::passed), 2u);
}

TEST_F(HttpGuard, RequiredKeyMissingIs400Problem) {
  make_guard(with_route([](Route& r) { r.required = true; }));
  Decision decision = begin(post(""));
  ASSERT_EQ(decision.action(), Decision::Action::respond);
  EXPECT_EQ(decision.response().status, 400);
  EXPECT_EQ(problem_body(decision).at("code"), "key-missing");
  EXPECT_EQ(store_->claims, 0);
}

TEST_F(HttpGuard, FirstRequestForwardsThenDuplicatesReplay) {
  make_guard();
  Decision first = begin(post("k1"));
  ASSERT_EQ(first.action(), Decision::Action::forward);
  ASSERT_TRUE(first.holds_claim());
  const Response sent = finish(first, created());
  EXPECT_EQ(sent.status, 201);
  EXPECT_TRUE(idem::http::find_header(sent.headers, "Idempotency-Key-Expires"));
  EXPECT_FALSE(idem::http::find_header(sent.headers, "Idempotent-Replayed"));
  EXPECT_TRUE(idem::http::find_header(sent.headers, "X-Trace"));  // the first client gets all

  Decision again = begin(post("k1"));
  ASSERT_EQ(again.action(), Decision::Action::respond);
  const Response& replay = again.response();
  EXPECT_EQ(replay.status, 201);
  EXPECT_EQ(replay.body, R"({"id":1})");
  EXPECT_EQ(idem::http::find_header(replay.headers, "Idempotent-Replayed"), "true");
  EXPECT_EQ(idem::http::find_header(replay.headers, "Content-Type"), "application/json");
  EXPECT_FALSE(idem::http::find_header(replay.headers, "X-Trace"));  // not in stored_headers
  EXPECT_EQ(idem::http::find_header(replay.headers, "Idempotency-Key-Expires"),
            idem::http::find_header(sent.headers, "Idempotency-Key-Expires"));
  EXPECT_EQ(count(GuardEvent::Kind::kept), 1u);
  EXPECT_EQ(count(GuardEvent::Kind::replayed), 1u);
}

TEST_F(HttpGuard, MismatchIs422OnEveryPath) {
  make_guard();
  // The claim fails on a completed record: its fingerprint is checked, not its response replayed.
  Decision first = begin(post("k", R"({"amount":5})"));
  (void)finish(first, created());
  Decision other = begin(post("k", R"({"amount":6})"));
  ASSERT_EQ(other.action(), Decision::Action::respond);
  EXPECT_EQ(other.response().status, 422);
  EXPECT_EQ(problem_body(other).at("code"), "fingerprint-mismatch");

  // The claim fails on a running request: 422 at once, under either while_running policy.
  Decision running = begin(post("k2", "a"));
  ASSERT_TRUE(running.holds_claim());
  Decision different = begin(post("k2", "b"));
  EXPECT_EQ(different.response().status, 422);
  (void)finish(running, created());
}

TEST_F(HttpGuard, MismatchWhileRunningUnderRejectPolicy) {
  make_guard(with_route([](Route& r) { r.policy.while_running = idem::InProgressPolicy::reject; }));
  Decision running = begin(post("k", "a", "/pay"));
  ASSERT_TRUE(running.holds_claim());
  EXPECT_EQ(begin(post("k", "b", "/pay")).response().status, 422);
  Decision same = begin(post("k", "a", "/pay"));
  EXPECT_EQ(same.response().status, 409);
  EXPECT_EQ(problem_body(same).at("code"), "in-progress");
  EXPECT_EQ(idem::http::find_header(same.response().headers, "Retry-After"), "1");
  (void)finish(running, created());
}

TEST_F(HttpGuard, JoinWaitsForTheRunningRequestAndReplaysIt) {
  make_guard();
  Decision first = begin(post("k"));
  ASSERT_TRUE(first.holds_claim());
  // The second request waits; once the store has told it "in progress" the first one finishes.
  std::optional<Decision> second;
  bool finished_first = false;
  store_->on_claim = [&](const idem::ClaimOutcome& outcome) {
    if (outcome.status != idem::ClaimOutcome::Status::in_progress || finished_first) return;
    finished_first = true;
    asio::co_spawn(io_, first.finish(created("joined")), asio::detached);
  };
  second = begin(post("k"));
  ASSERT_TRUE(finished_first);
  ASSERT_EQ(second->action(), Decision::Action::respond);
  EXPECT_EQ(second->response().status, 201);
  EXPECT_EQ(second->response().body, "joined");
  EXPECT_EQ(idem::http::find_header(second->response().headers, "Idempotent-Replayed"), "true");
  ASSERT_EQ(count(GuardEvent::Kind::replayed), 1u);
  EXPECT_EQ(count(GuardEvent::Kind::waiting), 1u);
  EXPECT_TRUE(events_.back().waited);
}

TEST_F(HttpGuard, JoinThatFindsAnotherRequestAfterWaitingIs422) {
  make_guard();
  Decision first = begin(post("k", "a"));
  // While the duplicate waits, the first request is released and a request with another body
  // takes the key and completes: the waiter's next claim meets that record, and refuses it.
  bool swapped = false;
  store_->on_claim = [&](const idem::ClaimOutcome& outcome) {
    if (outcome.status != idem::ClaimOutcome::Status::in_progress || swapped) return;
    swapped = true;
    asio::co_spawn(
        io_,
        [&]() -> Task<void> {
          co_await first.release();
          const Request request = post("k", "b");
          Decision other = co_await guard_->begin(request);
          EXPECT_TRUE(other.holds_claim());
          Response response = created("b");
          (void)co_await other.finish(std::move(response));
        },
        asio::detached);
  };
  Decision waiter = begin(post("k", "a"));
  ASSERT_TRUE(swapped);
  EXPECT_EQ(waiter.response().status, 422);
}

TEST_F(HttpGuard, JoinGivesUpAfterMaxWaitWith409) {
  make_guard(with_route([](Route& r) { r.policy.max_wait = 0ms; }));
  Decision first = begin(post("k", "a", "/pay"));
  Decision second = begin(post("k", "a", "/pay"));
  ASSERT_EQ(second.action(), Decision::Action::respond);
  EXPECT_EQ(second.response().status, 409);
  (void)finish(first, created());
}

TEST_F(HttpGuard, TransientOutcomesReleaseTheKey) {
  make_guard();
  for (int status : {500, 503, 429}) {
    Decision first = begin(post("k"));
    ASSERT_TRUE(first.holds_claim()) << status;
    Response failed;
    failed.status = status;
    failed.body = "try later";
    const Response sent = finish(first, failed);
    EXPECT_EQ(sent.status, status);
    EXPECT_FALSE(idem::http::find_header(sent.headers, "Idempotency-Key-Expires"));
  }
  Decision last = begin(post("k"));
  EXPECT_TRUE(last.holds_claim());  // every failure let the next request run
  EXPECT_EQ(count(GuardEvent::Kind::released), 3u);
  (void)finish(last, created());
}

TEST_F(HttpGuard, TerminalFailuresReplayUnlessRerunFailed) {
  make_guard();
  Decision first = begin(post("k"));
  Response not_found;
  not_found.status = 404;
  (void)finish(first, not_found);
  EXPECT_EQ(begin(post("k")).response().status, 404);  // "success or an error"

  make_guard(
      with_route([](Route& r) { r.policy.after_finished = idem::ReusePolicy::rerun_failed; }));
  Decision failing = begin(post("k2", "x", "/pay"));
  ASSERT_TRUE(failing.holds_claim());
  (void)finish(failing, not_found);
  Decision rerun = begin(post("k2", "x", "/pay"));
  ASSERT_TRUE(rerun.holds_claim());
  (void)finish(rerun, created());
  EXPECT_EQ(begin(post("k2", "x", "/pay")).response().status, 201);
}

TEST_F(HttpGuard, KeepTransientStoresA500LikeStripe) {
  make_guard(with_route([](Route& r) { r.policy.keep_transient = true; }));
  Decision first = begin(post("k", "x", "/pay"));
  Response boom;
  boom.status = 500;
  boom.body = "boom";
  (void)finish(first, boom);
  const Decision again = begin(post("k", "x", "/pay"));
  EXPECT_EQ(const_cast<Decision&>(again).response().status, 500);
}

TEST_F(HttpGuard, RejectAfterFinishedSpendsTheKey) {
  make_guard(with_route([](Route& r) { r.policy.after_finished = idem::ReusePolicy::reject; }));
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  Decision again = begin(post("k", "x", "/pay"));
  EXPECT_EQ(again.response().status, 409);
  EXPECT_EQ(problem_body(again).at("code"), "key-spent");
}

TEST_F(HttpGuard, ZeroTtlGuardsOnlyWhileRunning) {
  make_guard(with_route([](Route& r) { r.policy.ttl = 0ms; }));
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  Decision again = begin(post("k", "x", "/pay"));
  EXPECT_TRUE(again.holds_claim());
  (void)finish(again, created());
}

TEST_F(HttpGuard, LargeBodiesAreNotKept) {
  make_guard(with_route([](Route& r) { r.max_stored_body = 4; }));
  Decision first = begin(post("k", "x", "/pay"));
  EXPECT_TRUE(first.would_keep(201));
  EXPECT_FALSE(first.would_keep(503));
  (void)finish(first, created("too large"));
  Decision again = begin(post("k", "x", "/pay"));
  EXPECT_TRUE(again.holds_claim());
  (void)finish(again, created("ok"));
  EXPECT_EQ(begin(post("k", "x", "/pay")).response().body, "ok");
}

TEST_F(HttpGuard, PrincipalsNeverSeeEachOthersResponses) {
  GuardOptions options;
  options.principal.headers = {"Authorization"};
  make_guard(options);
  Request alice = post("guessable");
  alice.headers.push_back({"Authorization", "Bearer alice"});
  Request mallory = post("guessable");
  mallory.headers.push_back({"Authorization", "Bearer mallory"});
  Decision first = begin(alice);
  (void)finish(first, created("alice's card"));
  Decision guess = begin(mallory);
  EXPECT_EQ(guess.action(), Decision::Action::forward);  // a new request of mallory's own
  EXPECT_TRUE(guess.holds_claim());
  (void)finish(guess, created("mallory's"));
  EXPECT_EQ(begin(alice).response().body, "alice's card");
}

TEST_F(HttpGuard, ReleaseAndDroppedDecisionsFreeTheKey) {
  make_guard();
  Decision first = begin(post("k"));
  release(first);
  EXPECT_FALSE(first.holds_claim());
  std::optional<Decision> dropped = begin(post("k"));
  ASSERT_TRUE(dropped->holds_claim());
  dropped.reset();  // e.g. the request's coroutine ended without finishing
  settle();
  Decision after = begin(post("k"));
  EXPECT_TRUE(after.holds_claim());
  (void)finish(after, created());
  EXPECT_EQ(count(GuardEvent::Kind::released), 2u);
}

TEST_F(HttpGuard, StoreFailureIs503AndNothingForwards) {
  make_guard();
  store_->fail = true;
  Decision decision = begin(post("k"));
  ASSERT_EQ(decision.action(), Decision::Action::respond);
  EXPECT_EQ(decision.response().status, 503);
  EXPECT_EQ(problem_body(decision).at("code"), "store-unavailable");
}

TEST_F(HttpGuard, StoreFailureOnFinishStillReturnsTheResponse) {
  make_guard();
  Decision first = begin(post("k"));
  store_->fail = true;
  const Response sent = finish(first, created());
  EXPECT_EQ(sent.status, 201);
  EXPECT_FALSE(idem::http::find_header(sent.headers, "Idempotency-Key-Expires"));
  EXPECT_EQ(count(GuardEvent::Kind::released), 1u);
}

TEST_F(HttpGuard, UnreadableStoredResponseIs503) {
  make_guard();
  const idem::http::Inspection inspection = idem::http::inspect(guard_->options(), post("k"));
  auto memory = store_->memory();
  const auto claim =
      memory->claim(inspection.guarded.store_key, inspection.guarded.fingerprint, 30s);
  idem::StoredValue garbage;
  garbage.object = std::make_shared<const std::string>("not a response");
  garbage.type = std::type_index(typeid(std::string));
  ASSERT_TRUE(memory->complete(inspection.guarded.store_key, claim.token, garbage, {}, 1h));
  EXPECT_EQ(begin(post("k")).response().status, 503);
}

// The replay cache (GuardOptions::replay_cache): off by default; on, it answers a replayed key's
// duplicates as the store path would, without the store.
GuardOptions cached(std::size_t entries, const std::function<void(Route&)>& adjust = {}) {
  GuardOptions options;
  options.replay_cache.max_entries = entries;
  Route route;
  route.name = "pay";
  route.path = "/pay";
  if (adjust) adjust(route);
  options.routes.push_back(route);
  return options;
}

TEST_F(HttpGuard, ReplayCacheIsOffByDefault) {
  make_guard(with_route([](Route&) {}));
  EXPECT_EQ(guard_->options().replay_cache.max_entries, 0u);
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  for (int i = 0; i < 3; ++i) {
    Decision again = begin(post("k", "x", "/pay"));
    EXPECT_EQ(again.response().status, 201);
    EXPECT_FALSE(events_.back().cached);
  }
  EXPECT_EQ(store_->claims, 4);  // every replay read the store
}

TEST_F(HttpGuard, ReplayCacheAnswersAReplayedKeyWithoutTheStore) {
  make_guard(cached(16));
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  Decision from_store = begin(post("k", "x", "/pay"));
  ASSERT_EQ(from_store.action(), Decision::Action::respond);
  EXPECT_FALSE(events_.back().cached);
  EXPECT_EQ(store_->claims, 2);
  for (int i = 0; i < 3; ++i) {
    Decision hit = begin(post("k", "x", "/pay"));
    ASSERT_EQ(hit.action(), Decision::Action::respond);
    EXPECT_EQ(hit.response().status, 201);
    EXPECT_EQ(hit.response().body, R"({"id":1})");
    EXPECT_EQ(fields(hit.response()), fields(from_store.response()));  // replayed, expiry
    EXPECT_EQ(idem::http::find_header(hit.response().headers, "Idempotent-Replayed"), "true");
    EXPECT_EQ(events_.back().kind, GuardEvent::Kind::replayed);
    EXPECT_EQ(events_.back().status, 201);
    EXPECT_TRUE(events_.back().cached);
  }
  EXPECT_EQ(store_->claims, 2);  // the hits never reached the store
  // Another key, another principal's or route's record: not this entry.
  Decision other = begin(post("k2", "x", "/pay"));
  EXPECT_TRUE(other.holds_claim());
  (void)finish(other, created());
}

TEST_F(HttpGuard, ReplayCacheRefusesAnotherFingerprintWith422) {
  make_guard(cached(16));
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  (void)begin(post("k", "x", "/pay"));  // replayed from the store: now cached
  const int claims = store_->claims;
  Decision other = begin(post("k", "y", "/pay"));
  ASSERT_EQ(other.action(), Decision::Action::respond);
  EXPECT_EQ(other.response().status, 422);
  EXPECT_EQ(problem_body(other).at("code"), "fingerprint-mismatch");
  EXPECT_EQ(events_.back().kind, GuardEvent::Kind::refused);
  EXPECT_EQ(events_.back().refusal, idem::http::Refusal::fingerprint_mismatch);
  EXPECT_TRUE(events_.back().cached);
  EXPECT_EQ(store_->claims, claims);
  // The store path's 422 is the same response.
  make_guard(cached(0, [](Route&) {}));
  Decision from_store = begin(post("k", "y", "/pay"));
  EXPECT_EQ(from_store.response().status, 422);
  EXPECT_EQ(problem_body(from_store), problem_body(other));
  EXPECT_EQ(fields(from_store.response()), fields(other.response()));
}

TEST_F(HttpGuard, ReplayCacheIsBoundedByEntriesAndBytes) {
  make_guard(cached(2));
  for (const char* key : {"a", "b", "c"}) {
    Decision first = begin(post(key, "x", "/pay"));
    (void)finish(first, created());
    (void)begin(post(key, "x", "/pay"));  // cached; "a" goes when "c" comes
  }
  int claims = store_->claims;
  (void)begin(post("b", "x", "/pay"));
  (void)begin(post("c", "x", "/pay"));
  EXPECT_EQ(store_->claims, claims);
  (void)begin(post("a", "x", "/pay"));
  EXPECT_EQ(store_->claims, claims + 1);
  EXPECT_FALSE(events_.back().cached);

  // Bodies of 2000 bytes in 6000 bytes: two fit, not three.
  GuardOptions options = cached(100);
  options.replay_cache.max_bytes = 6000;
  make_guard(options);
  const std::string body(2000, 'b');
  for (const char* key : {"d", "e", "f"}) {
    Decision first = begin(post(key, "x", "/pay"));
    (void)finish(first, created(body));
    (void)begin(post(key, "x", "/pay"));
  }
  claims = store_->claims;
  EXPECT_EQ(begin(post("e", "x", "/pay")).response().body, body);
  EXPECT_EQ(begin(post("f", "x", "/pay")).response().body, body);
  EXPECT_EQ(store_->claims, claims);
  EXPECT_EQ(begin(post("d", "x", "/pay")).response().body, body);
  EXPECT_EQ(store_->claims, claims + 1);

  // An entry larger than max_bytes is never cached.
  options.replay_cache.max_bytes = 100;
  make_guard(options);
  claims = store_->claims;
  (void)begin(post("d", "x", "/pay"));
  (void)begin(post("d", "x", "/pay"));
  EXPECT_EQ(store_->claims, claims + 2);
}

TEST_F(HttpGuard, ReplayCacheNeverServesUnderRejectAfterFinished) {
  make_guard(cached(16, [](Route& r) { r.policy.after_finished = idem::ReusePolicy::reject; }));
  Decision first = begin(post("k", "x", "/pay"));
  (void)finish(first, created());
  for (int i = 0; i < 3; ++i) {
    Decision again = begin(post("k", "x", "/pay"));
    EXPECT_EQ(again.response().status, 409);
    EXPECT_EQ(problem_body(again).at("code"), "key-spent");
    EXPECT_FALSE(events_.back().cached);
  }
  EXPECT_EQ(store_->claims, 4);
}

TEST_F(HttpGuard, ReplayCacheNeverHoldsAReleasedKey) {
  make_guard(cached(16));
  for (int i = 0; i < 2; ++i) {
    Decision first = begin(post("k", "x", "/pay"));
    ASSERT_TRUE(first.holds_claim());
    Response unavailable;
    unavailable.status = 503;
    (void)finish(first, unavailable);  // transient: released
  }
  Decision dropped = begin(post("k", "x", "/pay"));
  ASSERT_TRUE(dropped.holds_claim());
  release(dropped);
  Decision runs = begin(post("k", "x", "/pay"));
  ASSERT_TRUE(runs.holds_claim());  // every time the store's claim, never a replay
  (void)finish(runs, created());
  EXPECT_EQ(count(GuardEvent::Kind::replayed), 0u);
}

TEST_F(HttpGuard, ReplayCacheSkipsAFailureTheRouteWouldRunAgain) {
  // A failure kept under another configuration, read by a route that reruns failures: the store
  // path replays it as it finds it, and the cache keeps nothing this route would not have kept.
  make_guard(
      cached(16, [](Route& r) { r.policy.after_finished = idem::ReusePolicy::rerun_failed; }));
  const idem::http::Inspection inspection =
      idem::http::inspect(guard_->options(), post("k", "x", "/pay"));
  auto memory = store_->memory();
  const auto claim =
      memory->claim(inspection.guarded.store_key, inspection.guarded.fingerprint, 30s);
  Response not_found;
  not_found.status = 404;
  idem::StoredValue value;
  value.object = std::make_shared<const std::string>(
      idem::http::encode_stored(*inspection.guarded.route, not_found, idem::OutcomeKind::failure));
  value.type = std::type_index(typeid(std::string));
  ASSERT_TRUE(memory->complete(inspection.guarded.store_key, claim.token, value, {}, 1h));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(begin(post("k", "x", "/pay")).response().status, 404);
    EXPECT_FALSE(events_.back().cached);
  }
  EXPECT_EQ(store_->claims, 3);
}

TEST_F(HttpGuard, ReplayCacheOptionsAreValidated) {
  GuardOptions options = cached(16);
  options.replay_cache.max_age = 0ms;
  EXPECT_THROW(make_guard(options), idem::ConfigError);
  options.replay_cache.max_age = 2h;
  EXPECT_THROW(make_guard(options), idem::ConfigError);
  options.replay_cache.max_age = 1s;
  options.replay_cache.max_bytes = 0;
  EXPECT_THROW(make_guard(options), idem::ConfigError);
  options.replay_cache.max_entries = 0;  // off: the other fields do not matter
  EXPECT_NO_THROW(make_guard(options));
}

// Leases on a ManualClock: the store's (takeover) and, when a test gives it, the guard's own
// (renewals).
class HttpGuardLease : public HttpGuard {
 protected:
  HttpGuardLease() { store_ = std::make_shared<ObservedStore>(clock_); }

  // One route that guards every POST, its claims leased for `lease`.
  static GuardOptions leased(idem::Millis lease, const std::function<void(Route&)>& adjust = {}) {
    GuardOptions options;
    options.routes.push_back(Route{});
    options.routes.back().policy.lease = lease;
    if (adjust) adjust(options.routes.back());
    return options;
  }

  // The key `request` is stored under.
  std::string store_key(const Request& request) const {
    return idem::http::inspect(guard_->options(), request).guarded.store_key;
  }
  // Claims `request`'s key in the store directly, as another process would.
  idem::ClaimOutcome claim_elsewhere(const Request& request, idem::Millis lease) {
    const idem::http::Inspection inspection = idem::http::inspect(guard_->options(), request);
    return store_->memory()->claim(inspection.guarded.store_key, inspection.guarded.fingerprint,
                                   lease);
  }

  std::shared_ptr<idem::testing::ManualClock> clock_ =
      std::make_shared<idem::testing::ManualClock>();
};

TEST_F(HttpGuardLease, ADeadOwnersClaimIsTakenOverAfterItsLease) {
  make_guard(
      leased(10s, [](Route& r) { r.policy.while_running = idem::InProgressPolicy::reject; }));
  // A process that claimed the key and died: its claim is in the store, nobody renews it.
  const Request request = post("k");
  const auto dead = claim_elsewhere(request, 10s);
  ASSERT_EQ(dead.status, idem::ClaimOutcome::Status::acquired);
  Decision during = begin(request);
  EXPECT_EQ(during.response().status, 409);  // still leased
  clock_->advance(11s);
  Decision after = begin(request);
  ASSERT_TRUE(after.holds_claim());
  EXPECT_TRUE(events_.back().took_over);
  // The dead owner's late completion is fenced off.
  EXPECT_FALSE(store_->memory()->complete(store_key(request), dead.token, {}, {}, 1h));
  finish(after, created());
  EXPECT_EQ(events_.back().kind, GuardEvent::Kind::kept);
  io_.restart();
  io_.run_for(1s);
}

TEST_F(HttpGuardLease, AHeldClaimIsRenewedOnTheGuardsClock) {
  make_guard(leased(9s), clock_);  // renewed every 3 s of the guard's clock
  const Request request = post("k");
  Decision held = begin(request);
  ASSERT_TRUE(held.holds_claim());
  const auto run_until = [&](const std::function<bool()>& done) {
    io_.restart();
    for (int i = 0; i < 100 && !done(); ++i)
      io_.run_for(20ms);
  };
  // Not due on real time: nothing moved the guard's clock yet.
  io_.restart();
  io_.run_for(200ms);
  EXPECT_EQ(store_->renewals.load(), 0);
  for (int round = 1; round <= 3; ++round) {
    clock_->advance(3100ms);
    run_until([&] { return store_->renewals.load() == round; });
    EXPECT_EQ(store_->renewals.load(), round);
  }
  // 9.3 s after the claim, with a 9 s lease: alive because it was renewed.
  EXPECT_EQ(claim_elsewhere(request, 9s).status, idem::ClaimOutcome::Status::in_progress);
  EXPECT_EQ(finish(held, created()).status, 201);
  // Finished: no more renewals, however far the clock moves.
  const int renewed = store_->renewals.load();
  clock_->advance(10s);
  io_.restart();
  io_.run_for(200ms);
  EXPECT_EQ(store_->renewals.load(), renewed);
}

TEST_F(HttpGuardLease, AClaimThatEndsBeforeItsFirstRenewalIsNeverRenewed) {
  make_guard(leased(9s), clock_);
  const auto run_until = [&](const std::function<bool()>& done) {
    io_.restart();
    for (int i = 0; i < 100 && !done(); ++i)
      io_.run_for(20ms);
  };
  // Finished within the first third of its lease.
  Decision finished = begin(post("finished"));
  ASSERT_TRUE(finished.holds_claim());
  clock_->advance(2s);
  EXPECT_EQ(finish(finished, created()).status, 201);
  // Dropped (released in the background) within the first third of its lease.
  std::optional<Decision> dropped(begin(post("dropped")));
  ASSERT_TRUE(dropped->holds_claim());
  dropped.reset();
  run_until([&] { return store_->releases.load() == 1; });
  EXPECT_EQ(store_->releases.load(), 1);
  // However far the clock moves afterwards, neither is renewed.
  for (int round = 0; round < 3; ++round) {
    clock_->advance(5s);
    io_.restart();
    io_.run_for(50ms);
  }
  EXPECT_EQ(store_->renewals.load(), 0);
  // Nothing is left waiting on the event loop.
  io_.restart();
  EXPECT_EQ(io_.poll(), 0u);
  EXPECT_TRUE(io_.stopped());
}

TEST_F(HttpGuardLease, AFencedOwnerStillAnswersItsClient) {
  make_guard(leased(10s));
  const Request request = post("k");
  Decision stalled = begin(request);
  ASSERT_TRUE(stalled.holds_claim());
  // Its renewals did not reach the store (stalled process): another takes the key over.
  clock_->advance(11s);
  ASSERT_EQ(claim_elsewhere(request, 10s).status, idem::ClaimOutcome::Status::acquired);
  EXPECT_EQ(finish(stalled, created()).status, 201);
  EXPECT_EQ(events_.back().kind, GuardEvent::Kind::fenced);
  io_.restart();
  io_.run_for(1s);
}

TEST(HttpGuardOptions, RefusesANullStoreAndBadOptions) {
  EXPECT_THROW(idem::http::Guard(nullptr, {}), idem::InvalidArgument);
  GuardOptions bad;
  bad.routes.push_back(Route{});
  bad.routes.back().path = "nope";
  EXPECT_THROW(idem::http::Guard(std::make_shared<ObservedStore>(), bad), idem::ConfigError);
}

TEST_F(HttpGuardLease, AReplayCacheEntryLastsMaxAgeAndNeverPastTheRecord) {
  GuardOptions options = leased(30s, [](Route& r) { r.policy.ttl = 10s; });
  options.replay_cache.max_entries = 16;
  options.replay_cache.max_age = 1s;
  make_guard(options, clock_);
  const Request request = post("k");
  Decision first = begin(request);
  (void)finish(first, created());  // expires at t = 10s
  (void)begin(request);            // from the store: cached
  (void)begin(request);
  EXPECT_EQ(store_->claims, 2);
  EXPECT_TRUE(events_.back().cached);
  clock_->advance(999ms);
  (void)begin(request);
  EXPECT_EQ(store_->claims, 2);
  clock_->advance(1ms);  // max_age reached: the store again, which caches it anew
  (void)begin(request);
  EXPECT_EQ(store_->claims, 3);
  EXPECT_FALSE(events_.back().cached);
  clock_->advance(8500ms);  // t = 9.5s: cached again at t = 9.5s
  (void)begin(request);
  EXPECT_EQ(store_->claims, 4);
  (void)begin(request);
  EXPECT_TRUE(events_.back().cached);
  clock_->advance(600ms);  // t = 10.1s: younger than max_age, but the record has expired
  Decision after = begin(request);
  EXPECT_EQ(store_->claims, 5);
  ASSERT_TRUE(after.holds_claim());  // the key is free again: it runs
  (void)finish(after, created());
}

}  // namespace
