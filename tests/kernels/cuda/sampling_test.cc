// kernels/cuda sampling against worker/sampling: the Philox draws bit for bit (host, runs
// everywhere), Argmax exactly, sampled tokens equal to SampleToken's except where the shared
// draw u lies within float rounding of a CDF boundary, and a simple frequency check. Parameter
// checks run everywhere; the device comparisons skip without a CUDA device.
#include "kernels/cuda/sampling.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <span>
#include <vector>

#include "kernels/cuda/philox.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/sampling/philox.h"
#include "worker/sampling/sampling.h"

namespace tandem::kernels::cuda {
namespace {

using testing::ExpectInvalid;

constexpr float kInf = std::numeric_limits<float>::infinity();

TEST(PhiloxTest, MatchesWorkerSamplingBitForBit) {
  EXPECT_EQ(kRngSample, static_cast<uint32_t>(RngPurpose::kSample));
  EXPECT_EQ(kRngAccept, static_cast<uint32_t>(RngPurpose::kAccept));
  EXPECT_EQ(kRngResample, static_cast<uint32_t>(RngPurpose::kResample));
  std::mt19937_64 rng(12345);
  for (int i = 0; i < 2000; ++i) {
    const uint64_t seed = rng(), position = i < 1000 ? i : rng();
    const auto purpose = static_cast<uint32_t>(rng() % 5);
    const auto stream = static_cast<uint32_t>(rng() % 3);
    const PhiloxCounter counter = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng()),
                                   static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    const PhiloxKey key = {static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng())};
    const PhiloxCounter want = tandem::Philox4x32_10(counter, key);
    const Philox4 got =
        Philox4x32_10(Philox4{{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]);
    for (int w = 0; w < 4; ++w) ASSERT_EQ(got.v[w], want[w]) << "draw " << i << " word " << w;
    ASSERT_EQ(UniformRandom(seed, position, purpose, stream),
              tandem::UniformRandom(seed, position, static_cast<RngPurpose>(purpose), stream))
        << "draw " << i;
  }
}

TEST(SamplingCheckTest, ValidatesFields) {
  std::vector<float> logits(2 * 10), workspace(2 * 10);
  std::vector<SamplingRow> rows(2);
  std::vector<int32_t> tokens(2);
  SamplingParams p;
  p.logits = logits.data();
  p.logits_stride = 10;
  p.rows_params = rows.data();
  p.tokens = tokens.data();
  p.rows = 2;
  p.vocab = 10;
  p.workspace = workspace.data();
  p.workspace_bytes = WorkspaceBytes(p);
  EXPECT_EQ(p.workspace_bytes, 2 * 10 * sizeof(float));
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  SamplingParams q = p;
  q.vocab = 0;
  ExpectInvalid(q, "vocab");
  q = p;
  q.logits_stride = 9;
  ExpectInvalid(q, "logits_stride");
  q = p;
  q.workspace_bytes = 4;
  ExpectInvalid(q, "workspace");
  q = p;
  q.tokens = nullptr;
  ExpectInvalid(q, "tokens");
  q = p;
  q.rows_params = nullptr;
  ExpectInvalid(q, "rows_params");
  q = SamplingParams{};
  q.vocab = 10;
  q.logits_stride = 10;
  EXPECT_TRUE(q.Check().ok()) << q.Check();
}

TEST(SamplingCheckTest, WorkspaceRowsSizeTheWorkspace) {
  SamplingParams p;
  p.rows = 5;
  p.vocab = 10;
  p.logits_stride = 10;
  EXPECT_EQ(WorkspaceBytes(p), 5 * 10 * sizeof(float));
  p.workspace_rows = 2;  // two sampled rows, the rest greedy
  EXPECT_EQ(WorkspaceBytes(p), 2 * 10 * sizeof(float));
  p.workspace_rows = 0;  // all greedy: no workspace at all
  EXPECT_EQ(WorkspaceBytes(p), 0u);
  std::vector<float> logits(5 * 10);
  std::vector<SamplingRow> rows(5);
  std::vector<int32_t> tokens(5);
  p.logits = logits.data();
  p.rows_params = rows.data();
  p.tokens = tokens.data();
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  p.workspace_rows = 1;
  ExpectInvalid(p, "workspace");
}

// Runs the op on `logits` ([rows, vocab]) with per-row settings; returns the tokens.
// `workspace_rows` as SamplingParams::workspace_rows.
std::vector<int32_t> RunOp(const std::vector<float>& logits, const std::vector<SamplingRow>& rows,
                           int vocab, int workspace_rows = -1) {
  const int n = static_cast<int>(rows.size());
  auto d_logits = testing::Upload(logits);
  auto d_rows = testing::Upload(rows);
  auto d_tokens = testing::Upload(std::vector<int32_t>(n, -7));
  EXPECT_TRUE(d_logits.ok() && d_rows.ok() && d_tokens.ok());
  SamplingParams p;
  p.logits = d_logits->get();
  p.logits_stride = vocab;
  p.rows_params = d_rows->get();
  p.tokens = d_tokens->get();
  p.rows = n;
  p.vocab = vocab;
  p.workspace_rows = workspace_rows;
  p.workspace_bytes = WorkspaceBytes(p);
  auto d_workspace = testing::Allocate(p.workspace_bytes);
  EXPECT_TRUE(d_workspace.ok());
  p.workspace = d_workspace->get();
  const absl::Status status = Invoke(p, nullptr);
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto got = testing::Download(p.tokens, n);
  EXPECT_TRUE(got.ok());
  return *got;
}

tandem::SamplingParams CpuParams(const SamplingRow& r) {
  tandem::SamplingParams s;
  s.temperature = r.temperature;
  s.top_k = r.top_k;
  s.top_p = r.top_p;
  s.min_p = r.min_p;
  s.seed = r.seed;
  return s;
}

// Whether GPU token `got` differing from CPU token `want` is explained by rounding: u * total
// lies within `tolerance` of the CPU cumulative mass at the boundary between the two tokens and
// the tokens strictly between them carry (almost) no mass.
bool NearBoundary(std::span<const float> logits, const SamplingRow& r, int32_t got, int32_t want) {
  if (got < 0 || want < 0) return false;
  std::vector<float> probs;
  tandem::SamplingDistribution(logits, CpuParams(r), &probs);
  double total = 0.0;
  for (float p : probs) total += p;
  const double target =
      tandem::UniformRandom(r.seed, r.position, static_cast<RngPurpose>(r.purpose), r.stream) *
      total;
  const int lo = std::min(got, want), hi = std::max(got, want);
  double through_lo = 0.0, between = 0.0;
  for (int i = 0; i <= lo; ++i) through_lo += probs[i];
  for (int i = lo + 1; i < hi; ++i) between += probs[i];
  constexpr double kTolerance = 1e-5;
  return std::fabs(target - through_lo) <= kTolerance * total && between <= kTolerance * total;
}

class SamplingCudaTest : public testing::CudaTest {};

TEST_F(SamplingCudaTest, ArgmaxIsExact) {
  const int vocab = 5000;
  std::vector<float> logits;
  std::vector<SamplingRow> rows;
  std::normal_distribution<float> dist(0, 3);
  for (int r = 0; r < 12; ++r) {
    std::vector<float> row(vocab);
    for (float& x : row) x = dist(rng_);
    if (r == 1) row[17] = row[4000] = 100.0f;            // tie: lowest index wins
    if (r == 2) row.assign(vocab, -kInf);                // nothing finite: 0
    if (r == 3) row[3] = std::nanf(""), row[9] = 50.0f;  // NaN skipped
    if (r == 4) row[2500] = kInf;
    if (r == 5) row.assign(vocab, std::nanf(""));
    logits.insert(logits.end(), row.begin(), row.end());
    SamplingRow s;
    s.temperature = r % 2 == 0 ? 0.0f : -1.0f;
    rows.push_back(s);
  }
  const std::vector<int32_t> got = RunOp(logits, rows, vocab);
  for (int r = 0; r < 12; ++r) {
    EXPECT_EQ(got[r], tandem::Argmax(std::span<const float>(logits).subspan(r * vocab, vocab)))
        << "row " << r;
  }
}

TEST_F(SamplingCudaTest, SampledTokensMatchCpuUpToRounding) {
  const int vocab = 32000;
  struct Setting {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
  };
  const Setting settings[] = {{1.0f, 0, 1.0f, 0.0f},  {0.7f, 50, 1.0f, 0.0f},
                              {1.0f, 0, 0.9f, 0.0f},  {0.8f, 40, 0.95f, 0.0f},
                              {1.3f, 0, 1.0f, 0.05f}, {0.6f, 1, 1.0f, 0.0f},
                              {1.0f, 0, 0.0f, 0.0f},  {2.0f, 20000, 0.5f, 0.01f}};
  std::vector<float> logits;
  std::vector<SamplingRow> rows;
  std::normal_distribution<float> dist(0, 2.5f);
  std::uniform_int_distribution<uint64_t> seeds;
  for (int repeat = 0; repeat < 8; ++repeat) {
    for (const Setting& s : settings) {
      std::vector<float> row(vocab);
      for (float& x : row) x = dist(rng_);
      // A few exact ties and a -inf (masked) token.
      row[10] = row[20];
      row[30] = -kInf;
      logits.insert(logits.end(), row.begin(), row.end());
      SamplingRow r;
      r.temperature = s.temperature;
      r.top_k = s.top_k;
      r.top_p = s.top_p;
      r.min_p = s.min_p;
      r.seed = seeds(rng_);
      r.position = static_cast<uint64_t>(rows.size()) * 1000 + 7;
      r.purpose = kRngSample;
      rows.push_back(r);
    }
  }
  const std::vector<int32_t> got = RunOp(logits, rows, vocab);
  int exact = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const std::span<const float> row = std::span<const float>(logits).subspan(i * vocab, vocab);
    const int32_t want = tandem::SampleToken(row, CpuParams(rows[i]), rows[i].position);
    if (got[i] == want) {
      ++exact;
      continue;
    }
    EXPECT_TRUE(NearBoundary(row, rows[i], got[i], want))
        << "row " << i << " got " << got[i] << " want " << want << " (temperature "
        << rows[i].temperature << " top_k " << rows[i].top_k << " top_p " << rows[i].top_p
        << " min_p " << rows[i].min_p << ")";
  }
  RecordProperty("exact_matches", exact);
}

// A workspace row per sampled row only (greedy rows need none) gives the tokens of the full
// [rows, vocab] workspace; a sampled row without a workspace row of its own gets -1.
TEST_F(SamplingCudaTest, CompactWorkspaceGivesTheSameTokens) {
  const int vocab = 5003;
  std::normal_distribution<float> dist(0, 2.0f);
  std::vector<float> logits;
  std::vector<SamplingRow> rows;
  int sampled = 0;
  for (int i = 0; i < 24; ++i) {
    for (int v = 0; v < vocab; ++v) logits.push_back(dist(rng_));
    SamplingRow r;
    r.seed = 100 + i;
    r.position = 10 * i;
    if (i % 3 != 0) {  // two of three rows sampled, in between greedy ones
      r.temperature = 0.9f;
      r.top_k = i % 2 == 0 ? 50 : 0;
      r.workspace_row = sampled++;
    }
    rows.push_back(r);
  }
  std::vector<SamplingRow> own = rows;
  for (SamplingRow& r : own) r.workspace_row = -1;
  const std::vector<int32_t> full = RunOp(logits, own, vocab);
  EXPECT_EQ(RunOp(logits, rows, vocab, sampled), full);
  // Too few workspace rows: the sampled rows beyond them fail visibly, the others are intact.
  const std::vector<int32_t> short_of = RunOp(logits, rows, vocab, sampled - 1);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (rows[i].workspace_row == sampled - 1) {
      EXPECT_EQ(short_of[i], -1) << i;
    } else {
      EXPECT_EQ(short_of[i], full[i]) << i;
    }
  }
}

TEST_F(SamplingCudaTest, FrequenciesFollowTheDistribution) {
  // One small distribution drawn at 20000 positions: each token's count within 5 sigma.
  const int vocab = 6, draws = 20000;
  const std::vector<float> base = {1.0f, 0.0f, -1.0f, 2.0f, -kInf, 0.5f};
  std::vector<float> logits;
  std::vector<SamplingRow> rows(draws);
  for (int i = 0; i < draws; ++i) {
    logits.insert(logits.end(), base.begin(), base.end());
    rows[i].temperature = 1.0f;
    rows[i].seed = 99;
    rows[i].position = i;
  }
  const std::vector<int32_t> got = RunOp(logits, rows, vocab);
  std::vector<float> probs;
  tandem::SamplingDistribution(base, CpuParams(rows[0]), &probs);
  std::vector<int> counts(vocab);
  for (int32_t t : got) {
    ASSERT_TRUE(t >= 0 && t < vocab) << t;
    ++counts[t];
  }
  EXPECT_EQ(counts[4], 0);  // -inf never drawn
  for (int t = 0; t < vocab; ++t) {
    const double expected = probs[t] * draws;
    const double sigma = std::sqrt(draws * probs[t] * (1 - probs[t])) + 1e-9;
    EXPECT_LE(std::fabs(counts[t] - expected), 5 * sigma + 1) << "token " << t;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
