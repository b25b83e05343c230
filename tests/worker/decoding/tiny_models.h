// Random-weight transformers small enough to decode thousands of tokens in a test, with a
// vocabulary small enough that greedy outputs repeat n-grams (so drafts get accepted).
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "worker/decoding/runner.h"
#include "worker/model/dflash.h"
#include "worker/model/transformer.h"

namespace tandem::testing {

enum class TinyArch { kQwen2, kQwen3 };

// Qwen2 style: q/k/v biases, untied head, vocab 64. Qwen3 style: per-head q/k RMSNorm, o_proj
// and MLP biases, tied embeddings, vocab 97.
inline ModelConfig TinyConfig(TinyArch arch, int max_positions = 128) {
  const bool qwen3 = arch == TinyArch::kQwen3;
  ModelConfig c;
  c.arch = qwen3 ? Arch::kQwen3 : Arch::kQwen2;
  c.vocab_size = qwen3 ? 97 : 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = qwen3 ? 12 : 8;
  c.max_position_embeddings = max_positions;
  c.qk_norm = qwen3;
  c.attention_bias = !qwen3;
  c.o_proj_bias = qwen3;
  c.mlp_bias = qwen3;
  c.tie_word_embeddings = qwen3;
  return c;
}

inline std::unique_ptr<Transformer> TinyModel(
    TinyArch arch, uint64_t seed, int max_positions = 128,
    kernels::cpu::WeightType cpu_weights = kernels::cpu::WeightType::kF32) {
  const ModelConfig c = TinyConfig(arch, max_positions);
  // Large weights make the logits peaked, so greedy outputs settle into repeating runs.
  return Transformer::FromWeights(c, RandomWeights(c, seed, 0.35f), cpu_weights);
}

// Every vector of a layer's weights (norms and biases too, empty ones included).
inline std::array<std::vector<float>*, 12> LayerVectors(LayerWeights& l) {
  return {&l.input_norm, &l.qkv,       &l.qkv_bias, &l.q_norm,       &l.k_norm, &l.o,
          &l.o_bias,     &l.post_norm, &l.gate_up,  &l.gate_up_bias, &l.down,   &l.down_bias};
}

// A copy of `model` with normal noise of `stddev` added to every weight: a drafter that agrees
// with the target often but not always.
inline std::unique_ptr<Transformer> PerturbedModel(const Transformer& model, uint64_t seed,
                                                   float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  ModelWeights w = model.weights().Unpacked();
  auto perturb = [&](std::vector<float>& v) {
    for (float& x : v) x += normal(rng);
  };
  perturb(w.embed);
  perturb(w.final_norm);
  perturb(w.lm_head);
  for (LayerWeights& l : w.layers) {
    for (std::vector<float>* v : LayerVectors(l)) perturb(*v);
  }
  return Transformer::FromWeights(model.config(), std::move(w));
}

// Rank-4 adapter on every projection with N(0, stddev) factors: large enough that the adapted
// rows' logits differ clearly from the base model's.
inline LoraAdapter RandomLoraAdapter(const ModelConfig& c, uint64_t seed, float stddev) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  const int q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const std::vector<std::tuple<LoraTarget, int, int>> shapes = {
      {LoraTarget::kQ, c.hidden_size, q},
      {LoraTarget::kK, c.hidden_size, kv},
      {LoraTarget::kV, c.hidden_size, kv},
      {LoraTarget::kO, q, c.hidden_size},
      {LoraTarget::kGate, c.hidden_size, c.intermediate_size},
      {LoraTarget::kUp, c.hidden_size, c.intermediate_size},
      {LoraTarget::kDown, c.intermediate_size, c.hidden_size}};
  constexpr int kRank = 4;
  LoraAdapter adapter{.name = "random", .scale = 1.0f};
  adapter.layers.resize(static_cast<size_t>(c.num_layers));
  for (auto& layer : adapter.layers) {
    for (const auto& [target, in, out] : shapes) {
      LoraPair pair{.rank = kRank};
      pair.a.resize(static_cast<size_t>(kRank) * in);
      pair.b.resize(static_cast<size_t>(out) * kRank);
      for (float& x : pair.a) x = normal(rng);
      for (float& x : pair.b) x = normal(rng);
      layer.emplace(target, std::move(pair));
    }
  }
  return adapter;
}

// Runs `mode` over `prompt` with a cache of its own.
inline absl::StatusOr<RunStats> RunOnce(Transformer& model, DecodingMode& mode,
                                        std::span<const int32_t> prompt,
                                        const RunOptions& options) {
  KvCache kv(model.KvOptions(static_cast<int64_t>(prompt.size()) + options.max_tokens + 512, 16));
  return RunSequence(model, kv, 1, mode, prompt, options);
}

// `count` prompts over [0, vocab): alternately random tokens (1..24 of them) and a short random
// motif repeated with noise, the kind of text prompt lookup and n-gram recycling feed on.
// Bytes for a tiny model's 64 ids, for structured-output grammars (GrammarCompiler): the JSON
// punctuation, digits and letters; id 63 has none (use it as the stop token).
inline std::vector<std::string> TinyByteVocab() {
  const std::string chars = " {}[]\":,.-0123456789eEtrufalsn\\bcdghijkmopqvwxyzABCDFGHIJKLMNOPQR";
  std::vector<std::string> vocab;
  for (size_t i = 0; i < 63; ++i) vocab.push_back(std::string(1, chars[i]));
  vocab.push_back("");
  return vocab;
}

inline std::vector<std::vector<int32_t>> TestPrompts(int vocab, int count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto token = [&] { return static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab)); };
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < count; ++p) {
    std::vector<int32_t> prompt;
    if (p % 2 == 0) {
      const int len = 1 + static_cast<int>(rng() % 24);
      for (int i = 0; i < len; ++i) prompt.push_back(token());
    } else {
      std::vector<int32_t> motif(2 + rng() % 5);
      for (int32_t& t : motif) t = token();
      const int repeats = 2 + static_cast<int>(rng() % 4);
      for (int r = 0; r < repeats; ++r) {
        for (int32_t t : motif) prompt.push_back(rng() % 8 == 0 ? token() : t);
      }
    }
    prompts.push_back(std::move(prompt));
  }
  return prompts;
}

// Next-token logits after `tokens` from one forward over all of them, in a cache of its own
// (the reference the sampling tests enumerate exact distributions with).
inline std::vector<float> NextLogits(Transformer& model, std::span<const int32_t> tokens) {
  KvCache kv(model.KvOptions(static_cast<int64_t>(tokens.size()) + 16, 16));
  EXPECT_TRUE(kv.AddSequence(1).ok());
  EXPECT_TRUE(kv.Reserve(1, static_cast<int>(tokens.size())).has_value());
  std::vector<int32_t> positions(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) positions[i] = static_cast<int32_t>(i);
  const std::vector<int32_t> outputs = {static_cast<int32_t>(tokens.size()) - 1};
  Extend extend{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
  absl::StatusOr<std::vector<ExtendOutput>> out = model.Forward({&extend, 1}, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? (*out)[0].logits : std::vector<float>();
}

// A random-weight DFlash drafter for `target` (not owned; must outlive it): one Qwen3 layer,
// blocks of `block` slots, the last token as mask, taps of the target's middle and last layers,
// up to two clean tokens per block (one when block is 2).
inline std::unique_ptr<DFlashModel> TinyDFlash(const Transformer* target, uint64_t seed,
                                               int block) {
  DFlashConfig d;
  d.model = target->config();
  d.model.arch = Arch::kQwen3;
  d.model.num_layers = 1;
  d.model.qk_norm = true;
  d.model.attention_bias = d.model.o_proj_bias = d.model.mlp_bias = false;
  d.block_size = block;
  d.mask_token_id = d.model.vocab_size - 1;
  d.target_layer_ids = {d.model.num_layers, target->config().num_layers};
  d.max_anchor = std::min(2, block - 1);
  DFlashWeights w = RandomDFlashWeights(d, seed, 0.35f);
  absl::StatusOr<std::unique_ptr<DFlashModel>> model =
      DFlashModel::Create(std::move(d), std::move(w), target);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

}  // namespace tandem::testing
