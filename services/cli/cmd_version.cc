#include <cstdio>

#include "common/version.h"
#include "services/cli/commands.h"

namespace tandem::cli {

void RegisterVersion(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand("version", "Print the version and build configuration");
  cmd->callback([exit_code] {
    std::printf("%s\n", VersionString().c_str());
    *exit_code = 0;
  });
}

}  // namespace tandem::cli
