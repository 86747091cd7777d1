// The Redis recorder's and store's operations as data (not installed): what each call sends
// (the script, its KEYS and ARGV, or the command) and what its reply means. The blocking
// RedisIdempotencyRecorder/Store and the coroutine AsyncRedisRecorder/Store both build their
// requests and read their replies here, so the two faces write the same keys with the same
// scripts and agree on every outcome.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"
#include "idem/redis/connection_pool.hpp"
#include "idem/redis/redis_options.hpp"
#include "idem/report.hpp"
#include "internal.hpp"

namespace idem::redis::detail {

// One run of a script, owning its KEYS and ARGV.
struct ScriptInvocation {
  const Script* script = nullptr;
  std::vector<std::string> keys;
  std::vector<std::string> args;

  std::vector<std::string_view> key_views() const { return {keys.begin(), keys.end()}; }
  std::vector<std::string_view> arg_views() const { return {args.begin(), args.end()}; }
};

// EVALSHA sha numkeys KEYS... ARGV... (or EVAL with the source when `with_source`).
std::vector<std::string_view> script_argv(const ScriptInvocation& call, const std::string& numkeys,
                                          bool with_source);
// A -NOSCRIPT reply: the script did not run; send it again with its source.
bool is_noscript(const RedisReply& reply);

// 1 → true, 0 → false; an error reply or another shape throws.
bool flag_reply(const RedisReply& reply, std::string_view what, const std::string& endpoint);

// ---- recorder ---------------------------------------------------------------------------------

// SET marker ts NX [PX marker_ttl]: the arguments of one mark.
std::vector<std::string> mark_command(const RedisOptions& options, const std::string& marker_key,
                                      const std::string& now_ms);
// "OK" when the marker is new, nil when it existed; an error reply throws.
bool mark_reply(const RedisReply& reply, const std::string& endpoint);

ScriptInvocation recorder_claim_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     Millis lease);
Claim recorder_claim_reply(const RedisReply& reply, std::string_view consumer,
                           std::string_view event_id, const std::string& claim_key,
                           const std::string& endpoint);
ScriptInvocation recorder_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                        std::string_view consumer, std::string_view event_id,
                                        std::uint64_t token);
ScriptInvocation recorder_release_call(const RedisOptions& options, std::string_view consumer,
                                       std::string_view event_id, std::uint64_t token);
ScriptInvocation recorder_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view consumer, std::string_view event_id,
                                     std::uint64_t token, Millis lease);

// ---- store ------------------------------------------------------------------------------------
// The record is one string (record_decoder.hpp's RecordText). Reading it is a plain GET, taking
// a new key a plain SET NX GET; the steps that compare and write are small scripts. A hash under
// the key is a record of an older idem: it is read with HGETALL (RecordDecoder) and replaced only
// through a compare-and-delete.

// One request of a store step: a plain command, or a script run when `script.script` is set.
struct Request {
  CommandKind kind = CommandKind::write;
  std::vector<std::string> command;
  ScriptInvocation script;

  bool is_script() const { return script.script != nullptr; }
  std::vector<std::string_view> command_views() const { return {command.begin(), command.end()}; }
};

// claim() as a conversation of a few requests at most, the same for both faces: send request(),
// give its reply to read(); when read() returns true, outcome() is the answer, else send the new
// request(). A new key is one plain command, SET <claim> NX PXAT <expiry> GET: nil means the
// claim is ours; a value back is the record that holds the key, decided by the client — a live
// one is the outcome (completed, in_progress or mismatch), an expired or abandoned one is
// replaced by the takeover script, which writes the claim only if the record is still exactly
// what the client read (else its reply is what is there now, read again like the SET's).
class StoreClaim {
 public:
  // `read_first`: start with a GET (a live record costs the server one plain read) rather than
  // with the SET NX GET (an absent key is taken in one round trip; a record found there comes
  // back in the reply): next_claim_reads_first().
  // `with_report` false: a completed record found is decoded without its report
  // (decode_record_text).
  StoreClaim(const RedisOptions& options, std::int64_t now_ms, std::string_view key,
             std::optional<std::string_view> fingerprint, Millis lease, bool read_first,
             bool with_report = true);

  const Request& request() const { return request_; }
  bool read(const RedisReply& reply, const std::string& endpoint);
  ClaimOutcome& outcome() { return outcome_; }
  const std::string& record_key() const { return record_key_; }

 private:
  enum class Step { get, set, takeover, legacy_get, legacy_drop };
  bool read_record(const RedisReply& reply, const std::string& endpoint);
  bool acquired();  // the claim being written was written
  bool read_legacy(const RedisReply& reply, const std::string& endpoint);
  // SET NX GET of a new claim, `replaces_claim` the outcome's took_over if it is taken; its
  // token is larger than `old_token` (of a record just deleted, or 0).
  void claim_absent(bool replaces_claim, std::uint64_t old_token = 0);
  // The takeover script: the claim replaces `expected` (token `old_token`) if it is still there.
  void take_over(std::string expected, std::uint64_t old_token, bool replaces_claim);

  const RedisOptions& options_;
  std::int64_t now_ms_;
  std::string_view key_;
  std::optional<std::string_view> fingerprint_;
  std::string record_key_;
  std::string tail_;  // the claim after its token
  std::string pxat_;  // the claim's Redis expiry
  Step step_ = Step::get;
  bool with_report_ = true;
  int rounds_ = 0;
  std::uint64_t token_ = 0;         // of the claim being written
  bool replaces_claim_ = false;     // took_over, if the claim is written
  bool legacy_claim_ = false;       // the hash being dropped was a claim
  std::uint64_t legacy_token_ = 0;  // and its token
  Request request_;
  ClaimOutcome outcome_;
};

// A new fencing token for a claim (store or recorder), greater than `above` (the token of the
// record being replaced, or 0). No shared counter: the milliseconds of the system clock in the
// high bits and random bits below them, kept strictly increasing within the process
// (docs/redis.md §5). Thread-safe; a forked child draws new random bits.
std::uint64_t draw_token(std::uint64_t above);

// How a store's next claim starts (StoreClaim's `read_first`): as its last claim ended. A claim
// that found a live record (a replay, a claim in progress, a mismatch) makes the next one read
// first, since replays come in runs (a client retrying, a batch resent); one that took its key
// makes the next one go straight to the SET NX GET, since new keys come in runs too. The
// outcome is the same either way; a wrong guess costs a new key one more round trip (the GET
// before its SET), or a replay a SET NX GET instead of a GET (still one round trip). The
// stores keep it in one relaxed atomic shared by their threads and coroutines.
inline bool next_claim_reads_first(const ClaimOutcome& last) noexcept {
  return last.status != ClaimOutcome::Status::acquired;
}

// lookup() likewise: a GET, then HGETALL when the key holds an older idem's hash.
class StoreLookup {
 public:
  StoreLookup(const RedisOptions& options, WallTime now, std::string_view key);

  const Request& request() const { return request_; }
  bool read(const RedisReply& reply, const std::string& endpoint);
  std::optional<IdempotencyRecord>& outcome() { return outcome_; }

 private:
  WallTime now_;
  std::string_view key_;
  std::string record_key_;
  bool legacy_ = false;
  Request request_;
  std::optional<IdempotencyRecord> outcome_;
};

// complete (a TTL of 0 deletes the claim: the release script), release and renew: one script
// each, answering 1 (done) or 0 (fenced).
ScriptInvocation store_complete_call(const RedisOptions& options, std::int64_t now_ms,
                                     std::string_view key, std::uint64_t token,
                                     const StoredValue& value, const ExecutionReport& report,
                                     Millis ttl);
ScriptInvocation store_release_call(const RedisOptions& options, std::string_view key,
                                    std::uint64_t token);
// Adds the publish arguments of complete, release and remove (scripts.cpp): PUBLISH, or SPUBLISH
// on a cluster, to the channel of the record in call.keys[0].
void add_done_notice(ScriptInvocation& call, const RedisOptions& options);
ScriptInvocation store_renew_call(const RedisOptions& options, std::int64_t now_ms,
                                  std::string_view key, std::uint64_t token, Millis lease);
// The HGETALL of an older idem's hash: the record, or nullopt when absent or expired at `now`.
std::optional<IdempotencyRecord> lookup_reply(const RedisReply& reply, std::string_view key,
                                              const std::string& record_key, WallTime now,
                                              const std::string& endpoint);

}  // namespace idem::redis::detail
