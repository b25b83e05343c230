#include <cstdio>

#include "services/cli/commands.h"

namespace tandem::cli {

void RegisterUp(CLI::App& app, int* exit_code) {
  CLI::App* cmd = app.add_subcommand(
      "up",
      "Start a local cluster (router, verifier, drafter) on the bundled models and serve until "
      "interrupted [not in this build yet: the services are not built]");
  cmd->callback([exit_code] {
    std::fprintf(stderr,
                 "tandem up: this build has no cluster services yet; use `tandem generate` to run "
                 "a model in-process.\n");
    *exit_code = 2;
  });
}

}  // namespace tandem::cli
