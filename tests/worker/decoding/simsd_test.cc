// `simsd`: the SimSD verification layout checked entry by entry, the step logic (acceptance,
// correction, block completion when R < γ, end-of-sequence and budget inside an accepted run)
// on synthetic logits, and on random-weight models the one statement that is exact: for a
// one-layer target every verification slot sees what its sequential denoising step sees, so
// the greedy output equals a sequential speculative decode with one denoising forward per
// draft.
#include "worker/decoding/simsd.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "tests/worker/decoding/bundled_target.h"
#include "tests/worker/decoding/distribution.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/diffusion_drafter.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// Answers fixed drafts (one list per call, the last one repeated) and records the contexts.
class ScriptedDrafter : public Drafter {
 public:
  explicit ScriptedDrafter(std::vector<std::vector<int32_t>> script) : script_(std::move(script)) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override {
    contexts.emplace_back(tokens.begin(), tokens.end());
    gammas.push_back(gamma);
    const size_t call = std::min(contexts.size() - 1, script_.size() - 1);
    return script_[call];
  }
  const DrafterStats& stats() const override { return stats_; }

  std::vector<std::vector<int32_t>> contexts;
  std::vector<int> gammas;

 private:
  std::vector<std::vector<int32_t>> script_;
  DrafterStats stats_;
};

// Answers fixed block drafts in its own slot order (one per call, the last one repeated) and
// records the block states it was shown.
class OrderedDrafter : public Drafter {
 public:
  explicit OrderedDrafter(std::vector<BlockDraft> script) : script_(std::move(script)) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t>, int) override {
    return absl::InternalError("simsd asks for block drafts");
  }
  absl::StatusOr<BlockDraft> DraftBlock(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block, int gamma) override {
    contexts.emplace_back(tokens.begin(), tokens.end());
    blocks.emplace_back(block.begin(), block.end());
    gammas.push_back(gamma);
    return script_[std::min(blocks.size() - 1, script_.size() - 1)];
  }
  const DrafterStats& stats() const override { return stats_; }

  std::vector<std::vector<int32_t>> contexts;
  std::vector<std::vector<int32_t>> blocks;
  std::vector<int> gammas;

 private:
  std::vector<BlockDraft> script_;
  DrafterStats stats_;
};

constexpr int kVocab = 32;
constexpr int32_t kMask = 31;
constexpr int32_t kEos = 7;

// Logits rows whose argmax (and near-certain top-1) is each of `tokens`.
ExtendOutput PeakedRows(const std::vector<int32_t>& tokens) {
  ExtendOutput out;
  for (int32_t t : tokens) {
    std::vector<float> row(kVocab, 0.0f);
    row[t] = 30.0f;
    out.logits.insert(out.logits.end(), row.begin(), row.end());
  }
  return out;
}

// The visible set of row `i` among the plan's n new tokens.
std::vector<int> Seen(const StepPlan& plan, int i) {
  std::vector<int> seen;
  for (int j = 0; j < static_cast<int>(plan.tokens.size()); ++j) {
    if (plan.visible.Sees(i, j)) seen.push_back(j);
  }
  return seen;
}

struct Harness {
  Harness(SimSdOptions options, std::vector<std::vector<int32_t>> script) {
    auto drafter = std::make_unique<ScriptedDrafter>(std::move(script));
    scripted = drafter.get();
    mode = std::make_unique<SimSdMode>(std::move(options), std::move(drafter), kVocab, 0);
  }
  Harness(SimSdOptions options, std::vector<BlockDraft> script) {
    auto drafter = std::make_unique<OrderedDrafter>(std::move(script));
    ordered = drafter.get();
    mode = std::make_unique<SimSdMode>(std::move(options), std::move(drafter), kVocab, 0);
  }
  // One step over `tokens` with `kv_len` committed; the logits rows' argmaxes are `answers`.
  StepResult Step(std::vector<int32_t>& tokens, int kv_len, const std::vector<int32_t>& answers,
                  StepPlan* plan_out = nullptr, int budget = 100) {
    DecodeState state{.tokens = tokens,
                      .prompt_len = 2,
                      .kv_len = kv_len,
                      .budget = budget,
                      .sampling = &sampling};
    StepPlan plan = mode->Plan(state);
    if (plan_out != nullptr) *plan_out = plan;
    absl::StatusOr<StepResult> result = mode->Consume(state, plan, PeakedRows(answers));
    EXPECT_TRUE(result.ok()) << result.status();
    EXPECT_TRUE(CheckStep(state, plan, *result, "simsd").ok());
    return result.ok() ? *result : StepResult{};
  }

  SamplingParams sampling;  // greedy
  ScriptedDrafter* scripted = nullptr;
  OrderedDrafter* ordered = nullptr;
  std::unique_ptr<SimSdMode> mode;
};

SimSdOptions Options(int block, int gamma) {
  return {.block_size = block,
          .gamma = gamma,
          .mask_token = kMask,
          .threshold = 0.9f,
          .eos_tokens = {kEos}};
}

TEST(SimSdLayoutTest, FirstStepDataAndMaskSectionsWithTheTemporalMask) {
  // B = 4, γ = 2, two pending prompt tokens. Labels: drafts s0 -> 1, s1 -> 2, s2 and s3
  // undrafted -> 3.
  Harness h(Options(4, 2), {{10, 11}});
  std::vector<int32_t> tokens = {1, 2};
  StepPlan plan;
  StepResult r = h.Step(tokens, 0, {10, 20}, &plan);
  // [P0 P1 | D0 D1 | M0 M1 M2 M3]
  EXPECT_THAT(plan.tokens, ElementsAre(1, 2, 10, 11, kMask, kMask, kMask, kMask));
  EXPECT_THAT(plan.positions, ElementsAre(0, 1, 2, 3, 2, 3, 4, 5));  // RoPE copy
  EXPECT_THAT(plan.outputs, ElementsAre(4, 5));                      // the drafts' mask slots
  EXPECT_THAT(Seen(plan, 0), ElementsAre(0));
  EXPECT_THAT(Seen(plan, 1), ElementsAre(0, 1));
  EXPECT_THAT(Seen(plan, 2), ElementsAre(0, 1, 2, 5, 6, 7));  // D0: itself, masks after step 1
  EXPECT_THAT(Seen(plan, 3), ElementsAre(0, 1, 2, 3, 6, 7));  // D1: D0, itself, masks after 2
  EXPECT_THAT(Seen(plan, 4), ElementsAre(0, 1, 4, 5, 6, 7));  // M0: step 1 = all masked
  EXPECT_THAT(Seen(plan, 5), ElementsAre(0, 1, 2, 5, 6, 7));  // M1: step 2 = D0 + masks s1..s3
  EXPECT_THAT(Seen(plan, 6), ElementsAre(0, 1, 2, 3, 6, 7));  // undrafted: D0, D1, s2, s3
  EXPECT_THAT(Seen(plan, 7), ElementsAre(0, 1, 2, 3, 6, 7));
  EXPECT_THAT(h.scripted->contexts[0], ElementsAre(1, 2));
  // Draft 1 accepted, draft 2 rejected: the target's token 20 takes slot 1; nothing appended
  // until the block is finished, only the pending tokens' KV kept.
  EXPECT_EQ(r.drafted, 2);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_THAT(r.keep, ElementsAre(0, 1));
  EXPECT_TRUE(r.append.empty());
}

TEST(SimSdLayoutTest, DecodedSlotsAreStepZeroDataAndTheDrafterSeesThem) {
  Harness h(Options(4, 2), {{10, 11}, {13, 14}});
  std::vector<int32_t> tokens = {1, 2};
  h.Step(tokens, 0, {10, 20});  // block = [10, 20, M, M]: R = 2 >= γ, so a second draft step
  StepPlan plan;
  StepResult r = h.Step(tokens, 2, {13, 14}, &plan);
  EXPECT_THAT(h.scripted->contexts[1], ElementsAre(1, 2, 10, 20));
  // [D0 D1 (τ 0) | D2 D3 (τ 1, 2) | M2 M3]
  EXPECT_THAT(plan.tokens, ElementsAre(10, 20, 13, 14, kMask, kMask));
  EXPECT_THAT(plan.positions, ElementsAre(2, 3, 4, 5, 4, 5));
  EXPECT_THAT(plan.outputs, ElementsAre(4, 5));
  EXPECT_THAT(Seen(plan, 0), ElementsAre(0, 1, 4, 5));
  EXPECT_THAT(Seen(plan, 1), ElementsAre(0, 1, 4, 5));
  EXPECT_THAT(Seen(plan, 2), ElementsAre(0, 1, 2, 5));
  EXPECT_THAT(Seen(plan, 3), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Seen(plan, 4), ElementsAre(0, 1, 4, 5));  // step 1: decoded slots + two masks
  EXPECT_THAT(Seen(plan, 5), ElementsAre(0, 1, 2, 5));  // step 2: + draft 1
  // Both accepted: the block is finished and joins the sequence.
  EXPECT_EQ(r.accepted, 2);
  EXPECT_THAT(r.append, ElementsAre(10, 20, 13, 14));
}

TEST(SimSdLayoutTest, DraftInducedOrderSetsTheLabelsAndTheVerificationOrder) {
  // B = 4, γ = 2, the drafter decodes slot 2 first, then slot 0. Labels: s2 -> 1, s0 -> 2,
  // s1 and s3 undrafted -> 3.
  Harness h(Options(4, 2), std::vector<BlockDraft>{{.slots = {2, 0}, .tokens = {10, 11}},
                                                   {.slots = {3, 1}, .tokens = {13, 14}}});
  std::vector<int32_t> tokens = {1, 2};
  StepPlan plan;
  StepResult r = h.Step(tokens, 0, {10, 20}, &plan);
  EXPECT_THAT(h.ordered->blocks[0],
              ElementsAre(kUndecodedSlot, kUndecodedSlot, kUndecodedSlot, kUndecodedSlot));
  EXPECT_THAT(h.ordered->gammas, ElementsAre(2));
  // [P0 P1 | D(s2) D(s0) | M(s2) M(s0) M(s1) M(s3)]: data and masks of the drafts in draft
  // order, then the undrafted masks in slot order; each row at its slot's position.
  EXPECT_THAT(plan.tokens, ElementsAre(1, 2, 10, 11, kMask, kMask, kMask, kMask));
  EXPECT_THAT(plan.positions, ElementsAre(0, 1, 4, 2, 4, 2, 3, 5));
  EXPECT_THAT(plan.outputs, ElementsAre(4, 5));
  EXPECT_THAT(Seen(plan, 2), ElementsAre(0, 1, 2, 5, 6, 7));  // D(s2): itself, masks after 1
  EXPECT_THAT(Seen(plan, 3), ElementsAre(0, 1, 2, 3, 6, 7));  // D(s0): D(s2), itself, s1, s3
  EXPECT_THAT(Seen(plan, 4), ElementsAre(0, 1, 4, 5, 6, 7));  // M(s2): step 1, all masked
  EXPECT_THAT(Seen(plan, 5), ElementsAre(0, 1, 2, 5, 6, 7));  // M(s0): step 2, s2 decoded
  EXPECT_THAT(Seen(plan, 6), ElementsAre(0, 1, 2, 3, 6, 7));  // undrafted: both drafts
  EXPECT_THAT(Seen(plan, 7), ElementsAre(0, 1, 2, 3, 6, 7));
  // Slot 2 accepted, slot 0 rejected and corrected to 20: the decoded slots {0, 2} are no
  // prefix of the block.
  EXPECT_EQ(r.accepted, 1);
  EXPECT_TRUE(r.append.empty());

  // R = 2 >= γ: a second speculative step over the scattered decoded slots.
  r = h.Step(tokens, 2, {13, 14}, &plan);
  EXPECT_THAT(h.ordered->contexts[1], ElementsAre(1, 2));
  EXPECT_THAT(h.ordered->blocks[1], ElementsAre(20, kUndecodedSlot, 10, kUndecodedSlot));
  // [D(s0) D(s2) (τ 0) | D(s3) D(s1) (τ 1, 2) | M(s3) M(s1)]
  EXPECT_THAT(plan.tokens, ElementsAre(20, 10, 13, 14, kMask, kMask));
  EXPECT_THAT(plan.positions, ElementsAre(2, 4, 5, 3, 5, 3));
  EXPECT_THAT(plan.outputs, ElementsAre(4, 5));
  EXPECT_THAT(Seen(plan, 0), ElementsAre(0, 1, 4, 5));
  EXPECT_THAT(Seen(plan, 1), ElementsAre(0, 1, 4, 5));
  EXPECT_THAT(Seen(plan, 2), ElementsAre(0, 1, 2, 5));
  EXPECT_THAT(Seen(plan, 3), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Seen(plan, 4), ElementsAre(0, 1, 4, 5));  // step 1: decoded slots + two masks
  EXPECT_THAT(Seen(plan, 5), ElementsAre(0, 1, 2, 5));  // step 2: + the draft at s3
  EXPECT_EQ(r.accepted, 2);
  EXPECT_THAT(r.append, ElementsAre(20, 14, 10, 13));
}

TEST(SimSdStepTest, ABlockDraftStopsAtItsFirstInvalidEntry) {
  // Slot 1 twice: the second entry is no draft of an undecoded slot, so one draft is verified.
  Harness h(Options(4, 3), std::vector<BlockDraft>{{.slots = {1, 1, 3}, .tokens = {10, 11, 12}}});
  std::vector<int32_t> tokens = {1, 2};
  StepPlan plan;
  StepResult r = h.Step(tokens, 0, {10}, &plan);
  EXPECT_EQ(r.drafted, 1);
  EXPECT_EQ(r.accepted, 1);
  EXPECT_THAT(plan.outputs, ElementsAre(3));  // [P0 P1 | D(s1) | M(s1) M(s0) M(s2) M(s3)]
  EXPECT_THAT(plan.positions, ElementsAre(0, 1, 3, 3, 2, 4, 5));
  // A slot outside the block, or a <|mask|> token, ends the drafts before they start: the
  // target completes the block.
  for (const BlockDraft& bad :
       {BlockDraft{.slots = {4}, .tokens = {10}}, BlockDraft{.slots = {0}, .tokens = {kMask}}}) {
    Harness g(Options(4, 1), std::vector<BlockDraft>{bad});
    std::vector<int32_t> t = {1, 2};
    StepResult c = g.Step(t, 0, {3, 4, 5, 6});
    EXPECT_EQ(c.drafted, 0);
    EXPECT_EQ(g.mode->stats().completion_steps, 1);
  }
}

TEST(SimSdStepTest, TargetCompletesTheBlockWhenFewerThanGammaRemain) {
  Harness h(Options(4, 3), {{10, 11, 12}});
  std::vector<int32_t> tokens = {1, 2};
  StepResult first = h.Step(tokens, 0, {10, 20, 21});  // slot 0 accepted, slot 1 corrected
  EXPECT_EQ(first.accepted, 1);
  StepPlan plan;
  StepResult second = h.Step(tokens, 2, {22, 23}, &plan);
  EXPECT_EQ(h.scripted->contexts.size(), 1u);  // R = 2 < γ = 3: no drafting
  // A vanilla block-diffusion step: the block's slots as they stand, every row sees them all.
  EXPECT_THAT(plan.tokens, ElementsAre(10, 20, kMask, kMask));
  EXPECT_THAT(plan.positions, ElementsAre(2, 3, 4, 5));
  EXPECT_THAT(plan.outputs, ElementsAre(2, 3));
  for (int i = 0; i < 4; ++i) EXPECT_THAT(Seen(plan, i), ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(second.drafted, 0);
  EXPECT_THAT(second.append, ElementsAre(10, 20, 22, 23));
  EXPECT_EQ(h.mode->stats().completion_steps, 1);
}

TEST(SimSdStepTest, FullAcceptanceDecodesTheBlockInOneForwardWithoutABonus) {
  Harness h(Options(4, 4), {{10, 11, 12, 13}});
  std::vector<int32_t> tokens = {1, 2};
  StepResult r = h.Step(tokens, 0, {10, 11, 12, 13});
  EXPECT_EQ(r.drafted, 4);
  EXPECT_EQ(r.accepted, 4);
  EXPECT_THAT(r.append, ElementsAre(10, 11, 12, 13));
}

TEST(SimSdStepTest, EndOfSequenceInsideAnAcceptedRunEndsTheBlock) {
  Harness h(Options(4, 4), {{10, kEos, 12, 13}});
  std::vector<int32_t> tokens = {1, 2};
  StepResult r = h.Step(tokens, 0, {10, kEos, 12, 13});
  EXPECT_EQ(r.accepted, 4);
  EXPECT_THAT(r.append, ElementsAre(10, kEos));
}

TEST(SimSdStepTest, BudgetTruncatesAnAcceptedRun) {
  Harness h(Options(4, 4), {{10, 11, 12, 13}});
  std::vector<int32_t> tokens = {1, 2};
  StepResult r = h.Step(tokens, 0, {10, 11, 12, 13}, nullptr, /*budget=*/3);
  EXPECT_THAT(r.append, ElementsAre(10, 11, 12));
}

TEST(SimSdStepTest, DrafterFailureGivesACompletionStep) {
  class Failing : public Drafter {
   public:
    absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t>, int) override {
      return absl::UnavailableError("drafter down");
    }
    const DrafterStats& stats() const override { return stats_; }

   private:
    DrafterStats stats_;
  };
  SimSdMode mode(Options(4, 4), std::make_unique<Failing>(), kVocab, 0);
  std::vector<int32_t> tokens = {1, 2};
  SamplingParams greedy;
  DecodeState state{
      .tokens = tokens, .prompt_len = 2, .kv_len = 0, .budget = 8, .sampling = &greedy};
  StepPlan plan = mode.Plan(state);
  EXPECT_TRUE(mode.asked_drafter());
  EXPECT_THAT(plan.outputs, ElementsAre(2, 3, 4, 5));  // every masked slot, vanilla layout
  absl::StatusOr<StepResult> r = mode.Consume(state, plan, PeakedRows({3, 4, 5, 6}));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->append, ElementsAre(3, 4, 5, 6));
  EXPECT_EQ(mode.stats().drafter_failures, 1);
}

TEST(SimSdModeTest, CreateModeChecksTheTargetTheDrafterAndGamma) {
  ModelConfig config = testing::TinyConfig(testing::TinyArch::kQwen2);
  std::unique_ptr<Transformer> drafter = testing::TinyModel(testing::TinyArch::kQwen2, 3);
  ModeOptions options;
  options.spec_drafter = drafter.get();
  SamplingParams greedy;
  auto made = CreateMode("simsd", options, config, greedy);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(), HasSubstr("<|mask|>"));
  config.diffusion.mask_token_id = 63;
  config.diffusion.block_size = 4;
  options.simsd_gamma = 5;
  made = CreateMode("simsd", options, config, greedy);
  ASSERT_FALSE(made.ok());
  EXPECT_THAT(made.status().message(), HasSubstr("simsd_gamma"));
  options.simsd_gamma = 0;
  made = CreateMode("simsd", options, config, greedy);
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_EQ((*made)->name(), "simsd");
  EXPECT_FALSE((*made)->lossless());
  options.spec_drafter = nullptr;
  EXPECT_FALSE(CreateMode("simsd", options, config, greedy).ok());
}

// ---- random-weight models ----

// Logits of `slots` of `block` (at positions prefix.size() ..) in one denoising forward over
// a fresh cache: the prefix causal, every block row seeing the prefix and the whole block.
std::vector<std::vector<float>> DenoiseLogits(Transformer& model,
                                              const std::vector<int32_t>& prefix,
                                              const std::vector<int32_t>& block,
                                              const std::vector<int>& slots) {
  std::vector<int32_t> tokens = prefix;
  tokens.insert(tokens.end(), block.begin(), block.end());
  const int n = static_cast<int>(tokens.size());
  const int p = static_cast<int>(prefix.size());
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = i;
  Visibility visible = Visibility::Explicit(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < (i < p ? i + 1 : n); ++j) visible.Allow(i, j);
  }
  std::vector<int32_t> outputs;
  for (int s : slots) outputs.push_back(p + s);
  KvCache kv(model.KvOptions(n + 16, 16));
  EXPECT_TRUE(kv.AddSequence(1).ok());
  EXPECT_TRUE(kv.Reserve(1, n).has_value());
  Extend extend{
      .seq = 1, .tokens = tokens, .positions = positions, .visible = visible, .outputs = outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  std::vector<std::vector<float>> rows;
  const int vocab = model.config().vocab_size;
  for (size_t r = 0; r < slots.size() && out.ok(); ++r) {
    rows.emplace_back((*out)[0].logits.begin() + r * vocab,
                      (*out)[0].logits.begin() + (r + 1) * vocab);
  }
  return rows;
}

// SimSD's decode spelled out sequentially: each draft is checked by its own denoising forward
// over the block state of its step (decoded slots and earlier drafts as tokens, the rest
// masked), in the drafter's order; blocks are completed by vanilla threshold steps. Greedy, no
// end-of-sequence.
std::vector<int32_t> SequentialSimSd(Transformer& target, Drafter& drafter,
                                     const std::vector<int32_t>& prompt, int block_size, int gamma,
                                     int32_t mask, float threshold, int max_tokens) {
  std::vector<int32_t> tokens = prompt;
  auto argmax = [&](std::vector<float> row) {
    row[mask] = -std::numeric_limits<float>::infinity();
    return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
  };
  while (static_cast<int>(tokens.size() - prompt.size()) < max_tokens) {
    std::vector<int32_t> block(block_size, mask);
    std::vector<bool> done(block_size, false);
    while (std::find(done.begin(), done.end(), false) != done.end()) {
      const int remaining = static_cast<int>(std::count(done.begin(), done.end(), false));
      BlockDraft draft;
      if (remaining >= gamma) {
        std::vector<int32_t> state(block_size);
        for (int s = 0; s < block_size; ++s) state[s] = done[s] ? block[s] : kUndecodedSlot;
        draft = *drafter.DraftBlock(tokens, state, gamma);
        // A <|mask|> draft ends the drafts, as in the mode.
        for (int r = 0; r < draft.size(); ++r) {
          if (draft.tokens[r] == mask) {
            draft.tokens.resize(r);
            draft.slots.resize(r);
          }
        }
      }
      if (draft.size() > 0) {
        for (int r = 0; r < draft.size(); ++r) {
          const int slot = draft.slots[r];
          const int32_t best = argmax(DenoiseLogits(target, tokens, block, {slot})[0]);
          block[slot] = best;
          done[slot] = true;
          if (best != draft.tokens[r]) break;
        }
        continue;
      }
      std::vector<int> slots;
      for (int s = 0; s < block_size; ++s) {
        if (!done[s]) slots.push_back(s);
      }
      const std::vector<std::vector<float>> rows = DenoiseLogits(target, tokens, block, slots);
      std::vector<float> confidence;
      for (const std::vector<float>& row : rows) {
        std::vector<float> r = row;
        r[mask] = -std::numeric_limits<float>::infinity();
        const float top = *std::max_element(r.begin(), r.end());
        double sum = 0;
        for (float x : r) sum += std::exp(static_cast<double>(x) - top);
        confidence.push_back(static_cast<float>(1.0 / sum));
      }
      const size_t best =
          std::max_element(confidence.begin(), confidence.end()) - confidence.begin();
      const bool any = confidence[best] >= threshold;
      for (size_t i = 0; i < slots.size(); ++i) {
        if (any ? confidence[i] < threshold : i != best) continue;
        block[slots[i]] = argmax(rows[i]);
        done[slots[i]] = true;
      }
    }
    tokens.insert(tokens.end(), block.begin(), block.end());
  }
  tokens.resize(prompt.size() + max_tokens);
  return {tokens.begin() + static_cast<std::ptrdiff_t>(prompt.size()), tokens.end()};
}

// Passes block drafts through and counts those whose order is not left to right.
class CountingDrafter : public Drafter {
 public:
  explicit CountingDrafter(std::unique_ptr<Drafter> inner) : inner_(std::move(inner)) {}

  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t> tokens, int gamma) override {
    return inner_->Draft(tokens, gamma);
  }
  absl::StatusOr<BlockDraft> DraftBlock(std::span<const int32_t> tokens,
                                        std::span<const int32_t> block, int gamma) override {
    absl::StatusOr<BlockDraft> draft = inner_->DraftBlock(tokens, block, gamma);
    if (draft.ok() && !std::is_sorted(draft->slots.begin(), draft->slots.end())) ++out_of_order;
    return draft;
  }
  const DrafterStats& stats() const override { return inner_->stats(); }

  int out_of_order = 0;

 private:
  std::unique_ptr<Drafter> inner_;
};

std::unique_ptr<Transformer> OneLayerModel(uint64_t seed) {
  ModelConfig c = testing::TinyConfig(testing::TinyArch::kQwen3, 256);
  c.num_layers = 1;
  return Transformer::FromWeights(c, RandomWeights(c, seed, 0.35f));
}

TEST(SimSdReferenceTest, OneLayerTargetEqualsTheSequentialSpeculativeDecode) {
  std::unique_ptr<Transformer> target = OneLayerModel(41);
  // A drafter that agrees with the target often but not always.
  std::unique_ptr<Transformer> drafter = testing::PerturbedModel(*target, 5, 0.05f);
  const int vocab = target->config().vocab_size;
  const int32_t mask = vocab - 1;
  constexpr int kBlock = 4;
  constexpr int kTokens = 24;
  int64_t accepted = 0;
  int64_t drafted = 0;
  int64_t completions = 0;
  for (int gamma : {4, 3, 2}) {
    for (const std::vector<int32_t>& prompt : testing::TestPrompts(vocab - 1, 6, 17)) {
      SCOPED_TRACE(::testing::Message() << "gamma " << gamma << ", prompt of " << prompt.size());
      SimSdMode mode(
          SimSdOptions{.block_size = kBlock, .gamma = gamma, .mask_token = mask, .threshold = 0.9f},
          std::make_unique<InProcessArDrafter>(drafter.get(), 1024), vocab, 0);
      RunOptions run;
      run.max_tokens = kTokens;
      absl::StatusOr<RunStats> got = testing::RunOnce(*target, mode, prompt, run);
      ASSERT_TRUE(got.ok()) << got.status();
      InProcessArDrafter reference(drafter.get(), 1024);
      EXPECT_EQ(got->tokens,
                SequentialSimSd(*target, reference, prompt, kBlock, gamma, mask, 0.9f, kTokens));
      accepted += mode.stats().accepted;
      drafted += mode.stats().drafted;
      completions += mode.stats().completion_steps;
    }
  }
  // The comparison covered accepted drafts, rejections and completion steps.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_GT(completions, 0);
}

TEST(SimSdReferenceTest, OneLayerTargetEqualsTheSequentialDecodeInTheDraftersOwnOrder) {
  // The drafter denoises its block by confidence, so drafts come in its own slot order and the
  // decoded slots of a block are often no prefix; the one-layer target still sees, at each
  // verification slot, exactly the block state of its sequential denoising step.
  std::unique_ptr<Transformer> target = OneLayerModel(41);
  std::unique_ptr<Transformer> drafter = testing::PerturbedModel(*target, 5, 0.05f);
  const int vocab = target->config().vocab_size;
  const int32_t mask = vocab - 1;
  constexpr int kBlock = 4;
  constexpr int kTokens = 24;
  int64_t accepted = 0;
  int64_t drafted = 0;
  int64_t completions = 0;
  int out_of_order = 0;
  for (int gamma : {4, 3, 2}) {
    for (const std::vector<int32_t>& prompt : testing::TestPrompts(vocab - 1, 6, 17)) {
      SCOPED_TRACE(::testing::Message() << "gamma " << gamma << ", prompt of " << prompt.size());
      auto counting = std::make_unique<CountingDrafter>(
          std::make_unique<DiffusionDrafter>(drafter.get(), mask, 1024));
      CountingDrafter* counter = counting.get();
      SimSdMode mode(
          SimSdOptions{.block_size = kBlock, .gamma = gamma, .mask_token = mask, .threshold = 0.9f},
          std::move(counting), vocab, 0);
      RunOptions run;
      run.max_tokens = kTokens;
      absl::StatusOr<RunStats> got = testing::RunOnce(*target, mode, prompt, run);
      ASSERT_TRUE(got.ok()) << got.status();
      DiffusionDrafter reference(drafter.get(), mask, 1024);
      EXPECT_EQ(got->tokens,
                SequentialSimSd(*target, reference, prompt, kBlock, gamma, mask, 0.9f, kTokens));
      accepted += mode.stats().accepted;
      drafted += mode.stats().drafted;
      completions += mode.stats().completion_steps;
      out_of_order += counter->out_of_order;
    }
  }
  EXPECT_GT(out_of_order, 0);  // the order was not left to right
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, drafted);
  EXPECT_GT(completions, 0);
}

TEST(DiffusionDrafterTest, DraftsAPermutationPrefixByConfidenceDeterministically) {
  std::unique_ptr<Transformer> model = OneLayerModel(7);
  const int vocab = model->config().vocab_size;
  const int32_t mask = vocab - 1;
  const std::vector<int32_t> prompt = {3, 9, 27, 4, 8, 15};
  constexpr int kBlock = 6;
  // A block with slots 1 and 4 decoded.
  const std::vector<int32_t> block = {kUndecodedSlot, 40, kUndecodedSlot,
                                      kUndecodedSlot, 41, kUndecodedSlot};
  DiffusionDrafter drafter(model.get(), mask, 256);
  absl::StatusOr<BlockDraft> draft = drafter.DraftBlock(prompt, block, 3);
  ASSERT_TRUE(draft.ok()) << draft.status();
  ASSERT_EQ(draft->size(), 3);
  ASSERT_EQ(draft->slots.size(), 3u);
  std::vector<int32_t> seen;
  for (int r = 0; r < draft->size(); ++r) {
    const int32_t slot = draft->slots[r];
    ASSERT_GE(slot, 0);
    ASSERT_LT(slot, kBlock);
    EXPECT_EQ(block[slot], kUndecodedSlot) << "slot " << slot << " was decoded already";
    EXPECT_EQ(std::count(seen.begin(), seen.end(), slot), 0) << "slot " << slot << " twice";
    seen.push_back(slot);
    EXPECT_NE(draft->tokens[r], mask);
  }
  EXPECT_EQ(drafter.stats().forwards, 3);  // one denoising forward per draft step
  // Each draft step: the most confident undecoded slot of a fresh denoising forward over the
  // block as the earlier steps left it, with its greedy token.
  std::vector<int32_t> state(kBlock);
  for (int s = 0; s < kBlock; ++s) state[s] = block[s] == kUndecodedSlot ? mask : block[s];
  for (int r = 0; r < draft->size(); ++r) {
    std::vector<int> open;
    for (int s = 0; s < kBlock; ++s) {
      if (state[s] == mask) open.push_back(s);
    }
    const std::vector<std::vector<float>> rows = DenoiseLogits(*model, prompt, state, open);
    int best = 0;
    float best_confidence = -1;
    int32_t best_token = 0;
    for (size_t i = 0; i < open.size(); ++i) {
      std::vector<float> row = rows[i];
      row[mask] = -std::numeric_limits<float>::infinity();
      const auto top = std::max_element(row.begin(), row.end());
      double sum = 0;
      for (float x : row) sum += std::exp(static_cast<double>(x) - *top);
      if (1.0 / sum > best_confidence) {
        best_confidence = static_cast<float>(1.0 / sum);
        best = open[i];
        best_token = static_cast<int32_t>(top - row.begin());
      }
    }
    EXPECT_EQ(draft->slots[r], best) << "draft step " << r;
    EXPECT_EQ(draft->tokens[r], best_token) << "draft step " << r;
    state[draft->slots[r]] = draft->tokens[r];
  }
  // Deterministic: again on the same drafter (its cached prefix reused) and on a fresh one.
  absl::StatusOr<BlockDraft> again = drafter.DraftBlock(prompt, block, 3);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->slots, draft->slots);
  EXPECT_EQ(again->tokens, draft->tokens);
  EXPECT_GT(drafter.stats().reused_tokens, 0);
  DiffusionDrafter fresh(model.get(), mask, 256);
  absl::StatusOr<BlockDraft> other = fresh.DraftBlock(prompt, block, 3);
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_EQ(other->slots, draft->slots);
  EXPECT_EQ(other->tokens, draft->tokens);
  // Decoding the first draft's slot with its token leaves the rest of the order as it was.
  std::vector<int32_t> advanced = block;
  advanced[draft->slots[0]] = draft->tokens[0];
  absl::StatusOr<BlockDraft> rest = fresh.DraftBlock(prompt, advanced, 2);
  ASSERT_TRUE(rest.ok()) << rest.status();
  EXPECT_THAT(rest->slots, ElementsAre(draft->slots[1], draft->slots[2]));
  EXPECT_THAT(rest->tokens, ElementsAre(draft->tokens[1], draft->tokens[2]));
  // γ past the undecoded slots drafts them all: a permutation of the four.
  absl::StatusOr<BlockDraft> all = fresh.DraftBlock(prompt, block, 10);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<int32_t> sorted = all->slots;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_THAT(sorted, ElementsAre(0, 2, 3, 5));
  // Bad input is an error, not a draft.
  EXPECT_FALSE(fresh.DraftBlock({}, block, 2).ok());
  EXPECT_FALSE(fresh.DraftBlock(prompt, std::vector<int32_t>{vocab, kUndecodedSlot}, 2).ok());
}

TEST(DiffusionDrafterTest, BlocksStopAtTheContext) {
  std::unique_ptr<Transformer> model = OneLayerModel(7);
  const int32_t mask = model->config().vocab_size - 1;
  DiffusionDrafter drafter(model.get(), mask, 10);  // positions 0..9
  const std::vector<int32_t> prompt = {3, 9, 27, 4, 8, 15, 16, 23};
  absl::StatusOr<BlockDraft> draft =
      drafter.DraftBlock(prompt, std::vector<int32_t>(4, kUndecodedSlot), 4);
  ASSERT_TRUE(draft.ok()) << draft.status();
  std::vector<int32_t> sorted = draft->slots;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_THAT(sorted, ElementsAre(0, 1));  // slots 2, 3 would be at positions 10, 11
}

TEST(DrafterTest, DefaultBlockDraftIsLeftToRightAfterTheDecodedPrefix) {
  ScriptedDrafter drafter({{10, 11, 12}});
  absl::StatusOr<BlockDraft> draft = drafter.DraftBlock(
      std::vector<int32_t>{1, 2},
      std::vector<int32_t>{5, kUndecodedSlot, kUndecodedSlot, kUndecodedSlot}, 2);
  ASSERT_TRUE(draft.ok());
  EXPECT_THAT(drafter.contexts[0], ElementsAre(1, 2, 5));
  EXPECT_THAT(draft->slots, ElementsAre(1, 2));
  EXPECT_THAT(draft->tokens, ElementsAre(10, 11));  // cut to γ
  // A decoded slot after an undecoded one: no left-to-right drafts, and no drafter call.
  draft = drafter.DraftBlock(std::vector<int32_t>{1, 2},
                             std::vector<int32_t>{kUndecodedSlot, 5, kUndecodedSlot}, 2);
  ASSERT_TRUE(draft.ok());
  EXPECT_EQ(draft->size(), 0);
  EXPECT_EQ(drafter.contexts.size(), 1u);
}

TEST(SimSdReferenceTest, RunnerStopsInsideAnAcceptedRun) {
  std::unique_ptr<Transformer> target = OneLayerModel(41);
  const int vocab = target->config().vocab_size;
  const std::vector<int32_t> prompt = {3, 9, 27, 4};
  auto run = [&](int max_tokens, std::function<bool(int32_t)> stop) {
    // Drafting with the target's own AR pathway: long accepted runs.
    SimSdMode mode(SimSdOptions{.block_size = 4, .gamma = 4, .mask_token = vocab - 1},
                   std::make_unique<InProcessArDrafter>(target.get(), 1024), vocab, 0);
    RunOptions options;
    options.max_tokens = max_tokens;
    options.on_token = std::move(stop);
    return testing::RunOnce(*target, mode, prompt, options);
  };
  absl::StatusOr<RunStats> full = run(16, {});
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_EQ(full->tokens.size(), 16u);
  // max_tokens inside a block: the first 6 tokens, finish "length".
  absl::StatusOr<RunStats> cut = run(6, {});
  ASSERT_TRUE(cut.ok()) << cut.status();
  EXPECT_THAT(cut->tokens, ElementsAreArray(full->tokens.begin(), full->tokens.begin() + 6));
  EXPECT_EQ(cut->finish, FinishReason::kLength);
  // A stop token at index 5 (inside the second block) ends the sequence right there.
  const int32_t stop_token = full->tokens[5];
  const auto first = std::find(full->tokens.begin(), full->tokens.end(), stop_token);
  absl::StatusOr<RunStats> stopped = run(16, [&](int32_t t) { return t == stop_token; });
  ASSERT_TRUE(stopped.ok()) << stopped.status();
  EXPECT_THAT(stopped->tokens, ElementsAreArray(full->tokens.begin(), first + 1));
}

TEST(SimSdSamplingTest, FirstSlotFollowsTheTargetDenoisingDistribution) {
  // Eq. 2 with a point-mass draft: accept x̂ with probability p(x̂), else draw from p without
  // x̂, so slot o_1 is distributed as p^(1), the target's prediction with the block all masked.
  std::unique_ptr<Transformer> target = OneLayerModel(41);
  std::unique_ptr<Transformer> drafter = testing::PerturbedModel(*target, 5, 0.05f);
  const int vocab = target->config().vocab_size;
  const int32_t mask = vocab - 1;
  const std::vector<int32_t> prompt = {3, 9, 27, 4, 8};
  constexpr float kTemperature = 2.0f;
  std::vector<float> row = DenoiseLogits(*target, prompt, std::vector<int32_t>(4, mask), {0})[0];
  row[mask] = -std::numeric_limits<float>::infinity();
  const float top = *std::max_element(row.begin(), row.end());
  std::vector<double> probs(vocab);
  double sum = 0;
  for (int v = 0; v < vocab; ++v) sum += probs[v] = std::exp((row[v] - top) / kTemperature);
  for (double& p : probs) p /= sum;
  constexpr int kDraws = 3000;
  std::map<int32_t, int> counts;
  int accepted = 0;
  for (int i = 0; i < kDraws; ++i) {
    SimSdMode mode(SimSdOptions{.block_size = 4, .gamma = 4, .mask_token = mask},
                   std::make_unique<InProcessArDrafter>(drafter.get(), 64), vocab, 0);
    RunOptions run;
    run.max_tokens = 1;
    run.sampling.temperature = kTemperature;
    run.sampling.seed = 1000 + i;
    absl::StatusOr<RunStats> r = testing::RunOnce(*target, mode, prompt, run);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens.size(), 1u);
    ++counts[r->tokens[0]];
    accepted += mode.stats().accepted > 0;
  }
  EXPECT_TRUE(testing::FitsDistribution(counts, probs, kDraws));
  // Both branches of the rule ran: some drafts accepted, some resampled.
  EXPECT_GT(accepted, 0);
  EXPECT_LT(accepted, kDraws);
}

// ---- the bundled tri-mode target with the bundled drafter ----

class SimSdBundledTest : public testing::BundledTargetTest {};

TEST_F(SimSdBundledTest, DecodesWithTheBundledDrafterAndAcceptsItsDrafts) {
  const std::string drafter_dir = std::string(TANDEM_SOURCE_DIR) + "/models/tandem-drafter";
  if (!std::filesystem::exists(drafter_dir + "/config.json")) {
    GTEST_SKIP() << "no bundled drafter at " << drafter_dir;
  }
  absl::StatusOr<std::unique_ptr<Transformer>> drafter = Transformer::Load(drafter_dir);
  ASSERT_TRUE(drafter.ok()) << drafter.status();
  ModeOptions options;
  options.spec_drafter = drafter->get();
  SamplingParams greedy;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int tokens = 0;
  int forwards = 0;
  for (const std::vector<int32_t>& prompt : prompts_) {
    auto mode = CreateMode("simsd", options, model_->config(), greedy);
    ASSERT_TRUE(mode.ok()) << mode.status();
    absl::StatusOr<RunStats> r = Decode(**mode, prompt);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_FALSE(r->tokens.empty());
    for (int32_t t : r->tokens) {
      EXPECT_GE(t, 0);
      EXPECT_LT(t, model_->config().vocab_size);
      EXPECT_NE(t, *model_->config().diffusion.mask_token_id);
    }
    drafted += r->drafted;
    accepted += r->accepted;
    tokens += static_cast<int>(r->tokens.size());
    forwards += r->forwards;
  }
  ASSERT_GT(drafted, 0);
  // The drafter was distilled from the target: a good share of drafts pass the SimSD check,
  // and a block costs well under one forward per token (1.49 tokens per forward on these
  // prompts; one forward per token is 1.0).
  EXPECT_GT(static_cast<double>(accepted) / drafted, 0.3);
  EXPECT_GT(static_cast<double>(tokens) / forwards, 1.35);
}

}  // namespace
}  // namespace tandem
