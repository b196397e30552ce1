// The logger's sinks: a file that rotates by size, and the journal's
// priority prefixes when stderr is the journal's stream.
#include "base/log.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "base/fs.h"
#include "test_util.h"

namespace aotid::log {
namespace {

using aotid::testing::TempDir;

// Points this process's stderr at a file until destroyed.
class StderrToFile {
 public:
  explicit StderrToFile(const std::string& path)
      : saved_(::dup(STDERR_FILENO)), fd_(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600)) {
    if (fd_ >= 0) ::dup2(fd_, STDERR_FILENO);
  }
  ~StderrToFile() {
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
    if (fd_ >= 0) ::close(fd_);
  }
  int fd() const { return fd_; }

 private:
  int saved_, fd_;
};

TEST(Log, FileRotatesBySizeKeepingAFew) {
  TempDir dir;
  std::string path = dir / "aotid.log";
  ASSERT_TRUE(SetFile(path, 1000, 2).ok());
  const std::string message(90, 'x');  // about 120 bytes a line with its stamp
  for (int i = 0; i < 100; ++i) Write(Level::kWarning, message + " " + std::to_string(i));
  ResetToStderr();
  // The newest line is in FILE; FILE.1 and FILE.2 hold the lines before;
  // older ones are gone, and no file passes its bound by more than a line.
  auto now = fs::ReadFile(path);
  auto first = fs::ReadFile(path + ".1");
  auto second = fs::ReadFile(path + ".2");
  ASSERT_TRUE(now.ok() && first.ok() && second.ok());
  EXPECT_FALSE(fs::Exists(path + ".3"));
  EXPECT_NE(now->find(message + " 99\n"), std::string::npos) << *now;
  EXPECT_NE(now->find(" warning " + message), std::string::npos) << *now;
  EXPECT_EQ(now->find(message + " 0\n"), std::string::npos);
  for (const std::string* f : {&*now, &*first, &*second}) EXPECT_LT(f->size(), 1000u + 130u);
  EXPECT_GE(first->size(), 1000u);
  struct stat st;
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);

  EXPECT_FALSE(SetFile(dir / "no/such/dir/aotid.log", 1000, 2).ok());
}

// A log file that takes no more (a full disk; /dev/full here) loses no
// line: it goes to stderr instead.
TEST(Log, LinesTheFileRefusesGoToStderr) {
  TempDir dir;
  std::string path = dir / "stderr";
  {
    StderrToFile to(path);
    ASSERT_GE(to.fd(), 0);
    ASSERT_TRUE(SetFile("/dev/full", 1 << 20, 1).ok());
    Write(Level::kError, "kept although the disk is full");
    ResetToStderr();
  }
  auto text = fs::ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("error kept although the disk is full\n"), std::string::npos) << *text;
}

// When stderr is the stream $JOURNAL_STREAM names, each line carries its
// syslog priority and no time stamp (journald keeps both).
TEST(Log, JournalStreamGetsPriorityPrefixes) {
  TempDir dir;
  std::string path = dir / "stderr";
  {
    StderrToFile to(path);
    ASSERT_GE(to.fd(), 0);
    struct stat st;
    ::fstat(to.fd(), &st);
    ::setenv("JOURNAL_STREAM", (std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino)).c_str(), 1);
    DetectJournal();
    Write(Level::kError, "the journal reads this");
    Write(Level::kInfo, "and this");
    Write(Level::kError, "a build failed:\n  compiler line");
    ::setenv("JOURNAL_STREAM", "1:2", 1);  // another stream: plain lines
    DetectJournal();
    Write(Level::kInfo, "plain again");
  }
  ::unsetenv("JOURNAL_STREAM");
  DetectJournal();
  auto text = fs::ReadFile(path);
  ASSERT_TRUE(text.ok());
  EXPECT_NE(text->find("<3>error the journal reads this\n<6>info and this\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("<3>error a build failed:\n<3>  compiler line\n"), std::string::npos) << *text;
  EXPECT_NE(text->find("Z info plain again\n"), std::string::npos) << *text;
}

}  // namespace
}  // namespace aotid::log
