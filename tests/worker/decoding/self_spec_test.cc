// self_spec with sampling: point-mass p/q verification must leave the target's AR distribution
// intact. The first two generated tokens of many seeded runs are compared (chi-square) with
// their exact AR marginals, computed by enumerating the first token. Both verification paths
// run: a draft checked by the draft forward's own AR row (the first) and drafts checked by the
// verify forward (the later ones), with acceptances and resampled rejections.
#include "worker/decoding/self_spec.h"

#include <cmath>
#include <map>

#include "gtest/gtest.h"
#include "tests/worker/decoding/distribution.h"
#include "tests/worker/decoding/tiny_models.h"

namespace tandem {
namespace {

using testing::TinyArch;

TEST(SelfSpecSamplingTest, FirstTokensFollowTheArDistribution) {
  std::unique_ptr<Transformer> model = testing::TinyModel(TinyArch::kQwen2, 3);
  const int vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {5, 9, 5, 9, 5};
  const SamplingParams sampling{.temperature = 1.5f};

  // Exact marginals of the first two tokens.
  std::vector<float> probs;
  SamplingDistribution(testing::NextLogits(*model, prompt), sampling, &probs);
  std::vector<double> first(probs.begin(), probs.end());
  std::vector<double> second(vocab, 0.0);
  for (int t = 0; t < vocab; ++t) {
    if (first[t] <= 0) continue;
    std::vector<int32_t> seq = prompt;
    seq.push_back(t);
    std::vector<float> next;
    SamplingDistribution(testing::NextLogits(*model, seq), sampling, &next);
    for (int u = 0; u < vocab; ++u) second[u] += first[t] * next[u];
  }

  constexpr int kRuns = 4000;
  std::map<int32_t, int> first_counts, second_counts;
  int accepted = 0, drafted = 0;
  for (int run = 0; run < kRuns; ++run) {
    SelfSpecMode mode({.draft_len = 4, .mask_token = vocab - 1}, vocab, 128);
    RunOptions options{.max_tokens = 3, .sampling = sampling};
    options.sampling.seed = 1000 + run;
    absl::StatusOr<RunStats> r = testing::RunOnce(*model, mode, prompt, options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens.size(), 3u);
    ++first_counts[r->tokens[0]];
    ++second_counts[r->tokens[1]];
    accepted += r->accepted;
    drafted += r->drafted;
  }
  // Both outcomes of verification happen often.
  EXPECT_GT(accepted, kRuns / 10);
  EXPECT_GT(drafted - accepted, kRuns / 10);
  EXPECT_TRUE(testing::FitsDistribution(first_counts, first, kRuns)) << "first token";
  EXPECT_TRUE(testing::FitsDistribution(second_counts, second, kRuns)) << "second token";
}

TEST(SelfSpecSamplingTest, SeededRunsRepeat) {
  std::unique_ptr<Transformer> model = testing::TinyModel(TinyArch::kQwen3, 4);
  const int vocab = model->config().vocab_size;
  const std::vector<int32_t> prompt = {1, 2, 3, 1, 2, 3};
  std::vector<int32_t> previous;
  for (int i = 0; i < 2; ++i) {
    SelfSpecMode mode({.draft_len = 8, .mask_token = vocab - 1}, vocab, 128);
    RunOptions options{.max_tokens = 40, .sampling = {.temperature = 0.8f, .seed = 77}};
    absl::StatusOr<RunStats> r = testing::RunOnce(*model, mode, prompt, options);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->tokens.size(), 40u);
    if (i == 1) {
      EXPECT_EQ(r->tokens, previous);
    }
    previous = r->tokens;
  }
}

}  // namespace
}  // namespace tandem
