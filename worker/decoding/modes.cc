#include "worker/decoding/modes.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/decoding/ar.h"

namespace tandem {

std::vector<std::string> ImplementedModes() { return {"ar"}; }

absl::StatusOr<std::unique_ptr<DecodingMode>> CreateMode(std::string_view name,
                                                         const ModeOptions& /*options*/,
                                                         const ModelConfig& config,
                                                         const SamplingParams& /*sampling*/) {
  if (name == "ar") return std::make_unique<ArMode>(config.vocab_size);
  return absl::InvalidArgumentError(
      absl::StrCat("unknown decoding mode '", std::string(name),
                   "'; this build has: ", absl::StrJoin(ImplementedModes(), ", ")));
}

}  // namespace tandem
