// self_spec_quadratic with sampling at lambda = 0, with plain and with shifted (SDLM, nsp's
// quadratic variant) groups: point-mass p/q verification inside the one fused forward must leave
// the AR distribution intact. The first three tokens of many seeded
// runs are compared (chi-square) with their exact AR marginals, computed by enumeration: token 0
// comes from the bootstrap step, token 1 from verifying the first carried draft (accepted or
// resampled), token 2 from the bonus after an accepted draft or from a later step.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "gtest/gtest.h"
#include "tests/worker/decoding/distribution.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/self_spec_quadratic.h"

namespace tandem {
namespace {

using testing::TinyArch;

// The sampling distribution of the token after `tokens`, from a cache of its own.
std::vector<double> NextDistribution(Transformer& model, std::span<const int32_t> tokens,
                                     const SamplingParams& sampling) {
  std::vector<float> probs;
  SamplingDistribution(testing::NextLogits(model, tokens), sampling, &probs);
  double total = 0;
  for (float p : probs) total += p;
  std::vector<double> normalised(probs.size());
  for (size_t i = 0; i < probs.size(); ++i) normalised[i] = probs[i] / total;
  return normalised;
}

TEST(SelfSpecQuadraticSamplingTest, FirstTokensFollowTheArDistribution) {
  std::unique_ptr<Transformer> model = testing::TinyModel(TinyArch::kQwen2, 3);
  const int vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {5, 9, 5, 9, 5};
  // top-k keeps the enumeration of the third token's marginal small.
  const SamplingParams sampling{.temperature = 1.5f, .top_k = 6};

  // Exact marginals of the first three tokens.
  const std::vector<double> first = NextDistribution(*model, prompt, sampling);
  std::vector<double> second(vocab, 0.0), third(vocab, 0.0);
  for (int t = 0; t < vocab; ++t) {
    if (first[t] <= 0) continue;
    std::vector<int32_t> seq = prompt;
    seq.push_back(t);
    const std::vector<double> next = NextDistribution(*model, seq, sampling);
    for (int u = 0; u < vocab; ++u) {
      if (next[u] <= 0) continue;
      second[u] += first[t] * next[u];
      seq.push_back(u);
      const std::vector<double> after = NextDistribution(*model, seq, sampling);
      for (int w = 0; w < vocab; ++w) third[w] += first[t] * next[u] * after[w];
      seq.pop_back();
    }
  }

  // Plain groups (self_spec_quadratic) and shifted SDLM blocks (nsp's quadratic variant).
  for (bool shifted : {false, true}) {
    SCOPED_TRACE(shifted ? "shifted" : "plain");
    constexpr int kRuns = 4000;
    std::map<int32_t, int> counts[3];
    int accepted = 0, drafted = 0;
    for (int run = 0; run < kRuns; ++run) {
      SelfSpecQuadraticMode mode({.draft_len = 4, .mask_token = vocab - 1, .shifted = shifted},
                                 vocab, 128);
      RunOptions options{.max_tokens = 3, .sampling = sampling};
      options.sampling.seed = 1000 + run;
      absl::StatusOr<RunStats> r = testing::RunOnce(*model, mode, prompt, options);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->tokens.size(), 3u);
      for (int i = 0; i < 3; ++i) ++counts[i][r->tokens[i]];
      accepted += r->accepted;
      drafted += r->drafted;
    }
    // Both outcomes of verification happen often.
    EXPECT_GT(accepted, kRuns / 20);
    EXPECT_GT(drafted - accepted, kRuns / 20);
    EXPECT_TRUE(testing::FitsDistribution(counts[0], first, kRuns)) << "first token";
    EXPECT_TRUE(testing::FitsDistribution(counts[1], second, kRuns)) << "second token";
    EXPECT_TRUE(testing::FitsDistribution(counts[2], third, kRuns)) << "third token";
    std::printf("[ verify   ] %s: %d of %d drafts accepted\n", shifted ? "shifted" : "plain",
                accepted, drafted);
  }
}

}  // namespace
}  // namespace tandem
