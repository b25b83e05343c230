#include "tests/worker/model/reference_model.h"

#include <algorithm>
#include <cmath>

namespace tandem::testing {

namespace {

using Vec = std::vector<double>;

Vec MatVec(const std::vector<float>& w, size_t row_offset, int rows, int cols, const Vec& x) {
  Vec y(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    const float* wr = &w[(row_offset + r) * cols];
    double acc = 0.0;
    for (int k = 0; k < cols; ++k) acc += wr[k] * x[k];
    y[r] = acc;
  }
  return y;
}

Vec RmsNorm(const Vec& x, const float* weight, int dim, float eps, int offset = 0) {
  double ss = 0.0;
  for (int i = 0; i < dim; ++i) ss += x[offset + i] * x[offset + i];
  const double inv = 1.0 / std::sqrt(ss / dim + eps);
  Vec y(dim);
  for (int i = 0; i < dim; ++i) y[i] = weight[i] * x[offset + i] * inv;
  return y;
}

void AddLora(const LoraAdapter* lora, bool on, int layer, LoraTarget target, const Vec& x, Vec* out,
             int col) {
  if (lora == nullptr || !on || layer >= static_cast<int>(lora->layers.size())) return;
  auto it = lora->layers[layer].find(target);
  if (it == lora->layers[layer].end()) return;
  const LoraPair& p = it->second;
  const int in = static_cast<int>(x.size());
  const int out_dim = static_cast<int>(p.b.size() / p.rank);
  Vec low = MatVec(p.a, 0, p.rank, in, x);
  Vec delta = MatVec(p.b, 0, out_dim, p.rank, low);
  for (int j = 0; j < out_dim; ++j) (*out)[col + j] += lora->scale * delta[j];
}

void Rope(Vec* v, int offset, int heads, int d, int pos, const std::vector<float>& inv_freq,
          float scaling) {
  const int half = d / 2;
  for (int h = 0; h < heads; ++h) {
    double* x = v->data() + offset + h * d;
    for (int i = 0; i < half; ++i) {
      const float angle = static_cast<float>(pos) * inv_freq[i];
      const double c = std::cos(angle) * scaling, s = std::sin(angle) * scaling;
      const double a = x[i], b = x[i + half];
      x[i] = a * c - b * s;
      x[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

std::vector<std::vector<bool>> CausalMask(int n) {
  std::vector<std::vector<bool>> m(n, std::vector<bool>(n, false));
  for (int i = 0; i < n; ++i)
    for (int j = 0; j <= i; ++j) m[i][j] = true;
  return m;
}

DenseResult DenseForward(const ModelConfig& c, const ModelWeights& w,
                         const std::vector<int32_t>& tokens, const std::vector<int32_t>& positions,
                         const std::vector<std::vector<bool>>& mask, const LoraAdapter* lora,
                         const std::vector<bool>& lora_gate) {
  const int n = static_cast<int>(tokens.size());
  const int hidden = c.hidden_size, d = c.head_dim, hq = c.num_heads, hkv = c.num_kv_heads;
  const int inter = c.intermediate_size, qkv_width = (hq + 2 * hkv) * d;
  int max_pos = 0;
  for (int p : positions) max_pos = std::max(max_pos, p + 1);
  const RopeTables rope = ComputeRope(c, max_pos);
  auto gate = [&](int t) { return !lora_gate.empty() && lora_gate[t]; };

  DenseResult result;
  // The weights as the checkpoint lays them out, packed for the CPU or not.
  const std::vector<float> embed = w.EmbedRowMajor();
  std::vector<float> head = w.HeadRowMajor();
  if (head.empty()) head = embed;
  std::vector<Vec> x(n, Vec(hidden));
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < hidden; ++i) x[t][i] = embed[static_cast<size_t>(tokens[t]) * hidden + i];
  auto snapshot = [&] {
    std::vector<std::vector<float>> s(n);
    for (int t = 0; t < n; ++t) s[t].assign(x[t].begin(), x[t].end());
    result.hidden.push_back(std::move(s));
  };
  snapshot();
  for (int l = 0; l < c.num_layers; ++l) {
    const LayerWeights lw = w.RowMajorLayer(l);
    std::vector<Vec> qkv(n);
    for (int t = 0; t < n; ++t) {
      Vec h = RmsNorm(x[t], lw.input_norm.data(), hidden, c.rms_norm_eps);
      qkv[t] = MatVec(lw.qkv, 0, qkv_width, hidden, h);
      if (!lw.qkv_bias.empty())
        for (int i = 0; i < qkv_width; ++i) qkv[t][i] += lw.qkv_bias[i];
      AddLora(lora, gate(t), l, LoraTarget::kQ, h, &qkv[t], 0);
      AddLora(lora, gate(t), l, LoraTarget::kK, h, &qkv[t], hq * d);
      AddLora(lora, gate(t), l, LoraTarget::kV, h, &qkv[t], (hq + hkv) * d);
      if (!lw.q_norm.empty()) {
        for (int hh = 0; hh < hq; ++hh) {
          Vec y = RmsNorm(qkv[t], lw.q_norm.data(), d, c.rms_norm_eps, hh * d);
          std::copy(y.begin(), y.end(), qkv[t].begin() + hh * d);
        }
        for (int hh = 0; hh < hkv; ++hh) {
          Vec y = RmsNorm(qkv[t], lw.k_norm.data(), d, c.rms_norm_eps, (hq + hh) * d);
          std::copy(y.begin(), y.end(), qkv[t].begin() + (hq + hh) * d);
        }
      }
      Rope(&qkv[t], 0, hq, d, positions[t], rope.inv_freq, rope.attention_scaling);
      Rope(&qkv[t], hq * d, hkv, d, positions[t], rope.inv_freq, rope.attention_scaling);
    }
    std::vector<Vec> attn(n, Vec(hq * d, 0.0));
    for (int t = 0; t < n; ++t) {
      for (int hh = 0; hh < hq; ++hh) {
        const int g = hh / (hq / hkv);
        std::vector<double> scores(n, -INFINITY);
        double mx = -INFINITY;
        for (int j = 0; j < n; ++j) {
          if (!mask[t][j]) continue;
          double dot = 0.0;
          for (int k = 0; k < d; ++k) dot += qkv[t][hh * d + k] * qkv[j][(hq + g) * d + k];
          scores[j] = dot / std::sqrt(static_cast<double>(d));
          mx = std::max(mx, scores[j]);
        }
        if (mx == -INFINITY) continue;
        double denom = 0.0;
        for (int j = 0; j < n; ++j) {
          if (scores[j] == -INFINITY) continue;
          const double p = std::exp(scores[j] - mx);
          denom += p;
          for (int k = 0; k < d; ++k) attn[t][hh * d + k] += p * qkv[j][(hq + hkv + g) * d + k];
        }
        for (int k = 0; k < d; ++k) attn[t][hh * d + k] /= denom;
      }
    }
    for (int t = 0; t < n; ++t) {
      Vec o = MatVec(lw.o, 0, hidden, hq * d, attn[t]);
      if (!lw.o_bias.empty())
        for (int i = 0; i < hidden; ++i) o[i] += lw.o_bias[i];
      AddLora(lora, gate(t), l, LoraTarget::kO, attn[t], &o, 0);
      for (int i = 0; i < hidden; ++i) x[t][i] += o[i];
      Vec h = RmsNorm(x[t], lw.post_norm.data(), hidden, c.rms_norm_eps);
      Vec gu = MatVec(lw.gate_up, 0, 2 * inter, hidden, h);
      if (!lw.gate_up_bias.empty())
        for (int i = 0; i < 2 * inter; ++i) gu[i] += lw.gate_up_bias[i];
      AddLora(lora, gate(t), l, LoraTarget::kGate, h, &gu, 0);
      AddLora(lora, gate(t), l, LoraTarget::kUp, h, &gu, inter);
      Vec act(inter);
      for (int i = 0; i < inter; ++i) act[i] = gu[i] / (1.0 + std::exp(-gu[i])) * gu[inter + i];
      Vec down = MatVec(lw.down, 0, hidden, inter, act);
      if (!lw.down_bias.empty())
        for (int i = 0; i < hidden; ++i) down[i] += lw.down_bias[i];
      AddLora(lora, gate(t), l, LoraTarget::kDown, act, &down, 0);
      for (int i = 0; i < hidden; ++i) x[t][i] += down[i];
    }
    snapshot();
  }
  for (int t = 0; t < n; ++t) {
    Vec h = RmsNorm(x[t], w.final_norm.data(), hidden, c.rms_norm_eps);
    Vec logits = MatVec(head, 0, c.vocab_size, hidden, h);
    result.logits.emplace_back(logits.begin(), logits.end());
  }
  return result;
}

double MaxRelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]) /
                                std::max(1.0, std::abs(static_cast<double>(b[i]))));
  }
  return worst;
}

}  // namespace tandem::testing
