#pragma once

#include <string>

namespace tandem {

// "tandem <semver> (<build details>)", e.g. for `tandem version` and ListModels.
std::string VersionString();

}  // namespace tandem
