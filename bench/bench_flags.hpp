// Flags of idem's own that a benchmark program takes before Google Benchmark parses the rest.
#pragma once

#include <cstring>
#include <string>

namespace idem::bench {

// The value of `--NAME=VALUE` in argv (removed from it, so Google Benchmark does not see an
// unknown flag), or "" when absent.
inline std::string take_flag(int& argc, char** argv, const std::string& name) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) {
      std::string value = argv[i] + prefix.size();
      for (int j = i; j + 1 < argc; ++j)
        argv[j] = argv[j + 1];
      --argc;
      return value;
    }
  }
  return {};
}

}  // namespace idem::bench
