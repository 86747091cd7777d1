// operation_error_cancelled_after(io, task, after): runs a resilient coroutine call on `io`,
// cancels it (terminal) once `after` has passed, and returns the OperationError it ended with, to
// look into its report:
//
//   const auto error = idem::test::operation_error_cancelled_after(io, op(), 20ms);
//   ASSERT_TRUE(error) << "expected a cancelled OperationError";
//   EXPECT_EQ(error->report().status, idem::OperationStatus::cancelled);
#pragma once

#include <asio/bind_cancellation_slot.hpp>
#include <asio/cancellation_signal.hpp>
#include <asio/co_spawn.hpp>
#include <asio/io_context.hpp>
#include <asio/steady_timer.hpp>
#include <asio/use_future.hpp>
#include <chrono>
#include <optional>
#include <utility>

#include "idem/async/task.hpp"
#include "idem/operation_result.hpp"
#include "thrown_by.hpp"

namespace idem::test {

// nullopt if the call returned; any other exception propagates.
template <class T>
std::optional<idem::OperationError> operation_error_cancelled_after(
    asio::io_context& io, idem::async::Task<T> task, std::chrono::milliseconds after) {
  asio::cancellation_signal cancel;
  auto future = asio::co_spawn(io, std::move(task),
                               asio::bind_cancellation_slot(cancel.slot(), asio::use_future));
  asio::steady_timer later(io, after);
  later.async_wait([&](asio::error_code) { cancel.emit(asio::cancellation_type::terminal); });
  io.run();
  return thrown_by<idem::OperationError>([&] { future.get(); });
}

}  // namespace idem::test
