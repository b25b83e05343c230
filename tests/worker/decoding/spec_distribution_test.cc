// Speculative decoding is lossless in distribution: the joint distribution of the first three
// tokens that `spec` samples (20k seeded runs) matches the target's exact AR distribution,
// computed by enumerating every prefix, by Pearson chi-square. Target and drafter are
// random-weight transformers over a 12-token vocabulary (a different model, and the target
// drafting for itself). The same check fails for two broken
// verification rules, so it can fail.
#include <cmath>
#include <cstdio>
#include <memory>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "tests/worker/sampling/chi_square.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/spec.h"

namespace tandem {
namespace {

constexpr int kVocab = 12;
constexpr int kContext = 64;
constexpr int kTokens = 3;       // generated tokens whose joint distribution is tested
constexpr int kRuns = 20000;     // seeded samples per case
constexpr double kAlpha = 1e-4;  // false-alarm rate of one check
// Categories expected fewer draws than this are pooled into one, as chi-square needs.
constexpr double kMinExpected = 5.0;

std::unique_ptr<Transformer> Model(uint64_t seed, float stddev) {
  ModelConfig c = testing::TinyConfig(testing::TinyArch::kQwen2, kContext);
  c.vocab_size = kVocab;
  return Transformer::FromWeights(c, RandomWeights(c, seed, stddev));
}

const std::vector<int32_t>& Prompt() {
  static const std::vector<int32_t> prompt = {3, 7, 1, 9, 4};
  return prompt;
}

// The sampling distribution after `tokens`, from one forward over all of them.
std::vector<float> NextDistribution(Transformer& model, std::span<const int32_t> tokens,
                                    const SamplingParams& sampling) {
  std::vector<float> probs;
  SamplingDistribution(testing::NextLogits(model, tokens), sampling, &probs);
  return probs;
}

// P(x_1 .. x_kTokens | prompt) under AR sampling, indexed by sum x_i kVocab^(kTokens - i).
std::vector<double> ExactJoint(Transformer& target, const SamplingParams& sampling) {
  std::vector<double> joint(1, 1.0);
  std::vector<std::vector<int32_t>> prefixes(1);
  for (int step = 0; step < kTokens; ++step) {
    std::vector<double> next_joint;
    std::vector<std::vector<int32_t>> next_prefixes;
    for (size_t c = 0; c < prefixes.size(); ++c) {
      std::vector<int32_t> tokens = Prompt();
      tokens.insert(tokens.end(), prefixes[c].begin(), prefixes[c].end());
      const std::vector<float> p = NextDistribution(target, tokens, sampling);
      for (int x = 0; x < kVocab; ++x) {
        next_joint.push_back(joint[c] * p[x]);
        next_prefixes.push_back(prefixes[c]);
        next_prefixes.back().push_back(x);
      }
    }
    joint = std::move(next_joint);
    prefixes = std::move(next_prefixes);
  }
  return joint;
}

struct Sampled {
  std::vector<int64_t> counts;  // [kVocab^kTokens]
  int64_t drafted = 0;
  int64_t accepted = 0;
};

// kRuns runs of `mode` with seeds 0, 1, ...; one mode instance throughout, so the drafter's
// cache carries over between runs as it would between requests.
Sampled SampleJoint(Transformer& target, DecodingMode& mode, SamplingParams sampling) {
  Sampled s;
  s.counts.assign(static_cast<size_t>(std::pow(kVocab, kTokens)), 0);
  KvCache kv(target.KvOptions(static_cast<int64_t>(Prompt().size()) + kTokens + 128));
  for (int run = 0; run < kRuns; ++run) {
    RunOptions options;
    options.max_tokens = kTokens;
    options.sampling = sampling;
    options.sampling.seed = static_cast<uint64_t>(run);
    absl::StatusOr<RunStats> got = RunSequence(target, kv, 1, mode, Prompt(), options);
    EXPECT_TRUE(got.ok()) << got.status();
    if (!got.ok() || got->tokens.size() != kTokens) return s;
    size_t index = 0;
    for (int32_t t : got->tokens) index = index * kVocab + static_cast<size_t>(t);
    ++s.counts[index];
    s.drafted += got->drafted;
    s.accepted += got->accepted;
  }
  return s;
}

// Chi-square of the counts against `expected` with sparse categories pooled. True when the
// counts fit (no impossible outcome, statistic below the critical value at kAlpha).
bool Fits(const Sampled& s, const std::vector<double>& expected, const std::string& label) {
  const testing::ChiSquareTest t =
      testing::PooledChiSquareTest(s.counts, expected, kAlpha, kMinExpected);
  std::printf(
      "[ chi2     ] %s: statistic %.1f, dof %d, critical %.1f (p %.3g), impossible %lld, "
      "%lld of %lld drafts accepted\n",
      label.c_str(), t.result.statistic, t.result.dof, t.critical,
      testing::ChiSquarePValue(t.result.statistic, t.result.dof),
      static_cast<long long>(t.result.impossible), static_cast<long long>(s.accepted),
      static_cast<long long>(s.drafted));
  return t.fits;
}

// Verification with a deliberate bug, everything else as in SpecMode (its Plan drafts).
enum class Bug {
  kAcceptAlways,       // never rejects a draft
  kResampleWithDraft,  // on rejection samples from p instead of p without the draft
};

class BrokenSpecMode : public DecodingMode {
 public:
  BrokenSpecMode(Bug bug, int gamma, Transformer* drafter)
      : bug_(bug),
        spec_(gamma, std::make_unique<InProcessArDrafter>(drafter, kContext), kVocab, kContext) {}

  std::string_view name() const override { return "broken_spec"; }
  bool lossless() const override { return false; }
  StepPlan Plan(const DecodeState& state) override {
    // Consume below samples from the logits itself, so a γ = 0 step must not trade them for a
    // model-sampled token (SpecMode's own Consume takes either).
    StepPlan plan = spec_.Plan(state);
    plan.samples.clear();
    plan.return_logits = true;
    return plan;
  }

  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    const int pending = state.pending();
    const int gamma = static_cast<int>(plan.tokens.size()) - pending;
    const SamplingParams& sampling = *state.sampling;
    const uint64_t t = state.tokens.size();
    StepResult r;
    for (int i = 0; i < pending; ++i) r.keep.push_back(i);
    std::vector<float> probs;
    int k = 0;
    int32_t next = -1;
    for (; k < gamma; ++k) {
      const int32_t draft = plan.tokens[pending + k];
      SamplingDistribution(LogitsRow(out, k, kVocab), sampling, &probs);
      if (bug_ == Bug::kAcceptAlways ||
          UniformRandom(sampling.seed, t + k, RngPurpose::kAccept) < probs[draft]) {
        continue;
      }
      next =
          SampleFromDistribution(probs, UniformRandom(sampling.seed, t + k, RngPurpose::kResample));
      break;
    }
    if (k == gamma) next = SampleToken(LogitsRow(out, gamma, kVocab), sampling, t + gamma);
    for (int i = 0; i < k; ++i) {
      r.keep.push_back(pending + i);
      r.append.push_back(plan.tokens[pending + i]);
    }
    r.append.push_back(next);
    r.drafted = gamma;
    r.accepted = k;
    return r;
  }

 private:
  Bug bug_;
  SpecMode spec_;
};

// The drafter is the target with noisy weights: its greedy drafts are often, not always, the
// target's most likely token, so both the accept and the resample branches run thousands of
// times.
struct Models {
  std::unique_ptr<Transformer> target = Model(101, 0.25f);
  std::unique_ptr<Transformer> drafter = testing::PerturbedModel(*target, 202, 0.1f);
};

Models& Shared() {
  static Models* models = new Models();
  return *models;
}

SamplingParams Temperature(float t, int top_k = 0) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = top_k;
  return s;
}

TEST(SpecDistributionTest, ArSamplingFitsTheExactDistribution) {
  Models& m = Shared();
  const SamplingParams sampling = Temperature(1.0f);
  ArMode ar(kVocab);
  EXPECT_TRUE(Fits(SampleJoint(*m.target, ar, sampling), ExactJoint(*m.target, sampling), "ar"));
}

TEST(SpecDistributionTest, SpecWithAnotherDrafterMatchesAr) {
  Models& m = Shared();
  // max_tokens = kTokens caps the first step at kTokens - 1 drafts.
  for (const int gamma : {1, kTokens - 1}) {
    const SamplingParams sampling = Temperature(1.0f);
    SpecMode spec(gamma, std::make_unique<InProcessArDrafter>(m.drafter.get(), kContext), kVocab,
                  kContext);
    const Sampled s = SampleJoint(*m.target, spec, sampling);
    EXPECT_TRUE(Fits(s, ExactJoint(*m.target, sampling), "spec gamma " + std::to_string(gamma)));
    EXPECT_GT(s.accepted, s.drafted / 10);
    EXPECT_LT(s.accepted, s.drafted * 9 / 10);
  }
}

TEST(SpecDistributionTest, SpecWithTopKMatchesAr) {
  Models& m = Shared();
  const SamplingParams sampling = Temperature(1.0f, 3);
  SpecMode spec(2, std::make_unique<InProcessArDrafter>(m.drafter.get(), kContext), kVocab,
                kContext);
  const Sampled s = SampleJoint(*m.target, spec, sampling);
  EXPECT_TRUE(Fits(s, ExactJoint(*m.target, sampling), "spec gamma 2, top-k 3"));
  EXPECT_GT(s.accepted, 0);
  EXPECT_LT(s.accepted, s.drafted);
}

TEST(SpecDistributionTest, SpecDraftingWithTheTargetMatchesAr) {
  Models& m = Shared();
  const SamplingParams sampling = Temperature(0.7f);
  SpecMode spec(2, std::make_unique<InProcessArDrafter>(m.target.get(), kContext), kVocab,
                kContext);
  const Sampled s = SampleJoint(*m.target, spec, sampling);
  EXPECT_TRUE(Fits(s, ExactJoint(*m.target, sampling), "spec gamma 2, target drafts, T 0.7"));
  EXPECT_GT(s.accepted, s.drafted / 3);
}

TEST(SpecDistributionTest, BrokenAcceptanceRulesFailTheSameCheck) {
  Models& m = Shared();
  const SamplingParams sampling = Temperature(1.0f);
  const std::vector<double> exact = ExactJoint(*m.target, sampling);
  for (const Bug bug : {Bug::kAcceptAlways, Bug::kResampleWithDraft}) {
    BrokenSpecMode broken(bug, 2, m.drafter.get());
    const std::string label =
        bug == Bug::kAcceptAlways ? "broken: accept always" : "broken: resample with the draft";
    EXPECT_FALSE(Fits(SampleJoint(*m.target, broken, sampling), exact, label)) << label;
  }
}

}  // namespace
}  // namespace tandem
