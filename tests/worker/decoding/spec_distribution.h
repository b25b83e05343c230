// The harness of the `spec` distribution tests: the exact AR distribution of the first kTokens
// tokens after a fixed prompt (every prefix enumerated) on random-weight transformers over a
// 12-token vocabulary, kRuns seeded runs of a mode, and a pooled Pearson chi-square of the
// samples against the exact distribution.
#pragma once

#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/decoding/tiny_models.h"
#include "tests/worker/sampling/chi_square.h"
#include "worker/decoding/runner.h"
#include "worker/sampling/sampling.h"

namespace tandem::testing::spec_distribution {

inline constexpr int kVocab = 12;
inline constexpr int kContext = 64;
inline constexpr int kTokens = 3;       // generated tokens whose joint distribution is tested
inline constexpr int kRuns = 20000;     // seeded samples per case
inline constexpr double kAlpha = 1e-4;  // false-alarm rate of one check
// Categories expected fewer draws than this are pooled into one, as chi-square needs.
inline constexpr double kMinExpected = 5.0;

// A random-weight target over kVocab tokens; with `mask_token`, one whose config names that id
// as <|mask|> (a block-diffusion pathway, for the modes that draft with masks).
inline std::unique_ptr<Transformer> Model(uint64_t seed, float stddev,
                                          std::optional<int32_t> mask_token = std::nullopt) {
  ModelConfig c = TinyConfig(testing::TinyArch::kQwen2, kContext);
  c.vocab_size = kVocab;
  c.diffusion.mask_token_id = mask_token;
  return Transformer::FromWeights(c, RandomWeights(c, seed, stddev));
}

inline const std::vector<int32_t>& Prompt() {
  static const std::vector<int32_t> prompt = {3, 7, 1, 9, 4};
  return prompt;
}

// The sampling distribution after `tokens`, from one forward over all of them.
inline std::vector<float> NextDistribution(Transformer& model, std::span<const int32_t> tokens,
                                           const SamplingParams& sampling) {
  std::vector<float> probs;
  SamplingDistribution(NextLogits(model, tokens), sampling, &probs);
  return probs;
}

// P(x_1 .. x_kTokens | prompt) under AR sampling, indexed by sum x_i kVocab^(kTokens - i).
inline std::vector<double> ExactJoint(Transformer& target, const SamplingParams& sampling) {
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
inline Sampled SampleJoint(Transformer& target, DecodingMode& mode, SamplingParams sampling) {
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
inline bool Fits(const Sampled& s, const std::vector<double>& expected, const std::string& label) {
  const ChiSquareTest t = PooledChiSquareTest(s.counts, expected, kAlpha, kMinExpected);
  std::printf(
      "[ chi2     ] %s: statistic %.1f, dof %d, critical %.1f (p %.3g), impossible %lld, "
      "%lld of %lld drafts accepted\n",
      label.c_str(), t.result.statistic, t.result.dof, t.critical,
      ChiSquarePValue(t.result.statistic, t.result.dof),
      static_cast<long long>(t.result.impossible), static_cast<long long>(s.accepted),
      static_cast<long long>(s.drafted));
  return t.fits;
}

inline SamplingParams Temperature(float t, int top_k = 0) {
  SamplingParams s;
  s.temperature = t;
  s.top_k = top_k;
  return s;
}

}  // namespace tandem::testing::spec_distribution
