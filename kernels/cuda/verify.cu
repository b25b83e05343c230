#include <algorithm>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling_internal.cuh"
#include "kernels/cuda/verify.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::kSamplingThreads;
using internal::SamplingShared;

constexpr int kRunThreads = 128;

__global__ void __launch_bounds__(kSamplingThreads)
    VerifyKernel(const float* logits, int logits_stride, const VerifyRow* rows_params,
                 int32_t* tokens, uint8_t* accepted, int vocab, float* workspace,
                 int workspace_rows) {
  __shared__ SamplingShared shared;
  const int row = blockIdx.x;
  const float* l = logits + static_cast<size_t>(row) * logits_stride;
  const VerifyRow v = rows_params[row];
  const SamplingRow& r = v.sampling;
  const bool is_draft = v.draft >= 0 && v.draft < vocab;
  float max_logit;
  const int best = internal::RowArgmax(l, vocab, shared, &max_logit);
  if (r.temperature <= 0.0f || !(max_logit > -INFINITY)) {
    // Greedy (or no finite maximum: point mass at Argmax, which accepts only Argmax itself).
    if (threadIdx.x == 0) {
      tokens[row] = best;
      accepted[row] = is_draft ? best == v.draft : 1;
    }
    return;
  }
  const int slot = internal::WorkspaceSlot(r, row, workspace_rows);
  if (slot < 0) {
    if (threadIdx.x == 0) {
      tokens[row] = -1;
      accepted[row] = 0;
    }
    return;
  }
  float* probs = workspace + static_cast<size_t>(slot) * vocab;
  internal::RowDistribution(l, vocab, r, max_logit, probs, shared);
  if (!is_draft) {
    const int token = internal::InverseCdf(
        probs, vocab, UniformRandom(r.seed, r.position, r.purpose, r.stream), shared);
    if (threadIdx.x == 0) {
      tokens[row] = token;
      accepted[row] = 1;
    }
    return;
  }
  const double total = internal::UsableSum(probs, vocab, shared);
  const double p_draft = total > 0.0 ? probs[v.draft] / total : 0.0;
  const bool accept = UniformRandom(r.seed, r.position, kRngAccept, r.stream) < p_draft;
  if (accept) {
    if (threadIdx.x == 0) {
      tokens[row] = v.draft;
      accepted[row] = 1;
    }
    return;
  }
  __syncthreads();  // every thread has read probs[draft]
  if (threadIdx.x == 0) probs[v.draft] = 0.0f;
  __syncthreads();
  const int token = internal::InverseCdf(
      probs, vocab, UniformRandom(r.seed, r.position, kRngResample, r.stream), shared);
  if (threadIdx.x == 0) {
    tokens[row] = token >= 0 ? token : v.draft;
    accepted[row] = 0;
  }
}

// One thread per run: leading accepted draft rows.
__global__ void CountAcceptedKernel(const int32_t* run_offsets, const VerifyRow* rows_params,
                                    const uint8_t* accepted, int32_t* accepted_drafts, int runs) {
  const int run = blockIdx.x * blockDim.x + threadIdx.x;
  if (run >= runs) return;
  int count = 0;
  for (int row = run_offsets[run]; row < run_offsets[run + 1]; ++row) {
    if (rows_params[row].draft < 0 || !accepted[row]) break;
    ++count;
  }
  accepted_drafts[run] = count;
}

}  // namespace

absl::Status VerifyParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("VerifyParams.", parts...));
  };
  if (rows < 0) return bad("rows must be >= 0, got ", rows);
  if (vocab <= 0) return bad("vocab must be > 0, got ", vocab);
  if (logits_stride < vocab) return bad("logits_stride ", logits_stride, " is below vocab ", vocab);
  if (runs < 0) return bad("runs must be >= 0, got ", runs);
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return bad("workspace: ", needed, " bytes required, got ", workspace_bytes,
               workspace == nullptr ? " at null" : "");
  }
  if (runs > 0 && (run_offsets == nullptr || accepted_drafts == nullptr)) {
    return bad("run_offsets and accepted_drafts are required when runs > 0");
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr) return bad("logits is null");
  if (rows_params == nullptr) return bad("rows_params is null");
  if (tokens == nullptr) return bad("tokens is null");
  if (accepted == nullptr) return bad("accepted is null");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const VerifyParams& params) {
  if (params.rows <= 0 || params.vocab <= 0) return 0;
  const int rows = params.workspace_rows < 0 ? params.rows : params.workspace_rows;
  return static_cast<size_t>(rows) * params.vocab * sizeof(float);
}

absl::Status Invoke(const VerifyParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.rows > 0) {
    VerifyKernel<<<params.rows, kSamplingThreads, 0, stream>>>(
        params.logits, params.logits_stride, params.rows_params, params.tokens, params.accepted,
        params.vocab, static_cast<float*>(params.workspace),
        params.workspace_rows < 0 ? params.rows : params.workspace_rows);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (params.runs > 0) {
    CountAcceptedKernel<<<(params.runs + kRunThreads - 1) / kRunThreads, kRunThreads, 0, stream>>>(
        params.run_offsets, params.rows_params, params.accepted, params.accepted_drafts,
        params.runs);
    TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
