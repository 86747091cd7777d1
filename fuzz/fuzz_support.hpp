// Shared by the fuzzers: what counts as a bug.
//
// idem's promise for bad input is "a clear error, never a crash": every function a fuzzer calls
// may throw an idem::Error (the classified family from error.hpp) and nothing else. Any other
// exception — std::out_of_range from a forgotten check, nlohmann's parse_error leaking through —
// is reported as a crash, as are the sanitizers' findings.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "idem/error.hpp"

namespace idem::fuzz {

template <class Fn>
void expect_only_idem_errors(const char* what, Fn&& fn) {
  try {
    fn();
  } catch (const idem::Error&) {
    // A classified error: what bad input must produce.
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s threw a non-idem exception: %s\n", what, e.what());
    std::abort();
  } catch (...) {
    std::fprintf(stderr, "%s threw a non-exception\n", what);
    std::abort();
  }
}

[[noreturn]] inline void fail(const std::string& why) {
  std::fprintf(stderr, "invariant broken: %s\n", why.c_str());
  std::abort();
}

}  // namespace idem::fuzz
