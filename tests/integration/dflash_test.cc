// A cluster whose tandem-drafter serves the bundled DFlash drafter (--model tandem-dflash
// --target-model tandem-target): greedy `spec` through the router reproduces `ar` token for
// token, and drafts get accepted, which the drafter can only propose from the target hidden
// states the verifier sends it.
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/cluster.h"

namespace tandem::testing {
namespace {

TEST(DFlashCluster, SpecWithTheDFlashDrafterEqualsArAndAcceptsDrafts) {
  ClusterOptions options;
  options.drafter_model_flags = {"--model",
                                 std::string(TANDEM_SOURCE_DIR) + "/models/tandem-dflash",
                                 "--target-model", TargetModelDir()};
  auto cluster = Cluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  int64_t drafted = 0, accepted = 0;
  // The first spec request opens the verifier's channel to the drafter; its session may open
  // before the verifier has learnt which layers to send (then it decodes by AR steps).
  const std::vector<std::string> prompts = {"Once upon a time", "Once upon a time",
                                            "def fibonacci(n):", "The capital of France is"};
  for (const std::string& prompt : prompts) {
    const StreamResult ar = Generate((*cluster)->generation(), Greedy(prompt, "ar", 48));
    ASSERT_TRUE(ar.status.ok()) << ar.status.error_message();
    const StreamResult spec = Generate((*cluster)->generation(), Greedy(prompt, "spec", 48));
    ASSERT_TRUE(spec.status.ok()) << spec.status.error_message();
    EXPECT_EQ(spec.tokens, ar.tokens) << prompt;
    EXPECT_EQ(spec.last.mode(), "spec");
    drafted += spec.last.usage().draft_tokens();
    accepted += spec.last.usage().accepted_tokens();
  }
  EXPECT_GT(drafted, 0);
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace tandem::testing
