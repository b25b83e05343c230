#pragma once

#include <string>

namespace tandem::cli {

struct BenchEngineArgs {
  bool json = false;
  int threads = 0;
  int decode_steps = 48;
  int prefill_tokens = 256;
  int layers = 12;
  std::string device = "cpu";  // cpu or cuda
  bool cuda_graphs = true;
};

int RunBenchEngine(const BenchEngineArgs& args);

}  // namespace tandem::cli
