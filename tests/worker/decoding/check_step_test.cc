// CheckStep, the step contract every driver checks after a mode's Consume: pending tokens first,
// and kept KV that is the sequence's own next tokens at their positions with the adapter off
// (the KV the prefix cache may share).
#include <vector>

#include "gtest/gtest.h"
#include "worker/decoding/decoding_mode.h"

namespace tandem {
namespace {

// A sequence of 5 tokens with KV for 4; the plan: the pending token, then drafts 7 and 8.
struct Step {
  std::vector<int32_t> tokens = {1, 2, 3, 4, 5};
  DecodeState state{.tokens = tokens, .prompt_len = 3, .kv_len = 4, .budget = 10};
  StepPlan plan;
  StepResult result;

  Step() {
    plan.tokens = {5, 7, 8};
    plan.positions = {4, 5, 6};
    result.keep = {0, 1};    // the pending token and the first draft
    result.append = {7, 9};  // the draft accepted, then a correction
  }
};

TEST(CheckStepTest, AcceptsKeptDraftsThatAreTheSequencesNextTokens) {
  Step step;
  EXPECT_TRUE(CheckStep(step.state, step.plan, step.result, "m").ok());
  step.plan.lora_gate = {0, 0, 1};  // the adapter on an unkept draft only
  EXPECT_TRUE(CheckStep(step.state, step.plan, step.result, "m").ok());
}

TEST(CheckStepTest, RefusesKeptKvOfAnotherTokenPositionOrTheAdapter) {
  {
    Step step;
    step.result.append = {6, 9};  // the kept draft's token is not the one appended
    EXPECT_EQ(CheckStep(step.state, step.plan, step.result, "m").code(),
              absl::StatusCode::kInternal);
  }
  {
    Step step;
    step.plan.positions = {4, 6, 6};  // kept at a position that is not its own
    EXPECT_EQ(CheckStep(step.state, step.plan, step.result, "m").code(),
              absl::StatusCode::kInternal);
  }
  {
    Step step;
    step.plan.lora_gate = {0, 1, 1};  // kept with the adapter on
    EXPECT_EQ(CheckStep(step.state, step.plan, step.result, "m").code(),
              absl::StatusCode::kInternal);
  }
  {
    Step step;
    step.result.keep = {0, 3};  // not a plan index
    EXPECT_EQ(CheckStep(step.state, step.plan, step.result, "m").code(),
              absl::StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace tandem
