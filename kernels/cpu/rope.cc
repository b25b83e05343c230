#include "kernels/cpu/rope.h"

#include <cmath>
#include <vector>

namespace tandem::kernels::cpu {

bool RopeCheck(const RopeParams& p) {
  return p.x != nullptr && p.positions != nullptr && p.inv_freq != nullptr && p.tokens >= 0 &&
         p.heads > 0 && p.head_dim > 0 && p.head_dim % 2 == 0 &&
         p.row_stride >= p.heads * p.head_dim;
}

void RopeInvoke(const RopeParams& p) {
  const int half = p.head_dim / 2;
  std::vector<float> cos_v(half), sin_v(half);
  for (int t = 0; t < p.tokens; ++t) {
    // Angles in fp32 like the reference implementation (position * inv_freq, then cos/sin).
    const float pos = static_cast<float>(p.positions[t]);
    for (int i = 0; i < half; ++i) {
      const float angle = pos * p.inv_freq[i];
      cos_v[i] = std::cos(angle) * p.attention_scaling;
      sin_v[i] = std::sin(angle) * p.attention_scaling;
    }
    float* row = p.x + static_cast<size_t>(t) * p.row_stride;
    for (int h = 0; h < p.heads; ++h) {
      float* v = row + static_cast<size_t>(h) * p.head_dim;
      for (int i = 0; i < half; ++i) {
        const float a = v[i];
        const float b = v[i + half];
        v[i] = a * cos_v[i] - b * sin_v[i];
        v[i + half] = b * cos_v[i] + a * sin_v[i];
      }
    }
  }
}

}  // namespace tandem::kernels::cpu
