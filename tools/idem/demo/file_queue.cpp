// The demo's file-backed queue (file_queue.hpp).
#include "file_queue.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace idem::cli::demo {

Fd::~Fd() {
  if (fd >= 0) ::close(fd);
}

void write_all(int fd, const std::string& text) {
  const char* p = text.data();
  std::size_t left = text.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error("write failed: " + std::string(std::strerror(errno)));
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
}

void AppendLog::line(const std::string& text) {
  if (fd_.fd < 0) {
    fd_.fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd_.fd < 0) {
      throw std::runtime_error("cannot open " + path_.string() + ": " + std::strerror(errno));
    }
  }
  write_all(fd_.fd, text + "\n");
}

HopFiles hop_files(const fs::path& dir, int hop) {
  if (hop == 2) {
    return {dir / "charged.jsonl", dir / "charged.offset", dir / "shipping.log",
            dir / "shipping_effects.log"};
  }
  return {dir / "queue.jsonl", dir / "offset", dir / "deliveries.log", dir / "side_effects.log"};
}

const std::vector<std::string>& work_dir_names() {
  static const std::vector<std::string> names = {"queue.jsonl",          "offset",
                                                 "offset.tmp",           "deliveries.log",
                                                 "side_effects.log",     "idem.db",
                                                 "idem.db-wal",          "idem.db-shm",
                                                 "idem.db-journal",      "idem.db-outbox.lock",
                                                 "charged.jsonl",        "charged.offset",
                                                 "charged.offset.tmp",   "shipping.log",
                                                 "shipping_effects.log", "relay.log"};
  return names;
}

std::uint64_t read_offset(const fs::path& path) {
  std::ifstream in(path);
  std::uint64_t offset = 0;
  if (in) in >> offset;
  return offset;
}

void commit_offset(const fs::path& path, std::uint64_t offset) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << offset << "\n";
  }
  fs::rename(tmp, path);
}

std::vector<Event> read_queue(const fs::path& path) {
  std::ifstream in(path);
  std::vector<Event> events;
  std::string line;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    Event e;
    e.id = j.at("id").get<std::string>();
    e.type = j.at("type").get<std::string>();
    e.payload = j.at("payload").get<std::string>();
    e.headers["seq"] = std::to_string(j.at("seq").get<std::uint64_t>());
    if (j.contains("source")) e.headers["source"] = j.at("source").get<std::string>();
    events.push_back(std::move(e));
  }
  return events;
}

}  // namespace idem::cli::demo
