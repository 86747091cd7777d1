#include "idem/event.hpp"

#include <sys/random.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

#include "idem/detail/fork.hpp"
#include "uuid_hex.hpp"

namespace idem {
namespace {

struct RandomBuffer {
  static constexpr std::size_t kSize = 4096;
  std::array<unsigned char, kSize> bytes{};
  std::size_t used = kSize;
  std::uint64_t generation = ~std::uint64_t{0};

  void refill() {
    std::size_t filled = 0;
    while (filled < kSize) {
      ssize_t n = ::getrandom(bytes.data() + filled, kSize - filled, 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw std::system_error(errno, std::generic_category(), "idem: getrandom failed");
      }
      filled += static_cast<std::size_t>(n);
    }
    used = 0;
  }

  void take(unsigned char* out, std::size_t n) {
    // A new generation after every fork(): per-thread buffers inherited from the parent are
    // discarded instead of repeating the parent's ids.
    const std::uint64_t current = detail::fork_generation();
    if (generation != current || used + n > kSize) {
      generation = current;
      refill();
    }
    std::memcpy(out, bytes.data() + used, n);
    // Never hand out the same bytes twice.
    std::memset(bytes.data() + used, 0, n);
    used += n;
  }
};

}  // namespace

std::string new_event_id() {
  thread_local RandomBuffer buffer;
  unsigned char raw[16];
  buffer.take(raw, sizeof raw);
  return detail::uuid_hex(raw, 4);
}

bool is_uuid4_hex(std::string_view id) noexcept {
  if (id.size() != 32) return false;
  for (char c : id) {
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
    if (!hex) return false;
  }
  if (id[12] != '4') return false;
  return id[16] == '8' || id[16] == '9' || id[16] == 'a' || id[16] == 'b';
}

Event Event::make(std::string type, std::string payload,
                  std::map<std::string, std::string> headers) {
  Event event;
  event.id = new_event_id();
  event.type = std::move(type);
  event.payload = std::move(payload);
  event.headers = std::move(headers);
  event.timestamp = std::chrono::system_clock::now();
  return event;
}

}  // namespace idem
