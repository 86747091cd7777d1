#include <idem/event.hpp>
#include <idem/open.hpp>

#include <iostream>

int main() {
  // Only idem::open is linked: the SQLite backend comes with it, chosen by URL.
  auto recorder = idem::open_recorder("sqlite::memory:");
  const std::string id = idem::new_event_id();
  recorder->mark_processed("install-test", id);
  if (!recorder->is_processed("install-test", id)) return 1;
  std::cout << "idem::open alone works\n";
  return 0;
}
