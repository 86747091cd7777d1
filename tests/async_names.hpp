// The names the coroutine face's unit tests use (async_join_test.cpp, async_operation_test.cpp,
// async_resilient_test.cpp, async_reentry_test.cpp), brought in with
// `using namespace idem::test::async_names;` instead of a list of using-declarations in every
// file, as the integration tests' per-backend names headers do.
#pragma once

#include <chrono>

#include "async_test_support.hpp"
#include "idem/async/task.hpp"

namespace idem::test::async_names {

using idem::async::Task;
using namespace std::chrono_literals;

using idem::test::nap;
using idem::test::run;
using idem::test::status_of;
using Stores = idem::test::MemoryStores;

}  // namespace idem::test::async_names
