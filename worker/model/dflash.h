// A DFlash-style block drafter conditioned on the target's hidden states, on the CPU in fp32 or,
// after UseDevice({Device::kCuda}), on a GPU in bf16 (worker/model/cuda/cuda_dflash.h).
//
// Context: for each committed token t the target's residual stream after the layers
// config.target_layer_ids (worker/model/extend.h taps: layer l = after l decoder layers, 0 =
// embeddings) is concatenated and fused into one context feature
//     c_t = hidden_norm(fc(concat_l h_l[t]))                    fc: [H, k * H], no bias
// Every drafter layer projects the SAME c_t (no input_layernorm) to context keys and values,
// k_norm and RoPE at position t applied to the keys. They depend on c_t alone, so they are
// computed once per committed token and kept in a DFlashContext.
//
// Block: positions p .. p + B - 1 (p = context length) hold a >= 1 clean tokens and B - a mask
// tokens, embedded with the TARGET's embed_tokens. Each layer is a Qwen3 block whose queries
// attend to every context key and every block key (bidirectional inside the block); then the
// final norm and the target's lm_head. Slot j's logits predict the token at position p + j; the
// drafts are the argmax of slots a .. B - 1.
//
// Thread-safety: apart from UseDevice the model is immutable after creation; the other methods
// only write the context passed in and per-call buffers (on a device: the backend's, under its
// lock), so several threads may draft with distinct contexts. UseDevice must not run
// concurrently with anything else.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint/model_config.h"
#include "worker/model/device.h"
#include "worker/model/dflash_backend.h"
#include "worker/model/transformer.h"
#include "worker/model/weights.h"

namespace tandem {

// The "architectures" entry of a DFlash drafter's config.json.
inline constexpr char kDFlashArchitecture[] = "TandemDFlashDrafter";

struct DFlashConfig {
  ModelConfig model;   // the drafter's own Qwen3 layers (num_layers, heads, rope, eps)
  int block_size = 0;  // B: slots of one drafted block
  int mask_token_id = -1;
  std::vector<int32_t> target_layer_ids;  // target taps concatenated into fc's input, in order
  std::string target;                     // name of the target the drafter was trained for
  int max_anchor = 1;                     // A: most clean tokens a block may start with
};

// Drafter weights; embed_tokens and lm_head are the target's.
struct DFlashWeights {
  std::vector<float> fc;           // [H, k * H], k = target_layer_ids.size(); empty when packed
  std::vector<float> hidden_norm;  // [H]
  std::vector<float> final_norm;   // [H]
  // Qwen3 layers in the target model's layout (q/k/v and gate/up fused; no biases).
  std::vector<LayerWeights> layers;

  // Filled by PackForCpu (DFlashModel::Create runs it with its target's weight type): fc and
  // each layer's products packed for the CPU kernels (kernels/cpu/packed_gemm.h), their
  // row-major vectors released, as ModelWeights::PackForCpu does for the target.
  kernels::cpu::PackedMatrix packed_fc;
  std::vector<PackedLayer> packed_layers;

  bool packed() const { return !packed_fc.empty(); }
  void PackForCpu(kernels::cpu::WeightType type);
  // Row-major copies, in either state (for a device upload, or to check shapes).
  std::vector<float> FcRowMajor() const;
  LayerWeights RowMajorLayer(int i) const;
  DFlashWeights Unpacked() const;
};

// Per-session context K/V: one row per committed token, position = row index. The rows live in
// storage made and read only by the backend the model ran on when the first row was appended
// (fp32 host vectors on the CPU, see worker/model/cpu_dflash.h). An empty context (new, or
// truncated to 0) follows the model to its current device; a non-empty one elsewhere is refused.
// Move-only; a context on a device must not outlive the process's use of that device.
class DFlashContext {
 public:
  DFlashContext() = default;
  DFlashContext(DFlashContext&&) = default;
  DFlashContext& operator=(DFlashContext&&) = default;

  int length() const { return length_; }
  // Whether the rows are in a device (not the CPU) backend's storage.
  bool on_device() const { return storage_ != nullptr && on_device_; }

 private:
  friend class DFlashModel;

  int length_ = 0;
  std::unique_ptr<DFlashContextStorage> storage_;  // null until the first append binds it
  bool on_device_ = false;                         // storage_ is a device backend's
};

// Whether <dir>/config.json names kDFlashArchitecture (false when it cannot be read).
bool IsDFlashCheckpoint(const std::string& dir);

// Parses a DFlash config.json; InvalidArgument names the missing or bad field.
absl::StatusOr<DFlashConfig> ParseDFlashConfig(const std::string& json_text,
                                               const std::string& origin = "config.json");

// Random weights (normal with `stddev`, norms around 1) for tests.
DFlashWeights RandomDFlashWeights(const DFlashConfig& config, uint64_t seed, float stddev = 0.02f);

class DFlashModel {
 public:
  // Loads <dir>/config.json and model.safetensors and checks them against `target`, which is
  // not owned and must outlive the model (its embeddings and LM head are used).
  static absl::StatusOr<std::unique_ptr<DFlashModel>> Load(const std::string& dir,
                                                           const Transformer* target);
  // InvalidArgument (naming the field or weight) when the config or the weight shapes do not
  // fit `target`.
  static absl::StatusOr<std::unique_ptr<DFlashModel>> Create(DFlashConfig config,
                                                             DFlashWeights weights,
                                                             const Transformer* target);

  ~DFlashModel();

  // Moves AppendContext, BlockLogits and Draft to `options.device`. kCuda uploads the drafter's
  // weights in bf16 and keeps the contexts' K/V on the GPU; it reuses the target's device
  // embeddings and LM head when the target runs on CUDA (the target must then stay there while
  // this model does), else uploads its own. Errors as CheckDeviceAvailable, FailedPrecondition
  // in a build without CUDA. Contexts with rows on the old device are refused afterwards.
  absl::Status UseDevice(const DeviceOptions& options);
  Device device() const { return device_; }

  const DFlashConfig& config() const { return config_; }
  const DFlashWeights& weights() const { return weights_; }
  const Transformer& target() const { return *target_; }
  int hidden_size() const { return config_.model.hidden_size; }

  // Appends `n` committed tokens to `context` (positions context.length() ..). `hidden`:
  // [target_layer_ids.size(), n, hidden_size], the ExtendOutput::hidden layout of the taps.
  absl::Status AppendContext(DFlashContext& context, std::span<const float> hidden, int n) const;
  // The same from rows already on the GPU (the model on kCuda, else FailedPrecondition):
  // `rows` is bf16 [target_layer_ids.size(), n, hidden_size] in device memory, valid once the
  // work queued on `stream` (a cudaStream_t) so far has run; the reads are ordered after that
  // work and before work queued on `stream` after this call, so the caller may reuse the rows in
  // stream order. Returns without waiting for the GPU.
  absl::Status AppendContextDevice(DFlashContext& context, const void* rows, int n,
                                   CUstream_st* stream) const;
  // Drops the context rows from `length` on (on any device: only the length changes there).
  static void TruncateContext(DFlashContext& context, int length);
  // The context's rows as fp32 (downloaded when on a device): keys and values
  // [layers][length, kv_heads * head_dim], RoPE applied to the keys.
  absl::Status ReadContext(const DFlashContext& context, std::vector<std::vector<float>>& keys,
                           std::vector<std::vector<float>>& values) const;

  // Logits [block_size, vocab] of the block whose first tokens are `clean` (1 .. block_size of
  // them; the rest are masks) at positions context.length() ... FailedPrecondition when the
  // context's rows are on another device. On CUDA the logits are downloaded.
  absl::StatusOr<std::vector<float>> BlockLogits(const DFlashContext& context,
                                                 std::span<const int32_t> clean) const;
  // The greedy drafts: argmax of slots clean.size() .. block_size - 1 (on CUDA taken on the
  // GPU; only the token ids are downloaded).
  absl::StatusOr<std::vector<int32_t>> Draft(const DFlashContext& context,
                                             std::span<const int32_t> clean) const;

 private:
  DFlashModel(DFlashConfig config, DFlashWeights weights, const Transformer* target);

  // Whether the context's storage is the current backend's.
  bool Holds(const DFlashContext& context) const;
  // Where a context this model does not hold has its rows, for messages.
  static std::string Where(const DFlashContext& context);
  // Binds an empty context to the current backend; OK when the rows are already there,
  // FailedPrecondition when they are on another device.
  absl::Status Bind(DFlashContext& context) const;
  // Checks `clean` and the context and returns the block's tokens (clean, then masks).
  absl::StatusOr<std::vector<int32_t>> BlockTokens(const DFlashContext& context,
                                                   std::span<const int32_t> clean) const;

  DFlashConfig config_;
  DFlashWeights weights_;
  const Transformer* target_;
  Device device_ = Device::kCpu;
  std::unique_ptr<DFlashBackend> backend_;  // CpuDFlash unless UseDevice attached another
};

}  // namespace tandem
