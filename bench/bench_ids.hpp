// Fresh, uuid4-shaped event ids for benchmarks, made from a counter so generating them costs a
// few nanoseconds and every iteration sees a new id (a check+mark of an unseen event).
#pragma once

#include <cstdint>
#include <string_view>

namespace idem::bench {

namespace detail {

// `value` as 16 lowercase hex digits at `out`.
inline void write_hex(char* out, std::uint64_t value) {
  static constexpr char kHex[] = "0123456789abcdef";
  for (int i = 15; i >= 0; --i) {
    out[i] = kHex[value & 0xf];
    value >>= 4;
  }
}

}  // namespace detail

class IdSequence {
 public:
  explicit IdSequence(std::uint64_t stream) : stream_(stream) {}

  std::string_view next() {
    detail::write_hex(buffer_, stream_);
    detail::write_hex(buffer_ + 16, counter_++);
    buffer_[12] = '4';  // version nibble
    buffer_[16] = '8';  // variant nibble
    return {buffer_, 32};
  }

 private:
  std::uint64_t stream_;
  std::uint64_t counter_ = 0;
  char buffer_[32] = {};
};

}  // namespace idem::bench

namespace idem::bench {

// Fresh ids of one shape, each a new id on every next(): 32 lowercase hex digits (what
// new_event_id() makes), a dashed UUID (36 characters), a short text id ("order-<stream>-<n>":
// 9 to 15 bytes in the timed loops, whose streams are 1 and 2; the prefill's stream makes 15 to
// 21), a 26-byte text id (the length of a ULID) or a 255-byte text id (the key length limit). A
// counter makes them, so generating one costs a few nanoseconds.
enum class IdShape { hex32 = 0, uuid36 = 1, short_text = 2, long_text = 3, text26 = 4 };
inline constexpr int kIdShapes = 5;

inline const char* shape_name(IdShape shape) {
  switch (shape) {
    case IdShape::hex32:
      return "hex32";
    case IdShape::uuid36:
      return "uuid36";
    case IdShape::short_text:
      return "text";
    case IdShape::long_text:
      return "text255";
    case IdShape::text26:
      return "text26";
  }
  return "?";
}

class ShapedIds {
 public:
  ShapedIds(IdShape shape, std::uint64_t stream) : shape_(shape), stream_(stream) {
    for (char& c : buffer_)
      c = 'x';
  }

  std::string_view next() {
    const std::uint64_t n = counter_++;
    switch (shape_) {
      case IdShape::hex32:
        detail::write_hex(buffer_, stream_);
        detail::write_hex(buffer_ + 16, n);
        return {buffer_, 32};
      case IdShape::uuid36: {
        char digits[32];
        detail::write_hex(digits, stream_);
        detail::write_hex(digits + 16, n);
        digits[12] = '4';
        const int groups[] = {8, 4, 4, 4, 12};
        char* out = buffer_;
        const char* in = digits;
        for (int g = 0; g < 5; ++g) {
          if (g > 0) *out++ = '-';
          for (int i = 0; i < groups[g]; ++i)
            *out++ = *in++;
        }
        return {buffer_, 36};
      }
      case IdShape::short_text:
      case IdShape::long_text:
      case IdShape::text26: {
        // "order-<stream>-<n>": the varying digits come last, as in most text ids.
        char* out = buffer_;
        for (const char c : std::string_view("order-"))
          *out++ = c;
        out = write_decimal(out, stream_);
        *out++ = '-';
        out = write_decimal(out, n);
        if (shape_ == IdShape::short_text)
          return {buffer_, static_cast<std::size_t>(out - buffer_)};
        // A 26- or 255-byte id: the same text padded in front, its digits at the end so ids
        // differ late.
        const std::size_t size = shape_ == IdShape::text26 ? 26 : 255;
        char tail[48];
        const std::size_t length = static_cast<std::size_t>(out - buffer_);
        for (std::size_t i = 0; i < length; ++i)
          tail[i] = buffer_[i];
        for (std::size_t i = 0; i < size - length; ++i)
          buffer_[i] = 'p';
        for (std::size_t i = 0; i < length; ++i)
          buffer_[size - length + i] = tail[i];
        return {buffer_, size};
      }
    }
    return {};
  }

 private:
  static char* write_decimal(char* out, std::uint64_t value) {
    char digits[20];
    int n = 0;
    do {
      digits[n++] = static_cast<char>('0' + value % 10);
      value /= 10;
    } while (value != 0);
    while (n > 0)
      *out++ = digits[--n];
    return out;
  }

  IdShape shape_;
  std::uint64_t stream_;
  std::uint64_t counter_ = 0;
  char buffer_[256];
};

}  // namespace idem::bench
