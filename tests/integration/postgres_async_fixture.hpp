// The fixture of the PostgreSQL coroutine-face tests (postgres_async_recorder_test.cpp,
// postgres_async_store_test.cpp): the object under test on a schema of its own with a pool of
// four, on an io_context the test runs, and the pool's shut-down run to its end afterwards.
#pragma once

#include <gtest/gtest.h>

#include <asio/io_context.hpp>
#include <memory>

#include "../postgres_test_support.hpp"

namespace idem::test::pg {

// `Backend`: AsyncPostgresRecorder or AsyncPostgresStore.
template <class Backend>
class AsyncPostgresTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto options = schema_.options();
    options.pool_size = 4;
    backend_ = std::make_unique<Backend>(io_.get_executor(), options);
  }
  void TearDown() override {
    backend_.reset();
    io_.restart();
    io_.run();  // let the pool's shut-down finish
  }

  TempSchema schema_;
  asio::io_context io_;
  std::unique_ptr<Backend> backend_;
};

}  // namespace idem::test::pg
