// What a chunked purge's progress callback must have seen (the recorders' purge() and the stores'
// purge_expired() on more rows than one chunk holds).
//
// Thread-safety: for a test's main thread.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

namespace idem::test {

// The running totals reported in `calls` grow strictly, by at most `chunk` each, over at least
// `min_calls` calls, and end at `total`.
inline void expect_chunked(const std::vector<std::size_t>& calls, std::size_t total,
                           std::size_t chunk, std::size_t min_calls) {
  ASSERT_GE(calls.size(), min_calls);
  std::size_t previous = 0;
  for (std::size_t done : calls) {
    EXPECT_GT(done, previous);
    EXPECT_LE(done - previous, chunk);
    previous = done;
  }
  EXPECT_EQ(calls.back(), total);
}

}  // namespace idem::test
