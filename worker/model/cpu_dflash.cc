#include "worker/model/cpu_dflash.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/rope.h"

namespace tandem {

namespace kc = kernels::cpu;

namespace {

int KvRow(const ModelConfig& c) { return c.num_kv_heads * c.head_dim; }

}  // namespace

CpuDFlash::CpuDFlash(const DFlashModel* model)
    : model_(model), rope_(ComputeRope(model->config().model)) {}

absl::StatusOr<std::unique_ptr<DFlashContextStorage>> CpuDFlash::NewStorage() {
  const ModelConfig& c = model_->config().model;
  return std::make_unique<CpuDFlashContext>(c.num_layers, KvRow(c));
}

bool CpuDFlash::Owns(const DFlashContextStorage& storage) const {
  const auto* ctx = dynamic_cast<const CpuDFlashContext*>(&storage);
  const ModelConfig& c = model_->config().model;
  return ctx != nullptr && ctx->keys.size() == static_cast<size_t>(c.num_layers) &&
         ctx->kv_row == KvRow(c);
}

absl::Status CpuDFlash::AppendHost(DFlashContextStorage& storage, int length,
                                   std::span<const float> hidden, int n) {
  auto& ctx = static_cast<CpuDFlashContext&>(storage);
  const DFlashConfig& config = model_->config();
  const DFlashWeights& weights = model_->weights();
  const ModelConfig& c = config.model;
  const int h = c.hidden_size, d = c.head_dim, hkv = c.num_kv_heads, hq = c.num_heads;
  const int k = static_cast<int>(config.target_layer_ids.size());
  // [n, k * h]: token t's taps side by side, in target_layer_ids order.
  std::vector<float> fused(static_cast<size_t>(n) * k * h);
  for (int t = 0; t < n; ++t) {
    for (int l = 0; l < k; ++l) {
      std::memcpy(&fused[(static_cast<size_t>(t) * k + l) * h],
                  &hidden[(static_cast<size_t>(l) * n + t) * h], sizeof(float) * h);
    }
  }
  std::vector<float> ctx_rows(static_cast<size_t>(n) * h);  // c_t: [n, h]
  kc::PackedLinear(fused.data(), weights.packed_fc, nullptr, ctx_rows.data(), n);
  kc::RmsNorm(ctx_rows.data(), weights.hidden_norm.data(), ctx_rows.data(), n, h, c.rms_norm_eps);

  const int kv_row = hkv * d, kv_width = 2 * kv_row;
  std::vector<float> kv(static_cast<size_t>(n) * kv_width);  // [n, k heads | v heads]
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = length + t;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights.layers[layer];
    // The k and v rows of the fused qkv weight.
    kc::PackedProduct product;
    product.x = ctx_rows.data();
    product.m = n;
    product.w = &weights.packed_layers[layer].qkv;
    product.row_begin = hq * d;
    product.row_end = hq * d + kv_width;
    product.y = kv.data();
    kc::InvokePacked(product);
    for (int t = 0; t < n; ++t) {
      float* row = &kv[static_cast<size_t>(t) * kv_width];
      kc::RmsNorm(row, w.k_norm.data(), row, hkv, d, c.rms_norm_eps);
    }
    kc::RopeParams rp;
    rp.x = kv.data();
    rp.positions = positions.data();
    rp.inv_freq = rope_.inv_freq.data();
    rp.attention_scaling = rope_.attention_scaling;
    rp.tokens = n;
    rp.heads = hkv;
    rp.head_dim = d;
    rp.row_stride = kv_width;
    kc::RopeInvoke(rp);
    std::vector<float>& keys = ctx.keys[layer];
    std::vector<float>& values = ctx.values[layer];
    keys.resize(static_cast<size_t>(length + n) * kv_row);
    values.resize(static_cast<size_t>(length + n) * kv_row);
    for (int t = 0; t < n; ++t) {
      const float* row = &kv[static_cast<size_t>(t) * kv_width];
      const size_t at = static_cast<size_t>(length + t) * kv_row;
      std::memcpy(&keys[at], row, sizeof(float) * kv_row);
      std::memcpy(&values[at], row + kv_row, sizeof(float) * kv_row);
    }
  }
  return absl::OkStatus();
}

absl::Status CpuDFlash::AppendDevice(DFlashContextStorage&, int, const void*, int, CUstream_st*) {
  return absl::FailedPreconditionError(
      "DFlash context: device rows need the model on cuda (DFlashModel::UseDevice); it runs on "
      "the cpu");
}

absl::StatusOr<std::vector<float>> CpuDFlash::BlockLogits(const DFlashContextStorage* storage,
                                                          int length,
                                                          std::span<const int32_t> block) {
  const auto* ctx = static_cast<const CpuDFlashContext*>(storage);
  const DFlashConfig& config = model_->config();
  const DFlashWeights& weights = model_->weights();
  const ModelConfig& c = config.model;
  const int h = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int b = config.block_size, inter = c.intermediate_size, vocab = c.vocab_size;
  const int p = length;
  const ModelWeights& target = model_->target().weights();
  std::vector<float> x(static_cast<size_t>(b) * h);  // residual stream [b, h]
  for (int j = 0; j < b; ++j) target.EmbedRow(block[j], &x[static_cast<size_t>(j) * h]);
  std::vector<int32_t> positions(b);
  for (int j = 0; j < b; ++j) positions[j] = p + j;
  const int qkv_width = (hq + 2 * hkv) * d, kv_row = hkv * d;
  std::vector<float> hbuf(static_cast<size_t>(b) * h), qkv(static_cast<size_t>(b) * qkv_width);
  std::vector<float> attn(static_cast<size_t>(b) * hq * d), proj(static_cast<size_t>(b) * h);
  std::vector<float> gate_up(static_cast<size_t>(b) * 2 * inter),
      act(static_cast<size_t>(b) * inter);
  // One "page" holding the context rows then the block's: [p + b, kv_heads, head_dim].
  std::vector<float> keys(static_cast<size_t>(p + b) * kv_row),
      values(static_cast<size_t>(p + b) * kv_row);
  std::vector<uint64_t> mask;
  Visibility::Full().ToBits(b, &mask);
  const int32_t block_table = 0;
  std::vector<float> workspace;
  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& w = weights.layers[layer];
    const PackedLayer& pw = weights.packed_layers[layer];
    kc::RmsNorm(x.data(), w.input_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
    kc::PackedLinear(hbuf.data(), pw.qkv, nullptr, qkv.data(), b);
    for (int j = 0; j < b; ++j) {
      float* row = &qkv[static_cast<size_t>(j) * qkv_width];
      kc::RmsNorm(row, w.q_norm.data(), row, hq, d, c.rms_norm_eps);
      kc::RmsNorm(row + hq * d, w.k_norm.data(), row + hq * d, hkv, d, c.rms_norm_eps);
    }
    for (int part = 0; part < 2; ++part) {  // q heads, then k heads
      kc::RopeParams rp;
      rp.x = qkv.data() + (part == 0 ? 0 : hq * d);
      rp.positions = positions.data();
      rp.inv_freq = rope_.inv_freq.data();
      rp.attention_scaling = rope_.attention_scaling;
      rp.tokens = b;
      rp.heads = part == 0 ? hq : hkv;
      rp.head_dim = d;
      rp.row_stride = qkv_width;
      kc::RopeInvoke(rp);
    }
    if (p > 0) {
      std::memcpy(keys.data(), ctx->keys[layer].data(), sizeof(float) * p * kv_row);
      std::memcpy(values.data(), ctx->values[layer].data(), sizeof(float) * p * kv_row);
    }
    for (int j = 0; j < b; ++j) {
      const float* row = &qkv[static_cast<size_t>(j) * qkv_width];
      std::memcpy(&keys[static_cast<size_t>(p + j) * kv_row], row + hq * d, sizeof(float) * kv_row);
      std::memcpy(&values[static_cast<size_t>(p + j) * kv_row], row + (hq + hkv) * d,
                  sizeof(float) * kv_row);
    }
    kc::AttentionParams ap;
    ap.q = qkv.data();
    ap.q_stride = qkv_width;
    ap.k_cache = keys.data();
    ap.v_cache = values.data();
    ap.block_table = &block_table;
    ap.block_size = p + b;
    ap.context_len = p;
    ap.new_tokens = b;
    ap.mask = mask.data();
    ap.mask_words = Visibility::Words(b);
    ap.q_heads = hq;
    ap.kv_heads = hkv;
    ap.head_dim = d;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(d));
    ap.out = attn.data();
    ap.out_stride = hq * d;
    workspace.resize(kc::AttentionWorkspaceFloats(ap));
    kc::AttentionInvoke(ap, workspace.data());
    kc::PackedLinear(attn.data(), pw.o, nullptr, proj.data(), b);
    kc::AddRmsNorm(x.data(), proj.data(), w.post_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
    kc::PackedLinear(hbuf.data(), pw.gate_up, nullptr, gate_up.data(), b);
    kc::SiluMulFused(gate_up.data(), act.data(), b, inter);
    kc::PackedLinear(act.data(), pw.down, nullptr, proj.data(), b);
    for (size_t i = 0; i < x.size(); ++i) x[i] += proj[i];
  }
  kc::RmsNorm(x.data(), weights.final_norm.data(), hbuf.data(), b, h, c.rms_norm_eps);
  std::vector<float> logits(static_cast<size_t>(b) * vocab);
  kc::PackedLinear(hbuf.data(), target.packed_head, nullptr, logits.data(), b);
  return logits;
}

absl::StatusOr<std::vector<int32_t>> CpuDFlash::Draft(const DFlashContextStorage* storage,
                                                      int length, std::span<const int32_t> block,
                                                      int first) {
  absl::StatusOr<std::vector<float>> logits = BlockLogits(storage, length, block);
  if (!logits.ok()) return logits.status();
  const int vocab = model_->config().model.vocab_size;
  std::vector<int32_t> drafts;
  for (int j = first; j < static_cast<int>(block.size()); ++j) {
    const float* row = logits->data() + static_cast<size_t>(j) * vocab;
    drafts.push_back(static_cast<int32_t>(std::max_element(row, row + vocab) - row));
  }
  return drafts;
}

absl::Status CpuDFlash::Read(const DFlashContextStorage& storage, int length,
                             std::vector<std::vector<float>>& keys,
                             std::vector<std::vector<float>>& values) {
  const auto& ctx = static_cast<const CpuDFlashContext&>(storage);
  const size_t rows = static_cast<size_t>(length) * ctx.kv_row;
  keys.resize(ctx.keys.size());
  values.resize(ctx.values.size());
  for (size_t l = 0; l < ctx.keys.size(); ++l) {
    keys[l].assign(ctx.keys[l].begin(), ctx.keys[l].begin() + rows);
    values[l].assign(ctx.values[l].begin(), ctx.values[l].begin() + rows);
  }
  return absl::OkStatus();
}

}  // namespace tandem
