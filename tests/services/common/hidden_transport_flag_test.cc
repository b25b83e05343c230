// `--hidden-transport nccl` on a host where NCCL is impossible (a build without CUDA, or no GPU
// visible): tandem-verifier and tandem-drafter refuse to start and say why. Skips where NCCL is
// possible.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "services/common/hidden_transport.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

struct Result {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

Result RunCommand(const std::string& command) {
  Result result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return result;
  char buffer[4096];
  size_t n = 0;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) result.output.append(buffer, n);
  const int status = pclose(pipe);
  if (WIFEXITED(status)) result.exit_code = WEXITSTATUS(status);
  return result;
}

class HiddenTransportFlagTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const HiddenTransportEnd local = LocalHiddenTransport(HiddenTransportMode::kNccl);
    if (local.nccl) GTEST_SKIP() << "NCCL is possible here (GPU " << local.gpu_uuid << ")";
    why_not_ = local.why_not;
  }
  std::string why_not_;
};

TEST_F(HiddenTransportFlagTest, VerifierRefusesToStartWithARequiredNcclItCannotUse) {
  const Result result =
      RunCommand(std::string(TANDEM_VERIFIER_BIN) + " --model " +
                 std::filesystem::temp_directory_path().string() + " --hidden-transport nccl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(
      result.output,
      HasSubstr("tandem-verifier: --hidden-transport nccl is impossible here: " + why_not_));
}

TEST_F(HiddenTransportFlagTest, DrafterRefusesToStartWithARequiredNcclItCannotUse) {
  const Result result = RunCommand(std::string(TANDEM_DRAFTER_BIN) +
                                   " --model /nonexistent-model --hidden-transport nccl");
  EXPECT_EQ(result.exit_code, 1) << result.output;
  EXPECT_THAT(result.output,
              HasSubstr("tandem-drafter: --hidden-transport nccl is impossible here: " + why_not_));
}

TEST_F(HiddenTransportFlagTest, AnUnknownTransportIsAUsageError) {
  const Result result = RunCommand(std::string(TANDEM_DRAFTER_BIN) +
                                   " --model /nonexistent-model --hidden-transport rdma");
  EXPECT_NE(result.exit_code, 0) << result.output;
  EXPECT_THAT(result.output, HasSubstr("--hidden-transport"));
}

}  // namespace
}  // namespace tandem
