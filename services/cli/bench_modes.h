// `tandem bench modes`: every implemented decoding mode (and a few option variants) on held-out
// prompts of a bundled model, greedy: tokens per target forward, acceptance length, CPU
// tokens/s and agreement with AR decoding, per prompt category.
#pragma once

#include <string>
#include <vector>

namespace tandem::cli {

struct BenchModesArgs {
  std::string model_dir;    // "" = FindModelDir (locate.h): the bundled target
  std::string drafter_dir;  // spec's drafter; empty = DefaultDrafterDir(model_dir)
  // LoRA adapter on the model: every isd / self_spec variant also runs with it (" +lora").
  std::string lora_dir;
  // PEFT adapter merged into the model's weights at load: every variant runs the adapted model.
  std::string merge_lora;
  std::string prompts_file;  // empty = <model_dir>/fixtures/bench_prompts.json
  // Mode names or variant labels ("jacobi", "spec gamma=2"); empty = all.
  std::vector<std::string> modes;
  int max_tokens = 64;
  int prompts = 0;  // per category; 0 = all in the file
  bool json = false;
  // With json: every variant's token ids per prompt ("outputs"), so that runs on two devices can
  // be compared token by token.
  bool tokens = false;
  int threads = 0;
  std::string device = "cpu";  // cpu or cuda: where the target and drafter models run
  bool cuda_graphs = true;
  std::string cpu_weights = "f32";  // f32 or bf16 (kernels/cpu/packed_gemm.h)
};

int RunBenchModes(const BenchModesArgs& args);

}  // namespace tandem::cli
