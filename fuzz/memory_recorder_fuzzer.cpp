// The in-memory recorder against a model (a map of (consumer, event id) to the first mark's
// time): marks, checks, batch calls, time passing and purges decoded from the input, on one or
// two shards so that ids share tables and hash bits. Ids come in every shape the recorder stores
// differently: as the input gives them (invalid ones included), short text (kept in the slot),
// longer text (kept in the arena), 32 hex digits and dashed UUIDs (packed) and near misses of those
// (upper-case digits, a moved dash), so that each is its own key exactly when its text differs.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fuzz_support.hpp"
#include "idem/error.hpp"
#include "idem/key.hpp"
#include "idem/memory_recorder.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  std::uint8_t byte() { return at_ < size_ ? data_[at_++] : 0; }
  std::string bytes(std::size_t n) {
    std::string out;
    while (n-- > 0 && at_ < size_)
      out.push_back(static_cast<char>(data_[at_++]));
    return out;
  }

 private:
  const std::uint8_t* data_;
  std::size_t size_;
  std::size_t at_ = 0;
};

// An id of the shape `shape` made from the input.
std::string make_id(Input& in, std::uint8_t shape) {
  static constexpr char kHex[] = "0123456789abcdef";
  switch (shape % 6) {
    case 0:  // raw bytes, 0 to 63 of them: invalid ids too
      return in.bytes(in.byte() % 64);
    case 1: {  // printable text of 1 to 40 bytes: both sides of the slot's 16
      std::string id = in.bytes(1 + in.byte() % 40);
      for (char& c : id)
        c = static_cast<char>(0x20 + static_cast<unsigned char>(c) % 0x5f);
      return id;
    }
    case 2:
    case 3: {  // 32 hex digits, or a dashed UUID; sometimes one character off the packed form
      std::string id;
      for (int i = 0; i < 32; ++i)
        id.push_back(kHex[in.byte() % 16]);
      if (shape % 6 == 3) {
        for (const std::size_t at : {8u, 13u, 18u, 23u})
          id.insert(at, 1, '-');
      }
      const std::uint8_t twist = in.byte();
      if (twist % 4 == 0) id[twist % id.size()] = "AFg-"[twist / 4 % 4];
      return id;
    }
    case 4:  // a long id, up to the key limit and one past it
      return std::string(200 + in.byte() % 57, 'p') + in.bytes(in.byte() % 4);
    default: {  // a short id from a tiny alphabet, so that ids repeat
      std::string id = in.bytes(1 + in.byte() % 3);
      for (char& c : id)
        c = "ab "[static_cast<unsigned char>(c) % 3];
      return id;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using Key = std::pair<std::string, std::string>;
  Input in(data, size);
  auto clock = std::make_shared<idem::testing::ManualClock>();
  idem::InMemoryIdempotencyRecorder recorder({.clock = clock, .shards = 1u + in.byte() % 2u});
  std::map<Key, idem::WallTime> model;  // the first mark's time of each marker
  const auto mark = [&](const Key& key) { model.emplace(key, clock->wall_now()); };
  const auto marked = [&](const Key& key) { return model.count(key) == 1; };
  const std::string consumers[] = {"billing", "audit", "b"};
  std::vector<std::string> seen;  // ids used so far, to come back to
  for (int step = 0; step < 200 && !in.empty(); ++step) {
    const std::uint8_t op = in.byte();
    const std::string& consumer = consumers[op / 8 % 3];
    std::string id;
    if (!seen.empty() && op / 32 % 2 == 1) {
      id = seen[in.byte() % seen.size()];
    } else {
      id = make_id(in, in.byte());
      seen.push_back(id);
    }
    const bool valid = idem::is_valid_key(id);
    switch (op % 8) {
      case 0:
      case 1:
      case 2: {  // mark
        bool threw = false;
        try {
          recorder.mark_processed(consumer, id);
        } catch (const idem::InvalidKey&) {
          threw = true;
        }
        if (threw == valid) idem::fuzz::fail("mark_processed and is_valid_key disagree");
        if (valid) mark({consumer, id});
        break;
      }
      case 3:
      case 4: {  // check
        bool processed = false;
        bool threw = false;
        try {
          processed = recorder.is_processed(consumer, id);
        } catch (const idem::InvalidKey&) {
          threw = true;
        }
        if (threw == valid) idem::fuzz::fail("is_processed and is_valid_key disagree");
        if (valid && processed != marked({consumer, id})) {
          idem::fuzz::fail("is_processed disagrees with the model for '" + id + "'");
        }
        break;
      }
      case 5: {  // the batch calls on the valid ids seen so far
        std::vector<std::string> ids;
        for (const std::string& s : seen) {
          if (idem::is_valid_key(s)) ids.push_back(s);
        }
        const std::vector<bool> processed = recorder.is_processed_many(consumer, ids);
        for (std::size_t i = 0; i < ids.size(); ++i) {
          if (processed[i] != marked({consumer, ids[i]})) {
            idem::fuzz::fail("is_processed_many disagrees with the model");
          }
        }
        if (op / 128 == 1) {
          recorder.mark_processed_many(consumer, ids);
          for (const std::string& s : ids)
            mark({consumer, s});
        }
        break;
      }
      case 6:  // time passes
        clock->advance(std::chrono::seconds(in.byte() % 4));
        break;
      default: {  // purge what is older than 0 to 3 s (rebuilds the tables, compacts the arena)
        const auto older_than = std::chrono::seconds(in.byte() % 4);
        const idem::WallTime cutoff = clock->wall_now() - older_than;
        std::size_t expected = 0;
        for (auto it = model.begin(); it != model.end();) {
          if (it->second < cutoff) {
            it = model.erase(it);
            ++expected;
          } else {
            ++it;
          }
        }
        if (recorder.purge(older_than) != expected) {
          idem::fuzz::fail("purge removed another number of markers than the model");
        }
        break;
      }
    }
    if (recorder.marker_count() != model.size()) idem::fuzz::fail("marker_count disagrees");
  }
  return 0;
}
