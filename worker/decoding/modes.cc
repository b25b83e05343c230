#include "worker/decoding/modes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/jacobi.h"

namespace tandem {

std::vector<std::string> ImplementedModes() { return {"ar", "jacobi"}; }

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
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decoding mode '", std::string(name),
                   "'; this build has: ", absl::StrJoin(ImplementedModes(), ", ")));
}

}  // namespace tandem
