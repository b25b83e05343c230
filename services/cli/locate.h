// Finding the service binaries and the bundled model from the `tandem` executable, in an
// installation (binaries side by side) or in the build tree (services/<folder>/<binary>).
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace tandem::cli {

// The directory of the running executable.
std::string ExecutableDir();

// `name` next to the executable, else in the build tree's services/<folder>/. NotFound says
// where it looked.
absl::StatusOr<std::string> FindServiceBinary(const std::string& name, const std::string& folder);

// `flag` when set, else $TANDEM_MODEL_DIR, else models/tandem-target found by walking up from the
// executable (the build tree sits inside the repository).
absl::StatusOr<std::string> FindModelDir(const std::string& flag);

// The drafter for `target_model_dir` when none is named: the separately trained drafter
// folder next to the target (<parent>/tandem-drafter, the bundled models/tandem-drafter)
// when it exists and its tokenizer.json is byte-identical to the target's, else the target
// itself (self-drafting: every greedy draft is accepted, an upper bound on acceptance).
std::string DefaultDrafterDir(const std::string& target_model_dir);

// `relative` (e.g. "tools/bench/plot_serve.py") in the repository found by walking up from the
// executable; NotFound outside a source tree.
absl::StatusOr<std::string> FindRepoFile(const std::string& relative);

}  // namespace tandem::cli
