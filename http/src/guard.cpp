#include "idem/http/guard.hpp"

#include <algorithm>
#include <exception>
#include <list>
#include <mutex>
#include <typeindex>
#include <unordered_map>
#include <utility>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/steady_timer.hpp>
#include <asio/strand.hpp>
#include <asio/system_error.hpp>
#include <asio/this_coro.hpp>

#include "idem/async/detail/holder_wait.hpp"
#include "idem/async/detail/renewal.hpp"
#include "idem/detail/lease_renewer.hpp"
#include "idem/error.hpp"

namespace idem::http {

namespace {

// A waiting request polls the store from this interval, doubling up to the cap.
constexpr Millis kFirstPoll{2};
constexpr Millis kPollCap{100};

constexpr std::string_view kMismatchDetail =
    "this key was first used with a different request; use a new key for a new request";

// The stored value's bytes, from a durable store (bytes) or the in-memory one (the object).
std::optional<std::string_view> stored_bytes(const IdempotencyRecord& record) {
  if (record.value.bytes) return std::string_view(*record.value.bytes);
  if (record.value.object && record.value.type == std::type_index(typeid(std::string))) {
    return std::string_view(*static_cast<const std::string*>(record.value.object.get()));
  }
  return std::nullopt;
}

// Whether `route` keeps an outcome of `kind` at all (a ttl of zero keeps nothing).
bool keeps_outcome(const Route& route, OutcomeKind kind) noexcept {
  return route.policy.ttl > Millis::zero() && keeps(route.policy, kind);
}

std::string failure_words(const std::exception& error) {
  if (const auto* idem_error = dynamic_cast<const Error*>(&error)) {
    return "the store answered " + std::string(idem_error->code_name());
  }
  return "the store could not be reached";
}

// GuardOptions::replay_cache: replays remembered by store key, least recently used first out.
// Every member function is under the mutex; a hit copies the replay out.
class ReplayCache {
 public:
  enum class Found { none, replay, mismatch };

  explicit ReplayCache(const ReplayCacheOptions& options) : options_(options) {}

  bool on() const noexcept { return options_.max_entries > 0; }

  // The entry for `key` if it is still valid at `wall` (the record not expired) and `steady` (no
  // older than max_age): `replay` (copied to `out`) when `fingerprint` matches the record's, else
  // `mismatch`. A stale entry is dropped.
  Found find(std::string_view key, std::optional<std::string_view> fingerprint, WallTime wall,
             SteadyTime steady, Response& out) {
    std::lock_guard lock(mutex_);
    const auto found = index_.find(key);
    if (found == index_.end()) return Found::none;
    const auto entry = found->second;
    if (wall >= entry->expires_at || steady - entry->stored_at >= options_.max_age) {
      erase(found);
      return Found::none;
    }
    entries_.splice(entries_.begin(), entries_, entry);
    // As the store decides (ClaimOutcome::found): both known and different is another request.
    if (fingerprint && entry->fingerprint && *fingerprint != *entry->fingerprint) {
      return Found::mismatch;
    }
    out = entry->response;
    return Found::replay;
  }

  // Remembers `response` (the replay as sent) for `key`, replacing what was there.
  void put(std::string_view key, std::optional<std::string> fingerprint, const Response& response,
           WallTime expires_at, SteadyTime stored_at) {
    std::size_t bytes = sizeof(Entry) + 2 * key.size() + response.body.size() +
                        (fingerprint ? fingerprint->size() : 0);
    for (const Header& header : response.headers)
      bytes += sizeof(Header) + header.name.size() + header.value.size();
    if (bytes > options_.max_bytes) return;
    std::lock_guard lock(mutex_);
    if (const auto found = index_.find(key); found != index_.end()) erase(found);
    while (!entries_.empty() &&
           (entries_.size() >= options_.max_entries || bytes_ + bytes > options_.max_bytes)) {
      erase(index_.find(std::string_view(entries_.back().key)));
    }
    entries_.push_front(
        Entry{std::string(key), std::move(fingerprint), response, expires_at, stored_at, bytes});
    index_.emplace(std::string_view(entries_.front().key), entries_.begin());
    bytes_ += bytes;
  }

 private:
  struct Entry {
    std::string key;
    std::optional<std::string> fingerprint;  // the record's
    Response response;                       // the replay, its headers set
    WallTime expires_at;                     // the record's
    SteadyTime stored_at;                    // when it was read from the store
    std::size_t bytes = 0;                   // what it counts against max_bytes
  };
  using Entries = std::list<Entry>;
  using Index = std::unordered_map<std::string_view, Entries::iterator>;

  void erase(Index::iterator found) {
    const Entries::iterator entry = found->second;
    bytes_ -= entry->bytes;
    index_.erase(found);  // before the entry: the index's key views the entry's
    entries_.erase(entry);
  }

  const ReplayCacheOptions options_;
  std::mutex mutex_;
  Entries entries_;  // most recently used first
  Index index_;      // keys view entries_' keys
  std::size_t bytes_ = 0;
};

}  // namespace

struct Guard::Shared {
  std::shared_ptr<async::AsyncStore> store;
  GuardOptions options;
  GuardHooks hooks;
  std::unique_ptr<ReplayCache> replay_cache;  // null when off

  void emit(const GuardEvent& event) const noexcept {
    if (!hooks.observer) return;
    try {
      hooks.observer(event);
    } catch (...) {
      // An observer's failure is not the request's.
    }
  }
};

// A held claim. Its renewal starts lazily: most upstreams answer well within a third of the
// lease, and such a claim is never renewed, so a claim arms one timer for its first renewal's due
// time (lease/3 after the claim, on the guard's clock) and starts the renewal coroutine only when
// that timer finds the claim still open. The keeper then starts from the claim's time, so its
// first renewal is at once and the schedule is the one of a keeper started with the claim.
struct Decision::Claim : std::enable_shared_from_this<Decision::Claim> {
  std::shared_ptr<Guard::Shared> shared;
  std::string key;
  std::uint64_t token = 0;
  Millis lease{};
  SteadyTime claimed_at{};  // on the guard's clock
  asio::any_io_executor executor;
  std::string route;       // for events
  std::string key_digest;  // for events
  bool open = true;        // neither finish() nor release() ran yet (the decision's coroutine)

  // The due timer's handler runs on `executor`, stop_renewal() on the decision's coroutine:
  // what follows is under `mutex`.
  std::mutex mutex;
  bool stopped = false;
  std::weak_ptr<asio::steady_timer> due;  // the pending due timer (its wait's handler owns it)
  // The lease renewal once due: the one renewal rule of both faces, on the guard's clock
  // (idem/async/detail/renewal.hpp).
  std::optional<async::detail::LeaseKeeper> renewal;

  Claim(std::shared_ptr<Guard::Shared> s, std::string k, std::uint64_t t, Millis l, SteadyTime at,
        asio::any_io_executor ex)
      : shared(std::move(s)),
        key(std::move(k)),
        token(t),
        lease(l),
        claimed_at(at),
        executor(std::move(ex)) {}

  // Arms the timer of the first renewal (once, after construction).
  void arm_renewal() {
    auto timer = std::make_shared<asio::steady_timer>(executor);
    std::lock_guard lock(mutex);
    wait_for_due(std::move(timer));
  }

  void stop_renewal() noexcept {
    std::lock_guard lock(mutex);
    stopped = true;
    if (const std::shared_ptr<asio::steady_timer> timer = due.lock()) timer->cancel();
    if (renewal) renewal->stop();
  }
  // True once a renewal was fenced off: another owner has the key.
  bool lost() noexcept {
    std::lock_guard lock(mutex);
    return renewal && renewal->fenced();
  }

  // Releases `claim` in the store (when that fails, the claim lapses with its lease) and reports
  // it released. The coroutine holds `claim` until it ends.
  static async::Task<void> release_and_report(std::shared_ptr<Claim> claim) {
    try {
      (void)co_await claim->shared->store->release(claim->key, claim->token);
    } catch (...) {
      // The claim then lapses with its lease.
    }
    GuardEvent event;
    event.kind = GuardEvent::Kind::released;
    event.route = claim->route;
    event.key_digest = claim->key_digest;
    event.token = claim->token;
    claim->shared->emit(event);
  }

 private:
  // The wait's handler owns the timer, and the claim only a weak reference to it: the timer goes
  // with the handler, also when the executor's context is destroyed with the wait pending, so a
  // claim never owns an I/O object that could outlive its context.
  struct DueHandler {
    std::shared_ptr<asio::steady_timer> timer;
    std::weak_ptr<Claim> claim;

    void operator()(const asio::error_code&) {
      const std::shared_ptr<Claim> held = claim.lock();
      if (!held) return;
      std::lock_guard lock(held->mutex);
      if (held->stopped) return;  // finished, released or dropped first: never renewed
      held->on_due(std::move(timer));
    }
  };

  // Under `mutex`, not stopped.
  void wait_for_due(std::shared_ptr<asio::steady_timer> timer) {
    const std::shared_ptr<Clock>& clock = shared->hooks.clock;
    const SteadyTime at = claimed_at + idem::detail::renewal_interval(lease);
    timer->expires_after(std::chrono::duration_cast<asio::steady_timer::duration>(
        idem::detail::renewal_wait(*clock, at, clock->steady_now())));
    due = timer;
    asio::steady_timer& waiting = *timer;
    waiting.async_wait(DueHandler{std::move(timer), weak_from_this()});
  }

  // Under `mutex`, not stopped: the first renewal's time, or (an injected clock) a look at it.
  void on_due(std::shared_ptr<asio::steady_timer> timer) {
    const std::shared_ptr<Clock>& clock = shared->hooks.clock;
    if (clock->steady_now() < claimed_at + idem::detail::renewal_interval(lease)) {
      wait_for_due(std::move(timer));  // an injected clock not there yet, or an early wake
      return;
    }
    due.reset();
    renewal.emplace(
        asio::make_strand(executor), clock, lease,
        [store = shared->store, key = key, token = token, lease = lease] {
          return store->renew(key, token, lease);
        },
        claimed_at);
  }
};

Guard::Guard(std::shared_ptr<async::AsyncStore> store, GuardOptions options, GuardHooks hooks)
    : shared_(std::make_shared<Shared>()) {
  if (!store) throw InvalidArgument("idem::http::Guard needs a store (got null)");
  shared_->store = std::move(store);
  shared_->options = normalized(std::move(options));
  if (shared_->options.replay_cache.max_entries > 0) {
    shared_->replay_cache = std::make_unique<ReplayCache>(shared_->options.replay_cache);
  }
  if (!hooks.clock) hooks.clock = system_clock();
  shared_->hooks = std::move(hooks);
}

Guard::~Guard() = default;

const GuardOptions& Guard::options() const noexcept {
  return shared_->options;
}
const std::shared_ptr<async::AsyncStore>& Guard::store() const noexcept {
  return shared_->store;
}

async::Task<Decision> Guard::begin(const Request& request) {
  std::shared_ptr<Shared> shared = shared_;
  Decision decision;
  decision.shared_ = shared;
  decision.inspection_ = inspect(shared->options, request);
  const Inspection& inspection = decision.inspection_;
  const std::string_view route_name =
      inspection.route != nullptr ? std::string_view(inspection.route->name) : std::string_view();
  GuardEvent event;
  event.route = route_name;
  const auto refuse = [&](Refusal refusal, std::string_view detail, bool waited) {
    decision.action_ = Decision::Action::respond;
    decision.response_ = problem(shared->options, refusal, detail);
    event.kind = GuardEvent::Kind::refused;
    event.refusal = refusal;
    event.waited = waited;
    shared->emit(event);
  };
  switch (inspection.kind) {
    case Inspection::Kind::pass:
      decision.action_ = Decision::Action::forward;
      event.kind = GuardEvent::Kind::passed;
      shared->emit(event);
      co_return decision;
    case Inspection::Kind::refuse:
      refuse(inspection.refusal, inspection.detail, false);
      co_return decision;
    case Inspection::Kind::guarded:
      break;
  }
  const GuardedRequest& guarded = inspection.guarded;
  event.key_digest = guarded.key_digest;
  const DuplicatePolicy& policy = guarded.route->policy;
  const std::shared_ptr<Clock>& clock = shared->hooks.clock;
  const std::optional<std::string_view> fingerprint(guarded.fingerprint);
  std::optional<SteadyTime> deadline;
  // The replay cache answers as the store would for a record it replayed: never under `reject`.
  ReplayCache* const cache =
      policy.after_finished != ReusePolicy::reject ? shared->replay_cache.get() : nullptr;
  if (cache != nullptr) {
    switch (cache->find(guarded.store_key, fingerprint, clock->wall_now(), clock->steady_now(),
                        decision.response_)) {
      case ReplayCache::Found::none:
        break;
      case ReplayCache::Found::replay:
        decision.action_ = Decision::Action::respond;
        event.kind = GuardEvent::Kind::replayed;
        event.status = decision.response_.status;
        event.cached = true;
        shared->emit(event);
        co_return decision;
      case ReplayCache::Found::mismatch:
        event.cached = true;
        refuse(Refusal::fingerprint_mismatch, kMismatchDetail, false);
        co_return decision;
    }
  }
  async::detail::HolderWait holder_wait(clock, kFirstPoll, kPollCap);
  bool waited = false;
  for (;;) {
    ClaimOutcome claim;
    std::string failure;
    // The lease runs from the claim's request: the renewals are timed from here.
    const SteadyTime claim_started = clock->steady_now();
    try {
      claim = co_await shared->store->claim_without_report(guarded.store_key, fingerprint,
                                                           policy.lease);
    } catch (const asio::system_error& e) {
      if (e.code() == asio::error::operation_aborted) throw;
      failure = "the store could not be reached";
    } catch (const std::exception& e) {
      failure = failure_words(e);
    }
    if (!failure.empty()) {
      refuse(Refusal::store_unavailable, failure + "; nothing was forwarded, retry later", waited);
      co_return decision;
    }
    switch (claim.status) {
      case ClaimOutcome::Status::acquired: {
        asio::any_io_executor executor = co_await asio::this_coro::executor;
        auto held =
            std::make_shared<Decision::Claim>(shared, guarded.store_key, claim.token, policy.lease,
                                              claim_started, std::move(executor));
        held->route = guarded.route->name;
        held->key_digest = guarded.key_digest;
        held->arm_renewal();
        decision.claim_ = std::move(held);
        decision.action_ = Decision::Action::forward;
        event.kind = GuardEvent::Kind::claimed;
        event.token = claim.token;
        event.took_over = claim.took_over;
        event.waited = waited;
        shared->emit(event);
        co_return decision;
      }
      case ClaimOutcome::Status::completed: {
        if (policy.after_finished == ReusePolicy::reject) {
          refuse(Refusal::key_spent,
                 "this key was already used, and this route does not replay its outcome", waited);
          co_return decision;
        }
        std::optional<StoredResponse> stored;
        if (claim.record) {
          if (const std::optional<std::string_view> bytes = stored_bytes(*claim.record)) {
            try {
              stored = decode_stored(*bytes);
            } catch (const DecodeError&) {
            }
          }
        }
        if (!stored) {
          refuse(Refusal::store_unavailable, "the stored response for this key cannot be read",
                 waited);
          co_return decision;
        }
        decision.action_ = Decision::Action::respond;
        decision.response_ = std::move(stored->response);
        set_header(decision.response_.headers, kReplayedField, "true");
        set_header(decision.response_.headers, kExpiresField, http_date(claim.record->expires_at));
        // Cached only when this route itself keeps (and so replays) the stored kind of outcome.
        if (cache != nullptr && keeps_outcome(*guarded.route, stored->kind)) {
          cache->put(guarded.store_key, claim.record->fingerprint, decision.response_,
                     claim.record->expires_at, clock->steady_now());
        }
        event.kind = GuardEvent::Kind::replayed;
        event.status = decision.response_.status;
        event.waited = waited;
        shared->emit(event);
        co_return decision;
      }
      case ClaimOutcome::Status::mismatch:
        refuse(Refusal::fingerprint_mismatch, kMismatchDetail, waited);
        co_return decision;
      case ClaimOutcome::Status::in_progress: {
        if (policy.while_running == InProgressPolicy::reject) {
          refuse(Refusal::in_progress,
                 "the first request with this key is still being processed; retry later", false);
          co_return decision;
        }
        const SteadyTime now = clock->steady_now();
        if (!deadline) deadline = now + policy.max_wait;
        if (now >= *deadline) {
          refuse(Refusal::in_progress,
                 "the first request with this key is still being processed after waiting " +
                     std::to_string(policy.max_wait.count()) + " ms; retry later",
                 waited);
          co_return decision;
        }
        if (!waited) {
          event.kind = GuardEvent::Kind::waiting;
          shared->emit(event);
        }
        waited = true;
        // Wait for the first request's end, then claim again (idem/async/detail/holder_wait.hpp
        // says how). On Redis a replica's duplicate replays about one round trip after the first
        // request is stored. A failed wait is not the request's failure: the claim that follows
        // says whether the store is reachable.
        bool waited_out = true;
        try {
          waited_out = co_await holder_wait.once(
              *shared->store, guarded.store_key,
              claim.record ? std::optional(claim.record->token) : std::nullopt, *deadline);
        } catch (const asio::system_error& e) {
          if (e.code() == asio::error::operation_aborted) throw;
        } catch (const std::exception&) {
        }
        if (!waited_out) throw asio::system_error(asio::error::operation_aborted);
        continue;
      }
    }
  }
}

Decision::Decision(Decision&&) noexcept = default;
Decision& Decision::operator=(Decision&& other) noexcept {
  if (this != &other) {
    Decision old(std::move(*this));  // releases what this held
    action_ = other.action_;
    response_ = std::move(other.response_);
    inspection_ = std::move(other.inspection_);
    shared_ = std::move(other.shared_);
    claim_ = std::move(other.claim_);
  }
  return *this;
}

Decision::~Decision() {
  if (!claim_ || !claim_->open) return;
  std::shared_ptr<Claim> claim = std::move(claim_);
  claim->open = false;
  claim->stop_renewal();
  try {
    asio::co_spawn(claim->executor, Claim::release_and_report(claim), asio::detached);
  } catch (...) {
    // No executor to run on (its context is gone): the claim lapses with its lease.
  }
}

bool Decision::holds_claim() const noexcept {
  return claim_ && claim_->open;
}

bool Decision::would_keep(int status) const noexcept {
  if (!holds_claim() || inspection_.guarded.route == nullptr) return false;
  const Route& route = *inspection_.guarded.route;
  return keeps_outcome(route, outcome_of(route, status));
}

async::Task<Response> Decision::finish(Response upstream) {
  if (!holds_claim()) co_return upstream;
  std::shared_ptr<Claim> claim = claim_;
  claim->open = false;
  claim->stop_renewal();
  const Route& route = *inspection_.guarded.route;
  const std::shared_ptr<async::AsyncStore>& store = shared_->store;
  GuardEvent event;
  event.route = route.name;
  event.key_digest = inspection_.guarded.key_digest;
  event.token = claim->token;
  event.status = upstream.status;
  const OutcomeKind kind = outcome_of(route, upstream.status);
  const bool keep = keeps_outcome(route, kind) && upstream.body.size() <= route.max_stored_body;
  if (claim->lost()) {
    event.kind = GuardEvent::Kind::fenced;
    shared_->emit(event);
    co_return upstream;
  }
  bool completed = false;
  bool failed = false;
  if (keep) {
    std::string encoded = encode_stored(route, upstream, kind);
    StoredValue value;
    if (store->needs_bytes()) value.bytes = encoded;
    value.type = std::type_index(typeid(std::string));
    value.object = std::make_shared<const std::string>(std::move(encoded));
    ExecutionReport report;
    report.operation = "http " + route.name;
    report.started_at = shared_->hooks.clock->wall_now();
    report.metadata["http_status"] = std::to_string(upstream.status);
    report.metadata["outcome"] = std::string(to_string(kind));
    const std::string& key = claim->key;
    const Millis ttl = route.policy.ttl;
    try {
      completed = co_await store->complete(key, claim->token, std::move(value), report, ttl);
    } catch (...) {
      failed = true;  // the response is real; only its record is missing: free the key
    }
    if (completed) {
      set_header(upstream.headers, kExpiresField,
                 http_date(shared_->hooks.clock->wall_now() + route.policy.ttl));
      event.kind = GuardEvent::Kind::kept;
      shared_->emit(event);
      co_return upstream;
    }
    if (!failed) {
      event.kind = GuardEvent::Kind::fenced;  // another owner took the key over meanwhile
      shared_->emit(event);
      co_return upstream;
    }
  }
  try {
    (void)co_await store->release(claim->key, claim->token);
  } catch (...) {
    // The claim then lapses with its lease.
  }
  event.kind = GuardEvent::Kind::released;
  shared_->emit(event);
  co_return upstream;
}

async::Task<void> Decision::release() {
  if (!holds_claim()) co_return;
  std::shared_ptr<Claim> claim = claim_;
  claim->open = false;
  claim->stop_renewal();
  co_await Claim::release_and_report(std::move(claim));
}

}  // namespace idem::http
