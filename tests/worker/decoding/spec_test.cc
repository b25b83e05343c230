// SpecMode and InProcessArDrafter: step layout, accounting (tokens = accepted + forwards),
// budget and context clamps, the AR fallback on drafter failure and γ = 0, the drafter's
// incremental KV against a fresh drafter, and option validation. Greedy exactness against AR is
// in exactness_test; the output distribution under sampling in spec_distribution_test.
#include "worker/decoding/spec.h"

#include <memory>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

using testing::TinyArch;

constexpr int kContext = 128;

std::unique_ptr<SpecMode> MakeSpec(Transformer& target, Transformer& drafter, int gamma) {
  return std::make_unique<SpecMode>(gamma, std::make_unique<InProcessArDrafter>(&drafter, kContext),
                                    target.config().vocab_size,
                                    target.config().max_position_embeddings);
}

RunOptions Sampled(int max_tokens, float temperature, uint64_t seed) {
  RunOptions run;
  run.max_tokens = max_tokens;
  run.sampling.temperature = temperature;
  run.sampling.seed = seed;
  return run;
}

TEST(SpecModeTest, PlansPendingTokensThenDraftsWithOutputsAtEach) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  auto mode = MakeSpec(*target, *target, 3);
  const std::vector<int32_t> tokens = {4, 8, 1, 9, 2};
  const SamplingParams greedy;
  const DecodeState state{
      .tokens = tokens, .prompt_len = 3, .kv_len = 3, .budget = 10, .sampling = &greedy};
  const StepPlan plan = mode->Plan(state);
  ASSERT_EQ(plan.tokens.size(), 5u);
  EXPECT_EQ(plan.tokens[0], 9);
  EXPECT_EQ(plan.tokens[1], 2);
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{3, 4, 5, 6, 7}));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{1, 2, 3, 4}));
  EXPECT_EQ(plan.visible.kind, Visibility::Kind::kCausal);
  EXPECT_EQ(mode->drafter().stats().calls, 1);
  EXPECT_EQ(mode->drafter().stats().drafted, 3);
  // The model verifies the drafts (rows 0..2, at sequence indices 5..7) and samples the bonus
  // token (row 3, index 8) itself; no logits come back.
  ASSERT_EQ(plan.samples.size(), 4u);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(plan.samples[j].position, 5u + j) << j;
    EXPECT_EQ(plan.samples[j].draft, j < 3 ? plan.tokens[2 + j] : -1) << j;
    EXPECT_EQ(plan.samples[j].purpose, RngPurpose::kSample) << j;
  }
  EXPECT_FALSE(plan.return_logits);
}

// The model's verdicts alone (tokens and accepted flags, no logits) make a step: the accepted
// drafts, then the first rejected row's correction.
TEST(SpecModeTest, ConsumesTheModelsVerdicts) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  auto mode = MakeSpec(*target, *target, 3);
  const std::vector<int32_t> tokens = {4, 8, 1, 9, 2};
  const SamplingParams hot{.temperature = 0.9f, .seed = 4};
  const DecodeState state{
      .tokens = tokens, .prompt_len = 3, .kv_len = 3, .budget = 10, .sampling = &hot};
  const StepPlan plan = mode->Plan(state);
  ASSERT_EQ(plan.tokens.size(), 5u);
  ExtendOutput out;
  out.tokens = {plan.tokens[2], 40, plan.tokens[4], 41};
  out.accepted = {1, 0, 1, 1};
  absl::StatusOr<StepResult> r = mode->Consume(state, plan, out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->append, (std::vector<int32_t>{plan.tokens[2], 40}));
  EXPECT_EQ(r->keep, (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(r->accepted, 1);
  EXPECT_EQ(r->drafted, 3);
  // All accepted: the drafts and the bonus row's token.
  out.tokens = {plan.tokens[2], plan.tokens[3], plan.tokens[4], 41};
  out.accepted = {1, 1, 1, 1};
  r = mode->Consume(state, plan, out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->append, (std::vector<int32_t>{plan.tokens[2], plan.tokens[3], plan.tokens[4], 41}));
  // Tokens without flags (a driver that ignored the drafts) and no logits: an error, not a guess.
  out.accepted.clear();
  EXPECT_EQ(mode->Consume(state, plan, out).status().code(), absl::StatusCode::kInternal);
}

// A step without drafts is a plain AR step: the model may sample its token (no logits), and a
// sampled token alone is enough to consume it.
TEST(SpecModeTest, StepWithoutDraftsAsksTheModelForItsToken) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  auto mode = MakeSpec(*target, *target, 3);
  const std::vector<int32_t> tokens = {4, 8, 1};
  const SamplingParams hot{.temperature = 0.9f, .seed = 4};
  const DecodeState state{.tokens = tokens, .kv_len = 2, .budget = 1, .sampling = &hot};
  const StepPlan plan = mode->Plan(state);  // budget 1: no drafts
  ASSERT_EQ(plan.tokens.size(), 1u);
  ASSERT_EQ(plan.samples.size(), 1u);
  EXPECT_EQ(plan.samples[0].position, 3u);
  EXPECT_EQ(plan.samples[0].params.seed, 4u);
  EXPECT_FALSE(plan.return_logits);
  ExtendOutput out;
  out.tokens = {42};
  absl::StatusOr<StepResult> r = mode->Consume(state, plan, out);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->append, (std::vector<int32_t>{42}));
  EXPECT_EQ(r->drafted, 0);
}

TEST(SpecModeTest, ClampsDraftsToBudgetAndContext) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  auto mode = MakeSpec(*target, *target, 5);
  const SamplingParams greedy;
  std::vector<int32_t> tokens = {1, 2, 3};
  DecodeState state{.tokens = tokens, .kv_len = 0, .budget = 3, .sampling = &greedy};
  EXPECT_EQ(mode->Plan(state).tokens.size(), 3u + 2u);  // budget - 1 drafts
  state.budget = 1;
  EXPECT_EQ(mode->Plan(state).tokens.size(), 3u);  // an AR step

  tokens.assign(kContext - 2, 5);
  state = {.tokens = tokens, .kv_len = kContext - 3, .budget = 50, .sampling = &greedy};
  const StepPlan plan = mode->Plan(state);
  ASSERT_EQ(plan.tokens.size(), 1u + 2u);  // drafts at positions kContext - 2 and - 1
  EXPECT_EQ(plan.positions.back(), kContext - 1);
}

// Every step gains its accepted drafts plus one token, and the drafter spends one forward per
// draft; drafting with the target itself accepts everything.
TEST(SpecModeTest, AccountingAddsUpAndSelfDraftingAcceptsAll) {
  auto target = testing::TinyModel(TinyArch::kQwen3, 8, kContext);
  auto other = testing::PerturbedModel(*target, 5, 0.05f);
  const auto prompts = testing::TestPrompts(target->config().vocab_size, 6, 3);
  for (const int gamma : {1, 4}) {
    for (Transformer* drafter : {target.get(), other.get()}) {
      for (const float temperature : {0.0f, 1.0f}) {
        for (size_t p = 0; p < prompts.size(); ++p) {
          auto mode = MakeSpec(*target, *drafter, gamma);
          const RunOptions run = Sampled(40, temperature, 77 + p);
          absl::StatusOr<RunStats> got = testing::RunOnce(*target, *mode, prompts[p], run);
          ASSERT_TRUE(got.ok()) << got.status();
          const auto tokens = static_cast<int>(got->tokens.size());
          EXPECT_EQ(tokens, 40);
          EXPECT_EQ(tokens, got->accepted + got->forwards);
          EXPECT_LE(got->accepted, got->drafted);
          EXPECT_EQ(got->drafted, mode->stats().drafted);
          EXPECT_EQ(got->accepted, mode->stats().accepted);
          EXPECT_EQ(got->forwards, mode->stats().steps);
          EXPECT_EQ(mode->stats().drafter_failures, 0);
          const DrafterStats& d = mode->drafter().stats();
          EXPECT_EQ(d.drafted, got->drafted);
          EXPECT_EQ(d.forwards, d.drafted);
          if (drafter == target.get() && temperature == 0.0f) {
            EXPECT_EQ(got->accepted, got->drafted);
            EXPECT_EQ(got->forwards, (40 + gamma) / (gamma + 1));
          }
        }
      }
    }
  }
}

TEST(SpecModeTest, GammaZeroIsArEvenWhenSampling) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  const auto prompts = testing::TestPrompts(target->config().vocab_size, 4, 9);
  for (size_t p = 0; p < prompts.size(); ++p) {
    const RunOptions run = Sampled(30, 0.9f, 1000 + p);
    ArMode ar(target->config().vocab_size);
    absl::StatusOr<RunStats> want = testing::RunOnce(*target, ar, prompts[p], run);
    auto mode = MakeSpec(*target, *target, 0);
    absl::StatusOr<RunStats> got = testing::RunOnce(*target, *mode, prompts[p], run);
    ASSERT_TRUE(want.ok() && got.ok());
    EXPECT_EQ(got->tokens, want->tokens);
    EXPECT_EQ(mode->drafter().stats().calls, 0);
  }
}

// A drafter that always fails: the sequence decodes by AR steps instead.
class FailingDrafter : public Drafter {
 public:
  absl::StatusOr<std::vector<int32_t>> Draft(std::span<const int32_t>, int) override {
    ++stats_.calls;
    return absl::UnavailableError("drafter went away");
  }
  const DrafterStats& stats() const override { return stats_; }

 private:
  DrafterStats stats_;
};

TEST(SpecModeTest, DrafterFailureFallsBackToArSteps) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  SpecMode mode(4, std::make_unique<FailingDrafter>(), target->config().vocab_size, kContext);
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5};
  const RunOptions run = Sampled(12, 0.8f, 5);
  ArMode ar(target->config().vocab_size);
  absl::StatusOr<RunStats> want = testing::RunOnce(*target, ar, prompt, run);
  absl::StatusOr<RunStats> got = testing::RunOnce(*target, mode, prompt, run);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_EQ(got->forwards, 12);
  EXPECT_EQ(mode.stats().drafter_failures, 11);  // the last step has no room for drafts
  EXPECT_EQ(mode.stats().last_drafter_error.code(), absl::StatusCode::kUnavailable);
}

// The incremental cache (truncate to the common prefix, feed the rest) drafts exactly what a
// drafter starting from nothing drafts, whatever the previous call left behind.
TEST(InProcessArDrafterTest, IncrementalCacheMatchesAFreshDrafter) {
  auto model = testing::TinyModel(TinyArch::kQwen3, 8, kContext);
  InProcessArDrafter kept(model.get(), kContext);
  std::vector<std::vector<int32_t>> calls;
  std::vector<int32_t> seq = {5, 9, 2, 7};
  calls.push_back(seq);
  seq.push_back(11);  // the previous drafts were all rejected
  calls.push_back(seq);
  for (int i = 0; i < 3; ++i) {
    // Accept what the drafter will draft next, plus a bonus token.
    InProcessArDrafter probe(model.get(), kContext);
    absl::StatusOr<std::vector<int32_t>> d = probe.Draft(seq, 3);
    ASSERT_TRUE(d.ok());
    seq.insert(seq.end(), d->begin(), d->begin() + i + 1);
    seq.push_back(40 + i);
    calls.push_back(seq);
  }
  calls.push_back(seq);                             // the same sequence again
  calls.push_back({seq.begin(), seq.begin() + 6});  // shorter (a restarted sequence)
  calls.push_back({60, 61, 62});                    // a different sequence
  for (const std::vector<int32_t>& tokens : calls) {
    for (int gamma : {1, 4}) {
      InProcessArDrafter fresh(model.get(), kContext);
      absl::StatusOr<std::vector<int32_t>> want = fresh.Draft(tokens, gamma);
      absl::StatusOr<std::vector<int32_t>> got = kept.Draft(tokens, gamma);
      ASSERT_TRUE(want.ok() && got.ok());
      EXPECT_EQ(*got, *want) << "after " << tokens.size() << " tokens, gamma " << gamma;
      EXPECT_EQ(got->size(), static_cast<size_t>(gamma));
    }
  }
  EXPECT_GT(kept.stats().reused_tokens, 0);
}

TEST(InProcessArDrafterTest, StopsAtTheContextAndRejectsForeignTokens) {
  auto model = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  InProcessArDrafter drafter(model.get(), kContext);
  const std::vector<int32_t> near_end(kContext - 2, 3);
  absl::StatusOr<std::vector<int32_t>> d = drafter.Draft(near_end, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size(), 3u);  // fed positions up to kContext - 1
  const std::vector<int32_t> full(kContext + 1, 3);
  d = drafter.Draft(full, 5);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_TRUE(d->empty());
  const std::vector<int32_t> foreign = {1, 64};
  EXPECT_EQ(drafter.Draft(foreign, 2).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(drafter.Draft({}, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(SpecModeTest, CreateModeValidatesTheDrafterAndGamma) {
  auto target = testing::TinyModel(TinyArch::kQwen2, 7, kContext);
  auto other_vocab = testing::TinyModel(TinyArch::kQwen3, 8, kContext);
  const SamplingParams greedy;
  ModeOptions options;
  EXPECT_EQ(CreateMode("spec", options, target->config(), greedy).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.spec_drafter = other_vocab.get();
  EXPECT_EQ(CreateMode("spec", options, target->config(), greedy).status().code(),
            absl::StatusCode::kInvalidArgument);
  options.spec_drafter = target.get();
  for (int gamma : {-1, kMaxSpecGamma + 1}) {
    options.spec_gamma = gamma;
    EXPECT_EQ(CreateMode("spec", options, target->config(), greedy).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  options.spec_gamma = 0;
  absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
      CreateMode("spec", options, target->config(), greedy);
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ((*mode)->name(), "spec");
  EXPECT_TRUE((*mode)->lossless());
}

}  // namespace
}  // namespace tandem
