// The demo's work directory: the queue files, the processes' logs and, by default, the
// recorder's idem.db.
//
// Without --dir it is a new temporary directory (mkdtemp under $TMPDIR), removed by the
// destructor — on every way out of the demo — unless --keep.
//
// With --dir DIR it is DIR, created when missing and never removed. The demo refuses
// (InvalidArgument naming the first such file, so exit 2) a DIR holding anything it did not
// make: DIR must be empty, or hold only what an earlier `idem demo --dir DIR` left (its marker
// file .idem-demo and the demo's own file names, which it replaces). --reuse-dir lets the demo
// run in a DIR with other files too: it then replaces only its own file names
// (work_dir_names()) and leaves everything else as it is.
//
// Thread-safety: one thread.
#pragma once

#include <filesystem>

#include "../demo.hpp"

namespace idem::cli::demo {

class WorkDir {
 public:
  explicit WorkDir(const DemoOptions& options);
  ~WorkDir();
  WorkDir(const WorkDir&) = delete;
  WorkDir& operator=(const WorkDir&) = delete;

  const std::filesystem::path& path() const noexcept { return path_; }
  // True when the directory stays after the demo (--dir, or --keep).
  bool kept() const noexcept { return !remove_; }

 private:
  std::filesystem::path path_;
  bool remove_ = false;
};

}  // namespace idem::cli::demo
