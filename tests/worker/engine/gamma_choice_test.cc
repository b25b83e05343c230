// The per-step γ choice over synthetic step-time curves: full drafts while a step's fixed cost
// dominates, AR steps (γ = 0) once the batch is large enough that a draft token costs the batch
// more than it is expected to gain, sequences with high acceptance drafting longer than those
// with low, and the acceptance estimate.
#include "worker/engine/gamma_choice.h"

#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

// Step time = fixed + per_token × batch tokens, measured at 1 .. 4096 tokens.
CostModel Linear(double fixed, double per_token) {
  CostModel cost;
  for (double tokens = 1; tokens <= 4096; tokens *= 4) {
    cost.step_times.push_back(StepTimePoint{
        .batch_tokens = tokens, .step_seconds = fixed + per_token * tokens, .samples = 10});
  }
  return cost;
}

std::vector<GammaCandidate> Same(int n, int max_gamma, double acceptance) {
  return std::vector<GammaCandidate>(
      n, GammaCandidate{.max_gamma = max_gamma, .acceptance = acceptance});
}

TEST(GammaChoiceTest, ExpectedTokens) {
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 0), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.5, 2), 1.75);
  EXPECT_DOUBLE_EQ(ExpectedTokens(1.0, 4), 5.0);
  EXPECT_DOUBLE_EQ(ExpectedTokens(0.0, 4), 1.0);
}

TEST(GammaChoiceTest, NothingMeasuredKeepsTheRequestedGamma) {
  const auto candidates = Same(3, 4, 0.1);
  EXPECT_EQ(ChooseGammas(candidates, {.candidate_tokens = 3}, CostModel()), std::vector<int>(3, 4));
}

TEST(GammaChoiceTest, FixedCostDominatedStepsDraftTheMaximum) {
  // 10 ms per step, 1 µs per token: a draft token is nearly free.
  const CostModel cost = Linear(0.010, 1e-6);
  const auto candidates = Same(2, 6, 0.5);
  EXPECT_EQ(ChooseGammas(candidates, {.candidate_tokens = 2}, cost), std::vector<int>(2, 6));
}

TEST(GammaChoiceTest, LargeBatchesTakeArSteps) {
  // 1 ms per step, 1 ms per token: compute-bound. 64 sequences at acceptance 0.6 gain less per
  // draft token than the batch loses to it.
  const CostModel cost = Linear(0.001, 0.001);
  const auto candidates = Same(64, 4, 0.6);
  EXPECT_EQ(ChooseGammas(candidates, {.candidate_tokens = 64}, cost), std::vector<int>(64, 0));
  // The same curve with one sequence: the fixed cost still pays for drafts.
  const auto one = Same(1, 4, 0.6);
  EXPECT_GT(ChooseGammas(one, {.candidate_tokens = 1}, cost)[0], 0);
}

TEST(GammaChoiceTest, GammaFallsAsTheBatchGrows) {
  const CostModel cost = Linear(0.005, 0.0002);
  int previous = 1 << 30;
  for (int n : {1, 4, 16, 64, 256}) {
    const auto candidates = Same(n, 8, 0.8);
    const int gamma =
        ChooseGammas(candidates, {.candidate_tokens = static_cast<double>(n)}, cost)[0];
    EXPECT_LE(gamma, previous) << n;
    previous = gamma;
  }
  EXPECT_EQ(previous, 0);
  EXPECT_EQ(ChooseGammas(Same(1, 8, 0.8), {.candidate_tokens = 1}, cost)[0], 8);
}

TEST(GammaChoiceTest, HighAcceptanceDraftsLonger) {
  const CostModel cost = Linear(0.002, 0.0002);
  std::vector<GammaCandidate> candidates(16, {.max_gamma = 8, .acceptance = 0.3});
  candidates[0].acceptance = 0.95;
  const std::vector<int> gammas = ChooseGammas(
      candidates, {.other_tokens = 16, .other_gain = 16, .candidate_tokens = 16}, cost);
  EXPECT_GT(gammas[0], gammas[1]);
  EXPECT_LE(gammas[0], 8);
}

TEST(GammaChoiceTest, OtherWorkInTheBatchCountsAgainstDrafts) {
  const CostModel cost = Linear(0.002, 0.0002);
  const auto candidates = Same(1, 8, 0.7);
  const int alone = ChooseGammas(candidates, {.candidate_tokens = 1}, cost)[0];
  const int crowded = ChooseGammas(
      candidates, {.other_tokens = 200, .other_gain = 200, .candidate_tokens = 1}, cost)[0];
  EXPECT_LT(crowded, alone);
}

TEST(AcceptanceEstimateTest, FollowsAcceptance) {
  AcceptanceEstimate estimate(0.6);
  EXPECT_DOUBLE_EQ(estimate.value(), 0.6);
  for (int i = 0; i < 20; ++i) estimate.Observe(4, 4);
  EXPECT_GT(estimate.value(), 0.95);
  for (int i = 0; i < 20; ++i) estimate.Observe(4, 0);
  EXPECT_LT(estimate.value(), 0.05);
  estimate.Observe(0, 0);  // no drafts: no information
  EXPECT_LT(estimate.value(), 0.05);
}

}  // namespace
}  // namespace tandem
