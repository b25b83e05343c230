// Rotary position embedding with explicit (possibly repeated) positions, "rotate half" layout
// as in Hugging Face Llama/Qwen: pairs are (i, i + head_dim / 2).
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

struct RopeParams {
  float* x = nullptr;                  // [tokens, heads, head_dim], rotated in place
  const int32_t* positions = nullptr;  // [tokens]
  const float* inv_freq = nullptr;     // [head_dim / 2]
  float attention_scaling = 1.0f;      // multiplies cos and sin (YaRN / LongRoPE)
  int tokens = 0;
  int heads = 0;
  int head_dim = 0;    // even
  int row_stride = 0;  // floats between consecutive tokens (>= heads * head_dim)
};

bool RopeCheck(const RopeParams& p);
void RopeInvoke(const RopeParams& p);

}  // namespace tandem::kernels::cpu
