// The CPU backend of Transformer: the fp32 forward over host KV storage with kernels/cpu, its
// products over the model's weights packed for the CPU (kernels/cpu/packed_gemm.h), the backend
// every model starts on (Transformer::UseDevice({Device::kCpu}) returns to it).
//
// One forward, per batch: lay the extends out as rows of one activation matrix (their RoPE
// tables and visibility masks), embed, then per layer the attention block (QKV projection with
// gated LoRA, q/k norms, RoPE, K/V written into the tentative slots, paged attention, output
// projection) and the MLP block (gate/up, SiLU·mul, down), each closed by the fused residual
// add and RMSNorm; finally the final norm and LM head over the output rows only, and the
// sample requests (SampleToken, or VerifyDraft for rows with a draft).
//
// Thread-safety: like Transformer::Forward, one caller at a time.
#pragma once

#include <span>
#include <vector>

#include "kernels/cpu/attention.h"
#include "worker/model/backend.h"
#include "worker/model/transformer.h"

namespace tandem {

class CpuTransformer final : public ModelBackend {
 public:
  // `model` outlives the backend (it owns it).
  explicit CpuTransformer(const Transformer* model);

  absl::StatusOr<std::vector<ExtendOutput>> Forward(std::span<const Extend> batch,
                                                    KvCache& kv) override;
  // Host storage is KvCache's default: no factory.
  KvStorageFactory StorageFactory() override { return nullptr; }
  bool OwnsStorage(const KvCache& kv) const override { return kv.host_storage() != nullptr; }
  // The forward reads the model's adapter each time.
  void LoraChanged() override {}
  // Attention's direct path and the few-rows products (kernels/cpu) are batch invariant.
  int ExactExtendTokens() const override;

 private:
  struct Layout;
  struct Activations;

  Layout LayOut(std::span<const Extend> batch, const KvCache& kv) const;
  void Embed(std::span<const Extend> batch, const Layout& layout, Activations& a) const;
  // Copies the residual stream into the outputs' hidden states of extends that tap `layer`.
  void Tap(int layer, std::span<const Extend> batch, const Layout& layout, const Activations& a,
           std::vector<ExtendOutput>& outputs) const;
  // a.h (the layer's normed input) → a.proj (the attention block's output projection).
  void AttentionBlock(int layer, std::span<const Extend> batch, const Layout& layout, KvCache& kv,
                      Activations& a) const;
  // Attention of every extend of the batch (their K/V rows already written) into a.attn.
  void Attend(std::span<const kernels::cpu::AttentionParams> params, Activations& a) const;
  // a.h (the post-attention normed stream) → a.proj (the MLP's down projection).
  void MlpBlock(int layer, const Layout& layout, Activations& a) const;
  // Final norm and LM head over the output rows, then the sample requests.
  void Head(std::span<const Extend> batch, const Layout& layout, const Activations& a,
            std::vector<ExtendOutput>& outputs) const;

  const Transformer* model_;
  std::vector<float> inv_freq_;  // RoPE [head_dim / 2]
  float rope_scaling_ = 1.0f;
};

}  // namespace tandem
