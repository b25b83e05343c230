// Single-request autoregressive generation in-process: prompt -> streamed text. Backs
// `tandem generate`; the services run the same model through the worker actor instead.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/diffusion_sampler.h"
#include "worker/decoding/modes.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"
#include "worker/sampling/logit_adjust.h"
#include "worker/sampling/sampling.h"
#include "worker/sampling/stop.h"
#include "worker/template/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {

class DFlashModel;
struct LoadedModel;

struct GenerateOptions {
  std::string mode = "ar";
  ModeOptions mode_options;
  int max_tokens = 128;
  SamplingParams sampling;
  // Penalties, logit bias and min_tokens, as the API's, checked like the engine checks a
  // request's. min_tokens holds back the stop tokens (min_tokens_ban is filled in with them);
  // unlike the API's, it does not hold back stop strings.
  LogitAdjust adjust;
  std::vector<std::string> stop_strings;
  std::vector<int32_t> extra_stop_token_ids;  // besides the model's EOS ids
  bool chat = false;  // the prompt is a user turn: the chat template (or ChatML) wraps it
  // The `spec` mode's drafter (same tokenizer as the target; may be the target itself). Not
  // owned; must outlive the call.
  LoadedModel* drafter = nullptr;
  // `spec` with a DFlash drafter loaded for this target (used instead of `drafter` when set).
  // Not owned; must outlive the call.
  const DFlashModel* dflash_drafter = nullptr;
};

struct GenerateResult {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> tokens;  // committed completion tokens (a stop token included)
  std::string text;             // emitted text (stop strings and stop tokens excluded)
  FinishReason finish = FinishReason::kNone;
  std::string mode;
  bool lossless = true;
  int forwards = 0;  // target forwards, prefill included
  int drafted = 0;   // draft tokens proposed
  int accepted = 0;  // draft tokens accepted
  int steps_with_drafts = 0;
  int drafter_forwards = 0;  // forwards of a separate drafter model (spec)
  double seconds = 0;        // prefill and decode
  // Until the first completion token arrived (the prompt's forward and that token's draw): the
  // rest of `seconds` is decode, seconds - first_token_seconds for tokens.size() - 1 tokens.
  double first_token_seconds = 0;
};

// A loaded model with its tokenizer and chat template.
struct LoadedModel {
  std::string dir;
  std::unique_ptr<Transformer> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ChatTemplate> chat_template;  // null: the checkpoint has none (ChatML)
  std::unique_ptr<DiffusionSampler> sampler;    // <dir>/sampler/ when present (diffusion)
};

// Loads <dir>/config.json, weights, tokenizer.json, the chat template (chat_template.jinja or
// tokenizer_config.json's) and the diffusion mode's trained sampler (<dir>/sampler/, when
// there), and moves the model to `device` (Transformer::UseDevice). `merge_lora`, when set, is
// a PEFT adapter directory merged into the weights (Transformer::Load): a fine-tuned variant of
// the model, such as the pcLLM adapter `jacobi` decodes faster.
absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir, const DeviceOptions& device = {},
                                         const std::string& merge_lora = "");

// The prompt text of a chat: the model's chat template with a generation prompt, or ChatML
// when it has none; `tools` (a JSON array, "" for none) as worker/template/chat_tools.h says.
// InvalidArgument when the template refuses the conversation.
absl::StatusOr<std::string> ApplyChat(const LoadedModel& model, std::span<const ChatTurn> turns,
                                      std::string_view tools = "");

// Loads the PEFT LoRA adapter in `dir` (adapter_config.json, adapter_model.safetensors) onto
// `model`. Modes run it only where they gate it (ModeOptions::lora_drafts).
absl::Status AttachLoraAdapter(LoadedModel& model, const std::string& dir);

class LocalGenerator {
 public:
  // `on_text` receives each emitted text delta as soon as it is safe to show.
  using TextSink = std::function<void(std::string_view)>;

  explicit LocalGenerator(LoadedModel* model);

  // Empty prompts, prompts that leave no room for one new token within the model's context,
  // max_tokens <= 0 and unknown modes are InvalidArgument.
  absl::StatusOr<GenerateResult> Generate(const std::string& prompt, const GenerateOptions& options,
                                          const TextSink& on_text = nullptr);

 private:
  LoadedModel* model_;
};

}  // namespace tandem
