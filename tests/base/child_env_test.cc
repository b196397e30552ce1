#include "base/child_env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstring>

namespace aotid {
namespace {

int Count(const std::vector<std::string>& env, const std::string& name) {
  return static_cast<int>(
      std::count_if(env.begin(), env.end(), [&](const std::string& e) { return e.starts_with(name + "="); }));
}

// A variable the parent sets for its child replaces the inherited one
// instead of standing beside it: with both, getenv in the child read the
// inherited value (TORCH_FORCE_WEIGHTS_ONLY_LOAD=0 from the daemon's
// environment would have won over the build's 1).
TEST(ChildEnvironment, SetVariablesReplaceInheritedOnesAndOthersPass) {
  ::setenv("AOTID_TEST_REPLACED", "parent", 1);
  ::setenv("AOTID_TEST_KEPT", "kept=with=equals", 1);
  ::setenv("AOTID_TEST_REPLACED_PREFIX", "other", 1);
  auto env = ChildEnvironment({"AOTID_TEST_REPLACED=child", "AOTID_TEST_NEW=1"});
  ::unsetenv("AOTID_TEST_REPLACED");
  ::unsetenv("AOTID_TEST_KEPT");
  ::unsetenv("AOTID_TEST_REPLACED_PREFIX");
  EXPECT_EQ(Count(env, "AOTID_TEST_REPLACED"), 1);
  EXPECT_NE(std::find(env.begin(), env.end(), "AOTID_TEST_REPLACED=child"), env.end());
  EXPECT_NE(std::find(env.begin(), env.end(), "AOTID_TEST_KEPT=kept=with=equals"), env.end());
  // Only the exact name is replaced, not every name it begins.
  EXPECT_NE(std::find(env.begin(), env.end(), "AOTID_TEST_REPLACED_PREFIX=other"), env.end());
  EXPECT_EQ(Count(env, "AOTID_TEST_NEW"), 1);
}

TEST(ChildEnvironment, NullTerminatedPointsIntoTheStrings) {
  std::vector<std::string> args = {"python", "-m", "x"};
  auto argv = NullTerminated(args);
  ASSERT_EQ(argv.size(), 4u);
  EXPECT_STREQ(argv[0], "python");
  EXPECT_STREQ(argv[2], "x");
  EXPECT_EQ(argv[3], nullptr);
  EXPECT_EQ(argv[1], args[1].data());
}

}  // namespace
}  // namespace aotid
