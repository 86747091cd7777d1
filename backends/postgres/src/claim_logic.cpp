#include "claim_logic.hpp"

#include <limits>

#include "idem/error.hpp"
#include "idem/postgres/postgres_error.hpp"

namespace idem::postgres::detail {

void require_utf8_marker(std::string_view consumer, std::string_view event_id) {
  require_utf8_key("consumer", consumer);
  require_utf8_key("event id", event_id);
}

void check_fingerprint(std::optional<std::string_view> fingerprint) {
  if (!fingerprint) return;
  if (fingerprint->find('\0') != std::string_view::npos || !is_utf8(*fingerprint)) {
    throw InvalidArgument(
        "an idempotency fingerprint stored in PostgreSQL must be UTF-8 text without NUL bytes "
        "(idem::fingerprint() gives hex)");
  }
}

bool fits_token(std::uint64_t token) noexcept {
  return token <= static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
}

bool is_live(const IdempotencyRecord& record, WallTime now) {
  return record.state == IdempotencyRecord::State::completed ? now < record.expires_at
                                                             : now < record.lease_until;
}

std::optional<Claim> recorder_claim_decision(const Result& rows, WallTime now) {
  bool processed = false;
  bool seen_live = false;
  WallTime seen_lease_until{};
  for (int row = 0; row < rows.rows(); ++row) {
    const std::string_view kind = rows.bytes(row, 0);
    if (kind == "acquired") {
      Claim acquired{Claim::Status::acquired};
      acquired.token = static_cast<std::uint64_t>(rows.int8(row, 1));
      acquired.lease_until = rows.timestamptz(row, 2);
      acquired.took_over = rows.boolean(row, 3);
      return acquired;
    }
    if (kind == "processed") processed = true;
    if (kind == "claimed" && rows.timestamptz(row, 2) > now) {
      seen_live = true;
      seen_lease_until = rows.timestamptz(row, 2);
    }
  }
  if (processed) return Claim{Claim::Status::processed};
  if (seen_live) {
    Claim busy{Claim::Status::in_progress};
    busy.lease_until = seen_lease_until;
    return busy;
  }
  return std::nullopt;
}

std::optional<Claim> recorder_reread_decision(const Result& again, WallTime now) {
  if (again.boolean(0, 0)) return Claim{Claim::Status::processed};
  if (again.is_null(0, 1)) return std::nullopt;
  if (again.boolean(0, 2)) return Claim{Claim::Status::processed};
  if (again.timestamptz(0, 1) > now) {
    Claim busy{Claim::Status::in_progress};
    busy.lease_until = again.timestamptz(0, 1);
    return busy;
  }
  return std::nullopt;
}

void throw_recorder_claim_busy(std::string_view call, const std::string& target,
                               std::string_view consumer, std::string_view event_id) {
  throw PostgresError(ErrorCode::store_busy,
                      std::string(call) + " on " + target + ": (" + std::string(consumer) + ", " +
                          std::string(event_id) + ") kept changing under " +
                          std::to_string(kClaimRounds) + " claim attempts",
                      "", /*retryable=*/true, false);
}

Params store_claim_params(std::string_view key, std::optional<std::string_view> fingerprint,
                          WallTime now, Millis lease) {
  Params params;
  params.text(key);
  if (fingerprint) {
    params.text(*fingerprint);
  } else {
    params.null(kTextOid);
  }
  params.timestamptz(now).timestamptz(add_saturating(now, lease));
  return params;
}

std::optional<ClaimOutcome> store_acquired(const Result& rows) {
  for (int row = 0; row < rows.rows(); ++row) {
    if (rows.boolean(row, 0)) {
      ClaimOutcome outcome;
      outcome.status = ClaimOutcome::Status::acquired;
      outcome.token = static_cast<std::uint64_t>(rows.int8(row, 1));
      outcome.took_over = rows.boolean(row, 2);
      return outcome;
    }
  }
  return std::nullopt;
}

void throw_store_claim_busy(std::string_view call, const std::string& target,
                            std::string_view key) {
  throw PostgresError(ErrorCode::store_busy,
                      std::string(call) + " on " + target + ": key '" + std::string(key) +
                          "' kept changing under " + std::to_string(kClaimRounds) +
                          " claim attempts",
                      "", /*retryable=*/true, false);
}

}  // namespace idem::postgres::detail
