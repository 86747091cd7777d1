#include <idem/event.hpp>
#include <idem/open.hpp>
#include <idem/sqlite/sqlite_recorder.hpp>

#include <iostream>

int main() {
  // A backend linked directly...
  idem::sqlite::SqliteIdempotencyRecorder recorder(":memory:");
  const std::string id = idem::new_event_id();
  recorder.mark_processed("install-test", id);
  if (!recorder.is_processed("install-test", id)) return 1;
  // ... and one chosen by URL through idem::open (which brings every backend it was built with).
  auto by_url = idem::open_recorder("sqlite::memory:");
  by_url->mark_processed("install-test", id);
  if (!by_url->is_processed("install-test", id)) return 1;
  std::cout << "installed idem works\n";
  return 0;
}
