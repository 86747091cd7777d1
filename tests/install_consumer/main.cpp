#include <idem/event.hpp>
#include <idem/sqlite/sqlite_recorder.hpp>

#include <iostream>

int main() {
  idem::sqlite::SqliteIdempotencyRecorder recorder(":memory:");
  const std::string id = idem::new_event_id();
  recorder.mark_processed("install-test", id);
  if (!recorder.is_processed("install-test", id)) return 1;
  std::cout << "installed idem works\n";
  return 0;
}
