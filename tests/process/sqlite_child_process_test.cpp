// Cases that need a child process of their own (fork without exec): a new event id in a child
// differs from the parent's, a crash point's kill action ends the whole process with SIGKILL, and
// a SQLite file that is read-only for a non-root user reads but refuses the first write.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <string>

#include "../temp_dir.hpp"
#include "idem/error.hpp"
#include "idem/event.hpp"
#include "idem/sqlite/sqlite_recorder.hpp"
#include "idem/testing/crash_points.hpp"

namespace {

using idem::test::TempDir;

TEST(NewEventId, ChildAfterForkDoesNotRepeatParent) {
  (void)idem::new_event_id();  // fill this thread's buffer before forking
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const std::string id = idem::new_event_id();
    (void)!write(fds[1], id.data(), id.size());
    _exit(0);
  }
  close(fds[1]);
  const std::string parent_id = idem::new_event_id();
  char buf[32];
  ASSERT_EQ(read(fds[0], buf, sizeof buf), 32);
  close(fds[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_NE(std::string(buf, 32), parent_id);
}

TEST(CrashPointFunction, KillEndsTheWholeProcessWithSigkill) {
  // fork() without exec is fine here: the child calls only crash_point() (kill + _Exit).
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    idem::testing::crash_point(idem::testing::CrashPoint::during_complete,
                               idem::testing::CrashPlan{idem::testing::CrashPoint::during_complete,
                                                        idem::testing::CrashAction::kill});
    ::_exit(0);  // reached only if the kill did nothing
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "status " << status;
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
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    std::string report;
    if (::geteuid() == 0 && (::setgid(65534) != 0 || ::setuid(65534) != 0)) {
      report = "setuid failed";
    } else {
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
    }
    (void)!::write(pipe_fds[1], report.data(), report.size());
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string report;
  char buffer[512];
  for (ssize_t n; (n = ::read(pipe_fds[0], buffer, sizeof buffer)) > 0;) {
    report.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(pipe_fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_EQ(report, "read:ok;write:store_read_only;new:absent");
}

}  // namespace
