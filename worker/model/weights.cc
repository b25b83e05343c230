#include "worker/model/weights.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/checkpoint/checkpoint.h"

namespace tandem {

namespace {

void Append(std::vector<float>* dst, const std::vector<float>& src) {
  dst->insert(dst->end(), src.begin(), src.end());
}

size_t Bytes(const std::vector<float>& v) { return v.size() * sizeof(float); }

}  // namespace

size_t ModelWeights::StepBytes() const {
  const auto matrix = [](const std::vector<float>& v, const kernels::cpu::PackedMatrix& m) {
    return m.empty() ? Bytes(v) : m.bytes();
  };
  size_t total = Bytes(final_norm) + (packed() ? packed_head.bytes() : Bytes(Head()));
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& l = layers[i];
    const PackedLayer none;
    const PackedLayer& p = i < packed_layers.size() ? packed_layers[i] : none;
    total += Bytes(l.input_norm) + matrix(l.qkv, p.qkv) + Bytes(l.qkv_bias) + Bytes(l.q_norm) +
             Bytes(l.k_norm) + matrix(l.o, p.o) + Bytes(l.o_bias) + Bytes(l.post_norm) +
             matrix(l.gate_up, p.gate_up) + Bytes(l.gate_up_bias) + matrix(l.down, p.down) +
             Bytes(l.down_bias);
  }
  return total;
}

size_t ModelWeights::ParameterCount() const {
  const auto matrix = [](const std::vector<float>& v, const kernels::cpu::PackedMatrix& m) {
    return m.empty() ? v.size() : static_cast<size_t>(m.rows()) * m.cols();
  };
  size_t total = embed.size() + final_norm.size() + matrix(lm_head, packed_head);
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerWeights& l = layers[i];
    const PackedLayer none;
    const PackedLayer& p = i < packed_layers.size() ? packed_layers[i] : none;
    total += l.input_norm.size() + matrix(l.qkv, p.qkv) + l.qkv_bias.size() + l.q_norm.size() +
             l.k_norm.size() + matrix(l.o, p.o) + l.o_bias.size() + l.post_norm.size() +
             matrix(l.gate_up, p.gate_up) + l.gate_up_bias.size() + matrix(l.down, p.down) +
             l.down_bias.size();
  }
  return total;
}

kernels::cpu::PackedMatrix PackRows(std::vector<float>& v, int cols,
                                    kernels::cpu::WeightType type) {
  if (v.empty() || cols <= 0) return {};
  const int rows = static_cast<int>(v.size() / cols);
  kernels::cpu::PackedMatrix m = kernels::cpu::PackedMatrix::Pack(v.data(), rows, cols, type);
  std::vector<float>().swap(v);
  return m;
}

std::vector<float> RowMajorOf(const std::vector<float>& v, const kernels::cpu::PackedMatrix& m) {
  return m.empty() ? v : m.RowMajor();
}

PackedLayer PackLayer(LayerWeights& l, int hidden, kernels::cpu::WeightType type) {
  PackedLayer p;
  p.qkv = PackRows(l.qkv, hidden, type);
  // o: [hidden, q_out]; down: [hidden, intermediate].
  p.o = PackRows(l.o, hidden > 0 ? static_cast<int>(l.o.size() / hidden) : 0, type);
  p.gate_up = PackRows(l.gate_up, hidden, type);
  p.down = PackRows(l.down, hidden > 0 ? static_cast<int>(l.down.size() / hidden) : 0, type);
  return p;
}

LayerWeights RowMajorLayerOf(const LayerWeights& layer, const PackedLayer* packed) {
  LayerWeights l = layer;
  if (packed != nullptr) {
    l.qkv = RowMajorOf(l.qkv, packed->qkv);
    l.o = RowMajorOf(l.o, packed->o);
    l.gate_up = RowMajorOf(l.gate_up, packed->gate_up);
    l.down = RowMajorOf(l.down, packed->down);
  }
  return l;
}

void ModelWeights::PackForCpu(kernels::cpu::WeightType type) {
  if (packed()) return;
  const int hidden = static_cast<int>(final_norm.size());
  packed_layers.clear();
  for (LayerWeights& l : layers) packed_layers.push_back(PackLayer(l, hidden, type));
  head_tied = lm_head.empty();
  packed_head = PackRows(head_tied ? embed : lm_head, hidden, type);
}

ModelWeights ModelWeights::Unpacked() const {
  ModelWeights w;
  w.embed = EmbedRowMajor();
  w.final_norm = final_norm;
  w.lm_head = HeadRowMajor();
  w.layers.reserve(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) w.layers.push_back(RowMajorLayer(static_cast<int>(i)));
  return w;
}

void ModelWeights::EmbedRow(int32_t token, float* out) const {
  const size_t hidden = final_norm.size();
  if (!embed.empty()) {
    std::copy_n(embed.data() + static_cast<size_t>(token) * hidden, hidden, out);
  } else {
    packed_head.CopyRow(token, out);
  }
}

std::vector<float> ModelWeights::EmbedRowMajor() const {
  return head_tied && packed() ? packed_head.RowMajor() : embed;
}

std::vector<float> ModelWeights::HeadRowMajor() const {
  if (!packed()) return lm_head;
  return head_tied ? std::vector<float>() : packed_head.RowMajor();
}

LayerWeights ModelWeights::RowMajorLayer(int i) const {
  return RowMajorLayerOf(
      layers[i], static_cast<size_t>(i) < packed_layers.size() ? &packed_layers[i] : nullptr);
}

absl::StatusOr<ModelWeights> LoadWeights(const std::string& dir, const ModelConfig& c) {
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const int64_t q_out = int64_t{c.num_heads} * d, kv_out = int64_t{c.num_kv_heads} * d;
  ModelWeights w;
  TANDEM_ASSIGN_OR_RETURN(w.embed,
                          ckpt->LoadF32("model.embed_tokens.weight", {c.vocab_size, hidden}));
  TANDEM_ASSIGN_OR_RETURN(w.final_norm, ckpt->LoadF32("model.norm.weight", {hidden}));
  if (!c.tie_word_embeddings) {
    TANDEM_ASSIGN_OR_RETURN(w.lm_head, ckpt->LoadF32("lm_head.weight", {c.vocab_size, hidden}));
  }
  w.layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    LayerWeights& l = w.layers[i];
    TANDEM_ASSIGN_OR_RETURN(l.input_norm, ckpt->LoadF32(p + "input_layernorm.weight", {hidden}));
    TANDEM_ASSIGN_OR_RETURN(l.post_norm,
                            ckpt->LoadF32(p + "post_attention_layernorm.weight", {hidden}));
    const std::string a = p + "self_attn.";
    TANDEM_ASSIGN_OR_RETURN(auto q, ckpt->LoadF32(a + "q_proj.weight", {q_out, hidden}));
    TANDEM_ASSIGN_OR_RETURN(auto k, ckpt->LoadF32(a + "k_proj.weight", {kv_out, hidden}));
    TANDEM_ASSIGN_OR_RETURN(auto v, ckpt->LoadF32(a + "v_proj.weight", {kv_out, hidden}));
    l.qkv = std::move(q);
    Append(&l.qkv, k);
    Append(&l.qkv, v);
    if (c.attention_bias) {
      TANDEM_ASSIGN_OR_RETURN(auto qb, ckpt->LoadF32(a + "q_proj.bias", {q_out}));
      TANDEM_ASSIGN_OR_RETURN(auto kb, ckpt->LoadF32(a + "k_proj.bias", {kv_out}));
      TANDEM_ASSIGN_OR_RETURN(auto vb, ckpt->LoadF32(a + "v_proj.bias", {kv_out}));
      l.qkv_bias = std::move(qb);
      Append(&l.qkv_bias, kb);
      Append(&l.qkv_bias, vb);
    }
    if (c.o_proj_bias) {
      TANDEM_ASSIGN_OR_RETURN(l.o_bias, ckpt->LoadF32(a + "o_proj.bias", {hidden}));
    }
    if (c.qk_norm) {
      TANDEM_ASSIGN_OR_RETURN(l.q_norm, ckpt->LoadF32(a + "q_norm.weight", {d}));
      TANDEM_ASSIGN_OR_RETURN(l.k_norm, ckpt->LoadF32(a + "k_norm.weight", {d}));
    }
    TANDEM_ASSIGN_OR_RETURN(l.o, ckpt->LoadF32(a + "o_proj.weight", {hidden, q_out}));
    const std::string m = p + "mlp.";
    TANDEM_ASSIGN_OR_RETURN(auto gate, ckpt->LoadF32(m + "gate_proj.weight", {inter, hidden}));
    TANDEM_ASSIGN_OR_RETURN(auto up, ckpt->LoadF32(m + "up_proj.weight", {inter, hidden}));
    l.gate_up = std::move(gate);
    Append(&l.gate_up, up);
    TANDEM_ASSIGN_OR_RETURN(l.down, ckpt->LoadF32(m + "down_proj.weight", {hidden, inter}));
    if (c.mlp_bias) {
      TANDEM_ASSIGN_OR_RETURN(auto gb, ckpt->LoadF32(m + "gate_proj.bias", {inter}));
      TANDEM_ASSIGN_OR_RETURN(auto ub, ckpt->LoadF32(m + "up_proj.bias", {inter}));
      l.gate_up_bias = std::move(gb);
      Append(&l.gate_up_bias, ub);
      TANDEM_ASSIGN_OR_RETURN(l.down_bias, ckpt->LoadF32(m + "down_proj.bias", {hidden}));
    }
  }
  return w;
}

namespace {

// Where a projection's rows sit in the fused matrix that holds it.
struct FusedRows {
  std::vector<float>* matrix = nullptr;
  int64_t first_row = 0;
  int64_t rows = 0;  // the projection's out_features
  int64_t cols = 0;  // its in_features
};

FusedRows RowsOf(const ModelConfig& c, LayerWeights& layer, LoraTarget target) {
  const int64_t q_rows = static_cast<int64_t>(c.num_heads) * c.head_dim;
  const int64_t kv_rows = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  switch (target) {
    case LoraTarget::kQ:
      return {&layer.qkv, 0, q_rows, c.hidden_size};
    case LoraTarget::kK:
      return {&layer.qkv, q_rows, kv_rows, c.hidden_size};
    case LoraTarget::kV:
      return {&layer.qkv, q_rows + kv_rows, kv_rows, c.hidden_size};
    case LoraTarget::kO:
      return {&layer.o, 0, c.hidden_size, q_rows};
    case LoraTarget::kGate:
      return {&layer.gate_up, 0, c.intermediate_size, c.hidden_size};
    case LoraTarget::kUp:
      return {&layer.gate_up, c.intermediate_size, c.intermediate_size, c.hidden_size};
    case LoraTarget::kDown:
      return {&layer.down, 0, c.hidden_size, c.intermediate_size};
  }
  return {};
}

}  // namespace

absl::Status MergeLoraAdapter(const LoraAdapter& adapter, const ModelConfig& config,
                              ModelWeights& weights) {
  if (weights.packed()) {
    return absl::FailedPreconditionError("a LoRA adapter merges into unpacked weights only");
  }
  if (adapter.layers.size() != weights.layers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("adapter \"", adapter.name, "\" has ",
                                                   adapter.layers.size(), " layers, the model ",
                                                   weights.layers.size()));
  }
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    for (const auto& [target, pair] : adapter.layers[l]) {
      const FusedRows rows = RowsOf(config, weights.layers[l], target);
      const int64_t rank = pair.rank;
      const int64_t in = rows.cols;
      const int64_t out = rows.rows;
      if (rows.matrix == nullptr || rank <= 0 || static_cast<int64_t>(pair.a.size()) != rank * in ||
          static_cast<int64_t>(pair.b.size()) != rank * out ||
          (rows.first_row + out) * in > static_cast<int64_t>(rows.matrix->size())) {
        return absl::InvalidArgumentError(absl::StrCat("adapter \"", adapter.name, "\": layer ", l,
                                                       " does not fit the model's shapes"));
      }
      // W[first_row + o, i] += scale * sum_r B[o, r] A[r, i]
      for (int64_t o = 0; o < out; ++o) {
        float* row = rows.matrix->data() + (rows.first_row + o) * in;
        for (int64_t r = 0; r < rank; ++r) {
          const float coef = adapter.scale * pair.b[o * rank + r];
          const float* a = pair.a.data() + r * in;
          for (int64_t i = 0; i < in; ++i) row[i] += coef * a[i];
        }
      }
    }
  }
  return absl::OkStatus();
}

namespace {

// The shapes of a model's weights, drawn from `randn(n)` (n weights around 0) and `norm(n)` (n
// norm weights around 1).
template <typename Randn, typename Norm>
ModelWeights DrawWeights(const ModelConfig& c, Randn randn, Norm norm) {
  const size_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const size_t qkv_out = (static_cast<size_t>(c.num_heads) + 2 * c.num_kv_heads) * d;
  ModelWeights w;
  w.embed = randn(static_cast<size_t>(c.vocab_size) * hidden);
  w.final_norm = norm(hidden);
  if (!c.tie_word_embeddings) w.lm_head = randn(static_cast<size_t>(c.vocab_size) * hidden);
  w.layers.resize(c.num_layers);
  for (LayerWeights& l : w.layers) {
    l.input_norm = norm(hidden);
    l.post_norm = norm(hidden);
    l.qkv = randn(qkv_out * hidden);
    if (c.attention_bias) l.qkv_bias = randn(qkv_out);
    if (c.o_proj_bias) l.o_bias = randn(hidden);
    if (c.mlp_bias) {
      l.gate_up_bias = randn(2 * inter);
      l.down_bias = randn(hidden);
    }
    if (c.qk_norm) {
      l.q_norm = norm(d);
      l.k_norm = norm(d);
    }
    l.o = randn(hidden * c.num_heads * d);
    l.gate_up = randn(2 * inter * hidden);
    l.down = randn(hidden * inter);
  }
  return w;
}

// SplitMix64's finaliser: a well-mixed 64-bit hash of a counter.
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

ModelWeights RandomWeights(const ModelConfig& c, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  auto randn = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  };
  auto norm = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = 1.0f + normal(rng);
    return v;
  };
  return DrawWeights(c, randn, norm);
}

ModelWeights BenchmarkWeights(const ModelConfig& c, uint64_t seed, float stddev) {
  // Uniform on [-a, a] has standard deviation a / sqrt(3).
  const float half_width = stddev * std::sqrt(3.0f);
  uint64_t tensor = 0;
  auto draw = [&](size_t n, float center) {
    std::vector<float> v(n);
    const uint64_t key = Mix(seed ^ Mix(++tensor));
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; ++i) {
      // 24 random bits -> [0, 1) -> [-1, 1).
      const float unit = static_cast<float>(Mix(key + i) >> 40) * 0x1.0p-24f;
      v[i] = center + half_width * (2.0f * unit - 1.0f);
    }
    return v;
  };
  return DrawWeights(
      c, [&](size_t n) { return draw(n, 0.0f); }, [&](size_t n) { return draw(n, 1.0f); });
}

}  // namespace tandem
