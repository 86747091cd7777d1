// The idempotency coordinator: in-process joining, store claims, lease renewals, replays.
//
// Shape of one run():
//   1. validate the key and the policy; refuse re-entry (ReentryError);
//   2. find or create the key's Flight in the in-process table. The first caller leads; the
//      others wait on the Flight (joiners). The Flight is registered BEFORE the store claim, so
//      an in-process duplicate never mistakes its own process's owner for another process;
//   3. the leader claims the key in the store: acquired -> execute (the lease renewer renews the
//   lease,
//      OwnedKeysScope marks the key as owned by this execution context); completed -> replay;
//      in_progress (another process) -> reject or wait and claim again; mismatch -> KeyReuse;
//   4. the leader publishes the outcome to its joiners. On success the Flight leaves the table
//      first, so a later caller replays from the store. On failure the Flight stays in the
//      table until the claim is released (ClaimHold tokens may keep it claimed); callers that
//      arrive meanwhile wait for the release and then start over.

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "idem/detail/flight.hpp"
#include "idem/detail/fork.hpp"
#include "idem/detail/lease_renewer.hpp"
#include "idem/error.hpp"
#include "idem/idempotency.hpp"
#include "idem/key.hpp"
#include "idem/memory_store.hpp"
#include "idempotency_metadata.hpp"
#include "keyed_hash.hpp"

namespace idem {

using detail::FlightEntry;
using detail::FlightLead;
using detail::FlightOutcome;
using detail::FlightWaiter;
using detail::SharedClaimHold;

std::string_view to_string(IdempotencyStatus status) noexcept {
  switch (status) {
    case IdempotencyStatus::executed:
      return "executed";
    case IdempotencyStatus::joined:
      return "joined";
    case IdempotencyStatus::replayed:
      return "replayed";
  }
  return "unknown";
}

// ---- execution context (re-entrancy) ----------------------------------------------------------

// The keys the current execution context owns: an immutable chain, one link per nested owner, so
// a context can be handed to another thread by sharing the pointer.
class OwnedKeys {
 public:
  OwnedKeys(const void* store, std::string key, std::shared_ptr<const OwnedKeys> parent)
      : store_(store), key_(std::move(key)), parent_(std::move(parent)) {}

  bool contains(const void* store, std::string_view key) const {
    for (const OwnedKeys* link = this; link != nullptr; link = link->parent_.get()) {
      if (link->store_ == store && link->key_ == key) return true;
    }
    return false;
  }

 private:
  const void* store_;  // the coordinator's identity, never dereferenced
  std::string key_;
  std::shared_ptr<const OwnedKeys> parent_;
};

namespace {
thread_local std::shared_ptr<const OwnedKeys> t_owned_keys;
}  // namespace

std::shared_ptr<const OwnedKeys> current_owned_keys() {
  return t_owned_keys;
}

OwnedKeysScope::OwnedKeysScope(std::shared_ptr<const OwnedKeys> keys)
    : previous_(std::exchange(t_owned_keys, std::move(keys))) {}

OwnedKeysScope::~OwnedKeysScope() {
  t_owned_keys = std::move(previous_);
}

namespace {

using RealClock = std::chrono::steady_clock;

// Waits re-read the injected clock at least this often: a ManualClock moved by a test cannot
// wake a condition variable.
constexpr auto kWaitSlice = std::chrono::milliseconds(20);

std::string quoted(std::string_view key) {
  return "'" + std::string(key) + "'";
}

// The key as the caller knows it: before scoping, when the caller said.
const std::string& shown_key(const IdempotentCall& call) {
  return call.caller_key.empty() ? call.key : call.caller_key;
}

std::string format_wall(WallTime t) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t.time_since_epoch());
  const std::time_t seconds =
      static_cast<std::time_t>(std::chrono::floor<std::chrono::seconds>(ms).count());
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char buffer[96];
  const auto millis = static_cast<int>(((ms.count() % 1000) + 1000) % 1000);
  std::snprintf(buffer, sizeof buffer, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900,
                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, millis);
  return buffer;
}

std::string type_name(const std::type_index& type) {
  int status = 0;
  char* demangled = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
  std::string name = (status == 0 && demangled != nullptr) ? demangled : type.name();
  std::free(demangled);
  return name;
}

// "claim token 7, started ..., completed ..., replayed until ..." or "claim token 7, its lease
// runs until ...": the claim that holds a key, as far as the record tells.
std::string holder_of(const IdempotencyRecord& record) {
  std::string out = "claim token " + std::to_string(record.token);
  if (record.state == IdempotencyRecord::State::completed) {
    if (record.report && record.report->started_at != WallTime{}) {
      out += ", started " + format_wall(record.report->started_at);
    }
    out += ", completed " + format_wall(record.completed_at) + ", replayed until " +
           format_wall(record.expires_at);
  } else {
    out += ", its lease runs until " + format_wall(record.lease_until);
  }
  return out;
}

void validate_policy(const IdempotencyPolicy& policy) {
  if (policy.lease <= Millis::zero()) {
    throw ConfigError("IdempotencyPolicy::lease must be positive (got " +
                      std::to_string(policy.lease.count()) + " ms)");
  }
  if (policy.ttl < Millis::zero()) {
    throw ConfigError("IdempotencyPolicy::ttl must not be negative (got " +
                      std::to_string(policy.ttl.count()) + " ms)");
  }
  if (policy.max_wait < Millis::zero()) {
    throw ConfigError("IdempotencyPolicy::max_wait must not be negative (got " +
                      std::to_string(policy.max_wait.count()) + " ms)");
  }
}

bool fingerprints_differ(const std::optional<std::string>& a, const std::optional<std::string>& b) {
  return a && b && *a != *b;
}

// Merges the idempotency_* entries of a coordinated result into its report, in key order.
void add_idempotency_metadata(ExecutionReport& report, const std::string& key,
                              IdempotencyStatus status, bool recorded) {
  const detail::MetadataKeys& keys = detail::metadata_keys();
  auto& metadata = report.metadata;
  auto at = metadata.lower_bound(keys.cache_hit);
  at = detail::set_metadata_after(metadata, at, keys.cache_hit,
                                  status == IdempotencyStatus::executed ? "false" : "true");
  at = detail::set_metadata_after(metadata, at, keys.enabled, "true");
  at = detail::set_metadata_after(metadata, at, keys.key, key);
  if (!recorded) at = detail::set_metadata_after(metadata, at, keys.recorded, "false");
  detail::set_metadata_after(metadata, at, keys.status, to_string(status));
}

// The stored value as the caller's type: the in-process object when there is one (its type
// checked against the call's; moved out of `stored`), else the bytes decoded with the call's
// codec.
std::shared_ptr<const void> replayed_value(StoredValue& stored, const IdempotentCall& call) {
  if (call.type && stored.type && *call.type != *stored.type) {
    throw DecodeError(detail::key_subject(call) + ": the stored result is a " +
                      type_name(*stored.type) + " but this call expects a " +
                      type_name(*call.type) + " (is the key shared by two operations?)");
  }
  if (stored.object) return std::move(stored.object);
  if (stored.bytes) {
    if (call.codec == nullptr || !call.codec->decode) {
      throw DecodeError(detail::key_subject(call) +
                        ": the stored result is bytes and the call has no codec to decode it");
    }
    return call.codec->decode(*stored.bytes);
  }
  return nullptr;  // a void result
}

// ---- in-flight state --------------------------------------------------------------------------

// A key with its hash, computed once per call and kept by the key's Flight, so the in-flight
// table is searched, filled and emptied without hashing the key again.
struct HashedKey {
  std::string_view text;
  std::size_t hash;

  static HashedKey of(std::string_view text) noexcept {
    return {text, static_cast<std::size_t>(detail::hash_bytes(text))};
  }
  bool operator==(const HashedKey& other) const noexcept {
    return hash == other.hash && text == other.text;
  }
};

struct HashedKeyHash {
  std::size_t operator()(const HashedKey& key) const noexcept { return key.hash; }
};

// One in-process execution of a key, shared by its leader and its joiners.
struct Flight {
  enum class Phase {
    running,    // the leader is claiming, executing or waiting for another process
    done,       // outcome published; no longer in the table
    lingering,  // execution failed (joiners told); the key stays claimed for ClaimHold tokens
    released,   // the lingering claim was released; no longer in the table
  };

  Flight(std::string k, std::size_t h, std::optional<std::string> fp,
         std::optional<std::type_index> t)
      : key(std::move(k)), hash(h), fingerprint(std::move(fp)), type(t) {}

  HashedKey table_key() const noexcept { return {key, hash}; }

  // Wakes the callers blocked in join() (mutex held).
  void notify_changed() {
    if (changed) changed->notify_all();
  }

  const std::string key;
  const std::size_t hash;  // of `key`, computed once per call (HashedKey)
  const std::optional<std::string> fingerprint;
  const std::optional<std::type_index> type;  // the leader's value type
  std::size_t attached = 0;  // callers that found this flight in the table (table mutex)

  std::mutex mutex;
  // Made by the first caller that blocks in join(): most flights (every replay, and every
  // execution nobody joins) have no one to wake.
  std::unique_ptr<std::condition_variable_any> changed;
  Phase phase = Phase::running;
  std::size_t waiting = 0;
  // The leader's claim once it acquired the key (token 0 until then), for the message of a
  // joiner refused for other arguments.
  std::uint64_t token = 0;
  WallTime claimed_at{};
  // The outcome (phase done or lingering). Neither a result nor an error: start over. The
  // result is the joiners' (status joined or replayed, metadata merged), built once and shared.
  std::shared_ptr<const CoordinatedResult> joined;
  std::exception_ptr error;

  // Waiters that entered through enter(), each knowing its index here (see take_ready()).
  std::vector<std::shared_ptr<FlightWaiter>> waiters;
};

// A caller about to join a running flight: same arguments, same value type (flight->mutex held).
void check_joinable(const Flight& flight, const IdempotentCall& call) {
  if (fingerprints_differ(flight.fingerprint, call.fingerprint)) {
    const std::string holder =
        flight.token == 0 ? std::string("another call in this process is claiming it")
                          : "claim token " + std::to_string(flight.token) + " of this process, " +
                                "started " + format_wall(flight.claimed_at);
    throw KeyReuseError(shown_key(call),
                        detail::key_subject(call) +
                            " is being executed with different arguments (the fingerprints "
                            "differ; " +
                            holder + "); this call did not run",
                        call.operation);
  }
  if (call.type && flight.type && *call.type != *flight.type) {
    // Handing over the leader's object would give this caller a value of the wrong type.
    throw DecodeError(detail::key_subject(call) + " is being executed for a " +
                      type_name(*flight.type) + " result but this call expects a " +
                      type_name(*call.type) + " (is the key shared by two operations?)");
  }
}

}  // namespace

// The coordinator's side of FlightWaiter: its registration in a flight's list.
struct detail::FlightAccess {
  static void list(Flight& flight, const std::shared_ptr<FlightWaiter>& waiter,
                   std::shared_ptr<Flight> owner, bool joining) {
    waiter->flight_ = std::move(owner);
    waiter->joining_ = joining;
    waiter->index_ = flight.waiters.size();
    flight.waiters.push_back(waiter);
    ++flight.waiting;
  }
  // Unlists the waiter at `index` (flight.mutex held): the last one takes its slot.
  static std::shared_ptr<FlightWaiter> unlist(Flight& flight, std::size_t index) {
    std::shared_ptr<FlightWaiter> waiter = std::move(flight.waiters[index]);
    waiter->index_ = FlightWaiter::kUnlisted;
    if (index + 1 != flight.waiters.size()) {
      flight.waiters[index] = std::move(flight.waiters.back());
      flight.waiters[index]->index_ = index;
    }
    flight.waiters.pop_back();
    --flight.waiting;
    return waiter;
  }
  static Flight* flight_of(const FlightWaiter& waiter) {
    return static_cast<Flight*>(waiter.flight_.get());
  }
  static std::size_t index_of(const FlightWaiter& waiter) { return waiter.index_; }
  static bool joining(const FlightWaiter& waiter) { return waiter.joining_; }
};

void FlightWaiter::detach() {
  Flight* flight = detail::FlightAccess::flight_of(*this);
  if (flight == nullptr) return;
  std::shared_ptr<FlightWaiter> self;  // released outside the lock
  std::lock_guard lock(flight->mutex);
  if (index_ != kUnlisted) self = detail::FlightAccess::unlist(*flight, index_);
}

namespace {

// The waiters whose wait has ended, with what each is told (flight.mutex held); notify them
// after unlocking (notify_all()).
struct Ready {
  std::vector<std::shared_ptr<FlightWaiter>> waiters;
  FlightOutcome joined;  // for waiters that joined the flight; the others start over
};

Ready take_ready(Flight& flight) {
  Ready ready;
  if (flight.waiters.empty()) return ready;
  if (flight.error) {
    ready.joined.kind = FlightOutcome::Kind::error;
    ready.joined.error = flight.error;
  } else if (flight.joined) {
    ready.joined.kind = FlightOutcome::Kind::result;
    ready.joined.result = flight.joined;
  }
  for (std::size_t i = flight.waiters.size(); i-- > 0;) {
    const FlightWaiter& waiter = *flight.waiters[i];
    const bool done = detail::FlightAccess::joining(waiter)
                          ? flight.phase != Flight::Phase::running
                          : flight.phase != Flight::Phase::lingering;
    if (done) ready.waiters.push_back(detail::FlightAccess::unlist(flight, i));
  }
  std::reverse(ready.waiters.begin(), ready.waiters.end());  // in the order they came
  return ready;
}

void notify_all(Ready ready) {
  static const FlightOutcome start_over{};
  for (const auto& waiter : ready.waiters) {
    waiter->notify(detail::FlightAccess::joining(*waiter) ? ready.joined : start_over);
  }
}

class Coordinator;

// Keeps a failed execution's key claimed while ClaimHold tokens live; releases it when the last
// reference (the owner's or a token) goes.
class ReleaseGuard {
 public:
  ReleaseGuard(std::shared_ptr<Coordinator> coordinator, std::shared_ptr<IdempotencyStore> store,
               std::shared_ptr<Flight> flight, std::shared_ptr<detail::LeaseRenewer::Lease> renewal,
               std::uint64_t token)
      : coordinator_(std::move(coordinator)),
        store_(std::move(store)),
        flight_(std::move(flight)),
        renewal_(std::move(renewal)),
        token_(token) {}
  ReleaseGuard(const ReleaseGuard&) = delete;
  ReleaseGuard& operator=(const ReleaseGuard&) = delete;
  ~ReleaseGuard();

  // The execution succeeded: nothing to release when the last reference goes.
  void disarm() noexcept { armed_ = false; }

 private:
  std::shared_ptr<Coordinator> coordinator_;
  std::shared_ptr<IdempotencyStore> store_;
  std::shared_ptr<Flight> flight_;
  std::shared_ptr<detail::LeaseRenewer::Lease> renewal_;
  std::uint64_t token_;
  std::atomic<bool> armed_{true};
};

// ---- the coordinator --------------------------------------------------------------------------

class Coordinator final : public IdempotencyCoordinator,
                          public std::enable_shared_from_this<Coordinator> {
 public:
  // `store` is held strongly by an independent coordinator, weakly by a shared one (the
  // registry must not keep users' stores alive).
  Coordinator(std::shared_ptr<IdempotencyStore> store, bool hold_store)
      : store_weak_(store),
        store_strong_(hold_store ? store : nullptr),
        // An in-process coordinator (no store) is its own identity.
        identity_(store ? static_cast<const void*>(store.get()) : static_cast<const void*>(this)),
        renewer_("this idempotency coordinator (of a resilient call)") {}

  CoordinatedResult run(const IdempotencyPolicy& policy, const IdempotentCall& call,
                        const std::function<Execution(ClaimHold&)>& execute) override;

  std::size_t waiters(std::string_view key) const override {
    const HashedKey hashed = HashedKey::of(key);
    std::lock_guard lock(table_mutex_);
    auto it = table_.find(hashed);
    if (it == table_.end()) return 0;
    std::lock_guard flight_lock(it->second->mutex);
    return it->second->waiting;
  }

  // The flight leaves the table; returns how many callers had found it there.
  std::size_t erase(const std::shared_ptr<Flight>& flight) {
    std::lock_guard lock(table_mutex_);
    auto it = table_.find(flight->table_key());
    if (it != table_.end() && it->second == flight) {
      spare_node_ = table_.extract(it);
      spare_node_.mapped().reset();  // not the last reference: the caller holds `flight`
    }
    return flight->attached;
  }

  void forget_claim(const std::shared_ptr<detail::LeaseRenewer::Lease>& renewal) {
    renewer_.remove(renewal);
  }

  FlightEntry enter(const IdempotentCall& call, std::shared_ptr<FlightWaiter> waiter) override;

  // Ends a flight that did not execute (replay, rejection, store error, or start over).
  void finish(const std::shared_ptr<Flight>& flight, std::exception_ptr error,
              const CoordinatedResult* result);
  // A completed record's replay for the leader of `flight` (and, through finish, its joiners).
  CoordinatedResult replay(const std::shared_ptr<Flight>& flight, const IdempotentCall& call,
                           IdempotencyRecord&& record);
  // The owner's success: hand it to the joiners.
  CoordinatedResult executed(const std::shared_ptr<Flight>& flight, Execution execution,
                             bool recorded, bool took_over);
  // The owner failed: joiners share `error` at once; the flight stays until released().
  static void linger(Flight& flight, std::exception_ptr error);
  // The failed owner's claim is gone: the flight leaves the table, its waiters start over.
  void released(const std::shared_ptr<Flight>& flight);

 private:
  using Table = std::unordered_map<HashedKey, std::shared_ptr<Flight>, HashedKeyHash>;

  // Puts a flight whose key is not in the table into it (table_mutex_ held), in the node the
  // last flight to leave left behind when there is one: one allocation less per call.
  void add_locked(const std::shared_ptr<Flight>& flight) {
    if (spare_node_.empty()) {
      table_.emplace(flight->table_key(), flight);
      return;
    }
    spare_node_.key() = flight->table_key();
    spare_node_.mapped() = flight;
    table_.insert(std::move(spare_node_));
  }

  std::shared_ptr<IdempotencyStore> lock_store() const {
    renewer_.check_process();  // in a child of fork(): ConfigError before the store is touched
    if (store_strong_) return store_strong_;
    auto store = store_weak_.lock();
    if (!store) {
      throw ConfigError(
          "the idempotency store of this coordinator was destroyed (or it has none: an "
          "in-process coordinator only joins through enter())");
    }
    return store;
  }

  CoordinatedResult join(const std::shared_ptr<Flight>& flight, const IdempotencyPolicy& policy,
                         const IdempotentCall& call, bool& start_over);
  CoordinatedResult lead(IdempotencyStore& store, const std::shared_ptr<Flight>& flight,
                         const IdempotencyPolicy& policy, const IdempotentCall& call,
                         const std::function<Execution(ClaimHold&)>& execute);
  CoordinatedResult execute_owned(IdempotencyStore& store, const std::shared_ptr<Flight>& flight,
                                  const ClaimOutcome& claim, const IdempotencyPolicy& policy,
                                  const IdempotentCall& call,
                                  const std::function<Execution(ClaimHold&)>& execute);
  // The store's claim; a store error ends the flight (its joiners get the error too).
  ClaimOutcome claim_or_fail(IdempotencyStore& store, const std::shared_ptr<Flight>& flight,
                             const IdempotencyPolicy& policy, const IdempotentCall& call) {
    try {
      return store.claim(call.key, call.fingerprint, policy.lease);
    } catch (...) {
      fail(flight, std::current_exception());
    }
  }
  [[noreturn]] void fail(const std::shared_ptr<Flight>& flight, std::exception_ptr error) {
    finish(flight, error, nullptr);
    std::rethrow_exception(error);
  }

  std::weak_ptr<IdempotencyStore> store_weak_;
  std::shared_ptr<IdempotencyStore> store_strong_;
  const void* identity_;  // of the keys this coordinator's owners own (OwnedKeys)
  mutable std::mutex table_mutex_;
  // Keyed by the flight's own key (Flight::table_key()).
  Table table_;
  Table::node_type spare_node_;  // a node of table_ kept for the next flight (table_mutex_)
  // Renews the leases of the claims this coordinator's owners hold. Last: its thread stops before
  // the table goes.
  detail::LeaseRenewer renewer_;
};

ReleaseGuard::~ReleaseGuard() {
  if (!armed_) return;
  try {
    // False: a takeover fenced this owner off; the key is no longer ours to release.
    static_cast<void>(store_->release(flight_->key, token_));
  } catch (...) {
    // The claim then lapses with its lease (its renewal stops below); nothing else to do in a
    // destructor.
  }
  coordinator_->forget_claim(renewal_);
  coordinator_->released(flight_);
}

void Coordinator::released(const std::shared_ptr<Flight>& flight) {
  erase(flight);
  Ready ready;
  {
    std::lock_guard lock(flight->mutex);
    flight->phase = Flight::Phase::released;
    flight->notify_changed();
    ready = take_ready(*flight);
  }
  notify_all(std::move(ready));
}

void Coordinator::linger(Flight& flight, std::exception_ptr error) {
  Ready ready;
  {
    std::lock_guard lock(flight.mutex);
    flight.phase = Flight::Phase::lingering;
    flight.error = std::move(error);
    flight.notify_changed();
    ready = take_ready(flight);
  }
  notify_all(std::move(ready));
}

CoordinatedResult Coordinator::run(const IdempotencyPolicy& policy, const IdempotentCall& call,
                                   const std::function<Execution(ClaimHold&)>& execute) {
  validate_key("idempotency key", call.key);
  validate_policy(policy);
  if (t_owned_keys && t_owned_keys->contains(identity_, call.key)) {
    throw ReentryError(shown_key(call),
                       detail::key_subject(call) +
                           " is already being executed by this caller; a nested call with the "
                           "same key would wait for itself");
  }
  auto store = lock_store();
  if (store->needs_bytes() &&
      (call.codec == nullptr || !call.codec->encode || !call.codec->decode)) {
    throw ConfigError("idempotency key " + quoted(call.key) +
                      ": the store keeps results as bytes, so the call needs a codec "
                      "(IdempotentCall::codec)");
  }
  const HashedKey hashed = HashedKey::of(call.key);
  for (;;) {
    std::shared_ptr<Flight> flight;
    bool leader = false;
    {
      std::lock_guard lock(table_mutex_);
      auto it = table_.find(hashed);
      if (it == table_.end()) {
        flight = std::make_shared<Flight>(call.key, hashed.hash, call.fingerprint, call.type);
        add_locked(flight);
        leader = true;
      } else {
        flight = it->second;
        ++flight->attached;
      }
    }
    if (leader) return lead(*store, flight, policy, call, execute);
    bool start_over = false;
    CoordinatedResult result = join(flight, policy, call, start_over);
    if (!start_over) return result;
  }
}

CoordinatedResult Coordinator::join(const std::shared_ptr<Flight>& flight,
                                    const IdempotencyPolicy& policy, const IdempotentCall& call,
                                    bool& start_over) {
  const auto& clock = policy.clock ? policy.clock : system_clock();
  std::unique_lock lock(flight->mutex);
  // A flight found running is joined: its outcome is ours. A failed one still holding its key
  // is waited out: then we start over and execute (never beside the lingering work).
  const bool joining = flight->phase == Flight::Phase::running;
  if (joining) check_joinable(*flight, call);
  auto ready = [&] {
    return joining ? flight->phase != Flight::Phase::running
                   : flight->phase != Flight::Phase::lingering;
  };
  if (!ready()) {
    if (!flight->changed) flight->changed = std::make_unique<std::condition_variable_any>();
    ++flight->waiting;
    struct Waiting {
      Flight& flight;
      ~Waiting() { --flight.waiting; }
    } waiting{*flight};
    for (;;) {
      if (call.stop.stop_requested()) {
        throw Cancelled("stopped waiting for " + detail::key_subject(call) +
                        " (the execution it waited for goes on)");
      }
      auto slice = RealClock::duration(kWaitSlice);
      if (call.wait_deadline) {
        const SteadyTime now = clock->steady_now();
        if (now >= *call.wait_deadline) {
          throw TimeoutError("gave up waiting for " + detail::key_subject(call) +
                             " at its wait deadline (the execution it waited for goes on)");
        }
        slice = std::min<RealClock::duration>(slice, *call.wait_deadline - now);
      }
      if (flight->changed->wait_for(lock, call.stop, slice, ready)) break;
    }
  }
  if (joining && flight->error) std::rethrow_exception(flight->error);
  if (!joining || !flight->joined) {
    // We waited out a failed execution's claim, or the leader gave up waiting for another
    // process: start over (and perhaps lead).
    start_over = true;
    return {};
  }
  const std::shared_ptr<const CoordinatedResult> joined = flight->joined;
  lock.unlock();
  return *joined;
}

void Coordinator::finish(const std::shared_ptr<Flight>& flight, std::exception_ptr error,
                         const CoordinatedResult* result) {
  if (erase(flight) == 0) return;  // nobody joined: nothing to hand over
  // What every joiner gets, built once for all of them.
  std::shared_ptr<CoordinatedResult> joined;
  if (!error && result != nullptr) {
    joined = std::make_shared<CoordinatedResult>();
    joined->value = result->value;
    joined->status = result->status == IdempotencyStatus::replayed ? IdempotencyStatus::replayed
                                                                   : IdempotencyStatus::joined;
    joined->recorded = result->recorded;
    joined->report = result->report;
    add_idempotency_metadata(joined->report, flight->key, joined->status, joined->recorded);
  }
  Ready ready;
  {
    std::lock_guard lock(flight->mutex);
    flight->phase = Flight::Phase::done;
    if (error) {
      flight->error = std::move(error);
    } else {
      flight->joined = std::move(joined);
    }
    flight->notify_changed();
    ready = take_ready(*flight);
  }
  notify_all(std::move(ready));
}

CoordinatedResult Coordinator::replay(const std::shared_ptr<Flight>& flight,
                                      const IdempotentCall& call, IdempotencyRecord&& record) {
  CoordinatedResult result;
  try {
    result.value = replayed_value(record.value, call);
  } catch (...) {
    fail(flight, std::current_exception());
  }
  result.status = IdempotencyStatus::replayed;
  if (record.report) {
    result.report = std::move(*record.report);
  } else {
    result.report.operation = call.operation;
  }
  finish(flight, nullptr, &result);
  add_idempotency_metadata(result.report, call.key, IdempotencyStatus::replayed, true);
  return result;
}

CoordinatedResult Coordinator::executed(const std::shared_ptr<Flight>& flight, Execution execution,
                                        bool recorded, bool took_over) {
  CoordinatedResult result;
  result.value = std::move(execution.value);
  result.status = IdempotencyStatus::executed;
  result.took_over = took_over;
  result.recorded = recorded;
  result.report = std::move(execution.report);
  finish(flight, nullptr, &result);
  add_idempotency_metadata(result.report, flight->key, IdempotencyStatus::executed, recorded);
  return result;
}

CoordinatedResult Coordinator::lead(IdempotencyStore& store, const std::shared_ptr<Flight>& flight,
                                    const IdempotencyPolicy& policy, const IdempotentCall& call,
                                    const std::function<Execution(ClaimHold&)>& execute) {
  std::optional<SteadyTime> max_wait_until;
  for (;;) {
    ClaimOutcome claim = claim_or_fail(store, flight, policy, call);
    switch (claim.status) {
      case ClaimOutcome::Status::acquired:
        return execute_owned(store, flight, claim, policy, call, execute);

      case ClaimOutcome::Status::completed: {
        if (!claim.record) {
          fail(flight, std::make_exception_ptr(
                           StoreError("the idempotency store answered 'completed' for " +
                                      detail::key_subject(call) + " without the record")));
        }
        return replay(flight, call, std::move(*claim.record));
      }

      case ClaimOutcome::Status::mismatch:
        fail(flight, std::make_exception_ptr(
                         detail::key_reuse_error(call, claim.record ? &*claim.record : nullptr)));

      case ClaimOutcome::Status::in_progress: {
        const IdempotencyRecord* holder = claim.record ? &*claim.record : nullptr;
        if (policy.in_progress == InProgressPolicy::reject) {
          fail(flight, std::make_exception_ptr(detail::in_progress_error(call, holder)));
        }
        const SteadyTime now = (policy.clock ? policy.clock : system_clock())->steady_now();
        if (!max_wait_until) max_wait_until = now + policy.max_wait;
        const bool caller_deadline_first =
            call.wait_deadline && *call.wait_deadline <= *max_wait_until;
        const SteadyTime until = caller_deadline_first ? *call.wait_deadline : *max_wait_until;
        if (now >= until) {
          if (caller_deadline_first) {
            // This caller gave up; its joiners did not: they start over without it.
            finish(flight, nullptr, nullptr);
            throw TimeoutError("gave up waiting for " + detail::key_subject(call) +
                               " (in progress in another process) at its wait deadline");
          }
          fail(flight,
               std::make_exception_ptr(detail::in_progress_error(call, holder, policy.max_wait)));
        }
        try {
          // The record it returns is read again by the claim that follows.
          static_cast<void>(store.wait(call.key, until, call.stop));
        } catch (...) {
          fail(flight, std::current_exception());
        }
        if (call.stop.stop_requested()) {
          finish(flight, nullptr, nullptr);
          throw Cancelled("stopped waiting for " + detail::key_subject(call) +
                          " (in progress in another process)");
        }
        continue;  // claim again: completed -> replay, absent/abandoned -> execute
      }
    }
  }
}

CoordinatedResult Coordinator::execute_owned(IdempotencyStore& store,
                                             const std::shared_ptr<Flight>& flight,
                                             const ClaimOutcome& claim,
                                             const IdempotencyPolicy& policy,
                                             const IdempotentCall& call,
                                             const std::function<Execution(ClaimHold&)>& execute) {
  {
    const WallTime now = (policy.clock ? policy.clock : system_clock())->wall_now();
    std::lock_guard lock(flight->mutex);
    flight->token = claim.token;
    flight->claimed_at = now;
  }
  std::shared_ptr<detail::LeaseRenewer::Lease> renewal;
  std::shared_ptr<ReleaseGuard> guard;
  try {
    // The lease is renewed on the policy's clock; the store decides each new deadline with its
    // own. The renewal holds the store weakly (the registry must not keep users' stores alive).
    renewal = renewer_.add(
        policy.clock, policy.lease,
        [store = store_weak_, key = call.key, token = claim.token, lease = policy.lease] {
          auto locked = store.lock();
          return !locked || locked->renew(key, token, lease);
        });
    guard = std::make_shared<ReleaseGuard>(shared_from_this(), lock_store(), flight, renewal,
                                           claim.token);
  } catch (...) {
    renewer_.remove(renewal);
    try {
      static_cast<void>(store.release(call.key, claim.token));  // false: already fenced off
    } catch (...) {
    }
    fail(flight, std::current_exception());
  }
  ReleaseGuard& release_guard = *guard;
  SharedClaimHold hold(std::move(guard));  // the owner's reference; retain() gives the others

  Execution execution;
  try {
    OwnedKeysScope owned(
        std::make_shared<const OwnedKeys>(identity_, call.key, current_owned_keys()));
    execution = execute(hold);
  } catch (...) {
    const std::exception_ptr error = std::current_exception();
    // Joiners share the failure at once; the flight stays in the table (new callers wait)
    // until the guard releases the key — now, or when the last ClaimHold token goes.
    linger(*flight, error);
    hold.drop();
    std::rethrow_exception(error);
  }

  // Success: record it, then hand it to the joiners. Tokens still alive no longer matter.
  release_guard.disarm();
  hold.drop();
  bool recorded = false;
  try {
    StoredValue stored;
    stored.object = execution.value;
    stored.type = call.type;
    if (store.needs_bytes()) stored.bytes = call.codec->encode(execution.value.get());
    recorded =
        store.complete(call.key, claim.token, std::move(stored), execution.report, policy.ttl);
  } catch (...) {
    // The work is done and its value is real; only the record is missing. Give the value back
    // (recorded == false says a later call runs again) and free the key rather than leave it
    // claimed until the lease lapses.
    try {
      static_cast<void>(store.release(call.key, claim.token));  // false: already fenced off
    } catch (...) {
    }
  }
  renewer_.remove(renewal);
  return executed(flight, std::move(execution), recorded, claim.took_over);
}

// ---- the non-blocking entry -------------------------------------------------------------------

class AsyncLead final : public FlightLead {
 public:
  AsyncLead(std::shared_ptr<Coordinator> coordinator, std::shared_ptr<Flight> flight,
            IdempotentCall call, std::shared_ptr<const OwnedKeys> owned)
      : coordinator_(std::move(coordinator)),
        flight_(std::move(flight)),
        call_(std::move(call)),
        owned_(std::move(owned)) {}
  ~AsyncLead() override {
    // A leader that vanished without a word (its coroutine was destroyed): its waiters start
    // over rather than wait forever.
    if (!ended_) coordinator_->finish(flight_, nullptr, nullptr);
  }

  CoordinatedResult replay(IdempotencyRecord record) override {
    ended_ = true;
    return coordinator_->replay(flight_, call_, std::move(record));
  }
  void abandon(std::exception_ptr error) override {
    ended_ = true;
    coordinator_->finish(flight_, std::move(error), nullptr);
  }
  CoordinatedResult succeeded(Execution execution, bool recorded, bool took_over) override {
    ended_ = true;
    return coordinator_->executed(flight_, std::move(execution), recorded, took_over);
  }
  void failed(std::exception_ptr error) override {
    Coordinator::linger(*flight_, std::move(error));
  }
  void released() override {
    ended_ = true;
    coordinator_->released(flight_);
  }
  void claimed(std::uint64_t token, WallTime at) override {
    std::lock_guard lock(flight_->mutex);
    flight_->token = token;
    flight_->claimed_at = at;
  }
  std::shared_ptr<const OwnedKeys> owned_keys() const override { return owned_; }

 private:
  std::shared_ptr<Coordinator> coordinator_;
  std::shared_ptr<Flight> flight_;
  IdempotentCall call_;
  std::shared_ptr<const OwnedKeys> owned_;
  bool ended_ = false;
};

FlightEntry Coordinator::enter(const IdempotentCall& call, std::shared_ptr<FlightWaiter> waiter) {
  validate_key("idempotency key", call.key);
  renewer_.check_process();
  if (t_owned_keys && t_owned_keys->contains(identity_, call.key)) {
    throw ReentryError(shown_key(call),
                       detail::key_subject(call) +
                           " is already being executed by this caller; a nested call with the "
                           "same key would wait for itself");
  }
  std::shared_ptr<Flight> flight;
  const HashedKey hashed = HashedKey::of(call.key);
  {
    std::lock_guard lock(table_mutex_);
    auto it = table_.find(hashed);
    if (it == table_.end()) {
      flight = std::make_shared<Flight>(call.key, hashed.hash, call.fingerprint, call.type);
      add_locked(flight);
      FlightEntry entry;
      entry.lead = std::make_shared<AsyncLead>(
          shared_from_this(), flight, call,
          std::make_shared<const OwnedKeys>(identity_, call.key, current_owned_keys()));
      return entry;
    }
    flight = it->second;
    ++flight->attached;
  }
  Ready ready;
  {
    std::lock_guard lock(flight->mutex);
    const bool joining = flight->phase == Flight::Phase::running;
    if (joining) check_joinable(*flight, call);
    detail::FlightAccess::list(*flight, waiter, flight, joining);
    ready = take_ready(*flight);  // the flight may have ended since the table lookup
  }
  notify_all(std::move(ready));
  return {};
}

// ---- the errors both faces' leaders throw ----------------------------------------------------

}  // namespace

std::string detail::key_subject(const IdempotentCall& call) {
  std::string out;
  if (!call.operation.empty()) out = "operation " + quoted(call.operation) + ": ";
  out += "idempotency key " + quoted(shown_key(call));
  return out;
}

KeyReuseError detail::key_reuse_error(const IdempotentCall& call, const IdempotencyRecord* record) {
  std::string message = key_subject(call);
  if (record != nullptr && record->state == IdempotencyRecord::State::in_progress) {
    message += " is in progress with different arguments (the fingerprints differ; " +
               holder_of(*record) + "); this call did not run";
  } else {
    message += " was first used with different arguments (the fingerprints differ";
    if (record != nullptr) message += "; " + holder_of(*record);
    message += "); this call did not run";
  }
  return KeyReuseError(shown_key(call), message, call.operation);
}

AlreadyInProgress detail::in_progress_error(const IdempotentCall& call,
                                            const IdempotencyRecord* record,
                                            std::optional<Millis> waited) {
  std::string message = key_subject(call);
  message += waited ? " is still in progress in another process after waiting " +
                          std::to_string(waited->count()) + " ms"
                    : std::string(" is in progress in another process");
  if (record != nullptr) message += " (" + holder_of(*record) + ")";
  return AlreadyInProgress(message);
}

namespace {

// ---- registry ---------------------------------------------------------------------------------

// One coordinator per live store. The registry holds the coordinators (so a caller that asks for
// one per call does not create one, and a lease-renewal thread, per call) and only weak references
// to the stores (so it never keeps a user's store, its files or connections, alive).
//
// A child of fork() starts with a registry of its own: the parent's coordinators (their renewal
// threads, which the child does not have, and their in-flight tables) are abandoned, never
// destroyed, and never handed out. The swap is lock-free, since a lock could have been held by a
// parent thread at the fork.
struct Registry {
  explicit Registry(std::uint64_t g) : generation(g) {}
  struct Entry {
    std::weak_ptr<IdempotencyStore> store;
    std::shared_ptr<Coordinator> coordinator;
  };
  const std::uint64_t generation;  // detail::fork_generation() of the process it serves
  std::mutex mutex;
  std::unordered_map<const IdempotencyStore*, Entry> entries;
};

Registry& registry() {
  // Never destroyed: coordinators may still be in use while static objects are torn down.
  static std::atomic<Registry*> current{new Registry(detail::fork_generation())};
  const std::uint64_t generation = detail::fork_generation();
  Registry* r = current.load(std::memory_order_acquire);
  while (r->generation != generation) {
    auto* fresh = new Registry(generation);
    if (current.compare_exchange_strong(r, fresh, std::memory_order_acq_rel)) {
      detail::abandon(std::shared_ptr<const Registry>(r));
      r = fresh;
    } else {
      delete fresh;  // another thread of this child swapped first; r is now its registry
    }
  }
  return *r;
}

}  // namespace

std::shared_ptr<IdempotencyCoordinator> IdempotencyCoordinator::for_store(
    std::shared_ptr<IdempotencyStore> store) {
  if (!store) store = default_idempotency_store();
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  auto it = r.entries.find(store.get());
  // An entry whose store is gone belongs to a dead store that lived at the same address.
  if (it != r.entries.end() && !it->second.store.expired()) return it->second.coordinator;
  // A new store: also drop the coordinators of stores that died (first use of a store is rare,
  // so this sweep costs nothing on the call path).
  std::erase_if(r.entries, [](const auto& entry) { return entry.second.store.expired(); });
  auto coordinator = std::make_shared<Coordinator>(store, /*hold_store=*/false);
  r.entries[store.get()] = Registry::Entry{store, coordinator};
  return coordinator;
}

std::shared_ptr<void> SharedClaimHold::retain() {
  std::lock_guard lock(mutex_);
  if (!owner_) throw ConfigError("ClaimHold::retain() called after the execution finished");
  return owner_;
}

void SharedClaimHold::drop() {
  std::shared_ptr<void> owner;
  std::lock_guard lock(mutex_);
  owner = std::move(owner_);
}

std::shared_ptr<IdempotencyCoordinator> make_in_process_coordinator() {
  return std::make_shared<Coordinator>(nullptr, /*hold_store=*/true);
}

FlightEntry IdempotencyCoordinator::enter(const IdempotentCall& /*call*/,
                                          std::shared_ptr<detail::FlightWaiter> /*waiter*/) {
  throw NotSupported("this idempotency coordinator has no non-blocking entry (enter())");
}

std::shared_ptr<IdempotencyCoordinator> make_idempotency_coordinator(
    std::shared_ptr<IdempotencyStore> store) {
  if (!store) store = default_idempotency_store();
  return std::make_shared<Coordinator>(std::move(store), /*hold_store=*/true);
}

}  // namespace idem
