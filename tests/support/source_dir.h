// Where a test finds the repository's files (models/, tests/fixtures/): the TANDEM_SOURCE_DIR
// environment variable when set, else the source directory the test was configured from. The
// override lets a packed test binary run from another checkout (scripts/gpu/check.sh runs the
// GPU tests on a machine where the build's source path does not exist).
#pragma once

#include <cstdlib>
#include <string>

namespace tandem::test_support {

inline std::string SourceDir() {
  const char* dir = std::getenv("TANDEM_SOURCE_DIR");
  return dir != nullptr && *dir != '\0' ? std::string(dir) : std::string(TANDEM_SOURCE_DIR);
}

}  // namespace tandem::test_support
