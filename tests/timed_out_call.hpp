// What the coroutine face's timeout tests share (async_operation_test.cpp,
// async_resilient_test.cpp): a call slower than its timeout, with an effect it must never reach,
// and the checks on how it failed.
#pragma once

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <atomic>
#include <chrono>

#include "async_test_support.hpp"
#include "idem/async/task.hpp"
#include "idem/operation_result.hpp"
#include "idem/report.hpp"
#include "thrown_by.hpp"

namespace idem::test {

// Naps 2 s, then counts an effect in `effects` and returns 1. Under a short timeout the nap is
// cancelled, so the effect is never reached.
inline idem::async::Task<int> slow_effect(std::atomic<int>& effects) {
  co_await nap(std::chrono::seconds(2));
  ++effects;
  co_return 1;
}

// Runs `call()` on `io`: it must fail with an OperationError that timed out after one timed-out
// attempt. Then runs whatever the attempt left behind to its end: the effect must not happen.
template <class Call>
void expect_timed_out_without_effect(asio::io_context& io, Call&& call,
                                     const std::atomic<int>& effects) {
  const auto error = thrown_by<idem::OperationError>([&] { run(io, call()); });
  ASSERT_TRUE(error) << "expected a timeout";
  EXPECT_EQ(error->report().status, idem::OperationStatus::timed_out);
  ASSERT_EQ(error->report().attempts.size(), 1u);
  EXPECT_EQ(error->report().attempts[0].status, idem::AttemptStatus::timed_out);
  io.restart();
  io.run();  // whatever the attempt left behind runs to its end
  EXPECT_EQ(effects.load(), 0);
}

}  // namespace idem::test
