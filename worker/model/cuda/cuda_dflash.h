// The CUDA backend of DFlashModel (DFlashModel::UseDevice({Device::kCuda})): the same context
// and block forward as worker/model/dflash.cc, run with the kernels/cuda ops in bf16 with fp32
// accumulation.
//
//   - Weights: the drafter's fp32 host weights rounded to bf16 and uploaded once (fc, norms,
//     fused q/k/v and gate/up). The target's embeddings and LM head: the target's own device
//     copies when it runs on CUDA (CudaTransformer::device_embed / device_head), else uploaded
//     here.
//   - Context storage (CudaDFlashContext): per context, keys and values [layers, capacity,
//     kv_heads * head_dim] bf16 on the GPU, capacity >= length + block_size, doubled (rows
//     copied) when an append needs more. Rows [length, length + block_size) are the block's
//     scratch: a block writes its own K/V there so the paged attention op reads context and block
//     through one single-block table.
//   - Append: the taps [k, n, hidden] (uploaded as bf16 from the host, or the caller's device
//     rows) are interleaved into [n, k * hidden] by strided copies, fc, hidden_norm, then per
//     layer the k and v products written straight into the context rows, k_norm and RoPE on the
//     keys in place.
//   - Block: embedding gather of the block's tokens, per layer q/k/v products (k/v into the
//     scratch rows), q/k norms, RoPE, paged attention with full visibility over context and
//     block, o, residual add fused with RMSNorm, gate/up, SwiGLU, down, residual add fused with
//     the next norm (the last with the final norm), fp32 logits through the LM head. Draft takes
//     the argmax of the draft slots on the GPU (kernels/cuda sampling, greedy) and downloads the
//     token ids only; BlockLogits downloads the logits.
//
// Numerics: bf16 weights, activations, context K/V and residual stream; fp32 accumulation,
// softmax and logits. Results match the CPU within bf16 rounding, not bit for bit.
//
// Thread-safety: every call takes the backend's lock (one stream, one set of buffers).
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/sampling.cuh"
#include "worker/model/cuda/device_array.h"
#include "worker/model/dflash_backend.h"

namespace tandem {

class DFlashModel;

// A context's rows on the GPU (made by CudaDFlash::NewStorage).
class CudaDFlashContext final : public DFlashContextStorage {
 public:
  explicit CudaDFlashContext(uint64_t owner) : owner_(owner) {}
  uint64_t owner() const { return owner_; }
  int capacity() const { return capacity_; }

 private:
  friend class CudaDFlash;
  uint64_t owner_;
  int capacity_ = 0;                                        // rows per layer
  cuda_backend::DeviceArray<__nv_bfloat16> keys_, values_;  // [layers, capacity, kv_row]
};

class CudaDFlash final : public DFlashBackend {
 public:
  // Uploads `model`'s weights; `model` (and its target) must outlive the backend.
  static absl::StatusOr<std::unique_ptr<CudaDFlash>> Create(const DFlashModel* model);
  ~CudaDFlash() override;

  absl::StatusOr<std::unique_ptr<DFlashContextStorage>> NewStorage() override;
  bool Owns(const DFlashContextStorage& storage) const override;
  absl::Status AppendHost(DFlashContextStorage& storage, int length, std::span<const float> hidden,
                          int n) override;
  absl::Status AppendDevice(DFlashContextStorage& storage, int length, const void* rows, int n,
                            CUstream_st* stream) override;
  absl::StatusOr<std::vector<float>> BlockLogits(const DFlashContextStorage* storage, int length,
                                                 std::span<const int32_t> block) override;
  absl::StatusOr<std::vector<int32_t>> Draft(const DFlashContextStorage* storage, int length,
                                             std::span<const int32_t> block, int first) override;
  absl::Status Read(const DFlashContextStorage& storage, int length,
                    std::vector<std::vector<float>>& keys,
                    std::vector<std::vector<float>>& values) override;

  // Whether the embeddings and head are the target's device copies.
  bool shares_target_weights() const { return embed_ptr_ != embed_.get(); }

 private:
  using Bf16 = __nv_bfloat16;

  struct DeviceLayer {
    cuda_backend::DeviceArray<Bf16> input_norm, qkv, q_norm, k_norm, o, post_norm, gate_up, down;
  };

  explicit CudaDFlash(const DFlashModel* model);
  absl::Status Init();
  // Grows `ctx` to hold `rows` rows per layer, keeping rows [0, keep).
  absl::Status Grow(CudaDFlashContext& ctx, int rows, int keep);
  // Sizes the append buffers for `n` tokens.
  absl::Status ReserveAppend(int n);
  // Enqueues the context rows of `n` tokens at [length, length + n) from the bf16 taps in
  // rows_ ([k, n, hidden]).
  absl::Status EnqueueAppend(CudaDFlashContext& ctx, int length, const Bf16* rows, int n);
  // Enqueues the block forward; the fp32 logits land in logits_.
  absl::Status EnqueueBlock(const DFlashContextStorage* storage, int length,
                            std::span<const int32_t> block);
  absl::Status Gemm(const Bf16* x, int ldx, const Bf16* w, void* y, int ldy, bool fp32_out, int m,
                    int n, int k);
  absl::Status Norm(const Bf16* x, Bf16* residual, const Bf16* weight, Bf16* y, int rows, int dim);

  const DFlashModel* model_;
  const uint64_t id_;
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  cudaEvent_t event_ = nullptr;  // orders the backend's stream against a caller's

  cuda_backend::DeviceArray<Bf16> fc_, hidden_norm_, final_norm_, embed_, head_;
  const Bf16* embed_ptr_ = nullptr;  // embed_, or the target's device table
  const Bf16* head_ptr_ = nullptr;   // head_ / embed_ when tied, or the target's device head
  std::vector<DeviceLayer> layers_;
  cuda_backend::DeviceArray<float> inv_freq_;
  float rope_scaling_ = 1.0f;

  // Append buffers ([n, ...]) and block buffers ([block_size, ...]).
  int append_capacity_ = 0;
  cuda_backend::DeviceArray<Bf16> rows_, fused_, ctx_;
  cuda_backend::DeviceArray<int32_t> positions_, ids_, block_table_, tokens_;
  cuda_backend::DeviceArray<kernels::cuda::AttentionExtend> extend_;
  cuda_backend::DeviceArray<kernels::cuda::SamplingRow> greedy_;
  cuda_backend::DeviceArray<Bf16> x_, h_, q_, attn_, proj_, gate_up_, act_;
  cuda_backend::DeviceArray<float> logits_;
  cuda_backend::DeviceArray<char> workspace_;
  CudaDFlashContext empty_;  // the block scratch of a context with no storage yet
};

}  // namespace tandem
