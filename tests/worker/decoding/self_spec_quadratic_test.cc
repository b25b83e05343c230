// self_spec_quadratic: the interleaved layout against a hand-written expectation (also with
// nsp's shifted SDLM groups), the drafts of every step against the linear mode's separate draft
// pass over the same accepted prefix (nsp's self-speculative one for shifted groups), and
// (on the bundled tri-mode target) exactness against AR plus tokens per forward next to the
// linear mode's. Random-weight exactness runs in exactness_test.
#include "worker/decoding/self_spec_quadratic.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/worker/decoding/bundled_target.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/nsp.h"
#include "worker/decoding/runner.h"
#include "worker/decoding/self_spec.h"

namespace tandem {
namespace {

using testing::TinyArch;

// Row i as the list of j that token i sees.
std::vector<std::vector<int>> SeenBy(const Visibility& v, int n) {
  std::vector<std::vector<int>> rows(n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < n; ++j) {
      if (v.Sees(i, j)) rows[i].push_back(j);
    }
  }
  return rows;
}

DecodeState State(std::span<const int32_t> tokens, int kv_len, int budget,
                  const SamplingParams* sampling) {
  return {.tokens = tokens,
          .prompt_len = static_cast<int>(tokens.size()),
          .kv_len = kv_len,
          .budget = budget,
          .sampling = sampling};
}

// A 32-token vocabulary whose last id is <|mask|>, blocks of 4.
ModelConfig MaskedConfig() {
  ModelConfig config;
  config.vocab_size = 32;
  config.max_position_embeddings = 64;
  config.diffusion.mask_token_id = 31;
  config.diffusion.block_size = 4;
  return config;
}

TEST(SelfSpecQuadraticLayoutTest, FirstStepIsTheLinearDraftPass) {
  constexpr int32_t kMask = 31;
  SelfSpecQuadraticMode mode({.draft_len = 2, .mask_token = kMask}, 32, 64);
  const std::vector<int32_t> tokens = {3, 4, 5};
  const SamplingParams greedy;
  const StepPlan plan = mode.Plan(State(tokens, 0, 10, &greedy));
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{3, 4, 5, kMask, kMask}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(
      SeenBy(plan.visible, 5),
      (std::vector<std::vector<int>>{{0}, {0, 1}, {0, 1, 2}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}}));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{2, 3, 4}));
}

TEST(SelfSpecQuadraticLayoutTest, InterleavedGroupsForK2) {
  constexpr int32_t kMask = 31;
  SelfSpecQuadraticMode mode({.draft_len = 2, .mask_token = kMask}, 32, 64);
  // Sequence 3 4 5 6 with 6 pending (L = 4); two drafts 7 8 for positions 4, 5 (one more than
  // k - 1, as a prefix of the layout of any width).
  const std::vector<int32_t> tokens = {3, 4, 5, 6};
  const SamplingParams greedy;
  mode.SetDraftsForTest({7, 8}, 4);
  const StepPlan plan = mode.Plan(State(tokens, 3, 10, &greedy));
  //                    index:  0  1      2      3  4      5      6  7      8
  //                            p  G0     G0     e0 G1     G1     e1 G2     G2
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{6, kMask, kMask, 7, kMask, kMask, 8, kMask, kMask}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{3, 4, 5, 4, 5, 6, 5, 6, 7}));
  EXPECT_EQ(SeenBy(plan.visible, 9), (std::vector<std::vector<int>>{
                                         {0},              // pending
                                         {0, 1, 2},        // G0: pending + own group
                                         {0, 1, 2},        //
                                         {0, 3},           // e0: causal chain
                                         {0, 3, 4, 5},     // G1: pending, e0 + own group
                                         {0, 3, 4, 5},     //
                                         {0, 3, 6},        // e1
                                         {0, 3, 6, 7, 8},  // G2: pending, e0, e1 + own group
                                         {0, 3, 6, 7, 8},
                                     }));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));

  // The budget caps the drafts (a step gains at most m + 1 tokens); with a budget of one the
  // step is a plain AR step.
  mode.SetDraftsForTest({7, 8}, 4);
  const StepPlan two = mode.Plan(State(tokens, 3, 2, &greedy));
  EXPECT_EQ(two.tokens, (std::vector<int32_t>{6, kMask, kMask, 7, kMask, kMask}));
  mode.SetDraftsForTest({7, 8}, 4);
  const StepPlan one = mode.Plan(State(tokens, 3, 1, &greedy));
  EXPECT_EQ(one.tokens, (std::vector<int32_t>{6}));
  // Drafts made for another length are not used.
  mode.SetDraftsForTest({7, 8}, 5);
  EXPECT_EQ(mode.Plan(State(tokens, 3, 10, &greedy)).tokens,
            (std::vector<int32_t>{6, kMask, kMask}));
}

TEST(SelfSpecQuadraticLayoutTest, ShiftedGroupsStartOnACopyOfTheChainToken) {
  constexpr int32_t kMask = 31;
  SelfSpecQuadraticMode mode({.draft_len = 2, .mask_token = kMask, .shifted = true}, 32, 64);
  EXPECT_EQ(mode.name(), "nsp");
  // Sequence 3 4 5 6 with 6 pending (L = 4); drafts 7 8 for positions 4, 5. Group a is
  // [chain token at L+a-1, <|mask|>] at positions L+a-1, L+a and sees the chain before it.
  const std::vector<int32_t> tokens = {3, 4, 5, 6};
  const SamplingParams greedy;
  mode.SetDraftsForTest({7, 8}, 4);
  const StepPlan plan = mode.Plan(State(tokens, 3, 10, &greedy));
  //                    index:  0  1  2      3  4  5      6  7  8
  //                            p  G0 G0     e0 G1 G1     e1 G2 G2
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{6, 6, kMask, 7, 7, kMask, 8, 8, kMask}));
  EXPECT_EQ(plan.positions, (std::vector<int32_t>{3, 3, 4, 4, 4, 5, 5, 5, 6}));
  EXPECT_EQ(SeenBy(plan.visible, 9), (std::vector<std::vector<int>>{
                                         {0},           // pending
                                         {1, 2},        // G0: its own group only
                                         {1, 2},        //
                                         {0, 3},        // e0: causal chain
                                         {0, 4, 5},     // G1: pending + own group
                                         {0, 4, 5},     //
                                         {0, 3, 6},     // e1
                                         {0, 3, 7, 8},  // G2: pending, e0 + own group
                                         {0, 3, 7, 8},
                                     }));
  EXPECT_EQ(plan.outputs, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8}));
  // The first step (no drafts) is nsp's linear draft pass: [pending | x[L-1], <|mask|>].
  SelfSpecQuadraticMode fresh({.draft_len = 2, .mask_token = kMask, .shifted = true}, 32, 64);
  const StepPlan first = fresh.Plan(State(tokens, 2, 10, &greedy));
  EXPECT_EQ(first.tokens, (std::vector<int32_t>{5, 6, 6, kMask}));
  EXPECT_EQ(first.positions, (std::vector<int32_t>{2, 3, 3, 4}));
  EXPECT_EQ(SeenBy(first.visible, 4),
            (std::vector<std::vector<int>>{{0}, {0, 1}, {0, 2, 3}, {0, 2, 3}}));
  EXPECT_EQ(first.outputs, (std::vector<int32_t>{1, 2, 3}));
}

TEST(SelfSpecQuadraticLayoutTest, OptionsAndLossiness) {
  ModelConfig config = MaskedConfig();
  ModeOptions options;
  auto exact = CreateMode("self_spec_quadratic", options, config, SamplingParams{});
  ASSERT_TRUE(exact.ok()) << exact.status();
  EXPECT_EQ((*exact)->name(), "self_spec_quadratic");
  EXPECT_TRUE((*exact)->lossless());
  options.quadratic_lambda = 0.3f;
  auto ensemble = CreateMode("self_spec_quadratic", options, config, SamplingParams{});
  ASSERT_TRUE(ensemble.ok()) << ensemble.status();
  EXPECT_FALSE((*ensemble)->lossless()) << "a diffusion term in the verifier is lossy";
  options.quadratic_lambda = 1.5f;
  EXPECT_EQ(CreateMode("self_spec_quadratic", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
  config.diffusion.mask_token_id.reset();
  EXPECT_EQ(CreateMode("self_spec_quadratic", {}, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(SelfSpecQuadraticLayoutTest, NspQuadraticIsTheShiftedLosslessMode) {
  ModelConfig config = MaskedConfig();
  ModeOptions options;
  options.nsp_quadratic = true;
  options.nsp_tau = 0.1f;  // longest prefix decoding's knob; the quadratic variant ignores it
  auto mode = CreateMode("nsp", options, config, SamplingParams{});
  ASSERT_TRUE(mode.ok()) << mode.status();
  EXPECT_EQ((*mode)->name(), "nsp");
  EXPECT_TRUE((*mode)->lossless());
  const std::vector<int32_t> tokens = {3, 4, 5};
  const SamplingParams greedy;
  const StepPlan plan = (*mode)->Plan(State(tokens, 2, 10, &greedy));
  EXPECT_EQ(plan.tokens, (std::vector<int32_t>{5, 5, 31, 31, 31})) << "a block of the model's 4";
  config.diffusion.mask_token_id.reset();
  EXPECT_EQ(CreateMode("nsp", options, config, SamplingParams{}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Prefills `committed` into a fresh cache, then runs `plan` on top: the forward a runner would
// make for this step, computed from scratch.
ExtendOutput RunPlan(Transformer& model, std::span<const int32_t> committed, const StepPlan& plan) {
  KvCache kv(model.KvOptions(static_cast<int64_t>(committed.size() + plan.tokens.size()) + 32));
  EXPECT_TRUE(kv.AddSequence(1).ok());
  if (!committed.empty()) {
    EXPECT_TRUE(kv.Reserve(1, static_cast<int>(committed.size())));
    std::vector<int32_t> positions(committed.size()), keep(committed.size());
    for (size_t i = 0; i < committed.size(); ++i) positions[i] = keep[i] = static_cast<int>(i);
    const std::vector<int32_t> outputs = {static_cast<int32_t>(committed.size()) - 1};
    Extend prefill{.seq = 1, .tokens = committed, .positions = positions, .outputs = outputs};
    EXPECT_TRUE(model.Forward({&prefill, 1}, kv).ok());
    EXPECT_TRUE(kv.Commit(1, keep).ok());
  }
  EXPECT_TRUE(kv.Reserve(1, static_cast<int>(plan.tokens.size())));
  Extend extend{.seq = 1,
                .tokens = plan.tokens,
                .positions = plan.positions,
                .visible = plan.visible,
                .outputs = plan.outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? std::move((*out)[0]) : ExtendOutput{};
}

float MaxDifference(std::span<const float> a, std::span<const float> b) {
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(a[i] - b[i]));
  return worst;
}

// Decodes `steps` steps of the quadratic mode. After each, every mask group of the forward is
// compared with the linear mode's draft pass over the prefix that group assumes (logits within
// 1e-4), and the drafts carried to the next step with that pass's drafts for the accepted
// prefix. `shifted`: SDLM groups, against nsp's self-speculative draft pass. Returns the number
// of steps whose drafts were compared.
int CompareWithLinearDraftPass(Transformer& model, int32_t mask, int k, std::vector<int32_t> tokens,
                               int steps, bool shifted = false) {
  const int vocab = model.config().vocab_size;
  const int max_positions = model.config().max_position_embeddings;
  SelfSpecQuadraticMode quadratic({.draft_len = k, .mask_token = mask, .shifted = shifted}, vocab,
                                  max_positions);
  const SamplingParams greedy;
  const int prompt_len = static_cast<int>(tokens.size());
  int kv_len = 0;
  int compared = 0;
  for (int step = 0; step < steps; ++step) {
    const std::span<const int32_t> committed(tokens.data(), kv_len);
    const DecodeState state = State(tokens, kv_len, 1000, &greedy);
    const StepPlan plan = quadratic.Plan(state);
    const int m = (static_cast<int>(plan.outputs.size()) - 1 - k) / (k + 1);
    EXPECT_EQ(static_cast<int>(plan.outputs.size()), 1 + k + m * (k + 1)) << "step " << step;
    const ExtendOutput out = RunPlan(model, committed, plan);
    absl::StatusOr<StepResult> result = quadratic.Consume(state, plan, out);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return compared;

    for (int a = 0; a <= m; ++a) {
      // The linear draft pass for the sequence that accepted the first a drafts.
      std::vector<int32_t> prefix = tokens;
      for (int i = 0; i < a; ++i) {
        prefix.push_back(plan.tokens[state.pending() + k + i * (k + 1)]);
      }
      std::unique_ptr<DecodingMode> linear;
      if (shifted) {
        linear = std::make_unique<NspMode>(
            NspOptions{.block_size = k, .mask_token = mask, .verify = true}, vocab, max_positions);
      } else {
        linear = std::make_unique<SelfSpecMode>(SelfSpecOptions{.draft_len = k, .mask_token = mask},
                                                vocab, max_positions);
      }
      const StepPlan lp = linear->Plan(State(prefix, kv_len, 1000, &greedy));
      EXPECT_EQ(static_cast<int>(lp.outputs.size()), 1 + k);
      const ExtendOutput lo = RunPlan(model, committed, lp);
      // Output rows of the quadratic forward: AR row a, then group a's k masks.
      const int ar_row = a == 0 ? 0 : a * (k + 1);
      const int group_row = 1 + a * (k + 1);
      EXPECT_LT(MaxDifference(LogitsRow(out, ar_row, vocab), LogitsRow(lo, 0, vocab)), 1e-4f)
          << "step " << step << " AR row " << a;
      for (int r = 0; r < k; ++r) {
        EXPECT_LT(MaxDifference(LogitsRow(out, group_row + r, vocab), LogitsRow(lo, 1 + r, vocab)),
                  1e-4f)
            << "step " << step << " group " << a << " mask " << r;
      }
      if (a == result->accepted) {
        std::vector<int32_t> want;
        for (int r = 1; r < k; ++r) want.push_back(Argmax(LogitsRow(lo, 1 + r, vocab)));
        EXPECT_EQ(std::vector<int32_t>(quadratic.drafts().begin(), quadratic.drafts().end()), want)
            << "step " << step << " accepted " << a;
        ++compared;
      }
    }
    kv_len += static_cast<int>(result->keep.size());
    tokens.insert(tokens.end(), result->append.begin(), result->append.end());
    EXPECT_EQ(quadratic.drafts_start(), static_cast<int>(tokens.size()));
  }
  EXPECT_GT(static_cast<int>(tokens.size()), prompt_len);
  return compared;
}

TEST(SelfSpecQuadraticDraftTest, DraftsEqualTheLinearDraftPassOnRandomModels) {
  for (TinyArch arch : {TinyArch::kQwen2, TinyArch::kQwen3}) {
    std::unique_ptr<Transformer> model = testing::TinyModel(arch, 5);
    const int32_t mask = model->config().vocab_size - 1;
    for (int k : {2, 4}) {
      const std::vector<std::vector<int32_t>> prompts =
          testing::TestPrompts(model->config().vocab_size - 1, 4, 40 + k);
      for (const std::vector<int32_t>& prompt : prompts) {
        EXPECT_EQ(CompareWithLinearDraftPass(*model, mask, k, prompt, 6), 6);
        EXPECT_EQ(CompareWithLinearDraftPass(*model, mask, k, prompt, 6, /*shifted=*/true), 6);
      }
    }
  }
}

class QuadraticBundledTest : public testing::BundledTargetTest {
 protected:
  std::unique_ptr<DecodingMode> Create(const std::string& name, int k, float lambda = 0) {
    ModeOptions options;
    options.self_spec_draft_len = k;
    options.quadratic_lambda = lambda;
    absl::StatusOr<std::unique_ptr<DecodingMode>> mode =
        CreateMode(name, options, model_->config(), SamplingParams{});
    EXPECT_TRUE(mode.ok()) << mode.status();
    return mode.ok() ? std::move(*mode) : nullptr;
  }
};

// Records the extend size and tokens gained of every step.
class StepRecorder : public DecodingMode {
 public:
  explicit StepRecorder(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override {
    StepPlan plan = inner_->Plan(state);
    extend_sizes.push_back(static_cast<int>(plan.tokens.size()) - state.pending());
    return plan;
  }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    absl::StatusOr<StepResult> r = inner_->Consume(state, plan, out);
    if (r.ok()) steps.push_back(static_cast<int>(r->append.size()));
    return r;
  }
  std::vector<int> extend_sizes;  // new tokens beyond the pending ones, per step
  std::vector<int> steps;         // tokens appended by each step

 private:
  std::unique_ptr<DecodingMode> inner_;
};

TEST_F(QuadraticBundledTest, DraftsEqualTheLinearDraftPass) {
  const int32_t mask = *model_->config().diffusion.mask_token_id;
  int compared = 0;
  for (int k : {2, 8}) {
    for (size_t p = 0; p < prompts_.size(); p += 3) {
      compared += CompareWithLinearDraftPass(*model_, mask, k, prompts_[p], 8);
    }
  }
  EXPECT_EQ(compared, 2 * 3 * 8);
}

TEST_F(QuadraticBundledTest, GreedyEqualsArAndTokensPerForward) {
  for (int k : {2, 4, 8}) {
    int64_t tokens = 0, forwards = 0, linear_tokens = 0, linear_forwards = 0, accepted = 0,
            drafted = 0, extend = 0, steps = 0;
    int max_extend = 0;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      StepRecorder mode(Create("self_spec_quadratic", k));
      absl::StatusOr<RunStats> r = Decode(mode, prompts_[p]);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->tokens, ar_[p]) << "prompt " << p << " k " << k;
      tokens += static_cast<int64_t>(r->tokens.size());
      forwards += r->forwards;
      accepted += r->accepted;
      drafted += r->drafted;
      for (int n : mode.extend_sizes) {
        extend += n;
        max_extend = std::max(max_extend, n);
      }
      steps += static_cast<int64_t>(mode.extend_sizes.size());

      std::unique_ptr<DecodingMode> linear = Create("self_spec", k);
      absl::StatusOr<RunStats> l = Decode(*linear, prompts_[p]);
      ASSERT_TRUE(l.ok()) << l.status();
      linear_tokens += static_cast<int64_t>(l->tokens.size());
      linear_forwards += l->forwards;
    }
    EXPECT_GT(accepted, 0);
    std::printf(
        "[ tpf      ] k=%d on tandem-target: self_spec_quadratic %.3f tokens/forward (%lld tokens, "
        "%lld forwards, %lld of %lld drafts accepted); self_spec %.3f (%lld forwards); extend "
        "beyond the pending tokens: %.1f new tokens per step on average, %d at most\n",
        k, static_cast<double>(tokens) / forwards, static_cast<long long>(tokens),
        static_cast<long long>(forwards), static_cast<long long>(accepted),
        static_cast<long long>(drafted), static_cast<double>(linear_tokens) / linear_forwards,
        static_cast<long long>(linear_forwards), static_cast<double>(extend) / steps, max_extend);
  }
}

// The exactness harness's stop-token and max_tokens probes on the trained model, where runs of
// accepted drafts are common.
TEST_F(QuadraticBundledTest, GreedyEqualsArWithStopsAndBudgets) {
  int stops_inside_steps = 0;
  for (int k : {8, 3}) {
    for (size_t p = 0; p < prompts_.size(); ++p) {
      const auto run = [&](int max_tokens, std::optional<int32_t> stop) {
        ArMode ar(model_->config().vocab_size);
        absl::StatusOr<RunStats> want = Decode(ar, prompts_[p], max_tokens, stop);
        ASSERT_TRUE(want.ok()) << want.status();
        StepRecorder mode(Create("self_spec_quadratic", k));
        absl::StatusOr<RunStats> got = Decode(mode, prompts_[p], max_tokens, stop);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->tokens, want->tokens) << "prompt " << p << " k " << k << " max_tokens "
                                             << max_tokens << " stop " << stop.value_or(-1);
        EXPECT_EQ(got->finish, want->finish);
        size_t seen = 0;
        for (int n : mode.steps) {
          seen += n;
          if (seen >= got->tokens.size()) {
            stops_inside_steps += got->finish == FinishReason::kStop && seen > got->tokens.size();
            break;
          }
        }
      };
      for (int max_tokens : {1, 2, k - 1, k, k + 1, 2 * k + 1}) run(max_tokens, std::nullopt);
      for (size_t at = 1; at < ar_[p].size(); at += 5) run(new_tokens_, ar_[p][at]);
    }
  }
  EXPECT_GT(stops_inside_steps, 0) << "no stop token fell inside a multi-token step";
}

// lambda > 0 verifies against the AR-diffusion mixture: lossy, so only its bookkeeping and
// agreement statistics are checked; lambda = 1 verifies with the diffusion pathway alone.
TEST_F(QuadraticBundledTest, EnsembleVerifierIsLossy) {
  for (float lambda : {0.5f, 1.0f}) {
    int64_t tokens = 0, forwards = 0, equal = 0;
    for (size_t p = 0; p < prompts_.size(); ++p) {
      std::unique_ptr<DecodingMode> mode = Create("self_spec_quadratic", 8, lambda);
      ASSERT_NE(mode, nullptr);
      EXPECT_FALSE(mode->lossless());
      absl::StatusOr<RunStats> r = Decode(*mode, prompts_[p]);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->tokens.size(), ar_[p].size());
      tokens += static_cast<int64_t>(r->tokens.size());
      forwards += r->forwards;
      for (size_t i = 0; i < r->tokens.size(); ++i) equal += r->tokens[i] == ar_[p][i];
    }
    std::printf(
        "[ tpf      ] self_spec_quadratic k=8 lambda %.1f (lossy): %.3f tokens/forward; %.1f%% of "
        "tokens equal AR greedy\n",
        lambda, static_cast<double>(tokens) / forwards, 100.0 * equal / tokens);
  }
}

}  // namespace
}  // namespace tandem
