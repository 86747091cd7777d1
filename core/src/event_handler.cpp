#include "idem/event_handler.hpp"

#include <utility>

namespace idem {

std::string_view to_string(HandleResult result) noexcept {
  switch (result) {
    case HandleResult::processed:
      return "processed";
    case HandleResult::duplicate:
      return "duplicate";
  }
  return "unknown";
}

std::vector<HandleOutcome> EventHandler::handle_batch(std::span<const Event> events,
                                                      BusProxy& bus) {
  std::vector<HandleOutcome> outcomes(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    try {
      outcomes[i].result = (*this)(events[i], bus);
    } catch (...) {
      outcomes[i].error = std::current_exception();
    }
  }
  return outcomes;
}

CollectingBusProxy::CollectingBusProxy(std::string consumer) : consumer_(std::move(consumer)) {}

void CollectingBusProxy::publish(Event event) {
  std::lock_guard lock(mutex_);
  published_.push_back(std::move(event));
}

std::vector<Event> CollectingBusProxy::published() const {
  std::lock_guard lock(mutex_);
  return published_;
}

std::vector<Event> CollectingBusProxy::take() {
  std::lock_guard lock(mutex_);
  return std::exchange(published_, {});
}

}  // namespace idem
