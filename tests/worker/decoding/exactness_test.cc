// The exactness harness for lossless decoding modes: under greedy decoding a lossless mode
// must reproduce ArMode's tokens exactly — over many prompts on two random-weight
// architectures (one with fp32 CPU weights, one with bf16), with stop tokens that land inside a
// multi-token step, at max_tokens boundaries around the draft length, and with the budget ending at
// the model's context limit. A mode joins by adding one line to the INSTANTIATE_TEST_SUITE_P list
// at the bottom.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <numeric>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"

namespace tandem {
namespace {

using testing::TinyArch;

constexpr int kPromptsPerModel = 30;
constexpr int kMaxTokens = 48;
constexpr int kContext = 128;  // the tiny models' max_position_embeddings

struct ModeCase {
  std::string label;  // test name suffix
  std::string mode;   // name for CreateMode
  ModeOptions options;
  int draft_len = 1;   // tokens a step drafts; max_tokens boundaries are probed around it
  bool drafts = true;  // the suite then asserts that drafts were accepted (not vacuous)
  // > 0: the random models get a <|mask|> id (the last token) and this block size, which the
  // diffusion-pathway modes need.
  int mask_block = 0;
  // spec: which model drafts for the target.
  enum class Drafter { kNone, kSelf, kPerturbed, kIndependent, kDFlash } drafter = Drafter::kNone;
};

ModeCase Spec(std::string label, int gamma, ModeCase::Drafter drafter) {
  ModeOptions options;
  options.spec_gamma = gamma;
  return {.label = std::move(label),
          .mode = "spec",
          .options = options,
          .draft_len = gamma,
          .drafter = drafter};
}

// spec with a random-weight DFlash drafter (blocks of 6, hidden states of the target):
// random weights seldom draft what the target says, so acceptance is not asserted.
ModeCase SpecDFlash(std::string label, int gamma) {
  ModeCase c = Spec(std::move(label), gamma, ModeCase::Drafter::kDFlash);
  c.drafts = false;
  return c;
}

void PrintTo(const ModeCase& c, std::ostream* os) { *os << c.label; }

ModeOptions JacobiOptions(int n, int blocks, int candidates, int pool) {
  ModeOptions o;
  o.jacobi_block_size = n;
  o.jacobi_blocks = blocks;
  o.jacobi_candidates = candidates;
  o.jacobi_pool_size = pool;
  return o;
}

// k = 0: the block size is the draft length. Random weights have no trained diffusion
// pathway: beyond the first draft (which the draft forward's own AR row checks) drafts are
// seldom accepted, so multi-token steps are too rare for the stop-inside-a-step assertion;
// nld_bundled_test runs those checks on the trained tri-mode model instead.
ModeCase SelfSpec(std::string label, int block, int k = 0) {
  ModeOptions options;
  options.self_spec_draft_len = k;
  return {.label = std::move(label),
          .mode = "self_spec",
          .options = options,
          .draft_len = k > 0 ? k : block,
          .drafts = false,
          .mask_block = block};
}

// self_spec_quadratic: k masks per group (0 = the block size), AR verification (lambda 0).
ModeCase SelfSpecQuadratic(std::string label, int block, int k = 0) {
  ModeCase c = SelfSpec(std::move(label), block, k);
  c.mode = "self_spec_quadratic";
  return c;
}

// isd: stride N (one exact token and N - 1 drafts per step), the last token as <|mask|>.
// Random weights have no trained mask pathway, but greedy outputs repeat, so a mask row's
// argmax is sometimes the next token and drafts do get accepted.
ModeCase Isd(std::string label, int stride) {
  ModeOptions options;
  options.isd_stride = stride;
  return {.label = std::move(label),
          .mode = "isd",
          .options = options,
          .draft_len = stride,
          .mask_block = stride};
}

// nsp's self-speculative variant: the SDLM block's drafts verified by the AR pathway. Random
// weights have no trained block pathway, so (as for self_spec) drafts beyond the first are
// seldom accepted; bundled_model_test measures the trained SDLM model.
ModeCase NspVerified(std::string label, int block) {
  ModeOptions options;
  options.nsp_verify = true;
  return {.label = std::move(label),
          .mode = "nsp",
          .options = options,
          .draft_len = block,
          .drafts = false,
          .mask_block = block};
}

// nsp's quadratic variant: the same drafts, each step verifying the carried ones and drafting
// after every acceptance length in one forward.
ModeCase NspQuadratic(std::string label, int block) {
  ModeCase c = NspVerified(std::move(label), block);
  c.options.nsp_verify = false;  // the quadratic variant is verified whatever nsp_verify says
  c.options.nsp_quadratic = true;
  return c;
}

ModeCase Jacobi(std::string label, int n, int blocks, int candidates, int pool = 64,
                bool lookup = false) {
  ModeOptions options = JacobiOptions(n, blocks, candidates, pool);
  options.jacobi_prompt_lookup = lookup;
  return {.label = std::move(label), .mode = "jacobi", .options = options, .draft_len = n};
}

// Checks what the runner cannot: no position reaches the model's context, a step never gains
// more tokens than the budget or accepts more drafts than it proposed. Records each step's
// appended tokens so tests can see where a stop token fell.
class CheckedMode : public DecodingMode {
 public:
  CheckedMode(std::unique_ptr<DecodingMode> inner, int max_positions)
      : inner_(std::move(inner)), max_positions_(max_positions) {}

  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override { return inner_->Plan(state); }

  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    for (int32_t p : plan.positions) {
      if (p >= max_positions_) {
        return absl::InternalError(
            absl::StrCat("position ", p, " is past the context of ", max_positions_));
      }
    }
    absl::StatusOr<StepResult> r = inner_->Consume(state, plan, out);
    if (!r.ok()) return r;
    if (static_cast<int>(r->append.size()) > state.budget) {
      return absl::InternalError(absl::StrCat("step gained ", r->append.size(),
                                              " tokens with a budget of ", state.budget));
    }
    if (r->accepted > r->drafted || r->accepted < 0) {
      return absl::InternalError(
          absl::StrCat("accepted ", r->accepted, " of ", r->drafted, " drafts"));
    }
    steps_.push_back(r->append);
    return r;
  }

  const std::vector<std::vector<int32_t>>& steps() const { return steps_; }

 private:
  std::unique_ptr<DecodingMode> inner_;
  int max_positions_;
  std::vector<std::vector<int32_t>> steps_;
};

using ModeFactory =
    std::function<absl::StatusOr<std::unique_ptr<DecodingMode>>(const ModelConfig&)>;

struct Tally {
  int64_t runs = 0;
  int64_t forwards = 0;
  int64_t tokens = 0;
  int64_t drafted = 0;
  int64_t accepted = 0;
  int64_t stops_inside_steps = 0;  // stop token followed by more tokens of the same step

  double Tpf() const { return forwards > 0 ? static_cast<double>(tokens) / forwards : 0; }
};

std::string Show(std::span<const int32_t> tokens) { return absl::StrJoin(tokens, " "); }

RunOptions Options(int max_tokens, std::optional<int32_t> stop) {
  RunOptions run;
  run.max_tokens = max_tokens;
  if (stop) run.on_token = [token = *stop](int32_t t) { return t == token; };
  return run;
}

// Decodes `prompt` with ArMode and with the mode under test; they must agree on every token
// and on why they finished.
::testing::AssertionResult MatchesAr(Transformer& model, const ModeFactory& factory,
                                     std::span<const int32_t> prompt, int max_tokens,
                                     std::optional<int32_t> stop, Tally* tally) {
  ArMode ar(model.config().vocab_size);
  absl::StatusOr<RunStats> want = testing::RunOnce(model, ar, prompt, Options(max_tokens, stop));
  if (!want.ok()) return ::testing::AssertionFailure() << "ar: " << want.status();
  absl::StatusOr<std::unique_ptr<DecodingMode>> created = factory(model.config());
  if (!created.ok()) return ::testing::AssertionFailure() << created.status();
  CheckedMode mode(std::move(*created), model.config().max_position_embeddings);
  absl::StatusOr<RunStats> got = testing::RunOnce(model, mode, prompt, Options(max_tokens, stop));
  if (!got.ok()) return ::testing::AssertionFailure() << mode.name() << ": " << got.status();

  tally->runs += 1;
  tally->forwards += got->forwards;
  tally->tokens += static_cast<int64_t>(got->tokens.size());
  tally->drafted += got->drafted;
  tally->accepted += got->accepted;
  if (stop && got->finish == FinishReason::kStop) {
    size_t seen = 0;
    for (const std::vector<int32_t>& step : mode.steps()) {
      seen += step.size();
      if (seen >= got->tokens.size()) {
        if (seen > got->tokens.size()) tally->stops_inside_steps += 1;
        break;
      }
    }
  }

  const auto context = [&] {
    return absl::StrCat("\n  prompt: ", Show(prompt), "\n  max_tokens ", max_tokens,
                        stop ? absl::StrCat(", stop token ", *stop) : std::string(),
                        "\n  ar:     ", Show(want->tokens), "\n  ", std::string(mode.name()), ": ",
                        Show(got->tokens));
  };
  const size_t common = std::min(want->tokens.size(), got->tokens.size());
  for (size_t i = 0; i < common; ++i) {
    if (want->tokens[i] != got->tokens[i]) {
      return ::testing::AssertionFailure() << "first difference at token " << i << context();
    }
  }
  if (want->tokens.size() != got->tokens.size()) {
    return ::testing::AssertionFailure() << "lengths differ" << context();
  }
  if (want->finish != got->finish) {
    return ::testing::AssertionFailure() << "finish " << FinishReasonName(got->finish) << ", ar "
                                         << FinishReasonName(want->finish) << context();
  }
  return ::testing::AssertionSuccess();
}

struct TestModel {
  std::string name;
  std::unique_ptr<Transformer> model;
  std::vector<std::vector<int32_t>> prompts;
  // Drafters for spec: the target with noise on its weights (partial acceptance) and an
  // unrelated random model of the same architecture (rare acceptance).
  std::unique_ptr<Transformer> perturbed;
  std::unique_ptr<Transformer> independent;
  std::unique_ptr<DFlashModel> dflash;  // conditioned on `model`'s hidden states
};

// Built once for the whole binary: the models are immutable and every run has its own cache.
const std::vector<TestModel>& Models() {
  static const std::vector<TestModel>* models = [] {
    auto* m = new std::vector<TestModel>();
    m->push_back({"qwen2", testing::TinyModel(TinyArch::kQwen2, 7, kContext),
                  testing::TestPrompts(64, kPromptsPerModel, 11)});
    // The Qwen3 model holds its CPU weights in bf16, so every mode is checked on both weight
    // types (against the AR of the same weights).
    m->push_back(
        {"qwen3_bf16",
         testing::TinyModel(TinyArch::kQwen3, 8, kContext, kernels::cpu::WeightType::kBf16),
         testing::TestPrompts(97, kPromptsPerModel, 12)});
    for (TestModel& t : *m) {
      t.perturbed = testing::PerturbedModel(*t.model, 21, 0.05f);
      t.independent = testing::TinyModel(
          t.model->config().arch == Arch::kQwen3 ? TinyArch::kQwen3 : TinyArch::kQwen2, 31,
          kContext);
      t.dflash = testing::TinyDFlash(t.model.get(), 41, 6);
    }
    return m;
  }();
  return *models;
}

// spec with the case's drafter for the target model of `config` (told apart by vocabulary).
absl::StatusOr<std::unique_ptr<DecodingMode>> CreateSpec(const ModeCase& c,
                                                         const ModelConfig& config) {
  ModeOptions options = c.options;
  for (const TestModel& m : Models()) {
    if (m.model->config().vocab_size != config.vocab_size) continue;
    options.spec_drafter = c.drafter == ModeCase::Drafter::kSelf        ? m.model.get()
                           : c.drafter == ModeCase::Drafter::kPerturbed ? m.perturbed.get()
                                                                        : m.independent.get();
    if (c.drafter == ModeCase::Drafter::kDFlash) options.spec_dflash = m.dflash.get();
  }
  return CreateMode(c.mode, options, config, SamplingParams{});
}

class ExactnessTest : public ::testing::TestWithParam<ModeCase> {
 protected:
  ModeFactory Factory() const {
    const ModeCase c = GetParam();
    return [c](const ModelConfig& config) {
      if (c.drafter != ModeCase::Drafter::kNone) return CreateSpec(c, config);
      if (c.mask_block == 0) return CreateMode(c.mode, c.options, config, SamplingParams{});
      ModelConfig with_mask = config;
      with_mask.diffusion.mask_token_id = config.vocab_size - 1;
      with_mask.diffusion.block_size = c.mask_block;
      return CreateMode(c.mode, c.options, with_mask, SamplingParams{});
    };
  }
};

TEST_P(ExactnessTest, GreedyOutputEqualsArOnManyPrompts) {
  Tally all;
  for (const TestModel& m : Models()) {
    Tally tally;
    for (size_t p = 0; p < m.prompts.size(); ++p) {
      EXPECT_TRUE(MatchesAr(*m.model, Factory(), m.prompts[p], kMaxTokens, std::nullopt, &tally))
          << m.name << " prompt " << p;
    }
    std::printf(
        "[ tpf      ] %s on %s: %.3f tokens/forward (%lld tokens, %lld forwards, "
        "%lld of %lld drafts accepted)\n",
        GetParam().label.c_str(), m.name.c_str(), tally.Tpf(), static_cast<long long>(tally.tokens),
        static_cast<long long>(tally.forwards), static_cast<long long>(tally.accepted),
        static_cast<long long>(tally.drafted));
    all.tokens += tally.tokens;
    all.accepted += tally.accepted;
  }
  EXPECT_EQ(all.tokens, static_cast<int64_t>(Models().size()) * kPromptsPerModel * kMaxTokens);
  if (GetParam().drafts) {
    EXPECT_GT(all.accepted, 0) << "no draft was ever accepted";
  }
}

TEST_P(ExactnessTest, StopTokenInsideAStep) {
  Tally tally;
  for (const TestModel& m : Models()) {
    for (size_t p = 0; p < m.prompts.size(); ++p) {
      ArMode ar(m.model->config().vocab_size);
      absl::StatusOr<RunStats> full =
          testing::RunOnce(*m.model, ar, m.prompts[p], Options(kMaxTokens, std::nullopt));
      ASSERT_TRUE(full.ok()) << full.status();
      // Tokens from the middle of the output; greedy outputs repeat, so the stop often falls
      // well before that point, inside a run of accepted drafts.
      for (size_t at : {full->tokens.size() / 2, full->tokens.size() - 3}) {
        EXPECT_TRUE(
            MatchesAr(*m.model, Factory(), m.prompts[p], kMaxTokens, full->tokens[at], &tally))
            << m.name << " prompt " << p;
      }
    }
  }
  if (GetParam().drafts) {
    EXPECT_GT(tally.stops_inside_steps, 0) << "no stop token fell inside a multi-token step";
  }
}

TEST_P(ExactnessTest, MaxTokensBoundaries) {
  const int d = GetParam().draft_len;
  std::set<int> limits = {1, 2, d - 1, d, d + 1, 2 * d + 1};
  limits.erase(0);
  Tally tally;
  for (const TestModel& m : Models()) {
    for (size_t p = 0; p < 8; ++p) {
      for (int limit : limits) {
        EXPECT_TRUE(MatchesAr(*m.model, Factory(), m.prompts[p], limit, std::nullopt, &tally))
            << m.name << " prompt " << p << " max_tokens " << limit;
      }
    }
  }
  EXPECT_EQ(tally.tokens, static_cast<int64_t>(Models().size()) * 8 *
                              std::accumulate(limits.begin(), limits.end(), 0));
}

TEST_P(ExactnessTest, BudgetEndsAtTheContextLimit) {
  const int d = GetParam().draft_len;
  Tally tally;
  for (const TestModel& m : Models()) {
    for (int room : {1, 2, 3, d, d + 1, 2 * d + 3}) {
      for (size_t p = 0; p < 3; ++p) {
        // The prompt repeated up to kContext - room tokens: long and repetitive, so drafts run
        // into the limit.
        std::vector<int32_t> prompt;
        while (static_cast<int>(prompt.size()) < kContext - room) {
          prompt.push_back(m.prompts[2 * p + 1][prompt.size() % m.prompts[2 * p + 1].size()]);
        }
        EXPECT_TRUE(MatchesAr(*m.model, Factory(), prompt, room, std::nullopt, &tally))
            << m.name << " room " << room;
      }
    }
  }
}

// A mode with a classic verification bug: it checks all drafts but the last one, so a wrong
// final draft slips through whenever the others match.
class SkipsLastCheckMode : public DecodingMode {
 public:
  SkipsLastCheckMode(int vocab_size, int drafts, int* bug_hits)
      : vocab_size_(vocab_size), drafts_(drafts), bug_hits_(bug_hits) {}

  std::string_view name() const override { return "skips_last_check"; }
  bool lossless() const override { return true; }

  StepPlan Plan(const DecodeState& state) override {
    StepPlan plan;
    AppendPending(state, &plan);
    const int n = std::min(drafts_, state.budget - 1);
    for (int i = 0; i < n; ++i) {
      plan.tokens.push_back(state.tokens.back());  // drafts: the last token repeated
      plan.positions.push_back(static_cast<int32_t>(state.tokens.size()) + i);
    }
    const int pending = state.pending();
    for (int i = pending - 1; i < static_cast<int>(plan.tokens.size()); ++i) {
      plan.outputs.push_back(i);
    }
    return plan;
  }

  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    const int pending = state.pending();
    const int n = static_cast<int>(plan.tokens.size()) - pending;
    StepResult r;
    for (int i = 0; i < pending; ++i) r.keep.push_back(i);
    int k = 0;
    while (k < n - 1 && plan.tokens[pending + k] == Argmax(LogitsRow(out, k, vocab_size_))) ++k;
    if (n > 0 && k == n - 1) {  // the bug: the last draft is taken unchecked
      if (plan.tokens[pending + k] != Argmax(LogitsRow(out, k, vocab_size_))) ++*bug_hits_;
      ++k;
    }
    for (int i = 0; i < k; ++i) {
      r.keep.push_back(pending + i);
      r.append.push_back(plan.tokens[pending + i]);
    }
    r.append.push_back(Argmax(LogitsRow(out, k, vocab_size_)));
    r.drafted = n;
    r.accepted = k;
    return r;
  }

 private:
  int vocab_size_;
  int drafts_;
  int* bug_hits_;
};

TEST(ExactnessHarness, DetectsAModeThatAcceptsAWrongDraft) {
  int bug_hits = 0;
  int detected = 0;
  Tally tally;
  const ModeFactory broken =
      [&](const ModelConfig& c) -> absl::StatusOr<std::unique_ptr<DecodingMode>> {
    return std::make_unique<SkipsLastCheckMode>(c.vocab_size, 2, &bug_hits);
  };
  for (const TestModel& m : Models()) {
    for (const std::vector<int32_t>& prompt : m.prompts) {
      if (!MatchesAr(*m.model, broken, prompt, kMaxTokens, std::nullopt, &tally)) ++detected;
    }
  }
  ASSERT_GT(bug_hits, 0) << "the broken mode never took its broken path";
  EXPECT_GT(detected, 0) << "the harness missed " << bug_hits << " wrong acceptances";
}

INSTANTIATE_TEST_SUITE_P(
    Modes, ExactnessTest,
    ::testing::Values(
        ModeCase{.label = "ar", .mode = "ar", .drafts = false},
        Jacobi("jacobi_n4_k1_plain", 4, 1, 0, 0), Jacobi("jacobi_n8_k1_plain", 8, 1, 0, 0),
        Jacobi("jacobi_n1_k1_plain", 1, 1, 0, 0), Jacobi("jacobi_n4_k1_recycling", 4, 1, 2),
        Jacobi("jacobi_n6_k1_recycling", 6, 1, 3, 32), Jacobi("jacobi_n4_k2_recycling", 4, 2, 2),
        Jacobi("jacobi_n8_k2_recycling", 8, 2, 2), Jacobi("jacobi_n4_k3_recycling", 4, 3, 2),
        Jacobi("jacobi_n5_k3_recycling", 5, 3, 3, 16),
        Jacobi("jacobi_n6_k1_lookup", 6, 1, 0, 0, true),
        Jacobi("jacobi_n4_k2_recycling_lookup", 4, 2, 2, 64, true), SelfSpec("self_spec_b8", 8),
        SelfSpec("self_spec_b4", 4), SelfSpec("self_spec_b8_k2", 8, 2),
        SelfSpec("self_spec_b8_k1", 8, 1), SelfSpecQuadratic("self_spec_quadratic_b8", 8),
        SelfSpecQuadratic("self_spec_quadratic_b4", 4),
        SelfSpecQuadratic("self_spec_quadratic_b8_k2", 8, 2),
        SelfSpecQuadratic("self_spec_quadratic_b8_k1", 8, 1), NspVerified("nsp_verify_b4", 4),
        NspVerified("nsp_verify_b8", 8), NspVerified("nsp_verify_b1", 1),
        NspQuadratic("nsp_quadratic_b4", 4), NspQuadratic("nsp_quadratic_b8", 8),
        NspQuadratic("nsp_quadratic_b1", 1),
        Spec("spec_g1_perturbed", 1, ModeCase::Drafter::kPerturbed),
        Spec("spec_g3_perturbed", 3, ModeCase::Drafter::kPerturbed),
        Spec("spec_g5_perturbed", 5, ModeCase::Drafter::kPerturbed),
        Spec("spec_g3_independent", 3, ModeCase::Drafter::kIndependent),
        Spec("spec_g1_self", 1, ModeCase::Drafter::kSelf),
        Spec("spec_g3_self", 3, ModeCase::Drafter::kSelf),
        Spec("spec_g5_self", 5, ModeCase::Drafter::kSelf), SpecDFlash("spec_dflash_b6", 5),
        Isd("isd_n2", 2), Isd("isd_n3", 3), Isd("isd_n4", 4), Isd("isd_n6", 6)),
    [](const ::testing::TestParamInfo<ModeCase>& info) { return info.param.label; });

}  // namespace
}  // namespace tandem
