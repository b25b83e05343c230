// The one forward primitive (see docs/ARCHITECTURE.md): a batch of extends, each one sequence's
// slice of a batched forward.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "worker/kv/kv_cache.h"
#include "worker/sampling/sampling.h"

namespace tandem {

// Which of an extend's NEW tokens each new token attends to. The sequence's committed KV is
// always visible; a new token does not automatically see itself (kExplicit must set the
// diagonal if it should).
struct Visibility {
  enum class Kind : uint8_t {
    kCausal,    // i sees j <= i
    kFull,      // i sees every new token
    kBlock,     // i sees j when j / block_size <= i / block_size (block-causal)
    kExplicit,  // bits
  };
  Kind kind = Kind::kCausal;
  int block_size = 0;
  int n = 0;                   // kExplicit: number of new tokens the bits describe
  std::vector<uint64_t> bits;  // kExplicit: [n, Words(n)] rows; bit j of row i: i sees j

  static Visibility Causal() { return {}; }
  static Visibility Full() { return {.kind = Kind::kFull}; }
  static Visibility Block(int block_size) {
    return {.kind = Kind::kBlock, .block_size = block_size};
  }
  // All-false explicit mask over n tokens; fill with Allow().
  static Visibility Explicit(int n);

  static int Words(int n) { return (n + 63) / 64; }
  void Allow(int i, int j) {
    bits[static_cast<size_t>(i) * Words(n) + j / 64] |= uint64_t{1} << (j % 64);
  }
  bool Sees(int i, int j) const;
  // Writes the [n, Words(n)] bit rows for `n` new tokens.
  void ToBits(int n, std::vector<uint64_t>* out) const;
};

// A token the model samples from one output row on its own device: exactly the arguments of
// worker/sampling SampleToken (the settings and the draw's coordinates). On the CPU the model
// calls SampleToken on the row's logits; the CUDA backend runs the device sampler on the
// device logits (same Philox draw; see kernels/cuda/sampling.cuh for how close it is).
// With a draft the row verifies it instead: exactly worker/sampling VerifyDraft(row, draft,
// params, position), whose kAccept / kResample draws at `position` replace the sample's
// (`purpose` is ignored); the CUDA backend runs kernels/cuda/verify.cuh.
struct SampleRequest {
  SamplingParams params;
  uint64_t position = 0;  // sequence index of the sampled token (the draw's RNG counter)
  RngPurpose purpose = RngPurpose::kSample;
  // -1: a plain sample. Otherwise a draft token in [0, vocab) proposed for `position`: the
  // row's token is the draft when accepted, else the resampled correction.
  int32_t draft = -1;
};

struct Extend {
  SeqId seq = 0;
  std::span<const int32_t> tokens;     // [n] new tokens: data, drafts, masks
  std::span<const int32_t> positions;  // [n] RoPE positions; may repeat
  Visibility visible;
  std::span<const int32_t> outputs;        // indices of new tokens whose logits are returned
  std::span<const uint8_t> lora_gate;      // [n] per-token adapter on/off; empty = off
  std::span<const int32_t> hidden_layers;  // hidden-state taps, each in [0, num_layers]
  // [outputs.size()] or empty: a token sampled from each output row (ExtendOutput::tokens).
  std::span<const SampleRequest> samples;
  // Whether the output rows' logits come back. A caller that needs only sampled tokens sets
  // this false: a device backend then downloads token ids alone.
  bool return_logits = true;
};

struct ExtendOutput {
  std::vector<float> logits;    // [outputs.size(), vocab_size]; empty unless return_logits
  std::vector<int32_t> tokens;  // [outputs.size()] sampled tokens; empty without samples
  // [outputs.size()] with samples: 1 when the row's draft was accepted (always 1 for a plain
  // sample), 0 when its token is a correction; empty without samples.
  std::vector<uint8_t> accepted;
  // [hidden_layers.size(), n, hidden_size]: residual stream after that many layers
  // (0 = embeddings; num_layers = before the final norm).
  std::vector<float> hidden;
};

}  // namespace tandem
