// Cases that need a child process of their own (fork without exec): a new event id in a child
// differs from the parent's, a crash point's kill action ends the whole process with SIGKILL, and
// a SQLite file that is read-only for a non-root user reads but refuses the first write.
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>

#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/crash_points.hpp"
#include "worker/child_process.hpp"

namespace {

using idem::test::ForkedChild;
using idem::test::TempDir;

TEST(NewEventId, ChildAfterForkDoesNotRepeatParent) {
  (void)idem::new_event_id();  // fill this thread's buffer before forking
  ForkedChild child([] { return idem::new_event_id(); });
  const std::string parent_id = idem::new_event_id();
  const ForkedChild::End end = child.wait();
  ASSERT_TRUE(end.exited_with(0)) << end.problem();
  ASSERT_EQ(end.report.size(), 32u) << end.report;
  EXPECT_NE(end.report, parent_id);
}

TEST(CrashPointFunction, KillEndsTheWholeProcessWithSigkill) {
  // fork() without exec is fine here: the child calls only crash_point() (kill + _Exit).
  ForkedChild child([] {
    idem::testing::crash_point(idem::testing::CrashPoint::during_complete,
                               idem::testing::CrashPlan{idem::testing::CrashPoint::during_complete,
                                                        idem::testing::CrashAction::kill});
    return std::string("the kill did nothing");
  });
  const ForkedChild::End end = child.wait();
  EXPECT_TRUE(end.killed_by(SIGKILL)) << end.problem();
}

// The file itself is read-only for the process (chmod 0444). root may write anyway, so as root
// the check runs in a forked child that drops to the "nobody" user first.
TEST(SqliteRecorderBadInput, ReadOnlyFileReadsButFailsOnTheFirstWrite) {
  TempDir dir;
  std::filesystem::permissions(dir.path(), std::filesystem::perms::all);  // nobody may enter
  const std::string path = dir.file("ro-file.db");
  { idem::sqlite::SqliteIdempotencyRecorder(path).mark_processed("billing", "old"); }
  std::filesystem::permissions(path, std::filesystem::perms::owner_read |
                                         std::filesystem::perms::group_read |
                                         std::filesystem::perms::others_read);
  ForkedChild child([&path] {
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      return std::string("setuid failed");
    }
    std::string report;
    try {
      idem::sqlite::SqliteIdempotencyRecorder recorder(path);
      report += recorder.is_processed("billing", "old") ? "read:ok;" : "read:missing;";
      try {
        recorder.mark_processed("billing", "new");
        report += "write:succeeded;";
      } catch (const idem::Error& e) {
        report += "write:" + std::string(e.code_name()) + ";";
      }
      report += recorder.is_processed("billing", "new") ? "new:marked" : "new:absent";
    } catch (const std::exception& e) {
      report = std::string("open:") + e.what();
    }
    return report;
  });
  const ForkedChild::End end = child.wait();
  ASSERT_TRUE(end.exited_with(0)) << end.problem();
  const std::string& report = end.report;
  EXPECT_EQ(report, "read:ok;write:store_read_only;new:absent");
}

}  // namespace
