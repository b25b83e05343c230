// What the CUDA backend's tests share: the bundled models' folder, a prompt in a model's own ids,
// the fixture that skips without a GPU, the logit tolerance against the CPU and a one-extend
// runner.
#pragma once

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "tests/support/source_dir.h"
#include "worker/engine/local_generator.h"
#include "worker/model/transformer.h"

namespace tandem::cuda_testing {

inline const std::string kModels = test_support::SourceDir() + "/models/";

// A short prompt in the ids of the bundled model under `dir` (its own tokenizer, so the ids are
// inside its vocabulary).
inline std::vector<int32_t> PromptIds(const std::string& dir) {
  absl::StatusOr<LoadedModel> loaded = LoadModelDir(dir);
  if (!loaded.ok()) return {};
  absl::StatusOr<std::vector<int32_t>> ids = loaded->tokenizer->Encode("The capital of France is");
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

class CudaModelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

// max |got - want| over the rows, against the CPU logits' spread: bf16 keeps ~3 significant
// digits through every layer, so a few percent of the logit range is the expected error.
inline double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_abs = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / max_abs;
}

inline constexpr double kLogitTolerance = 0.05;

// One extend on `seq` of a model/cache pair, logits of every new token.
struct Runner {
  Transformer* model;
  KvCache* kv;

  absl::StatusOr<std::vector<ExtendOutput>> Run(std::vector<Extend> batch) {
    for (const Extend& e : batch) {
      if (!kv->HasSequence(e.seq) && !kv->AddSequence(e.seq).ok()) {
        return absl::InternalError("add");
      }
      if (!kv->Reserve(e.seq, static_cast<int>(e.tokens.size()))) {
        return absl::InternalError("reserve");
      }
    }
    return model->Forward(batch, *kv);
  }
};

// A two-layer random model's shape: Qwen3 (q/k norms, tied head) or Qwen2 (biases).
inline ModelConfig TinyConfig(bool qwen3) {
  ModelConfig c;
  c.arch = qwen3 ? Arch::kQwen3 : Arch::kQwen2;
  c.vocab_size = 97;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 512;
  c.qk_norm = qwen3;
  c.attention_bias = !qwen3;
  c.o_proj_bias = qwen3;
  c.mlp_bias = qwen3;
  c.tie_word_embeddings = qwen3;
  return c;
}

inline std::vector<int32_t> Iota(int first, int n) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = first + i;
  return v;
}

// Prefills `batch` sequences of random tokens, sequence s of first + s * step tokens, as the same
// extends on both runners (the graphed and the eager backend of one model), and commits them, so
// both caches hold the same contexts. Returns the prompts.
inline absl::StatusOr<std::vector<std::vector<int32_t>>> PrefillBoth(Runner& a, Runner& b,
                                                                     int batch, int first, int step,
                                                                     int vocab, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  std::vector<std::vector<int32_t>> prompts(batch);
  for (int s = 0; s < batch; ++s) {
    prompts[s].resize(first + step * s);
    for (auto& t : prompts[s]) t = token(rng);
    const std::vector<int32_t> positions = Iota(0, static_cast<int>(prompts[s].size()));
    const std::vector<int32_t> out = {static_cast<int32_t>(prompts[s].size() - 1)};
    const Extend x{.seq = s, .tokens = prompts[s], .positions = positions, .outputs = out};
    for (Runner* r : {&a, &b}) {
      absl::StatusOr<std::vector<ExtendOutput>> run = r->Run({x});
      if (!run.ok()) return run.status();
      if (absl::Status commit = r->kv->Commit(s, positions); !commit.ok()) return commit;
    }
  }
  return prompts;
}

}  // namespace tandem::cuda_testing
