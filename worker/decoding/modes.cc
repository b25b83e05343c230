#include "worker/decoding/modes.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/dflash_drafter.h"
#include "worker/decoding/diffusion.h"
#include "worker/decoding/diffusion_drafter.h"
#include "worker/decoding/isd.h"
#include "worker/decoding/jacobi.h"
#include "worker/decoding/nsp.h"
#include "worker/decoding/self_spec.h"
#include "worker/decoding/self_spec_quadratic.h"
#include "worker/decoding/simsd.h"
#include "worker/decoding/spec.h"
#include "worker/model/transformer.h"

namespace tandem {

namespace {

// Drafter KV capacity when neither model states a context length.
constexpr int kDefaultDrafterCapacity = 8192;

// The <|mask|> id and block size that the diffusion pathway of a tri-mode checkpoint needs.
absl::Status CheckDiffusionPathway(std::string_view mode, const ModelConfig& config,
                                   int block_option) {
  if (!config.diffusion.mask_token_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mode ", std::string(mode), " needs a checkpoint with a <|mask|> token: config.json has ",
        "no mask_token_id and tokenizer.json no <|mask|>; use a block-diffusion model"));
  }
  if (block_option <= 0 && config.diffusion.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("mode ", std::string(mode),
                                                   " needs a block size: config.json has no "
                                                   "block_size; pass one in the mode options"));
  }
  return absl::OkStatus();
}

// KV capacity of an in-process drafter: its cache follows one sequence of the target, so the
// smaller of the two contexts bounds it.
int DrafterCapacity(const ModelConfig& target, const ModelConfig& drafter) {
  int capacity = target.max_position_embeddings;
  if (capacity <= 0 ||
      (drafter.max_position_embeddings > 0 && drafter.max_position_embeddings < capacity)) {
    capacity = drafter.max_position_embeddings;
  }
  return capacity > 0 ? capacity : kDefaultDrafterCapacity;
}

}  // namespace

absl::StatusOr<SimSdOptions> MakeSimSdOptions(const ModeOptions& options,
                                              const ModelConfig& config) {
  TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway("simsd", config, options.diffusion_block_size));
  SimSdOptions simsd{.block_size = options.diffusion_block_size > 0 ? options.diffusion_block_size
                                                                    : config.diffusion.block_size,
                     .mask_token = *config.diffusion.mask_token_id,
                     .threshold = options.diffusion_threshold,
                     .eos_tokens = {config.eos_token_ids.begin(), config.eos_token_ids.end()}};
  simsd.gamma = options.simsd_gamma > 0 ? options.simsd_gamma : simsd.block_size;
  TANDEM_RETURN_IF_ERROR(ValidateSimSdOptions(simsd, config.vocab_size));
  return simsd;
}

absl::Status CheckModeOptions(std::string_view mode, const ModeOptions& o,
                              const ModelConfig& config, const ModeLimits& limits) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  // Every block-like option is at most the model's context; the ones `mode` reads are at most
  // `max_block` too (an option the mode ignores is never planned with, and the verifier's own
  // defaults for other modes may be wider than a tight --max-mode-block).
  const int context =
      config.max_position_embeddings > 0 ? config.max_position_embeddings : (1 << 20);
  const int block = std::min(limits.max_block, context);
  auto check_block = [&](const char* field, int value, int lo,
                         std::initializer_list<const char*> readers) -> absl::Status {
    const bool read = std::any_of(readers.begin(), readers.end(),
                                  [&](const char* reader) { return mode == reader; });
    const int hi = read ? std::max(lo, block) : context;
    if (value >= lo && value <= hi) return absl::OkStatus();
    return bad(field, " must be in [", lo, ", ", hi, "]", lo == 0 ? " (0 = the default)" : "",
               read ? absl::StrCat(" for mode ", std::string(mode),
                                   " (this verifier's --max-mode-block and the model's context)")
                    : std::string(" (the model's context)"),
               ", got ", value);
  };
  auto check_unit = [&](const char* field, float value) -> absl::Status {
    if (value >= 0.0f && value <= 1.0f) return absl::OkStatus();  // false for NaN
    return bad(field, " must be in [0, 1], got ", value);
  };
  TANDEM_RETURN_IF_ERROR(check_block("spec_gamma", o.spec_gamma, 0, {"spec"}));
  if (o.spec_gamma > kMaxSpecGamma) {
    return bad("spec_gamma must be in [0, ", kMaxSpecGamma, "], got ", o.spec_gamma);
  }
  TANDEM_RETURN_IF_ERROR(check_block("jacobi_block_size", o.jacobi_block_size, 1, {"jacobi"}));
  TANDEM_RETURN_IF_ERROR(ValidateJacobiOptions({.block_size = o.jacobi_block_size,
                                                .blocks = o.jacobi_blocks,
                                                .spawn_ratio = o.jacobi_spawn_ratio,
                                                .pool_size = o.jacobi_pool_size,
                                                .candidates = o.jacobi_candidates,
                                                .prompt_lookup = o.jacobi_prompt_lookup}));
  TANDEM_RETURN_IF_ERROR(check_block("self_spec_draft_len", o.self_spec_draft_len, 0,
                                     {"self_spec", "self_spec_quadratic"}));
  TANDEM_RETURN_IF_ERROR(check_unit("quadratic_lambda", o.quadratic_lambda));
  TANDEM_RETURN_IF_ERROR(
      check_block("diffusion_block_size", o.diffusion_block_size, 0, {"diffusion", "simsd"}));
  TANDEM_RETURN_IF_ERROR(check_unit("diffusion_threshold", o.diffusion_threshold));
  TANDEM_RETURN_IF_ERROR(check_unit("diffusion_sampler", o.diffusion_sampler));
  TANDEM_RETURN_IF_ERROR(check_block("nsp_block", o.nsp_block, 0, {"nsp"}));
  TANDEM_RETURN_IF_ERROR(check_unit("nsp_tau", o.nsp_tau));
  if (o.nsp_confidence != "logit" && o.nsp_confidence != "entropy") {
    return bad("nsp_confidence must be 'logit' or 'entropy', got '", o.nsp_confidence, "'");
  }
  TANDEM_RETURN_IF_ERROR(check_block("isd_stride", o.isd_stride, 2, {"isd"}));
  if (o.isd_stride > kMaxIsdStride) {
    return bad("isd_stride must be in [2, ", kMaxIsdStride, "], got ", o.isd_stride);
  }
  if (!(o.isd_tau >= 0.0f) || std::isinf(o.isd_tau)) {
    return bad("isd_tau must be a finite number >= 0 (0 = lossless), got ", o.isd_tau);
  }
  TANDEM_RETURN_IF_ERROR(check_block("simsd_gamma", o.simsd_gamma, 0, {"simsd"}));
  // A quadratic step verifies up to k drafts and drafts a group of k after each: k (k + 2) tokens.
  auto check_quadratic = [&](const char* field, int64_t k) -> absl::Status {
    if (k * (k + 2) <= limits.max_step_tokens) return absl::OkStatus();
    return bad(std::string(mode), " with ", field, " ", k, " needs ", k * (k + 2),
               " tokens per step, more than this verifier's step budget of ",
               limits.max_step_tokens, " (--max-batch-tokens); ask for a shorter draft");
  };
  if (mode == "self_spec_quadratic") {
    TANDEM_RETURN_IF_ERROR(check_quadratic(
        "self_spec_draft_len",
        o.self_spec_draft_len > 0 ? o.self_spec_draft_len : config.diffusion.block_size));
  }
  if (mode == "nsp" && o.nsp_quadratic) {
    TANDEM_RETURN_IF_ERROR(
        check_quadratic("nsp_block", o.nsp_block > 0 ? o.nsp_block : config.diffusion.block_size));
  }
  return absl::OkStatus();
}

bool UsesDrafter(std::string_view name) { return name == "spec" || name == "simsd"; }

absl::StatusOr<DraftingNeeds> DraftingNeedsOf(std::string_view name, const ModeOptions& options,
                                              const ModelConfig& config) {
  if (name == "simsd") {
    TANDEM_ASSIGN_OR_RETURN(SimSdOptions simsd, MakeSimSdOptions(options, config));
    return DraftingNeeds{.uses_drafter = true,
                         .gamma = simsd.gamma,
                         .fixed_gamma = true,
                         .block_size = simsd.block_size};
  }
  if (name == "spec") {
    if (options.spec_gamma < 0 || options.spec_gamma > kMaxSpecGamma) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec_gamma must be in [0, ", kMaxSpecGamma, "], got ", options.spec_gamma));
    }
    return DraftingNeeds{.uses_drafter = true, .gamma = options.spec_gamma};
  }
  return DraftingNeeds{};
}

absl::StatusOr<std::unique_ptr<DecodingMode>> CreateModeWithDrafter(
    std::string_view name, const ModeOptions& options, const ModelConfig& config,
    std::unique_ptr<Drafter> drafter) {
  TANDEM_ASSIGN_OR_RETURN(DraftingNeeds needs, DraftingNeedsOf(name, options, config));
  if (!needs.uses_drafter) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode ", std::string(name), " does not draft with a separate drafter"));
  }
  if (drafter == nullptr) return absl::InvalidArgumentError("CreateModeWithDrafter: no drafter");
  if (name == "simsd") {
    TANDEM_ASSIGN_OR_RETURN(SimSdOptions simsd, MakeSimSdOptions(options, config));
    return std::make_unique<SimSdMode>(std::move(simsd), std::move(drafter), config.vocab_size,
                                       config.max_position_embeddings);
  }
  return std::make_unique<SpecMode>(needs.gamma, std::move(drafter), config.vocab_size,
                                    config.max_position_embeddings);
}

std::vector<std::string> ImplementedModes() {
  return {"ar",        "jacobi", "spec", "simsd", "self_spec", "self_spec_quadratic",
          "diffusion", "nsp",    "isd"};
}

absl::StatusOr<std::unique_ptr<DecodingMode>> CreateMode(std::string_view name,
                                                         const ModeOptions& options,
                                                         const ModelConfig& config,
                                                         const SamplingParams& sampling) {
  if (name == "ar") return std::make_unique<ArMode>(config.vocab_size);
  if (name == "jacobi") {
    if (!sampling.greedy()) {
      return absl::InvalidArgumentError("jacobi decodes greedily; use temperature 0");
    }
    const JacobiOptions jacobi{.block_size = options.jacobi_block_size,
                               .blocks = options.jacobi_blocks,
                               .spawn_ratio = options.jacobi_spawn_ratio,
                               .pool_size = options.jacobi_pool_size,
                               .candidates = options.jacobi_candidates,
                               .prompt_lookup = options.jacobi_prompt_lookup};
    TANDEM_RETURN_IF_ERROR(ValidateJacobiOptions(jacobi));
    return std::make_unique<JacobiMode>(jacobi, config.vocab_size, config.max_position_embeddings);
  }
  if (name == "spec" && options.spec_dflash != nullptr) {
    if (options.spec_gamma < 0 || options.spec_gamma > kMaxSpecGamma) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec_gamma must be in [0, ", kMaxSpecGamma, "], got ", options.spec_gamma));
    }
    const ModelConfig& target = options.spec_dflash->target().config();
    if (target.vocab_size != config.vocab_size || target.hidden_size != config.hidden_size ||
        target.num_layers != config.num_layers) {
      return absl::InvalidArgumentError(
          "spec: the DFlash drafter was loaded for a different target model");
    }
    return std::make_unique<SpecMode>(options.spec_gamma,
                                      std::make_unique<DFlashDrafter>(options.spec_dflash),
                                      config.vocab_size, config.max_position_embeddings);
  }
  if (name == "spec") {
    if (options.spec_drafter == nullptr) {
      return absl::InvalidArgumentError("spec needs a drafter model (tandem generate --drafter)");
    }
    if (options.spec_gamma < 0 || options.spec_gamma > kMaxSpecGamma) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec_gamma must be in [0, ", kMaxSpecGamma, "], got ", options.spec_gamma));
    }
    const ModelConfig& drafter = options.spec_drafter->config();
    if (drafter.vocab_size != config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec drafter has a vocabulary of ", drafter.vocab_size,
                       " tokens; the target's has ", config.vocab_size, " (they must match)"));
    }
    return std::make_unique<SpecMode>(options.spec_gamma,
                                      std::make_unique<InProcessArDrafter>(
                                          options.spec_drafter, DrafterCapacity(config, drafter)),
                                      config.vocab_size, config.max_position_embeddings);
  }
  if (name == "simsd") {
    TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway(name, config, options.diffusion_block_size));
    if (options.spec_drafter == nullptr) {
      return absl::InvalidArgumentError("simsd needs a drafter model (tandem generate --drafter)");
    }
    const ModelConfig& drafter = options.spec_drafter->config();
    if (drafter.vocab_size != config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("simsd drafter has a vocabulary of ", drafter.vocab_size,
                       " tokens; the target's has ", config.vocab_size, " (they must match)"));
    }
    TANDEM_ASSIGN_OR_RETURN(SimSdOptions simsd, MakeSimSdOptions(options, config));
    // A drafter with a diffusion pathway denoises the block in its own order (SimSD's
    // draft-induced order); an AR-only drafter drafts left to right.
    std::unique_ptr<Drafter> drafts;
    if (drafter.diffusion.mask_token_id) {
      drafts = std::make_unique<DiffusionDrafter>(
          options.spec_drafter, *drafter.diffusion.mask_token_id, DrafterCapacity(config, drafter));
    } else {
      drafts = std::make_unique<InProcessArDrafter>(options.spec_drafter,
                                                    DrafterCapacity(config, drafter));
    }
    return std::make_unique<SimSdMode>(std::move(simsd), std::move(drafts), config.vocab_size,
                                       config.max_position_embeddings);
  }
  if (name == "self_spec") {
    TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway(name, config, options.self_spec_draft_len));
    const SelfSpecOptions self_spec{.draft_len = options.self_spec_draft_len > 0
                                                     ? options.self_spec_draft_len
                                                     : config.diffusion.block_size,
                                    .mask_token = *config.diffusion.mask_token_id,
                                    .lora_masks = options.lora_drafts};
    TANDEM_RETURN_IF_ERROR(ValidateSelfSpecOptions(self_spec, config.vocab_size));
    return std::make_unique<SelfSpecMode>(self_spec, config.vocab_size,
                                          config.max_position_embeddings);
  }
  if (name == "self_spec_quadratic") {
    TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway(name, config, options.self_spec_draft_len));
    const SelfSpecQuadraticOptions quadratic{.draft_len = options.self_spec_draft_len > 0
                                                              ? options.self_spec_draft_len
                                                              : config.diffusion.block_size,
                                             .mask_token = *config.diffusion.mask_token_id,
                                             .lambda = options.quadratic_lambda,
                                             .lora_masks = options.lora_drafts};
    TANDEM_RETURN_IF_ERROR(ValidateSelfSpecQuadraticOptions(quadratic, config.vocab_size));
    return std::make_unique<SelfSpecQuadraticMode>(quadratic, config.vocab_size,
                                                   config.max_position_embeddings);
  }
  if (name == "diffusion") {
    TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway(name, config, options.diffusion_block_size));
    DiffusionOptions diffusion{
        .block_size = options.diffusion_block_size > 0 ? options.diffusion_block_size
                                                       : config.diffusion.block_size,
        .mask_token = *config.diffusion.mask_token_id,
        .threshold = options.diffusion_threshold,
        .eos_tokens = {config.eos_token_ids.begin(), config.eos_token_ids.end()}};
    if (options.diffusion_sampler > 0.0f) {
      if (options.sampler_model == nullptr) {
        return absl::InvalidArgumentError(
            "diffusion_sampler asks for the trained diffusion sampler, but this model has none "
            "(a sampler/ folder beside its weights); use diffusion_threshold instead");
      }
      diffusion.sampler = options.sampler_model;
      diffusion.sampler_threshold = options.diffusion_sampler;
    }
    TANDEM_RETURN_IF_ERROR(ValidateDiffusionOptions(diffusion, config.vocab_size));
    return std::make_unique<DiffusionMode>(std::move(diffusion), config.vocab_size,
                                           config.max_position_embeddings);
  }
  if (name == "nsp") {
    TANDEM_RETURN_IF_ERROR(CheckDiffusionPathway(name, config, options.nsp_block));
    if (options.nsp_confidence != "logit" && options.nsp_confidence != "entropy") {
      return absl::InvalidArgumentError(absl::StrCat(
          "nsp confidence must be 'logit' or 'entropy', got '", options.nsp_confidence, "'"));
    }
    const int block = options.nsp_block > 0 ? options.nsp_block : config.diffusion.block_size;
    if (options.nsp_quadratic) {
      const SelfSpecQuadraticOptions quadratic{
          .draft_len = block, .mask_token = *config.diffusion.mask_token_id, .shifted = true};
      TANDEM_RETURN_IF_ERROR(ValidateSelfSpecQuadraticOptions(quadratic, config.vocab_size));
      return std::make_unique<SelfSpecQuadraticMode>(quadratic, config.vocab_size,
                                                     config.max_position_embeddings);
    }
    NspOptions nsp{.block_size = block,
                   .mask_token = *config.diffusion.mask_token_id,
                   .tau = options.nsp_tau,
                   .confidence = options.nsp_confidence == "entropy" ? NspConfidence::kEntropy
                                                                     : NspConfidence::kLogit,
                   .verify = options.nsp_verify,
                   .eos_tokens = {config.eos_token_ids.begin(), config.eos_token_ids.end()}};
    TANDEM_RETURN_IF_ERROR(ValidateNspOptions(nsp, config.vocab_size));
    return std::make_unique<NspMode>(std::move(nsp), config.vocab_size,
                                     config.max_position_embeddings);
  }
  if (name == "isd") {
    if (!config.diffusion.mask_token_id) {
      return absl::InvalidArgumentError(
          "mode isd needs a checkpoint with a <|mask|> token: config.json has no mask_token_id "
          "and tokenizer.json no <|mask|>; use an I-DLM model (models/tandem-idlm)");
    }
    const IsdOptions isd{.stride = options.isd_stride,
                         .tau = options.isd_tau,
                         .mask_token = *config.diffusion.mask_token_id,
                         .argmax_proposals = options.isd_argmax_proposals,
                         .lora_masks = options.lora_drafts};
    TANDEM_RETURN_IF_ERROR(ValidateIsdOptions(isd, config.vocab_size));
    return std::make_unique<IsdMode>(isd, config.vocab_size, config.max_position_embeddings);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decoding mode '", std::string(name),
                   "'; this build has: ", absl::StrJoin(ImplementedModes(), ", ")));
}

}  // namespace tandem
