// The two outcomes of running a resilient operation: OperationResult<T> or OperationError.
//
// Success returns OperationResult<T>{value, report}; for a void operation only the report.
// Failure throws idem::OperationError, which carries the final ExecutionReport and the cause —
// the last attempt's exception, or a FallbackChainError when fallbacks were tried too. The cause
// is attached as a std::nested_exception, so both of these work:
//
//   catch (const idem::OperationError& e) {
//     e.report();                         // every attempt, what failed, how long it took
//     std::rethrow_exception(e.cause());  // or std::rethrow_if_nested(e)
//   }
//
// retryable() and in_doubt() are the cause's (for an idem::Error cause; a plain std::exception
// counts as retryable, anything else as neither): may the caller try the whole operation again
// later, and may its last write have happened?
//
// Errors from the idempotency layer — InvalidKey, KeyReuseError, ReentryError,
// AlreadyInProgress, a waiter's Cancelled or TimeoutError, StoreError — are not operation
// failures (the operation did not run for that caller) and reach the caller unchanged.
//
// Thread-safety: plain values / immutable exceptions.
#pragma once

#include <exception>
#include <string>

#include "idem/error.hpp"
#include "idem/report.hpp"

namespace idem {

template <class T>
struct OperationResult {
  T value;
  ExecutionReport report;
};

template <>
struct OperationResult<void> {
  ExecutionReport report;
};

class OperationError : public Error, public std::nested_exception {
 public:
  // Must be constructed while `cause` is the exception being handled (inside a catch block), so
  // that std::nested_exception captures it; throw_operation_error() does that.
  OperationError(const std::string& message, ExecutionReport report, bool retryable, bool in_doubt);

  const ExecutionReport& report() const noexcept { return report_; }
  // The underlying failure (never null when thrown by idem).
  std::exception_ptr cause() const noexcept { return nested_ptr(); }

 private:
  ExecutionReport report_;
};

// Throws OperationError("operation '<name>' failed after N attempt(s): <cause>") with `cause`
// nested and the flags taken from it.
[[noreturn]] void throw_operation_error(ExecutionReport report, std::exception_ptr cause);

}  // namespace idem
