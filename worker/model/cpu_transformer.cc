#include "worker/model/cpu_transformer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/packed_gemm.h"
#include "kernels/cpu/rope.h"
#include "worker/sampling/sampling.h"

namespace tandem {

namespace kc = kernels::cpu;

namespace {

// Rows from which the attention block's per-token work (q/k norms, RoPE, K/V rows into the cache)
// splits over the threads: below, a fork and join costs about what it saves.
constexpr int kParallelTokens = 4;

// Where an extend's rows sit in the concatenated batch.
struct Slice {
  int offset = 0;   // first row in the batch
  int n = 0;        // new tokens
  int context = 0;  // committed tokens of the sequence
};

// Adds the adapter's delta for `target` to out[t, col : col + out_dim] for every row t whose gate
// is set: out += scale * (x · A^T) · B^T.
void ApplyLora(const LoraAdapter& adapter, int layer, LoraTarget target, const float* x, int in_dim,
               float* out, int out_stride, int col, std::span<const int> rows) {
  if (rows.empty() || layer >= static_cast<int>(adapter.layers.size())) return;
  auto it = adapter.layers[layer].find(target);
  if (it == adapter.layers[layer].end()) return;
  const LoraPair& pair = it->second;
  const int out_dim = static_cast<int>(pair.b.size() / pair.rank);
  std::vector<float> gathered(rows.size() * in_dim), low(rows.size() * pair.rank),
      delta(rows.size() * out_dim);
  for (size_t r = 0; r < rows.size(); ++r) {
    std::memcpy(&gathered[r * in_dim], x + static_cast<size_t>(rows[r]) * in_dim,
                sizeof(float) * in_dim);
  }
  const int m = static_cast<int>(rows.size());
  kc::Linear(gathered.data(), pair.a.data(), nullptr, low.data(), m, pair.rank, in_dim);
  kc::Linear(low.data(), pair.b.data(), nullptr, delta.data(), m, out_dim, pair.rank);
  for (size_t r = 0; r < rows.size(); ++r) {
    float* dst = out + static_cast<size_t>(rows[r]) * out_stride + col;
    for (int j = 0; j < out_dim; ++j) dst[j] += adapter.scale * delta[r * out_dim + j];
  }
}

const float* BiasOrNull(const std::vector<float>& bias) {
  return bias.empty() ? nullptr : bias.data();
}

}  // namespace

// The batch as rows of one matrix, and what each extend's rows need besides the weights.
struct CpuTransformer::Layout {
  std::vector<Slice> slices;
  int total = 0;               // rows
  std::vector<int> lora_rows;  // rows whose LoRA gate is on
  // Per-extend RoPE tables when dynamic NTK scaling makes them depend on the length reached
  // (empty: the model's).
  std::vector<std::vector<float>> dyn_freq;
  std::vector<float> dyn_scaling;
  std::vector<std::vector<uint64_t>> masks;  // per extend: its visibility bits
  std::vector<int> extend_of;                // per row: its extend
};

// The forward's activations, [rows, width] each.
struct CpuTransformer::Activations {
  Activations(int total, const ModelConfig& c)
      : x(static_cast<size_t>(total) * c.hidden_size),
        h(static_cast<size_t>(total) * c.hidden_size),
        qkv(static_cast<size_t>(total) * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim),
        attn(static_cast<size_t>(total) * c.num_heads * c.head_dim),
        proj(static_cast<size_t>(total) * c.hidden_size),
        gate_up(static_cast<size_t>(total) * 2 * c.intermediate_size),
        act(static_cast<size_t>(total) * c.intermediate_size) {}
  std::vector<float> x;  // the residual stream
  std::vector<float> h;  // the normed stream a block reads
  std::vector<float> qkv, attn, proj, gate_up, act;
  std::vector<float> workspace;  // attention's
};

CpuTransformer::CpuTransformer(const Transformer* model) : model_(model) {
  RopeTables rope = ComputeRope(model_->config());
  inv_freq_ = std::move(rope.inv_freq);
  rope_scaling_ = rope.attention_scaling;
}

int CpuTransformer::ExactExtendTokens() const {
  return std::min(kernels::cpu::kAttentionDirectMaxTokens, kernels::cpu::kPackedMaxM);
}

absl::StatusOr<std::vector<ExtendOutput>> CpuTransformer::Forward(std::span<const Extend> batch,
                                                                  KvCache& kv) {
  const ModelConfig& c = model_->config();
  const ModelWeights& weights = model_->weights();
  const Layout layout = LayOut(batch, kv);
  std::vector<ExtendOutput> outputs(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    outputs[e].hidden.resize(batch[e].hidden_layers.size() *
                             static_cast<size_t>(layout.slices[e].n) * c.hidden_size);
  }
  if (layout.total == 0) return outputs;
  Activations a(layout.total, c);
  Embed(batch, layout, a);
  Tap(0, batch, layout, a, outputs);
  const int total = layout.total, hidden = c.hidden_size;
  kc::RmsNorm(a.x.data(), weights.layers[0].input_norm.data(), a.h.data(), total, hidden,
              c.rms_norm_eps);
  for (int layer = 0; layer < c.num_layers; ++layer) {
    AttentionBlock(layer, batch, layout, kv, a);
    kc::AddRmsNorm(a.x.data(), a.proj.data(), weights.layers[layer].post_norm.data(), a.h.data(),
                   total, hidden, c.rms_norm_eps);
    MlpBlock(layer, layout, a);
    // The residual add is fused with the next layer's input norm (or the final norm in Head).
    if (layer + 1 < c.num_layers) {
      kc::AddRmsNorm(a.x.data(), a.proj.data(), weights.layers[layer + 1].input_norm.data(),
                     a.h.data(), total, hidden, c.rms_norm_eps);
    } else {
      for (size_t i = 0; i < a.x.size(); ++i) a.x[i] += a.proj[i];
    }
    Tap(layer + 1, batch, layout, a, outputs);
  }
  Head(batch, layout, a, outputs);
  return outputs;
}

CpuTransformer::Layout CpuTransformer::LayOut(std::span<const Extend> batch,
                                              const KvCache& kv) const {
  const ModelConfig& c = model_->config();
  Layout l;
  l.slices.resize(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    l.slices[e] = {l.total, static_cast<int>(batch[e].tokens.size()),
                   kv.CommittedLength(batch[e].seq)};
    l.total += l.slices[e].n;
    l.extend_of.insert(l.extend_of.end(), l.slices[e].n, static_cast<int>(e));
  }
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int i = 0; i < static_cast<int>(batch[e].lora_gate.size()); ++i) {
      if (batch[e].lora_gate[i]) l.lora_rows.push_back(l.slices[e].offset + i);
    }
  }
  l.dyn_freq.resize(batch.size());
  l.dyn_scaling.assign(batch.size(), rope_scaling_);
  if (c.rope_scaling.kind == RopeScaling::Kind::kDynamic) {
    for (size_t e = 0; e < batch.size(); ++e) {
      int max_pos = l.slices[e].context;
      for (int32_t p : batch[e].positions) max_pos = std::max(max_pos, p + 1);
      RopeTables t = ComputeRope(c, max_pos);
      l.dyn_freq[e] = std::move(t.inv_freq);
      l.dyn_scaling[e] = t.attention_scaling;
    }
  }
  l.masks.resize(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) batch[e].visible.ToBits(l.slices[e].n, &l.masks[e]);
  return l;
}

void CpuTransformer::Embed(std::span<const Extend> batch, const Layout& layout,
                           Activations& a) const {
  const int hidden = model_->config().hidden_size;
  const ModelWeights& weights = model_->weights();
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int i = 0; i < layout.slices[e].n; ++i) {
      weights.EmbedRow(batch[e].tokens[i],
                       &a.x[static_cast<size_t>(layout.slices[e].offset + i) * hidden]);
    }
  }
}

void CpuTransformer::Tap(int layer, std::span<const Extend> batch, const Layout& layout,
                         const Activations& a, std::vector<ExtendOutput>& outputs) const {
  const int hidden = model_->config().hidden_size;
  for (size_t e = 0; e < batch.size(); ++e) {
    const auto& layers = batch[e].hidden_layers;
    const Slice& s = layout.slices[e];
    for (size_t t = 0; t < layers.size(); ++t) {
      if (layers[t] != layer) continue;
      std::memcpy(&outputs[e].hidden[t * s.n * hidden],
                  &a.x[static_cast<size_t>(s.offset) * hidden], sizeof(float) * s.n * hidden);
    }
  }
}

void CpuTransformer::AttentionBlock(int layer, std::span<const Extend> batch, const Layout& layout,
                                    KvCache& kv, Activations& a) const {
  const ModelConfig& c = model_->config();
  const LayerWeights& w = model_->weights().layers[layer];
  const PackedLayer& pw = model_->weights().packed_layers[layer];
  const std::optional<LoraAdapter>& lora = model_->lora();
  const int hidden = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int qkv_width = (hq + 2 * hkv) * d;
  const int total = layout.total;
  kc::PackedLinear(a.h.data(), pw.qkv, BiasOrNull(w.qkv_bias), a.qkv.data(), total);
  if (lora.has_value()) {
    ApplyLora(*lora, layer, LoraTarget::kQ, a.h.data(), hidden, a.qkv.data(), qkv_width, 0,
              layout.lora_rows);
    ApplyLora(*lora, layer, LoraTarget::kK, a.h.data(), hidden, a.qkv.data(), qkv_width, hq * d,
              layout.lora_rows);
    ApplyLora(*lora, layer, LoraTarget::kV, a.h.data(), hidden, a.qkv.data(), qkv_width,
              (hq + hkv) * d, layout.lora_rows);
  }
  // Per token: the q/k norms, RoPE and the K/V rows into the cache, the tokens split over the
  // threads (each token on its own, so the split leaves the values as they are). Each core then
  // moves half of the rows the product wrote on both; on one, it moved them all while the other
  // waited.
  const int threads = total >= kParallelTokens ? kc::CpuThreads() : 1;
#pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1)
  for (int t = 0; t < total; ++t) {
    const int e = layout.extend_of[t];
    const Slice& s = layout.slices[e];
    const int i = t - s.offset;
    float* row = &a.qkv[static_cast<size_t>(t) * qkv_width];
    if (!w.q_norm.empty()) {
      kc::RmsNorm(row, w.q_norm.data(), row, hq, d, c.rms_norm_eps);
      kc::RmsNorm(row + hq * d, w.k_norm.data(), row + hq * d, hkv, d, c.rms_norm_eps);
    }
    // The q heads and the k heads after them, one rotation.
    kc::RopeInvoke(
        {.x = row,
         .positions = batch[e].positions.data() + i,
         .inv_freq = layout.dyn_freq[e].empty() ? inv_freq_.data() : layout.dyn_freq[e].data(),
         .attention_scaling = layout.dyn_scaling[e],
         .tokens = 1,
         .heads = hq + hkv,
         .head_dim = d,
         .row_stride = qkv_width});
    std::memcpy(kv.KeyRow(batch[e].seq, layer, s.context + i), row + hq * d,
                sizeof(float) * hkv * d);
    std::memcpy(kv.ValueRow(batch[e].seq, layer, s.context + i), row + (hq + hkv) * d,
                sizeof(float) * hkv * d);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  std::vector<kc::AttentionParams> params(batch.size());
  for (size_t e = 0; e < batch.size(); ++e) {
    const Slice& s = layout.slices[e];
    float* base = &a.qkv[static_cast<size_t>(s.offset) * qkv_width];
    kc::AttentionParams& ap = params[e];
    ap.q = base;
    ap.q_stride = qkv_width;
    ap.k_cache = kv.Keys(layer);
    ap.v_cache = kv.Values(layer);
    ap.block_table = kv.BlockTable(batch[e].seq).data();
    ap.block_size = kv.options().block_size;
    ap.context_len = s.context;
    ap.new_tokens = s.n;
    ap.mask = layout.masks[e].data();
    ap.mask_words = Visibility::Words(s.n);
    ap.q_heads = hq;
    ap.kv_heads = hkv;
    ap.head_dim = d;
    ap.scale = scale;
    ap.window = c.sliding_window;
    ap.out = &a.attn[static_cast<size_t>(s.offset) * hq * d];
    ap.out_stride = hq * d;
  }
  Attend(params, a);
  kc::PackedLinear(a.attn.data(), pw.o, BiasOrNull(w.o_bias), a.proj.data(), total);
  if (lora.has_value()) {
    ApplyLora(*lora, layer, LoraTarget::kO, a.attn.data(), hq * d, a.proj.data(), hidden, 0,
              layout.lora_rows);
  }
}

void CpuTransformer::Attend(std::span<const kernels::cpu::AttentionParams> params,
                            Activations& a) const {
  bool all_serial = params.size() > 1;
  for (const kc::AttentionParams& p : params) all_serial = all_serial && kc::AttentionRunsSerial(p);
  // Side by side, each extend has a workspace of its own; one after another, they share one.
  std::vector<size_t> offsets(params.size(), 0);
  size_t floats = 0;
  for (size_t e = 0; e < params.size(); ++e) {
    const size_t need = kc::AttentionWorkspaceFloats(params[e]);
    if (all_serial) {
      offsets[e] = floats;
      floats += need;
    } else {
      floats = std::max(floats, need);
    }
  }
  a.workspace.resize(std::max(a.workspace.size(), floats));
  // A batch of small extends (decode steps of several sequences): one loop over the extends, each
  // on one thread, instead of one extend after another on the calling thread. Each query's sums
  // are the same either way.
  // (Not an inactive region otherwise: the extends' own parallel loops would then be nested ones,
  // which run on one thread.)
  const int extends = static_cast<int>(params.size());
  if (all_serial) {
#pragma omp parallel for schedule(dynamic) num_threads(kc::CpuThreads())
    for (int e = 0; e < extends; ++e) {
      kc::AttentionInvoke(params[e], a.workspace.data() + offsets[e]);
    }
  } else {
    for (int e = 0; e < extends; ++e) kc::AttentionInvoke(params[e], a.workspace.data());
  }
}

void CpuTransformer::MlpBlock(int layer, const Layout& layout, Activations& a) const {
  const ModelConfig& c = model_->config();
  const LayerWeights& w = model_->weights().layers[layer];
  const PackedLayer& pw = model_->weights().packed_layers[layer];
  const std::optional<LoraAdapter>& lora = model_->lora();
  const int hidden = c.hidden_size, inter = c.intermediate_size, total = layout.total;
  kc::PackedLinear(a.h.data(), pw.gate_up, BiasOrNull(w.gate_up_bias), a.gate_up.data(), total);
  if (lora.has_value()) {
    ApplyLora(*lora, layer, LoraTarget::kGate, a.h.data(), hidden, a.gate_up.data(), 2 * inter, 0,
              layout.lora_rows);
    ApplyLora(*lora, layer, LoraTarget::kUp, a.h.data(), hidden, a.gate_up.data(), 2 * inter, inter,
              layout.lora_rows);
  }
  kc::SiluMulFused(a.gate_up.data(), a.act.data(), total, inter);
  kc::PackedLinear(a.act.data(), pw.down, BiasOrNull(w.down_bias), a.proj.data(), total);
  if (lora.has_value()) {
    ApplyLora(*lora, layer, LoraTarget::kDown, a.act.data(), inter, a.proj.data(), hidden, 0,
              layout.lora_rows);
  }
}

void CpuTransformer::Head(std::span<const Extend> batch, const Layout& layout, const Activations& a,
                          std::vector<ExtendOutput>& outputs) const {
  const ModelConfig& c = model_->config();
  const ModelWeights& weights = model_->weights();
  const int hidden = c.hidden_size;
  std::vector<int> out_rows;
  for (size_t e = 0; e < batch.size(); ++e) {
    for (int32_t o : batch[e].outputs) out_rows.push_back(layout.slices[e].offset + o);
  }
  if (out_rows.empty()) return;
  const int m = static_cast<int>(out_rows.size());
  std::vector<float> normed(static_cast<size_t>(m) * hidden);
  for (int r = 0; r < m; ++r) {
    kc::RmsNorm(&a.x[static_cast<size_t>(out_rows[r]) * hidden], weights.final_norm.data(),
                &normed[static_cast<size_t>(r) * hidden], 1, hidden, c.rms_norm_eps);
  }
  std::vector<float> logits(static_cast<size_t>(m) * c.vocab_size);
  kc::PackedLinear(normed.data(), weights.packed_head, nullptr, logits.data(), m);
  // VerifyDraft's vocabulary-sized distribution, reused across the draft rows.
  std::vector<float> verify_scratch;
  size_t r = 0;
  for (size_t e = 0; e < batch.size(); ++e) {
    const Extend& x = batch[e];
    const size_t k = x.outputs.size();
    const float* first = logits.data() + r * c.vocab_size;
    if (!x.samples.empty()) {
      outputs[e].tokens.resize(k);
      outputs[e].accepted.assign(k, 1);
      for (size_t i = 0; i < k; ++i) {
        const SampleRequest& s = x.samples[i];
        const std::span<const float> row(first + i * c.vocab_size,
                                         static_cast<size_t>(c.vocab_size));
        if (s.draft >= 0) {
          bool accepted = false;
          outputs[e].tokens[i] =
              VerifyDraft(row, s.draft, s.params, s.position, &accepted, &verify_scratch);
          outputs[e].accepted[i] = accepted ? 1 : 0;
        } else {
          outputs[e].tokens[i] = SampleToken(row, s.params, s.position, s.purpose);
        }
      }
    }
    if (x.return_logits) outputs[e].logits.assign(first, first + k * c.vocab_size);
    r += k;
  }
}

}  // namespace tandem
