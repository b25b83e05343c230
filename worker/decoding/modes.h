// Creating decoding modes by name.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/simsd.h"
#include "worker/model/checkpoint/model_config.h"

namespace tandem {

class DFlashModel;
class DiffusionSampler;
class Drafter;
class Transformer;

// Knobs of every mode; each mode reads its own and ignores the rest.
struct ModeOptions {
  int jacobi_block_size = 16;       // n: tokens refined per Jacobi iteration
  int jacobi_blocks = 1;            // K: blocks kept in flight (multi-block decoding)
  float jacobi_spawn_ratio = 0.5f;  // r: a new block spawns when a block has >= ceil(r n) accepted
  int jacobi_pool_size = 64;        // n-grams kept for rejection recycling (0 = off)
  int jacobi_candidates = 2;        // recycled candidates verified per iteration
  bool jacobi_prompt_lookup = false;  // one more candidate by prompt lookup (not pcLLM)
  // self_spec, self_spec_quadratic and diffusion need a checkpoint with a <|mask|> token and a
  // block size. self_spec_quadratic reads self_spec_draft_len as its masks per group.
  int self_spec_draft_len = 0;       // k: masks per draft forward; 0 = the model's block size
  float quadratic_lambda = 0.0f;     // self_spec_quadratic: diffusion verifier weight, NLD App. C
  int diffusion_block_size = 0;      // tokens per denoised block; 0 = the model's block size
  float diffusion_threshold = 0.9f;  // unmask slots whose top-1 probability reaches this
  // > 0: diffusion unmasks by the model's trained sampler instead (slots whose sampler
  // probability reaches this; DiffusionOptions::sampler); 0: by diffusion_threshold.
  float diffusion_sampler = 0.0f;
  // nsp (SDLM next sequence prediction) needs a <|mask|> token and a block size too.
  int nsp_block = 0;                     // D: tokens predicted per step; 0 = the model's
  float nsp_tau = 0.9f;                  // keep the longest prefix with confidence product >= tau
  std::string nsp_confidence = "logit";  // "logit" (eq. 8) or "entropy" (eq. 9)
  bool nsp_verify = false;               // self-speculative AR verification: lossless
  // The verified variant with drafting and verification in one forward per step (the quadratic
  // layout of NLD §3.4 over SDLM blocks, self_spec_quadratic.h): lossless, whatever nsp_verify.
  bool nsp_quadratic = false;
  int spec_gamma = 4;  // spec: draft tokens verified per step (0 = AR steps)
  // simsd (SimSD on a block-diffusion target) reads diffusion_block_size for its block and
  // diffusion_threshold for the steps that complete a block, and drafts with spec_drafter.
  int simsd_gamma = 0;  // γ: drafts verified per step; 0 = the block size (the paper's choice)
  // isd (I-DLM introspective strided decoding) needs a <|mask|> token.
  int isd_stride = 4;                // N: tokens proposed per step (1 exact + N - 1 drafts)
  float isd_tau = 0.0f;              // relaxed acceptance (1 + tau) p / q; 0 = lossless
  bool isd_argmax_proposals = true;  // drafts = argmax q (I-DLM's choice) or draws from q
  // isd (R-ISD), self_spec and self_spec_quadratic (NLD's LoRA drafter): gate the model's LoRA
  // adapter (Transformer::SetLoraAdapter) on the <|mask|> draft rows only; verification keeps
  // the base weights, so all three stay lossless. The model must have an adapter (its forward fails
  // if not).
  bool lora_drafts = false;
  // spec: the drafter model (same vocabulary as the target; may be the target itself). Not
  // owned; must outlive the mode, which drafts with a KV cache of its own.
  Transformer* spec_drafter = nullptr;
  // spec: a DFlash drafter conditioned on the target's hidden states, used instead of
  // spec_drafter when set. Not owned; must outlive the mode.
  const DFlashModel* spec_dflash = nullptr;
  // diffusion with diffusion_sampler > 0: the model's trained sampler (its folder's sampler/,
  // LoadedModel::sampler). Not owned; must outlive the mode.
  const DiffusionSampler* sampler_model = nullptr;
};

// Upper bounds on what a request may ask of a mode (every client-controlled size). The block-like
// options (spec_gamma, jacobi_block_size, self_spec_draft_len, diffusion_block_size, nsp_block,
// isd_stride, simsd_gamma) are never more than the model's context, and the ones the requested
// mode reads at most `max_block` tokens; a mode's widest step (self_spec_quadratic's and
// quadratic nsp's k (k + 2) tokens) fits `max_step_tokens`.
struct ModeLimits {
  int max_block = 64;          // a verifier's --max-mode-block
  int max_step_tokens = 1024;  // the engine's step budget (EngineOptions::max_batch_tokens)
};

// Every field of `options` within its range and `limits` (0 keeps a field's default where 0
// means "the model's"), for mode `mode` on a model of `config`: InvalidArgument naming the field,
// the bound and the value. A request's options are checked with this before a mode is made, so
// no mode ever plans a step it was not meant to.
absl::Status CheckModeOptions(std::string_view mode, const ModeOptions& options,
                              const ModelConfig& config, const ModeLimits& limits);

// Names of the modes this build implements, in the order `tandem --help` lists them.
std::vector<std::string> ImplementedModes();

// The `simsd` options for a target (its block size and <|mask|>, γ resolved); InvalidArgument
// when the target has no diffusion pathway or the options are out of range.
absl::StatusOr<SimSdOptions> MakeSimSdOptions(const ModeOptions& options,
                                              const ModelConfig& config);

// How a mode drafts, for a driver that supplies the drafter itself (the engine's drafter
// sessions): `uses_drafter` is false for modes without a separate drafter.
struct DraftingNeeds {
  bool uses_drafter = false;
  int gamma = 0;             // the most drafts a step verifies
  bool fixed_gamma = false;  // the mode's layout fixes γ (no adaptive choice per step)
  int block_size = 0;        // > 0: block drafts of this many slots (Drafter::DraftBlock)
};

// Whether mode `name` drafts with a separate drafter (cheap, never fails).
bool UsesDrafter(std::string_view name);
// The drafting needs of mode `name` under `options`; InvalidArgument when its options are out of
// range (as CreateMode would say).
absl::StatusOr<DraftingNeeds> DraftingNeedsOf(std::string_view name, const ModeOptions& options,
                                              const ModelConfig& config);
// A mode that UsesDrafter, drafting with `drafter` instead of a drafter model of the options.
absl::StatusOr<std::unique_ptr<DecodingMode>> CreateModeWithDrafter(
    std::string_view name, const ModeOptions& options, const ModelConfig& config,
    std::unique_ptr<Drafter> drafter);

// InvalidArgument for an unknown mode or options/sampling the mode cannot honour.
absl::StatusOr<std::unique_ptr<DecodingMode>> CreateMode(std::string_view name,
                                                         const ModeOptions& options,
                                                         const ModelConfig& config,
                                                         const SamplingParams& sampling);

}  // namespace tandem
