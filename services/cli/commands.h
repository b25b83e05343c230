// Subcommands of the `tandem` command line. Each Register* adds its subcommand to the app; the
// callback runs the command and sets the process exit code through `exit_code`.
#pragma once

#include "CLI/CLI.hpp"

namespace tandem::cli {

void RegisterVersion(CLI::App& app, int* exit_code);
void RegisterGenerate(CLI::App& app, int* exit_code);
void RegisterBench(CLI::App& app, int* exit_code);
void RegisterUp(CLI::App& app, int* exit_code);

}  // namespace tandem::cli
