// `tandem`: the command-line entry point.
#include "CLI/CLI.hpp"
#include "services/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Tandem: a decode cluster for LLM inference (router, verifier and drafter services with "
      "autoregressive, speculative and diffusion decoding modes)."};
  app.require_subcommand(1);
  app.set_help_all_flag("--help-all", "Help for every subcommand");
  int exit_code = 0;
  tandem::cli::RegisterUp(app, &exit_code);
  tandem::cli::RegisterGenerate(app, &exit_code);
  tandem::cli::RegisterBench(app, &exit_code);
  tandem::cli::RegisterVersion(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
