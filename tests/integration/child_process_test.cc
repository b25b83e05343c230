// ChildProcess's environment defaults: a child gets an entry of Options::default_env only when
// the parent's environment has no such name; everything else is inherited.
#include "services/cli/child_process.h"

#include <gtest/gtest.h>
#include <stdlib.h>

namespace tandem {
namespace {

// A child that announces the value of `name` in its environment as its "address".
absl::StatusOr<std::string> ChildSees(const std::string& name,
                                      std::vector<std::string> default_env) {
  auto child = ChildProcess::Start(
      {.name = "shell",
       .argv = {"/bin/sh", "-c",
                "echo \"shell listening on ${" + name + ":-unset}\"; exec sleep 5"},
       .forward_output = false,
       .default_env = std::move(default_env)});
  if (!child.ok()) return child.status();
  return (*child)->WaitForAddress(absl::Seconds(10));
}

TEST(ChildProcessTest, DefaultEnvironmentAppliesOnlyWhereTheParentHasNone) {
  unsetenv("TANDEM_TEST_WAIT");
  EXPECT_EQ(*ChildSees("TANDEM_TEST_WAIT", {"TANDEM_TEST_WAIT=passive"}), "passive");
  EXPECT_EQ(*ChildSees("TANDEM_TEST_WAIT", {}), "unset");
  setenv("TANDEM_TEST_WAIT", "active", 1);
  EXPECT_EQ(*ChildSees("TANDEM_TEST_WAIT", {"TANDEM_TEST_WAIT=passive"}), "active");
  unsetenv("TANDEM_TEST_WAIT");
}

// Model services started side by side get OpenMP's passive waits unless the user chose a policy.
TEST(ChildProcessTest, ServicesSharingCoresWaitPassivelyUnlessTold) {
  const char* before = getenv("OMP_WAIT_POLICY");
  const std::string saved = before != nullptr ? before : "";
  unsetenv("OMP_WAIT_POLICY");
  EXPECT_EQ(*ChildSees("OMP_WAIT_POLICY", SharedCoresEnv()), "passive");
  setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_EQ(*ChildSees("OMP_WAIT_POLICY", SharedCoresEnv()), "active");
  if (before != nullptr) {
    setenv("OMP_WAIT_POLICY", saved.c_str(), 1);
  } else {
    unsetenv("OMP_WAIT_POLICY");
  }
}

}  // namespace
}  // namespace tandem
