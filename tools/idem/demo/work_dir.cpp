// The demo's work directory (work_dir.hpp).
#include "work_dir.hpp"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <string>
#include <system_error>

#include "file_queue.hpp"
#include "idem/error.hpp"

namespace idem::cli::demo {
namespace {

constexpr const char* kMarker = ".idem-demo";

bool is_demo_name(const std::string& name) {
  const auto& names = work_dir_names();
  return name == kMarker || std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

WorkDir::WorkDir(const DemoOptions& options) {
  if (options.dir.empty()) {
    std::string pattern = (fs::temp_directory_path() / "idem-demo-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      throw StoreError("cannot make a work dir " + pattern + ": " + std::strerror(errno), false);
    }
    path_ = pattern;
    remove_ = !options.keep;
    return;
  }
  path_ = fs::absolute(options.dir);
  std::error_code ec;
  const fs::file_status status = fs::status(path_, ec);
  if (fs::exists(status) && !fs::is_directory(status)) {
    throw InvalidArgument("--dir " + options.dir + " is not a directory");
  }
  if (!fs::exists(status)) {
    fs::create_directories(path_, ec);
    if (ec) throw StoreError("cannot make --dir " + options.dir + ": " + ec.message(), false);
  } else {
    const bool earlier_demo = fs::exists(path_ / kMarker);
    for (const fs::directory_entry& entry : fs::directory_iterator(path_)) {
      const std::string name = entry.path().filename().string();
      if (options.reuse_dir || (earlier_demo && is_demo_name(name))) continue;
      throw InvalidArgument(
          "--dir " + options.dir + " holds '" + name +
          "', which idem demo did not make; give a new or empty directory (or one an earlier "
          "`idem demo --dir` used), or pass --reuse-dir to let the demo replace its own files "
          "there (queue.jsonl, idem.db, ...: docs/cli.md) and leave the rest alone");
    }
  }
  for (const std::string& name : work_dir_names()) {
    fs::remove(path_ / name, ec);
    if (ec)
      throw StoreError("cannot replace " + (path_ / name).string() + ": " + ec.message(), false);
  }
  std::ofstream(path_ / kMarker, std::ios::trunc)
      << "made by idem demo, which may replace its own files in this directory\n";
}

WorkDir::~WorkDir() {
  if (!remove_) return;
  std::error_code ec;
  fs::remove_all(path_, ec);
}

}  // namespace idem::cli::demo
