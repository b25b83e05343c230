// The speed-of-light schemes on a scripted denoiser whose predictions depend on which slots are
// already committed, worked by hand: serial denoising's target, the confidence threshold,
// greedy acceptance leaving the target, recursive dynamic compaction finding the safe subset,
// and the probe budget.
#include "worker/decoding/diffusion_sol.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

constexpr int32_t kMask = 99;
constexpr int32_t kA = 1, kB = 2, kC = 3, kD = 4, kX = 5;

// A prediction scored by its confidence, as PredictSlot makes it.
SlotPrediction P(int32_t token, float confidence) { return {token, confidence, confidence}; }

// Four slots whose target (serial order 0, 1, 3, 2) is A B C D. Slot 3 predicts D (0.7) only
// once slot 1 is committed while slot 2 is still masked, and X (0.1) otherwise; the others
// always predict A (0.9), B (0.8), C (0.5). Committing slots 0-2 together (what greedy
// acceptance does first) therefore loses D; committing 0-1 first keeps it.
class Scripted {
 public:
  absl::StatusOr<std::vector<SlotPrediction>> operator()(std::span<const int32_t> block) {
    ++calls_;
    const bool d = block[1] != kMask && block[2] == kMask;
    return std::vector<SlotPrediction>{P(kA, 0.9f), P(kB, 0.8f), P(kC, 0.5f),
                                       d ? P(kD, 0.7f) : P(kX, 0.1f)};
  }
  int calls() const { return calls_; }

 private:
  int calls_ = 0;
};

const std::vector<int32_t> kTarget = {kA, kB, kC, kD};

TEST(DiffusionSolTest, SerialDenoisingCommitsTheMostConfidentSlotPerForward) {
  Scripted f;
  absl::StatusOr<BlockRun> run = SerialDenoise(std::ref(f), 4, kMask);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->tokens, kTarget);
  EXPECT_EQ(run->forwards, 4);
  EXPECT_EQ(f.calls(), 4);
}

TEST(DiffusionSolTest, GreedyAcceptanceCommitsEveryMatchAndCanLeaveTheTarget) {
  Scripted f;
  absl::StatusOr<BlockRun> run = GreedyAcceptance(std::ref(f), kTarget, kMask);
  ASSERT_TRUE(run.ok()) << run.status();
  // Forward 1 commits A B C; forward 2 finds no match for slot 3 and commits its X.
  EXPECT_EQ(run->tokens, (std::vector<int32_t>{kA, kB, kC, kX}));
  EXPECT_EQ(run->forwards, 2);
  EXPECT_FALSE(run->exact);
  EXPECT_EQ(run->probes, 0);
}

TEST(DiffusionSolTest, CompactionCommitsTheLongestSafePrefixAndStaysExact) {
  Scripted f;
  absl::StatusOr<BlockRun> run = DynamicCompaction(std::ref(f), kTarget, kMask, {});
  ASSERT_TRUE(run.ok()) << run.status();
  // Forward 1: {A,B,C} is unsafe (greedy from it commits X), {A,B} is safe; forward 2 commits
  // C and D together. Two checks of one probe each.
  EXPECT_EQ(run->tokens, kTarget);
  EXPECT_TRUE(run->exact);
  EXPECT_EQ(run->forwards, 2);
  EXPECT_EQ(run->probes, 2);
  EXPECT_FALSE(run->over_budget);
  EXPECT_EQ(f.calls(), 4);

  Scripted deeper;
  run = DynamicCompaction(std::ref(deeper), kTarget, kMask, {.depth = 3});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_TRUE(run->exact);
  EXPECT_EQ(run->forwards, 2);
}

TEST(DiffusionSolTest, CompactionWithoutProbesFallsBackToOneSlotPerForward) {
  Scripted f;
  absl::StatusOr<BlockRun> run = DynamicCompaction(std::ref(f), kTarget, kMask, {.probes = 0});
  ASSERT_TRUE(run.ok()) << run.status();
  // Every check that needs a forward is unsafe for want of probes, so forwards 1 and 2 commit
  // only their top match (A, then B); forward 3's commit of C and D fills the block, which
  // needs no probe to check.
  EXPECT_EQ(run->tokens, kTarget);
  EXPECT_EQ(run->forwards, 3);
  EXPECT_EQ(run->probes, 0);
  EXPECT_TRUE(run->over_budget);
}

TEST(DiffusionSolTest, ThresholdDenoisingIsTheDiffusionModesRule) {
  Scripted f;
  absl::StatusOr<BlockRun> run = ThresholdDenoise(std::ref(f), 4, kMask, 0.6f);
  ASSERT_TRUE(run.ok()) << run.status();
  // A B (>= 0.6), then D (0.7), then C alone as the most confident.
  EXPECT_EQ(run->tokens, kTarget);
  EXPECT_EQ(run->forwards, 3);

  run = ThresholdDenoise(std::ref(f), 4, kMask, 0.0f);  // everything in one forward
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->tokens, (std::vector<int32_t>{kA, kB, kC, kX}));
  EXPECT_EQ(run->forwards, 1);
}

TEST(DiffusionSolTest, ThresholdDenoisingByAnotherScoreStillTakesTheSerialStep) {
  // A sampler-like score that vouches for slot 2 only: forward 1 commits A (the most
  // confident) and C, which already costs D.
  Scripted scripted;
  auto scored = [&](std::span<const int32_t> block) -> absl::StatusOr<std::vector<SlotPrediction>> {
    absl::StatusOr<std::vector<SlotPrediction>> p = scripted(block);
    if (!p.ok()) return p;
    for (int i = 0; i < 4; ++i) (*p)[i].score = i == 2 ? 0.99f : 0.0f;
    return p;
  };
  absl::StatusOr<BlockRun> run = ThresholdDenoise(scored, 4, kMask, 0.9f);
  ASSERT_TRUE(run.ok()) << run.status();
  // After A and C, slot 3 predicts X (slot 2 is no longer masked): B is committed (0.8), then
  // X as the last slot.
  EXPECT_EQ(run->tokens, (std::vector<int32_t>{kA, kB, kC, kX}));
  EXPECT_EQ(run->forwards, 3);
}

TEST(DiffusionSolTest, PredictSlotExcludesTheMaskToken) {
  const std::vector<float> logits = {0.0f, std::log(3.0f), 10.0f};  // mask = 2
  const SlotPrediction p = PredictSlot(logits, 2);
  EXPECT_EQ(p.token, 1);
  EXPECT_NEAR(p.confidence, 0.75f, 1e-6);
  EXPECT_EQ(p.score, p.confidence);
}

TEST(DiffusionSolTest, BadInputAndABrokenDenoiserAreErrors) {
  Scripted f;
  EXPECT_EQ(SerialDenoise(std::ref(f), 0, kMask).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GreedyAcceptance(std::ref(f), std::vector<int32_t>{kA, kMask}, kMask).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DynamicCompaction(std::ref(f), kTarget, kMask, {.depth = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto short_rows = [](std::span<const int32_t>) -> absl::StatusOr<std::vector<SlotPrediction>> {
    return std::vector<SlotPrediction>{P(kA, 1.0f)};
  };
  EXPECT_EQ(SerialDenoise(short_rows, 4, kMask).status().code(), absl::StatusCode::kInternal);
  auto mask_guess = [](std::span<const int32_t> b) -> absl::StatusOr<std::vector<SlotPrediction>> {
    return std::vector<SlotPrediction>(b.size(), P(kMask, 1.0f));
  };
  EXPECT_EQ(SerialDenoise(mask_guess, 2, kMask).status().code(), absl::StatusCode::kInternal);
  auto failing = [](std::span<const int32_t>) -> absl::StatusOr<std::vector<SlotPrediction>> {
    return absl::UnavailableError("device lost");
  };
  EXPECT_EQ(DynamicCompaction(failing, kTarget, kMask, {}).status().code(),
            absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace tandem
