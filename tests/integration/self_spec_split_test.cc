// Self-speculation split across two processes: the tandem-drafter hosts the bundled tri-mode
// target itself with --mask-drafts (its block-diffusion pathway drafts), the verifier verifies
// with the target's AR pathway. Greedy `spec` through the router reproduces `ar` token for
// token, its drafts get accepted, and it takes fewer target forwards than in-process
// `self_spec`, whose cycles pay their draft forwards on the verifier.
#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace tandem::testing {
namespace {

TEST(SelfSpecSplitCluster, SpecWithTheTargetAsMaskDrafterEqualsArInFewerForwards) {
  ClusterOptions options;
  options.drafter_model_flags = {"--model", TargetModelDir(), "--mask-drafts", "8"};
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  int64_t split_tokens = 0, split_forwards = 0, accepted = 0;
  int64_t local_tokens = 0, local_forwards = 0;
  const std::vector<std::string> prompts = {"Once upon a time",
                                            "def fibonacci(n):", "The capital of France is"};
  for (const std::string& prompt : prompts) {
    const StreamResult ar = Generate((*cluster)->generation(), Greedy(prompt, "ar", 48));
    ASSERT_TRUE(ar.status.ok()) << ar.status.error_message();
    const StreamResult split = Generate((*cluster)->generation(), Greedy(prompt, "spec", 48));
    ASSERT_TRUE(split.status.ok()) << split.status.error_message();
    const StreamResult local = Generate((*cluster)->generation(), Greedy(prompt, "self_spec", 48));
    ASSERT_TRUE(local.status.ok()) << local.status.error_message();
    EXPECT_EQ(split.tokens, ar.tokens) << prompt;
    EXPECT_EQ(local.tokens, ar.tokens) << prompt;
    EXPECT_EQ(split.last.mode(), "spec");
    split_tokens += split.last.usage().completion_tokens();
    split_forwards += split.last.usage().target_forwards();
    accepted += split.last.usage().accepted_tokens();
    local_tokens += local.last.usage().completion_tokens();
    local_forwards += local.last.usage().target_forwards();
  }
  std::printf("[ split    ] tokens per target forward: split %.2f, in-process self_spec %.2f\n",
              static_cast<double>(split_tokens) / split_forwards,
              static_cast<double>(local_tokens) / local_forwards);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(split_tokens * local_forwards, local_tokens * split_forwards);
}

}  // namespace
}  // namespace tandem::testing
