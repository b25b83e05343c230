// The diffusion mode's trained sampler (NLD §3.2, App. A): a small bidirectional transformer
// over the current block that predicts, for each masked slot, the probability that its top-1
// prediction is already the token serial confidence decoding would end with there. `diffusion`
// then commits the slots whose probability reaches a threshold (at least the most probable one)
// instead of thresholding the model's confidence. It reads host-side logits rows, so it runs
// beside every backend.
//
// Folder <model>/sampler/ (tools/train/sampler.py writes it):
//   config.json        {"format": "tandem-diffusion-sampler", "version": 1, "vocab_size",
//                        "mask_token_id", "token_feature_dims" D, "hidden" d, "layers", "heads",
//                        "ffn", "max_block", "layer_norm_eps", "threshold" (suggested)}
//   model.safetensors  fp32: token_features [vocab, D] (PCA of the model's token embeddings),
//                      input.{weight [d, F], bias}, position [max_block, d],
//                      layers.L.norm1.{weight,bias}, layers.L.attn.qkv.{weight [3d, d], bias},
//                      layers.L.attn.out.{weight [d, d], bias}, layers.L.norm2.{weight,bias},
//                      layers.L.mlp.up.{weight [ffn, d], bias}, layers.L.mlp.down.{weight, bias},
//                      norm.{weight,bias}, head.{weight [1, d], bias [1]}
//
// Features of slot i of a block of B slots (F = 10 + D):
//   [0]        1 when the slot is masked
//   [1..6]     masked: p1, p2, p3 (top-3 probabilities, <|mask|> excluded), p1 - p2,
//              p1 + p2 + p3, entropy / ln(vocab - 1); unmasked: 0
//   [7..7+D)   token_features of the slot's top-1 prediction (masked) or of its token
//   [7+D]      i / B;  [8+D] B / max_block;  [9+D] masked slots / B
// The network: x = input(f) + position[i]; per layer (pre-norm) x += out(attention over every
// slot of the block, heads of d / heads), x += down(relu(up(norm2(x)))); then
// sigmoid(head(norm(x))).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

struct ModelConfig;

// What the sampler reads from a masked slot's logits row.
struct SlotSummary {
  int32_t top[3] = {-1, -1, -1};  // the three most probable tokens, <|mask|> excluded
  float prob[3] = {0, 0, 0};
  float entropy = 0;  // nats, over the row without <|mask|>
};

SlotSummary SummarizeSlot(std::span<const float> logits, int32_t mask_token);

class DiffusionSampler {
 public:
  // Loads <dir>/config.json and <dir>/model.safetensors for a model of `model` (its vocabulary
  // and <|mask|> must match). InvalidArgument naming the file for anything malformed.
  static absl::StatusOr<std::unique_ptr<DiffusionSampler>> Load(const std::string& dir,
                                                                const ModelConfig& model);
  ~DiffusionSampler();

  // Per slot of `block` (masked slots hold <|mask|>), the probability that the slot's top-1
  // prediction is final; `masked` has one summary per masked slot, in slot order. Entries of
  // unmasked slots are 0. InvalidArgument when the block is longer than max_block() or the
  // summaries do not match its masked slots.
  absl::StatusOr<std::vector<float>> Score(std::span<const int32_t> block,
                                           std::span<const SlotSummary> masked) const;

  // The input features of every slot (the layout above), [block.size(), features()].
  absl::StatusOr<std::vector<float>> Features(std::span<const int32_t> block,
                                              std::span<const SlotSummary> masked) const;

  int max_block() const;
  int features() const;
  float suggested_threshold() const;

 private:
  struct Weights;
  explicit DiffusionSampler(std::unique_ptr<Weights> w);
  std::unique_ptr<Weights> w_;
};

}  // namespace tandem
