#include "idem/idempotency_policy.hpp"

#include <string>

#include "idem/detail/printable.hpp"
#include "idem/error.hpp"

namespace idem {

bool keeps(const DuplicatePolicy& policy, OutcomeKind kind) noexcept {
  switch (kind) {
    case OutcomeKind::success:
      return true;
    case OutcomeKind::failure:
      return policy.keep_failures && policy.after_finished != ReusePolicy::rerun_failed;
    case OutcomeKind::transient:
      return policy.keep_transient && policy.after_finished != ReusePolicy::rerun_failed;
  }
  return false;
}

void validate(const DuplicatePolicy& policy, std::string_view what) {
  const std::string prefix = what.empty() ? std::string() : std::string(what) + ": ";
  if (policy.lease <= Millis::zero()) {
    throw ConfigError(prefix + "lease must be positive (got " +
                      std::to_string(policy.lease.count()) + " ms)");
  }
  if (policy.max_wait < Millis::zero()) {
    throw ConfigError(prefix + "max_wait must not be negative (got " +
                      std::to_string(policy.max_wait.count()) + " ms)");
  }
  if (policy.ttl < Millis::zero()) {
    throw ConfigError(prefix + "ttl must not be negative (got " +
                      std::to_string(policy.ttl.count()) + " ms)");
  }
}

std::string_view to_string(ReusePolicy policy) noexcept {
  switch (policy) {
    case ReusePolicy::replay:
      return "replay";
    case ReusePolicy::rerun_failed:
      return "rerun_failed";
    case ReusePolicy::reject:
      return "reject";
  }
  return "unknown";
}

std::string_view to_string(OutcomeKind kind) noexcept {
  switch (kind) {
    case OutcomeKind::success:
      return "success";
    case OutcomeKind::failure:
      return "failure";
    case OutcomeKind::transient:
      return "transient";
  }
  return "unknown";
}

std::string_view to_string(InProgressPolicy policy) noexcept {
  switch (policy) {
    case InProgressPolicy::wait:
      return "wait";
    case InProgressPolicy::reject:
      return "reject";
  }
  return "unknown";
}

ReusePolicy parse_reuse_policy(std::string_view text) {
  if (text == "replay") return ReusePolicy::replay;
  if (text == "rerun_failed") return ReusePolicy::rerun_failed;
  if (text == "reject") return ReusePolicy::reject;
  throw ConfigError("after_finished must be replay, rerun_failed or reject (got '" +
                    detail::printable(text, 64) + "')");
}

InProgressPolicy parse_in_progress_policy(std::string_view text) {
  if (text == "wait" || text == "join") return InProgressPolicy::wait;
  if (text == "reject") return InProgressPolicy::reject;
  throw ConfigError("while_running must be join (or wait) or reject (got '" +
                    detail::printable(text, 64) + "')");
}

}  // namespace idem
