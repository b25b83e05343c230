// ComputeRope (declared in model_config.h).
//
// The tables must agree with transformers' modeling_rope_utils, which computes them in fp32
// torch ops. Each step below keeps torch's operation order and fp32 rounding (e.g. `c / t` on a
// tensor is `t.reciprocal() * c`), so the results match to within the last-ulp differences of
// torch's vectorised pow.
#include <algorithm>
#include <cmath>
#include <numbers>

#include "worker/model/checkpoint/model_config.h"

namespace tandem {
namespace {

// base ** (arange(0, dim, 2).float() / dim) in fp32. `base` is rounded to fp32 first, as torch
// does when a Python float meets an fp32 tensor.
std::vector<float> PositionFrequencies(double base, int dim) {
  const float base_f = static_cast<float>(base);
  std::vector<float> powers(static_cast<size_t>(dim / 2));
  for (int i = 0; i < dim / 2; ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(dim);
    powers[static_cast<size_t>(i)] =
        static_cast<float>(std::pow(static_cast<double>(base_f), exponent));
  }
  return powers;
}

// The default RoPE inverse frequencies [dim / 2].
std::vector<float> DefaultInvFreq(double base, int dim) {
  std::vector<float> inv_freq = PositionFrequencies(base, dim);
  for (float& value : inv_freq) value = 1.0f / value;
  return inv_freq;
}

double YarnMscale(double scale, double mscale) {
  return scale <= 1.0 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

RopeTables Yarn(const ModelConfig& config, const RopeScaling& s) {
  const int dim = config.head_dim;
  const double base = config.rope_theta;
  const double factor = s.factor;
  RopeTables tables;
  if (s.attention_factor.has_value()) {
    tables.attention_scaling = *s.attention_factor;
  } else if (s.mscale.value_or(0.0f) != 0.0f && s.mscale_all_dim.value_or(0.0f) != 0.0f) {
    tables.attention_scaling =
        static_cast<float>(YarnMscale(factor, *s.mscale) / YarnMscale(factor, *s.mscale_all_dim));
  } else {
    tables.attention_scaling = static_cast<float>(YarnMscale(factor, 1.0));
  }

  // Dimension index at which a frequency completes `rotations` turns over the original context.
  const auto correction_dim = [&](double rotations) {
    return (dim *
            std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast);
  double high = correction_dim(s.beta_slow);
  if (s.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // avoid a zero-width ramp
  const float low_f = static_cast<float>(low);
  const float width_f = static_cast<float>(high - low);

  // Frequencies below the ramp are interpolated (divided by factor), above it extrapolated
  // (kept), blended linearly across it.
  const std::vector<float> pos_freqs = PositionFrequencies(base, dim);
  tables.inv_freq.resize(pos_freqs.size());
  const float factor_f = static_cast<float>(factor);
  for (size_t i = 0; i < pos_freqs.size(); ++i) {
    const float pos_freq = pos_freqs[i];
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (factor_f * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low_f) / width_f, 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    tables.inv_freq[i] =
        interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return tables;
}

RopeTables Llama3(const ModelConfig& config, const RopeScaling& s) {
  RopeTables tables;
  tables.inv_freq = DefaultInvFreq(config.rope_theta, config.head_dim);
  const float factor = s.factor;
  const float old_context = static_cast<float>(s.original_max_position_embeddings);
  const float low_wavelen = static_cast<float>(
      static_cast<double>(s.original_max_position_embeddings) / s.low_freq_factor);
  const float high_wavelen = static_cast<float>(
      static_cast<double>(s.original_max_position_embeddings) / s.high_freq_factor);
  const float smooth_width = static_cast<float>(static_cast<double>(s.high_freq_factor) -
                                                static_cast<double>(s.low_freq_factor));
  const float two_pi = static_cast<float>(2 * std::numbers::pi);
  for (float& inv : tables.inv_freq) {
    const float wavelen = (1.0f / inv) * two_pi;
    // Long wavelengths are interpolated by `factor`, short ones kept, the band between blended.
    const float scaled = wavelen > low_wavelen ? inv / factor : inv;
    const float smooth = ((1.0f / wavelen) * old_context - s.low_freq_factor) / smooth_width;
    const float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
    const bool medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
    inv = medium ? smoothed : scaled;
  }
  return tables;
}

}  // namespace

RopeTables ComputeRope(const ModelConfig& config, int seq_len) {
  const RopeScaling& s = config.rope_scaling;
  const int dim = config.head_dim;
  switch (s.kind) {
    case RopeScaling::Kind::kNone:
      return RopeTables{DefaultInvFreq(config.rope_theta, dim), 1.0f};
    case RopeScaling::Kind::kLinear: {
      RopeTables tables{DefaultInvFreq(config.rope_theta, dim), 1.0f};
      for (float& inv : tables.inv_freq) inv /= s.factor;
      return tables;
    }
    case RopeScaling::Kind::kDynamic: {
      // NTK-aware: the base grows once the sequence outgrows max_position_embeddings; below
      // that (and for seq_len 0) the default frequencies apply.
      const double max_positions = config.max_position_embeddings;
      const double len = std::max(static_cast<double>(seq_len), max_positions);
      const double factor = s.factor;
      const double base = config.rope_theta * std::pow(factor * len / max_positions - (factor - 1),
                                                       static_cast<double>(dim) / (dim - 2));
      return RopeTables{DefaultInvFreq(base, dim), 1.0f};
    }
    case RopeScaling::Kind::kYarn:
      return Yarn(config, s);
    case RopeScaling::Kind::kLlama3:
      return Llama3(config, s);
  }
  return RopeTables{DefaultInvFreq(config.rope_theta, dim), 1.0f};
}

}  // namespace tandem
