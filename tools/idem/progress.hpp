// A one-line progress bar for the terminal (redrawn in place with \r). On a non-terminal it
// prints a line only every 10%, so logs stay short.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace idem::cli {

class ProgressBar {
 public:
  ProgressBar(std::string label, std::uint64_t total, std::FILE* out = stderr);
  void update(std::uint64_t done, const std::string& note = "");
  void finish(const std::string& note = "");

 private:
  std::string label_;
  std::uint64_t total_;
  std::FILE* out_;
  bool tty_;
  int last_decile_ = -1;
};

}  // namespace idem::cli
