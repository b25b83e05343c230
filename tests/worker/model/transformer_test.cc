// The batched, paged forward against the dense oracle: prefill, extend/commit sequences,
// explicit visibility with repeated positions, block visibility, batching, taps and LoRA.
#include "worker/model/transformer.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "tests/worker/model/reference_model.h"

namespace tandem {
namespace {

using testing::CausalMask;
using testing::DenseForward;
using testing::MaxRelativeError;

constexpr double kTol = 1e-4;

ModelConfig TinyConfig(bool qwen3) {
  ModelConfig c;
  c.arch = qwen3 ? Arch::kQwen3 : Arch::kQwen2;
  c.vocab_size = 97;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = qwen3 ? 12 : 8;
  c.rms_norm_eps = 1e-6f;
  c.rope_theta = 10000.0f;
  c.max_position_embeddings = 512;
  c.qk_norm = qwen3;
  c.attention_bias = !qwen3;
  c.o_proj_bias = qwen3;  // exercises both bias placements
  c.mlp_bias = qwen3;
  c.tie_word_embeddings = qwen3;
  return c;
}

class TransformerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    config_ = TinyConfig(GetParam());
    model_ = Transformer::FromWeights(config_, RandomWeights(config_, 1234, 0.2f));
    kv_ = std::make_unique<KvCache>(model_->KvOptions(1024, 4));
  }

  std::vector<int32_t> RandomTokens(int n, std::mt19937& rng) {
    std::uniform_int_distribution<int32_t> dist(0, config_.vocab_size - 1);
    std::vector<int32_t> t(n);
    for (auto& x : t) x = dist(rng);
    return t;
  }

  // Runs one extend on `seq` (reserving first); returns logits for every new token.
  std::vector<std::vector<float>> Run(SeqId seq, const std::vector<int32_t>& tokens,
                                      const std::vector<int32_t>& positions, Visibility vis,
                                      std::vector<uint8_t> gate = {}) {
    EXPECT_TRUE(kv_->Reserve(seq, static_cast<int>(tokens.size())).has_value());
    std::vector<int32_t> outputs(tokens.size());
    for (size_t i = 0; i < outputs.size(); ++i) outputs[i] = static_cast<int32_t>(i);
    Extend e{.seq = seq,
             .tokens = tokens,
             .positions = positions,
             .visible = std::move(vis),
             .outputs = outputs,
             .lora_gate = gate};
    auto out = model_->Forward({&e, 1}, *kv_);
    EXPECT_TRUE(out.ok()) << out.status();
    std::vector<std::vector<float>> rows;
    const auto& logits = (*out)[0].logits;
    for (size_t i = 0; i < tokens.size(); ++i) {
      rows.emplace_back(logits.begin() + i * config_.vocab_size,
                        logits.begin() + (i + 1) * config_.vocab_size);
    }
    return rows;
  }

  static std::vector<int32_t> Iota(int from, int n) {
    std::vector<int32_t> v(n);
    for (int i = 0; i < n; ++i) v[i] = from + i;
    return v;
  }

  ModelConfig config_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<KvCache> kv_;
};

TEST_P(TransformerTest, PrefillMatchesDenseReference) {
  std::mt19937 rng(1);
  const auto tokens = RandomTokens(13, rng);
  const auto positions = Iota(0, 13);
  ASSERT_TRUE(kv_->AddSequence(1).ok());
  const auto got = Run(1, tokens, positions, Visibility::Causal());
  const auto want = DenseForward(config_, model_->weights(), tokens, positions, CausalMask(13));
  for (int t = 0; t < 13; ++t) EXPECT_LT(MaxRelativeError(got[t], want.logits[t]), kTol) << t;
}

TEST_P(TransformerTest, ExtendsWithArbitraryCommitsEqualCleanPrefill) {
  // Each step appends kept tokens interleaved with throw-away tokens (drafts that get rejected,
  // at repeated positions). Kept tokens see only committed and earlier kept tokens, so after
  // Commit the cache must be exactly that of a clean prefill of the kept tokens.
  std::mt19937 rng(2);
  ASSERT_TRUE(kv_->AddSequence(5).ok());
  std::vector<int32_t> committed;
  std::vector<std::vector<float>> got_logits;  // logits at each committed token
  for (int step = 0; step < 7; ++step) {
    const int n = 1 + static_cast<int>(rng() % 6);
    const auto tokens = RandomTokens(n, rng);
    std::vector<bool> keep(n);
    for (int i = 0; i < n; ++i) keep[i] = (rng() % 3) != 0;
    Visibility vis = Visibility::Explicit(n);
    std::vector<int32_t> positions(n), keep_idx;
    const int base = static_cast<int>(committed.size());
    for (int i = 0; i < n; ++i) {
      int rank = 0;
      for (int j = 0; j < i; ++j) rank += keep[j];
      positions[i] = base + rank;  // throw-away tokens repeat a kept token's position
      for (int j = 0; j <= i; ++j) {
        if (keep[i] ? (keep[j] || j == i) : (rng() % 2 == 0 || j == i)) vis.Allow(i, j);
      }
      if (keep[i]) keep_idx.push_back(i);
    }
    const auto rows = Run(5, tokens, positions, vis);
    for (int i : keep_idx) {
      committed.push_back(tokens[i]);
      got_logits.push_back(rows[i]);
    }
    ASSERT_TRUE(kv_->Commit(5, keep_idx).ok());
  }
  ASSERT_EQ(kv_->CommittedLength(5), static_cast<int>(committed.size()));
  const int total = static_cast<int>(committed.size());
  const auto want =
      DenseForward(config_, model_->weights(), committed, Iota(0, total), CausalMask(total));
  for (int t = 0; t < total; ++t) EXPECT_LT(MaxRelativeError(got_logits[t], want.logits[t]), kTol);
  // And a decode step on top of the compacted cache.
  std::vector<int32_t> next = RandomTokens(1, rng);
  const auto step = Run(5, next, {total}, Visibility::Causal());
  committed.push_back(next[0]);
  const auto want2 = DenseForward(config_, model_->weights(), committed, Iota(0, total + 1),
                                  CausalMask(total + 1));
  EXPECT_LT(MaxRelativeError(step[0], want2.logits[total]), kTol);
}

TEST_P(TransformerTest, ExplicitVisibilityAndRepeatedPositionsMatchDenseMask) {
  std::mt19937 rng(3);
  const int ctx = 9, n = 11;
  ASSERT_TRUE(kv_->AddSequence(2).ok());
  const auto prompt = RandomTokens(ctx, rng);
  Run(2, prompt, Iota(0, ctx), Visibility::Causal());
  ASSERT_TRUE(kv_->Commit(2, Iota(0, ctx)).ok());

  const auto tokens = RandomTokens(n, rng);
  std::vector<int32_t> positions(n);
  for (auto& p : positions) p = ctx + static_cast<int32_t>(rng() % 4);  // many repeats
  Visibility vis = Visibility::Explicit(n);
  auto mask = CausalMask(ctx + n);
  for (int i = 0; i < n; ++i) {
    for (int j = 0; j < ctx; ++j) mask[ctx + i][j] = true;
    for (int j = 0; j < n; ++j) {
      const bool sees = (rng() % 2) == 0;
      mask[ctx + i][ctx + j] = sees;
      if (sees) vis.Allow(i, j);
    }
  }
  const auto got = Run(2, tokens, positions, vis);
  std::vector<int32_t> all = prompt, all_pos = Iota(0, ctx);
  all.insert(all.end(), tokens.begin(), tokens.end());
  all_pos.insert(all_pos.end(), positions.begin(), positions.end());
  const auto want = DenseForward(config_, model_->weights(), all, all_pos, mask);
  for (int i = 0; i < n; ++i) EXPECT_LT(MaxRelativeError(got[i], want.logits[ctx + i]), kTol) << i;
}

TEST_P(TransformerTest, BlockAndFullVisibilityMatchDenseMask) {
  std::mt19937 rng(4);
  for (bool full : {false, true}) {
    const SeqId seq = full ? 11 : 10;
    ASSERT_TRUE(kv_->AddSequence(seq).ok());
    const auto prompt = RandomTokens(5, rng);
    Run(seq, prompt, Iota(0, 5), Visibility::Causal());
    ASSERT_TRUE(kv_->Commit(seq, Iota(0, 5)).ok());
    const int n = 8, bs = 3;
    const auto tokens = RandomTokens(n, rng);
    auto mask = CausalMask(5 + n);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < 5 + n; ++j) mask[5 + i][j] = j < 5 || full || (j - 5) / bs <= i / bs;
    const auto got =
        Run(seq, tokens, Iota(5, n), full ? Visibility::Full() : Visibility::Block(bs));
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), tokens.begin(), tokens.end());
    const auto want = DenseForward(config_, model_->weights(), all, Iota(0, 5 + n), mask);
    for (int i = 0; i < n; ++i) EXPECT_LT(MaxRelativeError(got[i], want.logits[5 + i]), kTol);
  }
}

TEST_P(TransformerTest, BatchOfExtendsEqualsEachAlone) {
  std::mt19937 rng(5);
  const std::vector<std::vector<int32_t>> prompts = {RandomTokens(6, rng), RandomTokens(1, rng),
                                                     RandomTokens(9, rng)};
  std::vector<std::vector<int32_t>> positions, outputs;
  std::vector<Extend> batch;
  for (size_t s = 0; s < prompts.size(); ++s) {
    ASSERT_TRUE(kv_->AddSequence(100 + s).ok());
    ASSERT_TRUE(kv_->Reserve(100 + s, static_cast<int>(prompts[s].size())).has_value());
    positions.push_back(Iota(0, static_cast<int>(prompts[s].size())));
    outputs.push_back({static_cast<int32_t>(prompts[s].size() - 1)});
  }
  for (size_t s = 0; s < prompts.size(); ++s) {
    batch.push_back({.seq = static_cast<SeqId>(100 + s),
                     .tokens = prompts[s],
                     .positions = positions[s],
                     .outputs = outputs[s]});
  }
  auto out = model_->Forward(batch, *kv_);
  ASSERT_TRUE(out.ok()) << out.status();
  for (size_t s = 0; s < prompts.size(); ++s) {
    const int n = static_cast<int>(prompts[s].size());
    const auto want =
        DenseForward(config_, model_->weights(), prompts[s], Iota(0, n), CausalMask(n));
    EXPECT_LT(MaxRelativeError((*out)[s].logits, want.logits[n - 1]), kTol) << s;
  }
}

// The promise the engine's replay of migrated tokens rests on (ModelBackend::ExactExtendTokens):
// causal extends of up to that many tokens give every token the logits (and so the KV) that
// one-token extends give it, bit for bit.
TEST_P(TransformerTest, ExactExtendsEqualOneTokenExtendsBitForBit) {
  const int exact = model_->backend()->ExactExtendTokens();
  ASSERT_GE(exact, 2) << "the CPU backend promises exact short extends";
  std::mt19937 rng(9);
  const auto prompt = RandomTokens(9, rng);
  const auto steps = RandomTokens(3 * exact, rng);
  const int n = static_cast<int>(steps.size());
  std::vector<std::vector<float>> one_by_one, in_extends;
  for (SeqId seq : {SeqId{7}, SeqId{8}}) {
    ASSERT_TRUE(kv_->AddSequence(seq).ok());
    Run(seq, prompt, Iota(0, 9), Visibility::Causal());
    ASSERT_TRUE(kv_->Commit(seq, Iota(0, 9)).ok());
  }
  for (int i = 0; i < n; ++i) {
    const auto rows = Run(7, {steps[i]}, {9 + i}, Visibility::Causal());
    ASSERT_TRUE(kv_->Commit(7, Iota(0, 1)).ok());
    one_by_one.push_back(rows[0]);
  }
  for (int i = 0; i < n; i += exact) {
    const std::vector<int32_t> chunk(steps.begin() + i, steps.begin() + i + exact);
    const auto rows = Run(8, chunk, Iota(9 + i, exact), Visibility::Causal());
    ASSERT_TRUE(kv_->Commit(8, Iota(0, exact)).ok());
    in_extends.insert(in_extends.end(), rows.begin(), rows.end());
  }
  ASSERT_EQ(in_extends.size(), one_by_one.size());
  for (int i = 0; i < n; ++i) EXPECT_EQ(in_extends[i], one_by_one[i]) << "token " << i;
}

TEST_P(TransformerTest, HiddenTapsReturnTheResidualStream) {
  std::mt19937 rng(6);
  const auto tokens = RandomTokens(4, rng);
  ASSERT_TRUE(kv_->AddSequence(3).ok());
  ASSERT_TRUE(kv_->Reserve(3, 4).has_value());
  const auto positions = Iota(0, 4);
  const std::vector<int32_t> taps = {config_.num_layers, 0, 1};
  Extend e{.seq = 3, .tokens = tokens, .positions = positions, .hidden_layers = taps};
  auto out = model_->Forward({&e, 1}, *kv_);
  ASSERT_TRUE(out.ok());
  const auto want = DenseForward(config_, model_->weights(), tokens, positions, CausalMask(4));
  const size_t h = config_.hidden_size;
  for (size_t t = 0; t < taps.size(); ++t) {
    for (int i = 0; i < 4; ++i) {
      std::vector<float> got((*out)[0].hidden.begin() + (t * 4 + i) * h,
                             (*out)[0].hidden.begin() + (t * 4 + i + 1) * h);
      EXPECT_LT(MaxRelativeError(got, want.hidden[taps[t]][i]), kTol) << "tap " << taps[t];
    }
  }
}

TEST_P(TransformerTest, LoraAppliesOnlyToGatedTokens) {
  std::mt19937 rng(7);
  LoraAdapter adapter;
  adapter.scale = 0.5f;
  adapter.layers.resize(config_.num_layers);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  auto rand_pair = [&](int out, int in) {
    LoraPair p;
    p.rank = 3;
    p.a.resize(3 * in);
    p.b.resize(out * 3);
    for (auto& v : p.a) v = normal(rng);
    for (auto& v : p.b) v = normal(rng);
    return p;
  };
  const int d = config_.head_dim;
  adapter.layers[0][LoraTarget::kQ] = rand_pair(config_.num_heads * d, config_.hidden_size);
  adapter.layers[0][LoraTarget::kV] = rand_pair(config_.num_kv_heads * d, config_.hidden_size);
  adapter.layers[1][LoraTarget::kO] = rand_pair(config_.hidden_size, config_.num_heads * d);
  adapter.layers[1][LoraTarget::kUp] = rand_pair(config_.intermediate_size, config_.hidden_size);
  adapter.layers[1][LoraTarget::kDown] = rand_pair(config_.hidden_size, config_.intermediate_size);
  model_->SetLoraAdapter(adapter);
  const auto tokens = RandomTokens(6, rng);
  const std::vector<uint8_t> gate = {0, 1, 1, 0, 1, 0};
  ASSERT_TRUE(kv_->AddSequence(4).ok());
  const auto got = Run(4, tokens, Iota(0, 6), Visibility::Causal(), gate);
  const std::vector<bool> gate_b(gate.begin(), gate.end());
  const auto want =
      DenseForward(config_, model_->weights(), tokens, Iota(0, 6), CausalMask(6), &adapter, gate_b);
  const auto plain = DenseForward(config_, model_->weights(), tokens, Iota(0, 6), CausalMask(6));
  for (int i = 0; i < 6; ++i) EXPECT_LT(MaxRelativeError(got[i], want.logits[i]), kTol) << i;
  EXPECT_EQ(MaxRelativeError(want.logits[0], plain.logits[0]), 0.0);
  EXPECT_GT(MaxRelativeError(want.logits[1], plain.logits[1]), 1e-3);  // the adapter matters
}

TEST_P(TransformerTest, MergedLoraEqualsTheAdapterOnEveryRow) {
  std::mt19937 rng(11);
  LoraAdapter adapter{.name = "merged", .scale = 0.75f};
  adapter.layers.resize(config_.num_layers);
  std::normal_distribution<float> normal(0.0f, 0.3f);
  const int q = config_.num_heads * config_.head_dim, kv = config_.num_kv_heads * config_.head_dim;
  const int h = config_.hidden_size, inter = config_.intermediate_size;
  const std::vector<std::tuple<LoraTarget, int, int>> shapes = {
      {LoraTarget::kQ, q, h},       {LoraTarget::kK, kv, h},       {LoraTarget::kV, kv, h},
      {LoraTarget::kO, h, q},       {LoraTarget::kGate, inter, h}, {LoraTarget::kUp, inter, h},
      {LoraTarget::kDown, h, inter}};
  for (int l = 0; l < config_.num_layers; ++l) {
    for (const auto& [target, out, in] : shapes) {
      LoraPair p{.rank = 2};
      p.a.resize(2 * in);
      p.b.resize(out * 2);
      for (auto& v : p.a) v = normal(rng);
      for (auto& v : p.b) v = normal(rng);
      adapter.layers[l][target] = std::move(p);
    }
  }
  ModelWeights merged = model_->weights().Unpacked();
  ASSERT_TRUE(MergeLoraAdapter(adapter, config_, merged).ok());
  auto merged_model = Transformer::FromWeights(config_, std::move(merged));
  const auto tokens = RandomTokens(7, rng);
  const std::vector<bool> every_row(7, true);
  const auto want = DenseForward(config_, model_->weights(), tokens, Iota(0, 7), CausalMask(7),
                                 &adapter, every_row);
  const auto plain = DenseForward(config_, model_->weights(), tokens, Iota(0, 7), CausalMask(7));
  model_ = std::move(merged_model);
  kv_ = std::make_unique<KvCache>(model_->KvOptions(1024, 4));
  ASSERT_TRUE(kv_->AddSequence(5).ok());
  const auto got = Run(5, tokens, Iota(0, 7), Visibility::Causal());
  for (int i = 0; i < 7; ++i) {
    EXPECT_LT(MaxRelativeError(got[i], want.logits[i]), kTol) << i;
    EXPECT_GT(MaxRelativeError(got[i], plain.logits[i]), 1e-3) << i;  // the merge changed it
  }

  // Packed weights, and an adapter of another model's shapes, are refused.
  ModelWeights packed = model_->weights();
  EXPECT_EQ(MergeLoraAdapter(adapter, config_, packed).code(),
            absl::StatusCode::kFailedPrecondition);
  ModelWeights unpacked = model_->weights().Unpacked();
  adapter.layers[1][LoraTarget::kDown].a.resize(2 * (inter + 1));
  const absl::Status misfit = MergeLoraAdapter(adapter, config_, unpacked);
  EXPECT_EQ(misfit.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(misfit.message().find("layer 1"), std::string::npos) << misfit;
  adapter.layers.pop_back();
  EXPECT_EQ(MergeLoraAdapter(adapter, config_, unpacked).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransformerTest, MalformedExtendsAreRejectedWithoutTouchingTheCache) {
  ASSERT_TRUE(kv_->AddSequence(9).ok());
  const std::vector<int32_t> tokens = {1, 2, 3}, positions = {0, 1, 2}, bad_tok = {1, 1000, 2};
  const std::vector<int32_t> bad_out = {3};
  Extend no_reservation{.seq = 9, .tokens = tokens, .positions = positions};
  EXPECT_EQ(model_->Forward({&no_reservation, 1}, *kv_).status().code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(kv_->Reserve(9, 3).has_value());
  Extend out_of_vocab{.seq = 9, .tokens = bad_tok, .positions = positions};
  auto s = model_->Forward({&out_of_vocab, 1}, *kv_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("vocabulary"), std::string::npos) << s;
  Extend bad_output{.seq = 9, .tokens = tokens, .positions = positions, .outputs = bad_out};
  EXPECT_EQ(model_->Forward({&bad_output, 1}, *kv_).status().code(),
            absl::StatusCode::kInvalidArgument);
  Extend unknown{.seq = 77, .tokens = tokens, .positions = positions};
  EXPECT_EQ(model_->Forward({&unknown, 1}, *kv_).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_P(TransformerTest, SlidingWindowMatchesDenseWindowedMask) {
  config_.sliding_window = 4;
  model_ = Transformer::FromWeights(config_, RandomWeights(config_, 1234, 0.2f));
  std::mt19937 rng(8);
  const int n = 11;
  const auto tokens = RandomTokens(n, rng);
  auto mask = CausalMask(n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) mask[i][j] = mask[i][j] && i - j < 4;
  const auto want = DenseForward(config_, model_->weights(), tokens, Iota(0, n), mask);
  // A prefill of 7, then single-token steps through the cache.
  ASSERT_TRUE(kv_->AddSequence(6).ok());
  std::vector<int32_t> head(tokens.begin(), tokens.begin() + 7);
  auto got = Run(6, head, Iota(0, 7), Visibility::Causal());
  ASSERT_TRUE(kv_->Commit(6, Iota(0, 7)).ok());
  for (int i = 7; i < n; ++i) {
    got.push_back(Run(6, {tokens[i]}, {i}, Visibility::Causal())[0]);
    ASSERT_TRUE(kv_->Commit(6, std::vector<int32_t>{0}).ok());
  }
  for (int i = 0; i < n; ++i) EXPECT_LT(MaxRelativeError(got[i], want.logits[i]), kTol) << i;
  const auto unwindowed =
      DenseForward(config_, model_->weights(), tokens, Iota(0, n), CausalMask(n));
  EXPECT_GT(MaxRelativeError(want.logits[n - 1], unwindowed.logits[n - 1]), 1e-3);
}

// A batch of three extends with several output rows each, run on a fresh cache of the model;
// `samples` (one list per extend, empty = none) and `return_logits` apply to every extend.
std::vector<ExtendOutput> RunSampledBatch(Transformer& model,
                                          const std::vector<std::vector<SampleRequest>>& samples,
                                          bool return_logits) {
  KvCache kv(model.KvOptions(256, 4));
  const std::vector<std::vector<int32_t>> tokens = {
      {5, 17, 3, 88, 41, 9}, {60, 2, 2, 71}, {33, 12, 90}};
  const std::vector<std::vector<int32_t>> outputs = {{2, 5}, {3}, {0, 1, 2}};
  std::vector<std::vector<int32_t>> positions(tokens.size());
  std::vector<Extend> batch;
  for (size_t e = 0; e < tokens.size(); ++e) {
    EXPECT_TRUE(kv.AddSequence(e).ok());
    EXPECT_TRUE(kv.Reserve(e, static_cast<int>(tokens[e].size())).has_value());
    for (size_t i = 0; i < tokens[e].size(); ++i) positions[e].push_back(static_cast<int32_t>(i));
  }
  for (size_t e = 0; e < tokens.size(); ++e) {
    batch.push_back({.seq = static_cast<SeqId>(e),
                     .tokens = tokens[e],
                     .positions = positions[e],
                     .outputs = outputs[e],
                     .samples = samples[e],
                     .return_logits = return_logits});
  }
  auto out = model.Forward(batch, kv);
  EXPECT_TRUE(out.ok()) << out.status();
  return out.ok() ? *std::move(out) : std::vector<ExtendOutput>(tokens.size());
}

TEST_P(TransformerTest, SampleRequestsGiveTheHostSamplersTokens) {
  // Mixed settings per row: greedy, temperature, top-k, top-p, min-p, seeds, purposes.
  const SamplingParams greedy;
  const SamplingParams hot{.temperature = 2.0f, .seed = 7};
  const SamplingParams top_k{.temperature = 1.5f, .top_k = 5, .seed = 11};
  const SamplingParams top_p{.temperature = 1.2f, .top_p = 0.8f, .seed = 3};
  const SamplingParams min_p{.temperature = 1.0f, .min_p = 0.05f, .seed = 99};
  const SamplingParams all{.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 123456789};
  const std::vector<std::vector<SampleRequest>> samples = {
      {{.params = greedy, .position = 6}, {.params = hot, .position = 40}},
      {{.params = top_k, .position = 4, .purpose = RngPurpose::kResample}},
      {{.params = top_p, .position = 3},
       {.params = min_p, .position = 1000},
       {.params = all, .position = 12, .purpose = RngPurpose::kDraft}}};
  const std::vector<std::vector<SampleRequest>> none(samples.size());
  const std::vector<ExtendOutput> plain = RunSampledBatch(*model_, none, true);
  const std::vector<ExtendOutput> both = RunSampledBatch(*model_, samples, true);
  const std::vector<ExtendOutput> only = RunSampledBatch(*model_, samples, false);
  ASSERT_EQ(plain.size(), 3u);
  ASSERT_EQ(both.size(), 3u);
  ASSERT_EQ(only.size(), 3u);
  const size_t vocab = config_.vocab_size;
  int differs_from_argmax = 0;
  for (size_t e = 0; e < samples.size(); ++e) {
    SCOPED_TRACE(e);
    EXPECT_TRUE(plain[e].tokens.empty());
    ASSERT_EQ(plain[e].logits.size(), samples[e].size() * vocab);
    // Sampling changes nothing about the logits; without return_logits none come back.
    EXPECT_EQ(both[e].logits, plain[e].logits);
    EXPECT_TRUE(only[e].logits.empty());
    ASSERT_EQ(both[e].tokens.size(), samples[e].size());
    ASSERT_EQ(only[e].tokens.size(), samples[e].size());
    for (size_t i = 0; i < samples[e].size(); ++i) {
      const std::span<const float> row(plain[e].logits.data() + i * vocab, vocab);
      const SampleRequest& r = samples[e][i];
      const int32_t want = SampleToken(row, r.params, r.position, r.purpose);
      EXPECT_EQ(both[e].tokens[i], want) << "row " << i;
      EXPECT_EQ(only[e].tokens[i], want) << "row " << i;
      if (r.params.greedy()) {
        EXPECT_EQ(want, Argmax(row));
      }
      if (want != Argmax(row)) ++differs_from_argmax;
    }
  }
  // The rows really sample (a sampler that ignored the settings would give argmax everywhere).
  EXPECT_GT(differs_from_argmax, 0);
}

// Requests with a draft verify it on the model: each row's token and flag are exactly
// VerifyDraft's over the row's logits (greedy and sampled rows; drafts both the row's argmax
// and other tokens, so that both verdicts occur), mixed with plain samples in one batch.
TEST_P(TransformerTest, DraftRequestsGiveVerifyDraftsVerdicts) {
  const std::vector<std::vector<SampleRequest>> none(3);
  const std::vector<ExtendOutput> plain = RunSampledBatch(*model_, none, true);
  ASSERT_EQ(plain.size(), 3u);
  const size_t vocab = config_.vocab_size;
  auto row = [&](size_t e, size_t i) {
    return std::span<const float>(plain[e].logits.data() + i * vocab, vocab);
  };
  const SamplingParams greedy;
  const SamplingParams hot{.temperature = 1.5f, .seed = 21};
  const SamplingParams top_k{.temperature = 0.7f, .top_k = 3, .seed = 5};
  const SamplingParams top_p{.temperature = 1.0f, .top_p = 0.9f, .seed = 77};
  const int32_t other = 13;  // a draft for the sampled rows, accepted or not by chance
  // A greedy row's draft that is not its argmax, so rejected.
  const int32_t wrong = (Argmax(row(0, 1)) + 1) % static_cast<int32_t>(vocab);
  std::vector<std::vector<SampleRequest>> samples = {
      {{.params = greedy, .position = 6, .draft = Argmax(row(0, 0))},
       {.params = greedy, .position = 7, .draft = wrong}},
      {{.params = hot, .position = 4, .draft = Argmax(row(1, 0))}},
      {{.params = top_k, .position = 3, .draft = other},
       {.params = top_p, .position = 4},  // a plain sample (the bonus row)
       {.params = hot, .position = 5, .draft = other}}};
  const std::vector<ExtendOutput> both = RunSampledBatch(*model_, samples, true);
  const std::vector<ExtendOutput> only = RunSampledBatch(*model_, samples, false);
  int accepted = 0, rejected = 0;
  std::vector<float> scratch;
  for (size_t e = 0; e < samples.size(); ++e) {
    SCOPED_TRACE(e);
    EXPECT_EQ(both[e].logits, plain[e].logits);
    EXPECT_TRUE(only[e].logits.empty());
    ASSERT_EQ(only[e].tokens.size(), samples[e].size());
    ASSERT_EQ(only[e].accepted.size(), samples[e].size());
    EXPECT_EQ(both[e].tokens, only[e].tokens);
    EXPECT_EQ(both[e].accepted, only[e].accepted);
    for (size_t i = 0; i < samples[e].size(); ++i) {
      const SampleRequest& r = samples[e][i];
      if (r.draft < 0) {
        EXPECT_EQ(only[e].tokens[i], SampleToken(row(e, i), r.params, r.position)) << i;
        EXPECT_EQ(only[e].accepted[i], 1) << i;
        continue;
      }
      bool ok = false;
      const int32_t want = VerifyDraft(row(e, i), r.draft, r.params, r.position, &ok, &scratch);
      EXPECT_EQ(only[e].tokens[i], want) << "row " << i;
      EXPECT_EQ(only[e].accepted[i], ok ? 1 : 0) << "row " << i;
      if (ok) {
        EXPECT_EQ(want, r.draft);
        ++accepted;
      } else {
        EXPECT_NE(want, r.draft);
        ++rejected;
      }
    }
  }
  // Greedy rows settle both ways by construction: the argmax draft is accepted, `wrong` not.
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
}

TEST_P(TransformerTest, DraftsOutsideTheVocabularyAreRejected) {
  ASSERT_TRUE(kv_->AddSequence(3).ok());
  ASSERT_TRUE(kv_->Reserve(3, 3).has_value());
  const std::vector<int32_t> tokens = {1, 2, 3}, positions = {0, 1, 2}, outputs = {1, 2};
  for (const int32_t draft : {config_.vocab_size, -2}) {
    SCOPED_TRACE(draft);
    std::vector<SampleRequest> requests(2);
    requests[0].draft = draft;
    Extend x{.seq = 3,
             .tokens = tokens,
             .positions = positions,
             .outputs = outputs,
             .samples = requests,
             .return_logits = false};
    const absl::Status status = model_->Forward({&x, 1}, *kv_).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(status.message().find("draft token"), std::string::npos) << status;
  }
  // The cache is untouched by the rejected extends: a valid one still runs.
  std::vector<SampleRequest> valid(2);
  valid[0].draft = config_.vocab_size - 1;
  Extend x{
      .seq = 3, .tokens = tokens, .positions = positions, .outputs = outputs, .samples = valid};
  EXPECT_TRUE(model_->Forward({&x, 1}, *kv_).ok());
}

TEST_P(TransformerTest, MalformedSampleRequestsAreRejected) {
  ASSERT_TRUE(kv_->AddSequence(3).ok());
  ASSERT_TRUE(kv_->Reserve(3, 3).has_value());
  const std::vector<int32_t> tokens = {1, 2, 3}, positions = {0, 1, 2}, outputs = {1, 2};
  const std::vector<SampleRequest> one = {{.position = 3}};
  Extend too_few{
      .seq = 3, .tokens = tokens, .positions = positions, .outputs = outputs, .samples = one};
  auto status = model_->Forward({&too_few, 1}, *kv_).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("sample requests"), std::string::npos) << status;
  std::vector<SampleRequest> nan(2);
  nan[1].params.temperature = std::nanf("");
  Extend bad_setting{
      .seq = 3, .tokens = tokens, .positions = positions, .outputs = outputs, .samples = nan};
  EXPECT_EQ(model_->Forward({&bad_setting, 1}, *kv_).status().code(),
            absl::StatusCode::kInvalidArgument);
  std::vector<SampleRequest> negative_k(2);
  negative_k[0].params.top_k = -1;
  Extend bad_k{.seq = 3,
               .tokens = tokens,
               .positions = positions,
               .outputs = outputs,
               .samples = negative_k};
  EXPECT_EQ(model_->Forward({&bad_k, 1}, *kv_).status().code(), absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Archs, TransformerTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Qwen3" : "Qwen2"; });

}  // namespace
}  // namespace tandem
