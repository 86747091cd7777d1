// The coroutine face's test scaffolding under the names idem's own tests use (idem::test::run,
// IoThread, ...): the shipped idem/testing/async_support.hpp (running a coroutine to its end on a
// test's io_context, cancelled part-way or on two threads; an io_context on a thread of its own,
// and the teardown order it needs), plus an in-memory store with its coroutine face.
#pragma once

#include <memory>

#include "idem/async/memory_store.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/async_support.hpp"

namespace idem::test {

using idem::testing::IoThread;
using idem::testing::async_detail::keep_exception;
using idem::testing::async_detail::kept_exceptions;
using idem::testing::async_detail::live_io_threads;
using idem::testing::async_detail::nap;
using idem::testing::async_detail::Outcome;
using idem::testing::async_detail::resuming_on;
using idem::testing::async_detail::run;
using idem::testing::async_detail::run_cancelled;
using idem::testing::async_detail::run_on_two_threads;
using idem::testing::async_detail::status_of;
using idem::testing::async_detail::stop_io_thread;

// One in-memory store and its coroutine face: blocking and coroutine callers share its flights.
struct MemoryStores {
  std::shared_ptr<idem::InMemoryIdempotencyStore> memory =
      std::make_shared<idem::InMemoryIdempotencyStore>();
  std::shared_ptr<idem::async::AsyncMemoryStore> async =
      std::make_shared<idem::async::AsyncMemoryStore>(memory);
};

}  // namespace idem::test
