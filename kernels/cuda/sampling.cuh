// Logits processing and token sampling over [rows, vocab] fp32 logits, one CTA per row, with
// the semantics of worker/sampling SampleToken:
//   greedy (temperature <= 0, or no finite maximum): Argmax, lowest index among ties, NaN as
//   -inf. Exact: the same token as the CPU for the same logits.
//   otherwise: z = (l - max) / T (in double, then float; +inf logits share the mass), top-k on z
//   (ties with the k-th value kept), weights exp(z), top-p (smallest prefix by decreasing
//   weight, lower index first among equal weights, whose mass reaches top_p), min-p,
//   renormalise, then an inverse-CDF draw in index order with u = UniformRandom(seed, position,
//   purpose) from the same Philox4x32-10 stream as the CPU (kernels/cuda/philox.cuh).
//
// Contract against the CPU sampler: same filters, same u, same inverse-CDF order; the sums run
// in a different order and expf may differ from the host's by an ulp, so a sampled token equals
// the CPU's except when u lands within float rounding (~1e-6 relative) of a CDF boundary or a
// filter threshold. Argmax is bit-exact.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// Per-row sampling settings (worker/sampling SamplingParams plus the draw's coordinates); an
// array of these lives in device memory.
struct SamplingRow {
  float temperature = 0.0f;  // <= 0: greedy
  int32_t top_k = 0;         // 0 = off
  float top_p = 1.0f;        // >= 1 = off
  float min_p = 0.0f;        // 0 = off
  uint64_t seed = 0;
  uint64_t position = 0;  // sequence index of the sampled token
  uint32_t purpose = 0;   // RngPurpose value (kRngSample for plain sampling)
  uint32_t stream = 0;
  // The workspace row a sampled (non-greedy) row keeps its weights in; < 0: its own row index.
  // Greedy rows use none. See SamplingParams::workspace_rows.
  int32_t workspace_row = -1;
};

struct SamplingParams {
  const float* logits = nullptr;             // [rows, vocab], row stride logits_stride
  int logits_stride = 0;                     // >= vocab
  const SamplingRow* rows_params = nullptr;  // [rows] device
  int32_t* tokens = nullptr;                 // [rows] output
  int rows = 0;                              // 0 is a valid no-op
  int vocab = 0;                             // > 0
  void* workspace = nullptr;                 // [workspace rows, vocab] floats of row weights
  size_t workspace_bytes = 0;
  // Vocabulary-sized workspace rows: < 0 = `rows` (row i uses row i). A caller that knows its
  // rows' settings sets the number of sampled rows instead (0 when all are greedy, which need
  // no workspace) and gives each sampled row a distinct workspace_row in [0, workspace_rows);
  // a sampled row whose workspace row falls outside gets token -1 rather than writing there.
  int workspace_rows = -1;

  // INVALID_ARGUMENT naming the bad field; host only (row settings are on the device: a
  // negative top_k counts as off, like 0).
  absl::Status Check() const;
};

// [workspace rows, vocab] floats: rows × vocab unless workspace_rows says fewer.
size_t WorkspaceBytes(const SamplingParams& params);

absl::Status Invoke(const SamplingParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
