#include "progress.hpp"

#include <unistd.h>

#include <algorithm>

namespace idem::cli {

ProgressBar::ProgressBar(std::string label, std::uint64_t total, std::FILE* out)
    : label_(std::move(label)),
      total_(std::max<std::uint64_t>(total, 1)),
      out_(out),
      tty_(::isatty(::fileno(out)) != 0) {}

void ProgressBar::update(std::uint64_t done, const std::string& note) {
  constexpr int kWidth = 30;
  const double fraction = std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  if (!tty_) {
    const int decile = static_cast<int>(fraction * 10);
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(out_, "%s %3d%% %llu/%llu %s\n", label_.c_str(), decile * 10,
                 static_cast<unsigned long long>(done), static_cast<unsigned long long>(total_),
                 note.c_str());
    std::fflush(out_);
    return;
  }
  const int filled = static_cast<int>(fraction * kWidth);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.append(static_cast<std::size_t>(kWidth - filled), '.');
  std::fprintf(out_, "\r%s [%s] %3d%% %llu/%llu %s\x1b[K", label_.c_str(), bar.c_str(),
               static_cast<int>(fraction * 100), static_cast<unsigned long long>(done),
               static_cast<unsigned long long>(total_), note.c_str());
  std::fflush(out_);
}

void ProgressBar::finish(const std::string& note) {
  update(total_, note);
  if (tty_) std::fputc('\n', out_);
  std::fflush(out_);
}

}  // namespace idem::cli
