// The demo's file-backed queue: a stand-in for a broker with at-least-once delivery.
//
// A hop's queue is a file of JSON events, one a line, each with its delivery position "seq". Its
// consumer acknowledges by committing an offset (a small file renamed into place every few
// deliveries): after a SIGKILL the restarted consumer resumes from the last committed offset, so
// what the dead one handled since then is delivered again — the redelivery a broker gives a
// consumer that died before its ack. Logs are appended with O_APPEND writes, so what a killed
// process wrote is still there to count.
//
// Thread-safety: none needed; each process of the demo uses these from one thread.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "idem/event.hpp"

namespace idem::cli::demo {

namespace fs = std::filesystem;

// An owned file descriptor (closed by the destructor).
struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
};

// Writes all of `text` (retrying short writes and EINTR); std::runtime_error on failure.
void write_all(int fd, const std::string& text);

// Appends lines with O_APPEND writes: every line is on disk (in the page cache) the moment
// write() returns, so what a killed process did is still countable afterwards. The file is
// created by the first line, not before.
class AppendLog {
 public:
  explicit AppendLog(fs::path path) : path_(std::move(path)) {}
  void line(const std::string& text);

 private:
  fs::path path_;
  Fd fd_;
};

// The files of one hop in the work dir: its queue (one JSON event a line), the consumer's
// committed offset, its delivery log and (outside transactional mode) its side-effect log.
struct HopFiles {
  fs::path queue, offset, deliveries, side_effects;
};
HopFiles hop_files(const fs::path& dir, int hop);

// Every name the demo may create in its work dir (for --dir: what it may replace).
const std::vector<std::string>& work_dir_names();

std::uint64_t read_offset(const fs::path& path);
// The "ack": atomically replace the committed offset (write a temp file, then rename).
void commit_offset(const fs::path& path, std::uint64_t offset);

// The events of a queue file, with their "seq" (and "source", when present) as headers.
std::vector<Event> read_queue(const fs::path& path);

}  // namespace idem::cli::demo
