#include "absl/strings/str_cat.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/sampling.cuh"
#include "kernels/cuda/sampling_internal.cuh"

namespace tandem::kernels::cuda {
namespace {

using internal::kSamplingThreads;
using internal::SamplingShared;

// One CTA per row: worker/sampling SampleToken.
__global__ void __launch_bounds__(kSamplingThreads)
    SampleKernel(const float* logits, int logits_stride, const SamplingRow* rows_params,
                 int32_t* tokens, int vocab, float* workspace, int workspace_rows) {
  __shared__ SamplingShared shared;
  const int row = blockIdx.x;
  const float* l = logits + static_cast<size_t>(row) * logits_stride;
  const SamplingRow r = rows_params[row];
  float max_logit;
  const int best = internal::RowArgmax(l, vocab, shared, &max_logit);
  if (r.temperature <= 0.0f || !(max_logit > -INFINITY)) {
    if (threadIdx.x == 0) tokens[row] = best;
    return;
  }
  const int slot = internal::WorkspaceSlot(r, row, workspace_rows);
  if (slot < 0) {
    if (threadIdx.x == 0) tokens[row] = -1;
    return;
  }
  float* probs = workspace + static_cast<size_t>(slot) * vocab;
  internal::RowDistribution(l, vocab, r, max_logit, probs, shared);
  const double u = UniformRandom(r.seed, r.position, r.purpose, r.stream);
  const int token = internal::InverseCdf(probs, vocab, u, shared);
  if (threadIdx.x == 0) tokens[row] = token;
}

}  // namespace

absl::Status SamplingParams::Check() const {
  auto bad = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("SamplingParams.", parts...));
  };
  if (rows < 0) return bad("rows must be >= 0, got ", rows);
  if (vocab <= 0) return bad("vocab must be > 0, got ", vocab);
  if (logits_stride < vocab) return bad("logits_stride ", logits_stride, " is below vocab ", vocab);
  const size_t needed = WorkspaceBytes(*this);
  if (workspace_bytes < needed || (needed > 0 && workspace == nullptr)) {
    return bad("workspace: ", needed, " bytes required, got ", workspace_bytes,
               workspace == nullptr ? " at null" : "");
  }
  if (rows == 0) return absl::OkStatus();
  if (logits == nullptr) return bad("logits is null");
  if (rows_params == nullptr) return bad("rows_params is null");
  if (tokens == nullptr) return bad("tokens is null");
  return absl::OkStatus();
}

size_t WorkspaceBytes(const SamplingParams& params) {
  if (params.rows <= 0 || params.vocab <= 0) return 0;
  const int rows = params.workspace_rows < 0 ? params.rows : params.workspace_rows;
  return static_cast<size_t>(rows) * params.vocab * sizeof(float);
}

absl::Status Invoke(const SamplingParams& params, cudaStream_t stream) {
  if (absl::Status status = params.Check(); !status.ok()) return status;
  if (params.rows == 0) return absl::OkStatus();
  SampleKernel<<<params.rows, kSamplingThreads, 0, stream>>>(
      params.logits, params.logits_stride, params.rows_params, params.tokens, params.vocab,
      static_cast<float*>(params.workspace),
      params.workspace_rows < 0 ? params.rows : params.workspace_rows);
  TANDEM_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace tandem::kernels::cuda
