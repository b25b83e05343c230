// LoRA delta with a per-token gate, as worker/model/transformer.cc ApplyLora:
//   y[t, 0:out_dim] += gate[t] ? scale * B · (A · x[t]) : 0
// A: [rank, in_dim], B: [out_dim, rank] (Hugging Face lora_A / lora_B layouts). bf16 x, A, B and
// y; the low-rank product A·x stays fp32 in the workspace, the delta is added to y in fp32 and
// rounded once. Ungated rows are left bit for bit unchanged.
//
// Two simple kernels (rank is small, 8-64): one CTA per token computes A·x (a warp per rank
// row), then one CTA per token adds B·(A·x) to the row's y columns. A gated batch dominated by
// many tokens would rather use two GemmParams products; this op serves decode-sized batches.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

struct LoraParams {
  const __nv_bfloat16* x = nullptr;  // [tokens, in_dim], row stride x_stride
  int x_stride = 0;
  const __nv_bfloat16* a = nullptr;  // [rank, in_dim]
  const __nv_bfloat16* b = nullptr;  // [out_dim, rank]
  const uint8_t* gate = nullptr;     // [tokens] device; nonzero = adapter on
  float scale = 1.0f;                // alpha / rank
  __nv_bfloat16* y = nullptr;        // [tokens, out_dim] columns of a row of stride y_stride
  int y_stride = 0;
  int tokens = 0;  // 0 is a valid no-op
  int in_dim = 0;
  int out_dim = 0;
  int rank = 0;               // 1 .. 256
  void* workspace = nullptr;  // [tokens, rank] floats
  size_t workspace_bytes = 0;

  // INVALID_ARGUMENT naming the bad field; host only.
  absl::Status Check() const;
};

size_t WorkspaceBytes(const LoraParams& params);

absl::Status Invoke(const LoraParams& params, cudaStream_t stream);

}  // namespace tandem::kernels::cuda
