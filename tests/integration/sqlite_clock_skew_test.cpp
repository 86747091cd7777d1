// Clock skew between processes sharing one SQLite file: two recorder/store objects on the same
// file, each with its own ManualClock (tests/integration/clock_skew_cases.hpp). SQLite has no
// clock of its own in idem's protocol: every time is the caller's options.clock.
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "clock_skew_cases.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/sqlite/sqlite_store.hpp"

namespace {

class SqliteSkewBackend final : public idem::test::SkewBackend {
 public:
  SqliteSkewBackend() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "idem-clock-skew-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
  }
  ~SqliteSkewBackend() override {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  SqliteSkewBackend(const SqliteSkewBackend&) = delete;
  SqliteSkewBackend& operator=(const SqliteSkewBackend&) = delete;

  std::shared_ptr<idem::IdempotencyRecorder> recorder(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::sqlite::SqliteIdempotencyRecorder>(path(), options(clock));
  }
  std::shared_ptr<idem::IdempotencyStore> store(std::shared_ptr<idem::Clock> clock) override {
    return std::make_shared<idem::sqlite::SqliteIdempotencyStore>(path(), options(clock));
  }

 private:
  std::string path() const { return (dir_ / "shared.db").string(); }
  static idem::sqlite::SqliteOptions options(std::shared_ptr<idem::Clock> clock) {
    idem::sqlite::SqliteOptions options;
    options.clock = std::move(clock);
    return options;
  }
  std::filesystem::path dir_;
};

}  // namespace

using idem::test::ClockSkewTest;

INSTANTIATE_TEST_SUITE_P(Sqlite, ClockSkewTest,
                         ::testing::Values(idem::test::SkewBackendFactory([] {
                           return std::make_unique<SqliteSkewBackend>();
                         })));
