// Prefix caching across the cluster: two verifiers behind a router with prefix affinity (the
// default) and one without. A conversation resends its history each turn; with affinity every
// turn after the first lands on the verifier that holds that history and takes it from its
// prefix cache; without, the least-loaded choice alternates between the idle verifiers and half
// the turns find nothing cached.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace tandem::testing {
namespace {

struct Verifiers {
  std::unique_ptr<ChildProcess> processes[2];
  std::string addresses[2];
  std::vector<std::unique_ptr<ChildProcess>> routers;

  absl::Status Start() {
    for (int i = 0; i < 2; ++i) {
      auto verifier =
          StartService("verifier",
                       {BinaryPath("verifier", "tandem-verifier"), "--model", TargetModelDir(),
                        "--listen", "127.0.0.1:0", "--calibration-seconds", "0"},
                       &addresses[i]);
      if (!verifier.ok()) return verifier.status();
      processes[i] = std::move(*verifier);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> StartRouter(std::vector<std::string> flags) {
    std::vector<std::string> argv = {BinaryPath("router", "tandem-router"),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--verifier",
                                     addresses[0],
                                     "--verifier",
                                     addresses[1]};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string address;
    auto router = StartService("router", argv, &address);
    if (!router.ok()) return router.status();
    routers.push_back(std::move(*router));
    return address;
  }
};

// Four turns of one conversation through `router`; the cached prompt tokens of each turn.
std::vector<int> Converse(const std::string& router, const std::string& topic) {
  auto stub = GenerationStub(router);
  std::string history = "# A module about " + topic + ".\n";
  for (int i = 0; i < 6; ++i) {
    history += "# Section " + std::to_string(i) + " describes the " + topic + " in detail.\n";
  }
  std::vector<int> cached;
  for (int turn = 1; turn <= 4; ++turn) {
    history += "\ndef " + topic + "_step_" + std::to_string(turn) + "(state):\n";
    v1::GenerateRequest request;
    request.set_prompt(history);
    request.set_max_tokens(16);
    request.set_mode("ar");
    request.mutable_sampling()->set_temperature(0.0f);
    const StreamResult result = Generate(*stub, request);
    EXPECT_TRUE(result.status.ok()) << result.status.error_message();
    if (!result.status.ok()) return cached;
    cached.push_back(result.last.usage().cached_tokens());
    history += result.text;
  }
  return cached;
}

TEST(PrefixAffinityTest, AConversationSticksToTheVerifierThatHoldsItsHistory) {
  Verifiers cluster;
  ASSERT_TRUE(cluster.Start().ok());
  absl::StatusOr<std::string> affine = cluster.StartRouter({});
  ASSERT_TRUE(affine.ok()) << affine.status();
  absl::StatusOr<std::string> plain = cluster.StartRouter({"--prefix-affinity=false"});
  ASSERT_TRUE(plain.ok()) << plain.status();

  const std::vector<int> with = Converse(*affine, "parser");
  const std::vector<int> without = Converse(*plain, "scheduler");
  ASSERT_EQ(with.size(), 4u);
  ASSERT_EQ(without.size(), 4u);
  // The first turn finds nothing; every later one finds at least the whole earlier prompt's
  // blocks (more than 100 tokens of history) on its verifier.
  EXPECT_EQ(with[0], 0);
  for (int turn = 1; turn < 4; ++turn) EXPECT_GE(with[turn], 96) << "turn " << turn + 1;
  // Alternating between two idle verifiers, turn 2 lands where nothing of the conversation is.
  EXPECT_EQ(without[1], 0);
  int sum_with = 0, sum_without = 0;
  for (int turn = 0; turn < 4; ++turn) {
    sum_with += with[turn];
    sum_without += without[turn];
  }
  EXPECT_GT(sum_with, sum_without);
}

}  // namespace
}  // namespace tandem::testing
