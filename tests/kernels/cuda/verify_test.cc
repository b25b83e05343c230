// kernels/cuda fused draft verification against the rule of worker/decoding/verify.cc
// VerifyDraft, rebuilt here from worker/sampling's primitives (the decoding library itself
// would pull in the whole model stack): greedy rows exactly; sampled rows equal except where a
// draw lies within float rounding of its threshold. Parameter checks run everywhere; the device
// comparisons skip without a CUDA device.
#include "kernels/cuda/verify.cuh"

#include <gtest/gtest.h>

#include <cmath>
#include <span>
#include <vector>

#include "kernels/cuda/philox.cuh"
#include "tests/kernels/cuda/cuda_test_util.h"
#include "worker/sampling/sampling.h"

namespace tandem::kernels::cuda {
namespace {

using testing::ExpectInvalid;

TEST(VerifyCheckTest, ValidatesFields) {
  std::vector<float> logits(3 * 10), workspace(3 * 10);
  std::vector<VerifyRow> rows(3);
  std::vector<int32_t> tokens(3), offsets(2), counts(1);
  std::vector<uint8_t> accepted(3);
  VerifyParams p;
  p.logits = logits.data();
  p.logits_stride = 10;
  p.rows_params = rows.data();
  p.tokens = tokens.data();
  p.accepted = accepted.data();
  p.rows = 3;
  p.vocab = 10;
  p.run_offsets = offsets.data();
  p.accepted_drafts = counts.data();
  p.runs = 1;
  p.workspace = workspace.data();
  p.workspace_bytes = WorkspaceBytes(p);
  EXPECT_TRUE(p.Check().ok()) << p.Check();
  VerifyParams q = p;
  q.accepted = nullptr;
  ExpectInvalid(q, "accepted is null");
  q = p;
  q.run_offsets = nullptr;
  ExpectInvalid(q, "run_offsets");
  q = p;
  q.runs = -1;
  ExpectInvalid(q, "runs");
  q = p;
  q.workspace = nullptr;
  ExpectInvalid(q, "workspace");
  q = p;
  q.logits_stride = 5;
  ExpectInvalid(q, "logits_stride");
  // Only sampled rows need a vocabulary-sized workspace row; all-greedy rows none.
  q = p;
  q.workspace_rows = 1;
  EXPECT_EQ(WorkspaceBytes(q), 10 * sizeof(float));
  q.workspace_rows = 0;
  q.workspace = nullptr;
  q.workspace_bytes = 0;
  EXPECT_TRUE(q.Check().ok()) << q.Check();
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

struct CpuVerdict {
  int32_t token;
  bool accepted;
  double p_draft;  // for judging draws at the threshold
};

// worker/decoding/verify.cc VerifyDraft (draft >= 0) or SampleToken (draft < 0).
CpuVerdict CpuVerify(std::span<const float> logits, const VerifyRow& row) {
  const tandem::SamplingParams s = CpuParams(row.sampling);
  const uint64_t index = row.sampling.position;
  if (row.draft < 0) return {tandem::SampleToken(logits, s, index), true, 0.0};
  if (s.greedy()) {
    const int32_t best = tandem::Argmax(logits);
    return {best, best == row.draft, 0.0};
  }
  std::vector<float> probs;
  tandem::SamplingDistribution(logits, s, &probs);
  double total = 0;
  for (float p : probs) total += p;
  const double p_draft = total > 0 ? probs[row.draft] / total : 0.0;
  if (tandem::UniformRandom(s.seed, index, RngPurpose::kAccept) < p_draft) {
    return {row.draft, true, p_draft};
  }
  probs[row.draft] = 0.0f;
  const int32_t token = tandem::SampleFromDistribution(
      probs, tandem::UniformRandom(s.seed, index, RngPurpose::kResample));
  return {token >= 0 ? token : row.draft, false, p_draft};
}

class VerifyCudaTest : public testing::CudaTest {};

TEST_F(VerifyCudaTest, MatchesCpuVerification) {
  const int vocab = 4096;
  // Runs of drafts followed by a bonus row; greedy and sampled settings.
  const int run_lengths[] = {4, 1, 6, 3, 5, 2};
  std::vector<float> logits;
  std::vector<VerifyRow> rows;
  std::vector<int32_t> offsets = {0};
  std::normal_distribution<float> dist(0, 2.0f);
  std::uniform_int_distribution<int32_t> any_token(0, vocab - 1);
  std::uniform_int_distribution<uint64_t> seeds;
  for (size_t run = 0; run < std::size(run_lengths); ++run) {
    const bool greedy = run % 2 == 0;
    const uint64_t seed = seeds(rng_);
    for (int j = 0; j <= run_lengths[run]; ++j) {
      std::vector<float> row(vocab);
      for (float& x : row) x = dist(rng_);
      const int32_t best = tandem::Argmax(row);
      row[best] += 4.0f;  // a confident target, so drafts of the argmax are often accepted
      logits.insert(logits.end(), row.begin(), row.end());
      VerifyRow v;
      v.sampling.temperature = greedy ? 0.0f : 0.9f;
      v.sampling.top_k = run == 3 ? 64 : 0;
      v.sampling.top_p = run == 5 ? 0.9f : 1.0f;
      v.sampling.seed = seed;
      v.sampling.position = 100 + j;
      const bool bonus = j == run_lengths[run];
      v.draft = bonus ? -1 : (j % 3 == 2 ? any_token(rng_) : best);
      rows.push_back(v);
    }
    offsets.push_back(static_cast<int32_t>(rows.size()));
  }
  const int n = static_cast<int>(rows.size());
  const int runs = static_cast<int>(offsets.size()) - 1;
  auto d_logits = testing::Upload(logits);
  auto d_rows = testing::Upload(rows);
  auto d_offsets = testing::Upload(offsets);
  auto d_tokens = testing::Upload(std::vector<int32_t>(n, -7));
  auto d_accepted = testing::Upload(std::vector<uint8_t>(n, 7));
  auto d_counts = testing::Upload(std::vector<int32_t>(runs, -7));
  ASSERT_TRUE(d_logits.ok() && d_rows.ok() && d_offsets.ok() && d_tokens.ok() && d_accepted.ok() &&
              d_counts.ok());
  VerifyParams p;
  p.logits = d_logits->get();
  p.logits_stride = vocab;
  p.rows_params = d_rows->get();
  p.tokens = d_tokens->get();
  p.accepted = d_accepted->get();
  p.rows = n;
  p.vocab = vocab;
  p.run_offsets = d_offsets->get();
  p.accepted_drafts = d_counts->get();
  p.runs = runs;
  p.workspace_bytes = WorkspaceBytes(p);
  auto d_workspace = testing::Allocate(p.workspace_bytes);
  ASSERT_TRUE(d_workspace.ok());
  p.workspace = d_workspace->get();
  ASSERT_TRUE(Invoke(p, nullptr).ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  auto tokens = testing::Download(p.tokens, n);
  auto accepted = testing::Download(p.accepted, n);
  auto counts = testing::Download(p.accepted_drafts, runs);
  ASSERT_TRUE(tokens.ok() && accepted.ok() && counts.ok());

  for (int run = 0; run < runs; ++run) {
    int want_count = 0;
    bool leading = true;
    for (int i = offsets[run]; i < offsets[run + 1]; ++i) {
      SCOPED_TRACE(absl::StrCat("run ", run, " row ", i));
      const std::span<const float> row = std::span<const float>(logits).subspan(i * vocab, vocab);
      const CpuVerdict want = CpuVerify(row, rows[i]);
      const bool greedy = rows[i].sampling.temperature <= 0.0f;
      const double u_accept =
          UniformRandom(rows[i].sampling.seed, rows[i].sampling.position, kRngAccept);
      // A sampled accept decision may only differ when u is at the threshold p(draft).
      const bool decision_at_threshold = !greedy && std::fabs(u_accept - want.p_draft) < 1e-5;
      if (!decision_at_threshold) {
        EXPECT_EQ((*accepted)[i], want.accepted ? 1 : 0);
        // Greedy rows are exact. A sampled resample could in principle differ when its draw
        // lies within ~1e-6 of a CDF boundary (probability ~1e-5 per row); not expected here.
        EXPECT_EQ((*tokens)[i], want.token);
      }
      if (rows[i].draft >= 0 && leading && (*accepted)[i]) {
        ++want_count;
      } else {
        leading = false;
      }
    }
    EXPECT_EQ((*counts)[run], want_count) << "run " << run;
  }
}

}  // namespace
}  // namespace tandem::kernels::cuda
