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
// masked); blocks are completed by vanilla threshold steps. Greedy, no end-of-sequence.
std::vector<int32_t> SequentialSimSd(Transformer& target, Transformer& drafter_model,
                                     const std::vector<int32_t>& prompt, int block_size, int gamma,
                                     int32_t mask, float threshold, int max_tokens) {
  InProcessArDrafter drafter(&drafter_model, 1024);
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
      const int decoded = block_size - remaining;
      std::vector<int32_t> drafts;
      if (remaining >= gamma &&
          std::all_of(done.begin(), done.begin() + decoded, [](bool d) { return d; })) {
        std::vector<int32_t> context = tokens;
        context.insert(context.end(), block.begin(), block.begin() + decoded);
        drafts = *drafter.Draft(context, gamma);
        // A <|mask|> draft ends the drafts, as in the mode.
        drafts.erase(std::find(drafts.begin(), drafts.end(), mask), drafts.end());
      }
      if (!drafts.empty()) {
        for (size_t r = 0; r < drafts.size(); ++r) {
          const int slot = decoded + static_cast<int>(r);
          const int32_t best = argmax(DenoiseLogits(target, tokens, block, {slot})[0]);
          block[slot] = best;
          done[slot] = true;
          if (best != drafts[r]) break;
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
      EXPECT_EQ(got->tokens,
                SequentialSimSd(*target, *drafter, prompt, kBlock, gamma, mask, 0.9f, kTokens));
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
  // The drafter was distilled from the target: most drafts pass the SimSD check, and a block
  // costs well under one forward per token.
  EXPECT_GT(static_cast<double>(accepted) / drafted, 0.3);
  EXPECT_GT(static_cast<double>(tokens) / forwards, 1.5);
}

}  // namespace
}  // namespace tandem
