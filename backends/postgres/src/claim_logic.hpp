// Internal: what the recorder's and the store's claim statements' rows mean, and the argument
// checks PostgreSQL adds to the base class's, shared by the blocking classes
// (postgres_recorder.cpp, postgres_store.cpp) and the coroutine ones (async_postgres.cpp). Both
// faces run the same statements (sql_text.hpp); this is the one place that reads their answers,
// so a blocking and a coroutine caller on one database decide alike. Not installed.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "connection.hpp"
#include "idem/clock.hpp"
#include "idem/idempotency_store.hpp"
#include "idem/recorder.hpp"

namespace idem::postgres::detail {

// A claim statement loses a race twice in a row only when other callers keep claiming and
// releasing (or completing) the same key; after this many rounds the caller gets a retryable
// StoreError (store_busy).
inline constexpr int kClaimRounds = 16;

// The base class has checked the keys; PostgreSQL also needs them as UTF-8 text.
void require_utf8_marker(std::string_view consumer, std::string_view event_id);
// A fingerprint is stored as text: UTF-8 without NUL bytes (idem::fingerprint() gives hex).
void check_fingerprint(std::optional<std::string_view> fingerprint);
// Tokens are bigint in the database; a larger one was never issued.
bool fits_token(std::uint64_t token) noexcept;
// A completed record lives until expires_at, a claim until lease_until.
bool is_live(const IdempotencyRecord& record, WallTime now);

// ---- recorder ---------------------------------------------------------------------------------

// The recorder claim statement's rows (kind, token, lease_until, took_over), in no particular
// order: an acquisition wins, then a marker, then a live claim. Nothing decided (nullopt) means
// the statement's snapshot saw no claim, or a dead one, and yet could not claim: another writer
// got there first, so the caller rereads (recorder_reread_decision).
std::optional<Claim> recorder_claim_decision(const Result& rows, WallTime now);
// The reread statement's one row (processed, lease_until, claim processed). Nothing decided
// means the claim was released (or its lease passed) in between: claim again.
std::optional<Claim> recorder_reread_decision(const Result& again, WallTime now);
[[noreturn]] void throw_recorder_claim_busy(std::string_view call, const std::string& target,
                                            std::string_view consumer, std::string_view event_id);

// ---- store ------------------------------------------------------------------------------------

// The parameters of the store's claim statement.
Params store_claim_params(std::string_view key, std::optional<std::string_view> fingerprint,
                          WallTime now, Millis lease);
// The acquisition among the claim statement's rows (acquired, token, took_over, ...), if any.
std::optional<ClaimOutcome> store_acquired(const Result& rows);
[[noreturn]] void throw_store_claim_busy(std::string_view call, const std::string& target,
                                         std::string_view key);

}  // namespace idem::postgres::detail
