// Speculative decoding is lossless in distribution: the joint distribution of the first three
// tokens that `spec` samples (20k seeded runs) matches the target's exact AR distribution,
// computed by enumerating every prefix, by Pearson chi-square. Target and drafter are
// random-weight transformers over a 12-token vocabulary (a different model, and the target
// drafting for itself). The same check fails for two broken
// verification rules, so it can fail.
#include "tests/worker/decoding/spec_distribution.h"

#include <cmath>
#include <cstdio>
#include <memory>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/spec.h"

namespace tandem {
namespace {

using testing::spec_distribution::ExactJoint;
using testing::spec_distribution::Fits;
using testing::spec_distribution::kContext;
using testing::spec_distribution::kTokens;
using testing::spec_distribution::kVocab;
using testing::spec_distribution::Model;
using testing::spec_distribution::Sampled;
using testing::spec_distribution::SampleJoint;
using testing::spec_distribution::Temperature;

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
