// `isd` (I-DLM introspective strided decoding), away from any trained model:
//  - accounting: on a stand-in model whose per-draft acceptance probabilities are set by
//    construction, the measured tokens per forward match I-DLM Appendix B's
//    TPF_N = (2 + P_1 + ... + P_{N-2}) / (2 - P_{N-1}) evaluated at the measured per-position
//    acceptance, for several strides and both proposal kinds;
//  - distribution: with tau = 0 the joint distribution of the first three sampled tokens
//    (20k seeded runs on a random-weight transformer over a 12-token vocabulary whose last
//    token serves as <|mask|>) matches the exact AR distribution by chi-square; the same check
//    fails for two broken acceptance rules and for the relaxed tau = 1 rule; it holds with a
//    random LoRA adapter gated on the mask rows (R-ISD);
//  - the step plan: one 2N-1-token causal extend once drafts exist, budget and context limits.
// Greedy exactness against `ar` runs in exactness_test and isd_bundled_test.
#include "worker/decoding/isd.h"

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/decoding/spec_distribution.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

// ---------------------------------------------------------------------------------------------
// Accounting on a stand-in model.

constexpr int kFakeVocab = 8;
constexpr int32_t kFakeMask = kFakeVocab - 1;

// Context-free stand-in for an I-DLM checkpoint over V tokens, the last of them <|mask|>, which
// no row ever predicts (so a <|mask|> in the plan is always a mask). Anchor rows (clean
// tokens): the anchor of the i-th draft of the step (i = 0 for the last pending row) puts mass
// accept[i] on token 0 and spreads the rest evenly over the other V - 2 tokens; mask rows
// propose token 0 with probability (1 - mix) + mix / (V - 1), the others with mix / (V - 1).
// With argmax proposals (always 0) draft i is accepted with probability accept[i]; with
// sampled proposals and a uniform anchor (`uniform_anchor`) with probability
// sum_x min(p, q) = 1 / (V - 1) + (V - 2) mix / (V - 1).
struct FakeIdlm {
  std::vector<double> accept;  // per draft slot; argmax proposals
  bool uniform_anchor = false;
  double mix = 1.0;

  ExtendOutput Forward(const StepPlan& plan, int pending) const {
    ExtendOutput out;
    for (int32_t row : plan.outputs) {
      constexpr int kWords = kFakeVocab - 1;  // every token but <|mask|>
      std::vector<double> probs(kFakeVocab, 0.0);
      if (plan.tokens[row] == kFakeMask) {
        for (int x = 0; x < kWords; ++x) probs[x] = mix / kWords;
        probs[0] += 1.0 - mix;
      } else if (uniform_anchor) {
        for (int x = 0; x < kWords; ++x) probs[x] = 1.0 / kWords;
      } else {
        const int slot = row - (pending - 1);
        const double a = slot < static_cast<int>(accept.size()) ? accept[slot] : 0.5;
        for (int x = 1; x < kWords; ++x) probs[x] = (1.0 - a) / (kWords - 1);
        probs[0] = a;
      }
      for (double p : probs) out.logits.push_back(static_cast<float>(std::log(p)));
    }
    return out;
  }
};

struct Accounting {
  int64_t tokens = 0;
  int64_t forwards = 0;
  std::vector<int64_t> reached;   // [slot]: steps whose draft `slot` was checked
  std::vector<int64_t> accepted;  // [slot]: of those, accepted
};

// The runner's loop without a cache: plans, the stand-in's logits, consume, commit.
void Drive(IsdMode& mode, const FakeIdlm& model, int max_tokens, uint64_t seed, Accounting* acc,
           int max_positions = 0) {
  std::vector<int32_t> tokens = {1, 2, 3};
  const int prompt_len = static_cast<int>(tokens.size());
  SamplingParams sampling;
  sampling.temperature = 1.0f;
  sampling.seed = seed;
  int kv_len = 0;
  while (static_cast<int>(tokens.size()) - prompt_len < max_tokens) {
    const DecodeState state{.tokens = tokens,
                            .prompt_len = prompt_len,
                            .kv_len = kv_len,
                            .budget = max_tokens - (static_cast<int>(tokens.size()) - prompt_len),
                            .sampling = &sampling};
    const StepPlan plan = mode.Plan(state);
    for (size_t i = 0; i < plan.positions.size(); ++i) {
      ASSERT_EQ(plan.positions[i], kv_len + static_cast<int>(i));
      if (max_positions > 0) {
        ASSERT_LT(plan.positions[i], max_positions);
      }
    }
    const ExtendOutput out = model.Forward(plan, state.pending());
    absl::StatusOr<StepResult> r = mode.Consume(state, plan, out);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(CheckStep(state, plan, *r, "isd").ok());
    ASSERT_LE(static_cast<int>(r->append.size()), state.budget);
    ++acc->forwards;
    acc->tokens += static_cast<int64_t>(r->append.size());
    for (int slot = 0; slot < r->drafted && slot <= r->accepted; ++slot) {
      if (slot >= static_cast<int>(acc->reached.size())) {
        acc->reached.resize(slot + 1, 0);
        acc->accepted.resize(slot + 1, 0);
      }
      ++acc->reached[slot];
      if (slot < r->accepted) ++acc->accepted[slot];
    }
    kv_len += static_cast<int>(r->keep.size());
    tokens.insert(tokens.end(), r->append.begin(), r->append.end());
  }
}

// I-DLM eq. 3 with P_k = p_1 ... p_k.
double AppendixBTpf(const std::vector<double>& p, int stride) {
  std::vector<double> cumulative(stride, 1.0);  // cumulative[k] = P_k, P_0 = 1
  for (int k = 1; k < stride; ++k) cumulative[k] = cumulative[k - 1] * p[k - 1];
  double numerator = 2.0;
  for (int k = 1; k <= stride - 2; ++k) numerator += cumulative[k];
  return numerator / (2.0 - cumulative[stride - 1]);
}

void CheckTpf(const FakeIdlm& model, int stride, bool argmax_proposals,
              const std::vector<double>& designed) {
  IsdMode mode({.stride = stride, .mask_token = kFakeMask, .argmax_proposals = argmax_proposals},
               kFakeVocab, 0);
  Accounting acc;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    Drive(mode, model, 3000, seed, &acc);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_EQ(static_cast<int>(acc.reached.size()), stride - 1);
  std::vector<double> measured;
  for (int k = 0; k < stride - 1; ++k) {
    measured.push_back(static_cast<double>(acc.accepted[k]) / acc.reached[k]);
    EXPECT_NEAR(measured.back(), designed[k], 0.02)
        << "draft " << k + 1 << " of stride " << stride << ": the stand-in's acceptance";
  }
  const double tpf = static_cast<double>(acc.tokens) / acc.forwards;
  const double formula = AppendixBTpf(measured, stride);
  std::printf("[ tpf      ] N=%d %s: measured %.4f, Appendix B %.4f at p =", stride,
              argmax_proposals ? "argmax" : "sampled", tpf, formula);
  for (double p : measured) std::printf(" %.3f", p);
  std::printf(" (%lld tokens, %lld forwards)\n", static_cast<long long>(acc.tokens),
              static_cast<long long>(acc.forwards));
  EXPECT_NEAR(tpf / formula, 1.0, 0.05);
  // Not vacuous: the stride pays off, and a geometric chain is not what plain AR gives.
  EXPECT_GT(tpf, 1.2);
}

TEST(IsdAccountingTest, TokensPerForwardFollowAppendixB) {
  const std::vector<double> accept = {0.9, 0.75, 0.6, 0.45};
  const FakeIdlm model{.accept = accept};
  for (int stride : {2, 3, 4, 5}) CheckTpf(model, stride, /*argmax_proposals=*/true, accept);
}

TEST(IsdAccountingTest, TokensPerForwardFollowAppendixBWithSampledProposals) {
  const FakeIdlm model{.uniform_anchor = true, .mix = 0.7};
  const double p = (1.0 + (kFakeVocab - 2) * 0.7) / (kFakeVocab - 1);
  for (int stride : {2, 4}) {
    CheckTpf(model, stride, /*argmax_proposals=*/false, std::vector<double>(stride - 1, p));
  }
}

TEST(IsdAccountingTest, PerfectAndNoAcceptanceGiveNAndOne) {
  for (const double a : {1.0, 0.0}) {
    const FakeIdlm model{.accept = std::vector<double>(3, a)};
    IsdMode mode({.stride = 4, .mask_token = kFakeMask}, kFakeVocab, 0);
    Accounting acc;
    Drive(mode, model, 2000, 1, &acc);
    const double tpf = static_cast<double>(acc.tokens) / acc.forwards;
    // a = 1: every step after the first yields N tokens; a = 0: one token per forward.
    EXPECT_NEAR(tpf, a == 1.0 ? 4.0 : 1.0, 0.01) << "acceptance " << a;
  }
}

// ---------------------------------------------------------------------------------------------
// The step plan.

TEST(IsdPlanTest, FusedStepIsOneCausalExtendOfTwoNMinusOneTokens) {
  const FakeIdlm model{.accept = std::vector<double>(4, 1.0)};
  IsdMode mode({.stride = 4, .mask_token = kFakeMask}, kFakeVocab, 0);
  std::vector<int32_t> tokens = {5, 6};
  SamplingParams greedy;
  int kv_len = 0;
  for (int step = 0; step < 3; ++step) {
    const DecodeState state{
        .tokens = tokens, .prompt_len = 2, .kv_len = kv_len, .budget = 100, .sampling = &greedy};
    const StepPlan plan = mode.Plan(state);
    EXPECT_EQ(plan.visible.kind, Visibility::Kind::kCausal);
    // First step: the prompt and N - 1 masks; then the exact token, N - 1 drafts, N - 1 masks.
    EXPECT_EQ(plan.tokens.size(), step == 0 ? 2u + 3u : 7u) << "step " << step;
    int masks = 0;
    for (int32_t t : plan.tokens) masks += t == kFakeMask;
    EXPECT_EQ(masks, 3);
    EXPECT_EQ(plan.outputs.size(), step == 0 ? 4u : 7u);
    absl::StatusOr<StepResult> r = mode.Consume(state, plan, model.Forward(plan, state.pending()));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->append.size(), step == 0 ? 1u : 4u);
    kv_len += static_cast<int>(r->keep.size());
    tokens.insert(tokens.end(), r->append.begin(), r->append.end());
  }
}

TEST(IsdPlanTest, BudgetAndContextBoundTheStep) {
  const FakeIdlm model{.accept = std::vector<double>(4, 1.0)};
  for (const int max_positions : {0, 12}) {
    IsdMode mode({.stride = 5, .mask_token = kFakeMask}, kFakeVocab, max_positions);
    Accounting acc;
    // max_positions 12 with a 3-token prompt: 9 tokens fill the context exactly.
    Drive(mode, model, 9, 0, &acc, max_positions);
    EXPECT_EQ(acc.tokens, 9);
  }
  IsdMode mode({.stride = 5, .mask_token = kFakeMask}, kFakeVocab, 12);
  std::vector<int32_t> tokens(10, 1);
  SamplingParams greedy;
  const DecodeState state{
      .tokens = tokens, .prompt_len = 10, .kv_len = 0, .budget = 10, .sampling = &greedy};
  const StepPlan plan = mode.Plan(state);
  EXPECT_EQ(plan.tokens.size(), 12u);  // the prompt and the two masks that still fit
  for (int32_t p : plan.positions) EXPECT_LT(p, 12);
}

TEST(IsdOptionsTest, RejectsBadOptions) {
  EXPECT_TRUE(ValidateIsdOptions({.stride = 4, .mask_token = 3}, 8).ok());
  EXPECT_FALSE(ValidateIsdOptions({.stride = 1, .mask_token = 3}, 8).ok());
  EXPECT_FALSE(ValidateIsdOptions({.stride = kMaxIsdStride + 1, .mask_token = 3}, 8).ok());
  EXPECT_FALSE(ValidateIsdOptions({.stride = 4, .tau = -0.5f, .mask_token = 3}, 8).ok());
  EXPECT_FALSE(ValidateIsdOptions({.stride = 4, .mask_token = 8}, 8).ok());
}

TEST(IsdOptionsTest, CreateModeNeedsAMaskToken) {
  ModelConfig config = testing::TinyConfig(testing::TinyArch::kQwen3);
  ModeOptions options;
  absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
      CreateMode("isd", options, config, SamplingParams{});
  ASSERT_FALSE(mode.ok());
  EXPECT_EQ(mode.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mode.status().message().find("<|mask|>"), std::string_view::npos);
  config.diffusion.mask_token_id = config.vocab_size - 1;
  mode = CreateMode("isd", options, config, SamplingParams{});
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ((*mode)->name(), "isd");
  EXPECT_TRUE((*mode)->lossless());
  options.isd_tau = 0.5f;
  EXPECT_FALSE((*CreateMode("isd", options, config, SamplingParams{}))->lossless());
  options.isd_stride = 1;
  EXPECT_FALSE(CreateMode("isd", options, config, SamplingParams{}).ok());
}

// ---------------------------------------------------------------------------------------------
// Distribution on a random-weight transformer.

using testing::spec_distribution::ExactJoint;
using testing::spec_distribution::Fits;
using testing::spec_distribution::kContext;
using testing::spec_distribution::kRuns;
using testing::spec_distribution::kTokens;
using testing::spec_distribution::kVocab;
using testing::spec_distribution::Model;
using testing::spec_distribution::Prompt;
using testing::spec_distribution::Sampled;
using testing::spec_distribution::Temperature;

constexpr int32_t kMask = kVocab - 1;

Transformer& Target() {
  static Transformer* model = Model(101, 0.25f).release();
  return *model;
}

// kRuns seeded runs of max_tokens kTokens + 1 (so a stride-3 step verifies two drafts inside
// the tested window); the first kTokens tokens are counted.
Sampled SampleJoint(const IsdOptions& options, const SamplingParams& sampling,
                    Transformer& model = Target()) {
  Sampled s;
  s.counts.assign(static_cast<size_t>(std::pow(kVocab, kTokens)), 0);
  KvCache kv(model.KvOptions(static_cast<int64_t>(Prompt().size()) + kTokens + 64));
  IsdMode mode(options, kVocab, kContext);
  for (int run = 0; run < kRuns; ++run) {
    RunOptions run_options;
    run_options.max_tokens = kTokens + 1;
    run_options.sampling = sampling;
    run_options.sampling.seed = static_cast<uint64_t>(run);
    absl::StatusOr<RunStats> got = RunSequence(model, kv, 1, mode, Prompt(), run_options);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || static_cast<int>(got->tokens.size()) != kTokens + 1) return s;
    size_t index = 0;
    for (int i = 0; i < kTokens; ++i) index = index * kVocab + static_cast<size_t>(got->tokens[i]);
    ++s.counts[index];
    s.drafted += got->drafted;
    s.accepted += got->accepted;
  }
  return s;
}

TEST(IsdDistributionTest, ExactAcceptanceMatchesAr) {
  struct Case {
    std::string label;
    IsdOptions options;
    SamplingParams sampling;
  };
  const std::vector<Case> cases = {
      {"isd N=3, argmax proposals, T 1", {.stride = 3, .mask_token = kMask}, Temperature(1.0f)},
      {"isd N=3, sampled proposals, T 1",
       {.stride = 3, .mask_token = kMask, .argmax_proposals = false},
       Temperature(1.0f)},
      {"isd N=2, sampled proposals, T 0.8, top-k 4",
       {.stride = 2, .mask_token = kMask, .argmax_proposals = false},
       Temperature(0.8f, 4)},
  };
  for (const Case& c : cases) {
    const Sampled s = SampleJoint(c.options, c.sampling);
    EXPECT_TRUE(Fits(s, ExactJoint(Target(), c.sampling), c.label)) << c.label;
    // Both branches ran thousands of times.
    EXPECT_GT(s.accepted, 1000) << c.label;
    EXPECT_GT(s.drafted - s.accepted, 1000) << c.label;
  }
}

// R-ISD: Target()'s weights plus a random LoRA adapter that the mode gates on its <|mask|>
// rows. The proposals q change, the anchors p do not, so the samples must still follow
// Target()'s AR distribution.
TEST(IsdDistributionTest, LoraOnMaskRowsKeepsTheArDistribution) {
  const std::unique_ptr<Transformer> adapted =
      Transformer::FromWeights(Target().config(), Target().weights());
  adapted->SetLoraAdapter(testing::RandomLoraAdapter(Target().config(), 7, 0.5f));
  const SamplingParams sampling = Temperature(1.0f);
  const IsdOptions plain{.stride = 3, .mask_token = kMask, .argmax_proposals = false};
  IsdOptions lora = plain;
  lora.lora_masks = true;
  const Sampled with = SampleJoint(lora, sampling, *adapted);
  EXPECT_TRUE(Fits(with, ExactJoint(Target(), sampling), "isd N=3 + LoRA on masks, sampled, T 1"));
  EXPECT_GT(with.accepted, 1000);
  EXPECT_GT(with.drafted - with.accepted, 1000);
  // Not vacuous: without the gate the same model proposes (and accepts) differently.
  const Sampled without = SampleJoint(plain, sampling, *adapted);
  EXPECT_NE(with.accepted, without.accepted);
}

// Broken rules: accept every proposal; on rejection draw from p instead of max(0, p - q).
int32_t AcceptAlways(std::span<const float>, std::span<const float>, int32_t token, float, double,
                     double, bool* accepted, std::vector<float>*) {
  *accepted = true;
  return token;
}

int32_t ResampleFromP(std::span<const float> p, std::span<const float> q, int32_t token, float tau,
                      double u_accept, double u_resample, bool* accepted,
                      std::vector<float>* scratch) {
  VerifyProposal(p, q, token, tau, u_accept, u_resample, accepted, scratch);
  return *accepted ? token : SampleFromDistribution(p, u_resample);
}

TEST(IsdDistributionTest, BrokenAndRelaxedAcceptanceFailTheSameCheck) {
  const SamplingParams sampling = Temperature(1.0f);
  const std::vector<double> exact = ExactJoint(Target(), sampling);
  struct Case {
    std::string label;
    IsdOptions options;
  };
  const std::vector<Case> cases = {
      {"broken: accept always",
       {.stride = 3, .mask_token = kMask, .argmax_proposals = false, .verifier = &AcceptAlways}},
      {"broken: resample from p",
       {.stride = 3, .mask_token = kMask, .argmax_proposals = false, .verifier = &ResampleFromP}},
      {"relaxed: tau 1", {.stride = 3, .tau = 1.0f, .mask_token = kMask}},
  };
  for (const Case& c : cases) {
    EXPECT_FALSE(Fits(SampleJoint(c.options, sampling), exact, c.label)) << c.label;
  }
}

}  // namespace
}  // namespace tandem
