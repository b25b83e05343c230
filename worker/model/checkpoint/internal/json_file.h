// Reading small JSON side files of a checkpoint (config.json, index, adapter_config.json).
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace tandem::checkpoint_internal {

// The whole file as bytes; NotFound names the path.
absl::StatusOr<std::string> ReadTextFile(const std::string& path);

// The file parsed as a JSON object; anything else is InvalidArgument naming the path.
// Never throws.
absl::StatusOr<nlohmann::json> ReadJsonObject(const std::string& path);

}  // namespace tandem::checkpoint_internal
