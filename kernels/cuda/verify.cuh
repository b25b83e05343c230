// Fused speculative verification of draft runs (worker/sampling/sampling.h VerifyDraft, and
// worker/decoding/verify.h VerifyDraftRun) over [rows, vocab] fp32 target logits, one CTA per row:
//   draft >= 0: the row verifies a point-mass draft token. Greedy rows: accepted iff draft ==
//     Argmax, token = Argmax (exact). Sampled rows: p = the row's sampling distribution
//     (sampling.cuh), accepted iff UniformRandom(seed, position, kAccept) < p(draft) / sum(p);
//     token = draft if accepted, else an inverse-CDF draw (kResample) from p with the draft's
//     mass removed (the draft itself when nothing else has mass).
//   draft < 0: the row is a plain sample (the bonus token after a fully accepted run; drawn
//     with the row's purpose, kSample for a bonus row), accepted = 1.
// Rows verify independently; a run's rows are consecutive and run_offsets gives, per run, the
// number of leading accepted draft rows (the caller keeps those drafts, then appends the token
// of the first rejected row, or of the bonus row when all were accepted).
//
// Same contract against the CPU as sampling.cuh: greedy results are exact; sampled results use
// the same u and differ only when u falls within float rounding of a boundary.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "kernels/cuda/sampling.cuh"

namespace tandem::kernels::cuda {

struct VerifyRow {
  SamplingRow sampling;  // purpose: a plain sample's; draft rows use kAccept / kResample
  int32_t draft = -1;    // draft token in [0, vocab), or < 0 for a plain sample
};

struct VerifyParams {
  const float* logits = nullptr;           // [rows, vocab], row stride logits_stride
  int logits_stride = 0;                   // >= vocab
  const VerifyRow* rows_params = nullptr;  // [rows] device
  int32_t* tokens = nullptr;               // [rows] output: the row's token
  uint8_t* accepted = nullptr;             // [rows] output: 1 = draft accepted (or plain sample)
  int rows = 0;                            // 0 is a valid no-op
  int vocab = 0;                           // > 0
  // Optional: [runs + 1] device row offsets of consecutive runs (run r is rows
  // [run_offsets[r], run_offsets[r + 1])), and [runs] outputs: leading accepted draft rows.
  const int32_t* run_offsets = nullptr;
  int32_t* accepted_drafts = nullptr;
  int runs = 0;
  void* workspace = nullptr;  // [workspace rows, vocab] floats
  size_t workspace_bytes = 0;
  // As SamplingParams::workspace_rows: < 0 = `rows`; else the sampled rows' count, each with a
  // distinct sampling.workspace_row below it (greedy rows need none). A sampled row whose
  // workspace row falls outside gets token -1 and accepted 0.
  int workspace_rows = -1;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

// [workspace rows, vocab] floats: rows × vocab unless workspace_rows says fewer.
size_t WorkspaceBytes(const VerifyParams& params);

absl::Status Invoke(const VerifyParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
