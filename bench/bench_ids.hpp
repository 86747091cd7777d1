// Fresh, uuid4-shaped event ids for benchmarks, made from a counter so generating them costs a
// few nanoseconds and every iteration sees a new id (a check+mark of an unseen event).
#pragma once

#include <cstdint>
#include <string_view>

namespace idem::bench {

class IdSequence {
 public:
  explicit IdSequence(std::uint64_t stream) : stream_(stream) {}

  std::string_view next() {
    write_hex(buffer_, stream_);
    write_hex(buffer_ + 16, counter_++);
    buffer_[12] = '4';  // version nibble
    buffer_[16] = '8';  // variant nibble
    return {buffer_, 32};
  }

 private:
  static void write_hex(char* out, std::uint64_t value) {
    static constexpr char kHex[] = "0123456789abcdef";
    for (int i = 15; i >= 0; --i) {
      out[i] = kHex[value & 0xf];
      value >>= 4;
    }
  }

  std::uint64_t stream_;
  std::uint64_t counter_ = 0;
  char buffer_[32] = {};
};

}  // namespace idem::bench
