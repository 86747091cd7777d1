// The demo's producer (producer.hpp).
#include "producer.hpp"

#include <algorithm>
#include <fstream>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "idem/event.hpp"
#include "supervisor.hpp"

namespace idem::cli::demo {
namespace {

constexpr std::uint64_t kProgressStep = 1024;

struct Original {
  std::string id;
  std::string payload;
};

// A copy of `original` placed before the original at index `before` (the stream's end when it
// is the count of originals).
struct Duplicate {
  std::size_t before;
  std::size_t original;
};

}  // namespace

std::uint64_t produce(const std::filesystem::path& queue, const DemoOptions& options,
                      const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  const std::size_t n = options.events;
  // Where the copies go is drawn first (cheap); the events themselves are made as they are
  // written, so the progress line covers all the work. A copy always comes after its original,
  // so the original exists by then.
  std::mt19937_64 pattern(options.seed);
  const auto count =
      static_cast<std::size_t>(static_cast<double>(options.events) * options.duplicate_ratio);
  std::vector<Duplicate> duplicates;
  duplicates.reserve(count);
  for (std::size_t d = 0; d < count; ++d) {
    const std::size_t original = pattern() % n;
    duplicates.push_back({original + 1 + pattern() % (n - original), original});
  }
  std::stable_sort(duplicates.begin(), duplicates.end(),
                   [](const Duplicate& a, const Duplicate& b) { return a.before < b.before; });
  std::mt19937_64 amounts(options.seed + 1);
  std::vector<Original> originals;
  originals.reserve(n);

  const std::uint64_t total = n + count;
  std::ofstream out(queue, std::ios::trunc);
  std::uint64_t seq = 0;
  auto write = [&](const Original& event) {
    out << nlohmann::json{{"id", event.id},
                          {"type", "order.paid"},
                          {"payload", event.payload},
                          {"seq", seq}}
               .dump()
        << "\n";
    if (++seq % kProgressStep == 0) {
      check_interrupted();
      progress(seq, total);
    }
  };
  std::size_t next_duplicate = 0;
  for (std::size_t i = 0; i <= n; ++i) {
    for (; next_duplicate < duplicates.size() && duplicates[next_duplicate].before == i;
         ++next_duplicate)
      write(originals[duplicates[next_duplicate].original]);
    if (i == n) break;
    const nlohmann::json payload = {{"order", i + 1}, {"amount_cents", 100 + (amounts() % 90000)}};
    originals.push_back({new_event_id(), payload.dump()});
    write(originals[i]);
  }
  out.flush();
  if (!out) throw std::runtime_error("cannot write the queue file " + queue.string());
  progress(seq, total);
  return seq;
}

}  // namespace idem::cli::demo
