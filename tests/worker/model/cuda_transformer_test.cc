// The CUDA backend (Transformer::UseDevice({Device::kCuda})) against the fp32 CPU forward:
// full-model logits on the bundled models, every visibility kind, batches, hidden taps and
// gated LoRA on a random model, CUDA-graph replay against eager launches, and every lossless
// mode's greedy output through the in-process generator. bf16 weights, activations and KV make
// logits differ from the CPU's within bf16 rounding; greedy tokens are compared exactly.
// Device sampling and verification: cuda_sampling_test.cc. Every test skips without a GPU.
#include "worker/model/cuda/cuda_transformer.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"
#include "tests/worker/model/cuda_test_support.h"
#include "worker/decoding/modes.h"
#include "worker/engine/engine.h"
#include "worker/engine/local_generator.h"
#include "worker/model/transformer.h"

namespace tandem {
namespace {

using cuda_testing::CudaModelTest;
using cuda_testing::Iota;
using cuda_testing::kLogitTolerance;
using cuda_testing::kModels;
using cuda_testing::PromptIds;
using cuda_testing::RelativeError;
using cuda_testing::Runner;
using cuda_testing::TinyConfig;

TEST_F(CudaModelTest, BundledModelsLogitsMatchTheCpu) {
  int checked = 0;
  for (const char* name : {"tandem-target", "tandem-drafter", "tandem-idlm", "tandem-sdlm"}) {
    const std::string dir = kModels + name;
    if (!std::filesystem::exists(dir + "/config.json")) continue;
    SCOPED_TRACE(name);
    auto cpu = Transformer::Load(dir);
    auto gpu = Transformer::Load(dir);
    ASSERT_TRUE(cpu.ok() && gpu.ok());
    ASSERT_TRUE((*gpu)->UseDevice({.device = Device::kCuda}).ok());
    KvCache cpu_kv((*cpu)->KvOptions(512));
    KvCache gpu_kv((*gpu)->KvOptions(512));
    ASSERT_EQ(gpu_kv.host_storage(), nullptr);
    Runner c{cpu->get(), &cpu_kv}, g{gpu->get(), &gpu_kv};
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> token(0, (*cpu)->config().vocab_size - 1);
    std::vector<int32_t> prompt(37);
    for (auto& t : prompt) t = token(rng);
    const std::vector<int32_t> positions = Iota(0, 37), outputs = Iota(0, 37);
    const Extend prefill{.seq = 1, .tokens = prompt, .positions = positions, .outputs = outputs};
    auto want = c.Run({prefill});
    auto got = g.Run({prefill});
    ASSERT_TRUE(want.ok() && got.ok()) << got.status();
    EXPECT_LE(RelativeError((*got)[0].logits, (*want)[0].logits), kLogitTolerance);
    ASSERT_TRUE(cpu_kv.Commit(1, outputs).ok());
    ASSERT_TRUE(gpu_kv.Commit(1, outputs).ok());
    // Decode steps on the committed KV, greedy from the CPU logits.
    int32_t next = static_cast<int32_t>(Argmax(std::span<const float>(
        (*want)[0].logits.data() + 36 * (*cpu)->config().vocab_size, (*cpu)->config().vocab_size)));
    for (int step = 0; step < 8; ++step) {
      const std::vector<int32_t> tok = {next}, pos = {37 + step}, out = {0}, keep = {0};
      const Extend e{.seq = 1, .tokens = tok, .positions = pos, .outputs = out};
      auto w = c.Run({e});
      auto r = g.Run({e});
      ASSERT_TRUE(w.ok() && r.ok()) << r.status();
      EXPECT_LE(RelativeError((*r)[0].logits, (*w)[0].logits), kLogitTolerance) << step;
      ASSERT_TRUE(cpu_kv.Commit(1, keep).ok());
      ASSERT_TRUE(gpu_kv.Commit(1, keep).ok());
      next = static_cast<int32_t>(Argmax((*w)[0].logits));
    }
    ++checked;
  }
  if (checked == 0) GTEST_SKIP() << "no bundled model under " << kModels;
}

// Host-only: which captured graph a decode batch replays.
TEST(CudaGraphBucketTest, SmallestBucketThatHoldsTheBatch) {
  EXPECT_EQ(CudaTransformer::GraphBucket(1), 1);
  EXPECT_EQ(CudaTransformer::GraphBucket(2), 2);
  EXPECT_EQ(CudaTransformer::GraphBucket(3), 4);
  EXPECT_EQ(CudaTransformer::GraphBucket(9), 16);
  EXPECT_EQ(CudaTransformer::GraphBucket(64), 64);
  EXPECT_EQ(CudaTransformer::GraphBucket(65), 0);  // eager
}

LoraAdapter RandomAdapter(const ModelConfig& c, int rank, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, 0.1f);
  LoraAdapter adapter;
  adapter.scale = 0.5f;
  adapter.layers.resize(c.num_layers);
  const int q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  const std::pair<LoraTarget, std::pair<int, int>> shapes[] = {
      {LoraTarget::kQ, {c.hidden_size, q}},
      {LoraTarget::kV, {c.hidden_size, kv}},
      {LoraTarget::kO, {q, c.hidden_size}},
      {LoraTarget::kUp, {c.hidden_size, c.intermediate_size}},
      {LoraTarget::kDown, {c.intermediate_size, c.hidden_size}}};
  for (auto& layer : adapter.layers) {
    for (const auto& [target, dims] : shapes) {
      LoraPair pair;
      pair.rank = rank;
      pair.a.resize(static_cast<size_t>(rank) * dims.first);
      pair.b.resize(static_cast<size_t>(dims.second) * rank);
      for (float& x : pair.a) x = dist(rng);
      for (float& x : pair.b) x = dist(rng);
      layer[target] = std::move(pair);
    }
  }
  return adapter;
}

class CudaTinyModelTest : public CudaModelTest, public ::testing::WithParamInterface<bool> {};

TEST_P(CudaTinyModelTest, VisibilityBatchesTapsAndLoraMatchTheCpu) {
  const ModelConfig config = TinyConfig(GetParam());
  std::mt19937 rng(11);
  const ModelWeights weights = RandomWeights(config, 21, 0.2f);
  auto cpu = Transformer::FromWeights(config, weights);
  auto gpu = Transformer::FromWeights(config, weights);
  const LoraAdapter adapter = RandomAdapter(config, 8, rng);
  cpu->SetLoraAdapter(adapter);
  gpu->SetLoraAdapter(adapter);
  ASSERT_TRUE(gpu->UseDevice({.device = Device::kCuda}).ok());
  KvCache cpu_kv(cpu->KvOptions(1024, 4)), gpu_kv(gpu->KvOptions(1024, 4));
  Runner c{cpu.get(), &cpu_kv}, g{gpu.get(), &gpu_kv};
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  auto tokens = [&](int n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = token(rng);
    return t;
  };

  // Prefill three sequences in one batch (different lengths, causal).
  const std::vector<int32_t> t1 = tokens(19), t2 = tokens(5), t3 = tokens(33);
  const std::vector<int32_t> p1 = Iota(0, 19), p2 = Iota(0, 5), p3 = Iota(0, 33);
  const std::vector<int32_t> o1 = Iota(0, 19), o2 = {4}, o3 = {0, 32};
  const std::vector<int32_t> taps = {0, 1, 2};
  std::vector<Extend> prefill = {
      {.seq = 1, .tokens = t1, .positions = p1, .outputs = o1, .hidden_layers = taps},
      {.seq = 2, .tokens = t2, .positions = p2, .outputs = o2},
      {.seq = 3, .tokens = t3, .positions = p3, .outputs = o3}};
  auto want = c.Run(prefill);
  auto got = g.Run(prefill);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  for (size_t e = 0; e < prefill.size(); ++e) {
    EXPECT_LE(RelativeError((*got)[e].logits, (*want)[e].logits), kLogitTolerance) << e;
    EXPECT_LE(RelativeError((*got)[e].hidden, (*want)[e].hidden), kLogitTolerance) << e;
    EXPECT_EQ((*got)[e].hidden.size(), (*want)[e].hidden.size());
  }
  for (SeqId s : {1, 2, 3}) {
    const std::vector<int32_t> all = Iota(0, cpu_kv.TentativeLength(s));
    ASSERT_TRUE(cpu_kv.Commit(s, all).ok());
    ASSERT_TRUE(gpu_kv.Commit(s, all).ok());
  }

  // Drafts with every visibility kind, repeated positions and gated LoRA, then commits that
  // move rows (kv_commit on the device), then a causal step that reads the moved rows.
  Visibility expl = Visibility::Explicit(6);
  for (int i = 0; i < 6; ++i) {
    expl.Allow(i, i);
    if (i > 0) expl.Allow(i, i / 2);
  }
  const std::vector<int32_t> d1 = tokens(6), d2 = tokens(8), d3 = tokens(4);
  const std::vector<int32_t> q1 = {19, 20, 20, 21, 21, 22}, q2 = Iota(5, 8), q3 = Iota(33, 4);
  const std::vector<int32_t> all6 = Iota(0, 6), all8 = Iota(0, 8), all4 = Iota(0, 4);
  const std::vector<uint8_t> gate8 = {0, 1, 1, 0, 1, 1, 1, 0}, gate4 = {1, 1, 1, 1};
  std::vector<Extend> drafts = {
      {.seq = 1, .tokens = d1, .positions = q1, .visible = expl, .outputs = all6},
      {.seq = 2,
       .tokens = d2,
       .positions = q2,
       .visible = Visibility::Block(3),
       .outputs = all8,
       .lora_gate = gate8},
      {.seq = 3,
       .tokens = d3,
       .positions = q3,
       .visible = Visibility::Full(),
       .outputs = all4,
       .lora_gate = gate4}};
  want = c.Run(drafts);
  got = g.Run(drafts);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  for (size_t e = 0; e < drafts.size(); ++e) {
    EXPECT_LE(RelativeError((*got)[e].logits, (*want)[e].logits), kLogitTolerance) << e;
  }
  const std::vector<int32_t> keep1 = {1, 3, 4}, keep2 = {2, 5, 6, 7}, keep3 = {3};
  for (auto [s, keep] : {std::pair{1, &keep1}, std::pair{2, &keep2}, std::pair{3, &keep3}}) {
    ASSERT_TRUE(cpu_kv.Commit(s, *keep).ok());
    ASSERT_TRUE(gpu_kv.Commit(s, *keep).ok());
  }
  const std::vector<int32_t> n1 = tokens(2), n2 = tokens(2), n3 = tokens(2);
  const std::vector<int32_t> r1 = Iota(22, 2), r2 = Iota(9, 2), r3 = Iota(34, 2), out2 = {0, 1};
  std::vector<Extend> next = {{.seq = 1, .tokens = n1, .positions = r1, .outputs = out2},
                              {.seq = 2, .tokens = n2, .positions = r2, .outputs = out2},
                              {.seq = 3, .tokens = n3, .positions = r3, .outputs = out2}};
  want = c.Run(next);
  got = g.Run(next);
  ASSERT_TRUE(want.ok() && got.ok()) << got.status();
  for (size_t e = 0; e < next.size(); ++e) {
    EXPECT_LE(RelativeError((*got)[e].logits, (*want)[e].logits), kLogitTolerance) << e;
  }
}

INSTANTIATE_TEST_SUITE_P(Arch, CudaTinyModelTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Qwen3" : "Qwen2"; });

// Decode steps of `batch` sequences, run on a graph-enabled and an eager model with the same
// weights; returns the logits of both for each step.
TEST_F(CudaModelTest, GraphReplayEqualsEagerLaunches) {
  const ModelConfig config = TinyConfig(true);
  const ModelWeights weights = RandomWeights(config, 5, 0.2f);
  auto graphed = Transformer::FromWeights(config, weights);
  auto eager = Transformer::FromWeights(config, weights);
  ASSERT_TRUE(graphed->UseDevice({.device = Device::kCuda, .cuda_graphs = true}).ok());
  ASSERT_TRUE(eager->UseDevice({.device = Device::kCuda, .cuda_graphs = false}).ok());
  auto* graphed_backend = dynamic_cast<CudaTransformer*>(graphed->backend());
  auto* eager_backend = dynamic_cast<CudaTransformer*>(eager->backend());
  ASSERT_NE(graphed_backend, nullptr);
  ASSERT_NE(eager_backend, nullptr);
  std::mt19937 rng(3);
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  for (int batch : {1, 2, 3, 4, 7, 8}) {
    SCOPED_TRACE(batch);
    KvCache gkv(graphed->KvOptions(4096, 16)), ekv(eager->KvOptions(4096, 16));
    Runner g{graphed.get(), &gkv}, e{eager.get(), &ekv};
    // Prefill each sequence (eager on both), of different lengths.
    absl::StatusOr<std::vector<std::vector<int32_t>>> prefilled =
        PrefillBoth(g, e, batch, 5, 9, config.vocab_size, rng);
    ASSERT_TRUE(prefilled.ok()) << prefilled.status();
    const std::vector<std::vector<int32_t>>& prompts = *prefilled;
    const std::vector<int32_t> last = {0};
    const int64_t replays_before = graphed_backend->stats().graph_replays;
    for (int step = 0; step < 20; ++step) {
      std::vector<std::vector<int32_t>> tok(batch), pos(batch);
      std::vector<Extend> extends;
      for (int s = 0; s < batch; ++s) {
        tok[s] = {token(rng)};
        pos[s] = {static_cast<int32_t>(prompts[s].size()) + step};
        extends.push_back({.seq = s, .tokens = tok[s], .positions = pos[s], .outputs = last});
      }
      auto got = g.Run(extends);
      auto want = e.Run(extends);
      ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
      for (int s = 0; s < batch; ++s) {
        const bool exact_bucket = CudaTransformer::GraphBucket(batch) == batch;
        if (exact_bucket) {
          // Same shapes, same launches: bit-identical.
          EXPECT_EQ((*got)[s].logits, (*want)[s].logits) << "step " << step << " seq " << s;
        } else {
          // Padded to the bucket: the matrix products may pick other kernels for more rows.
          EXPECT_LE(RelativeError((*got)[s].logits, (*want)[s].logits), 1e-2);
          EXPECT_EQ(Argmax((*got)[s].logits), Argmax((*want)[s].logits));
        }
        ASSERT_TRUE(gkv.Commit(s, last).ok());
        ASSERT_TRUE(ekv.Commit(s, last).ok());
      }
    }
    EXPECT_EQ(graphed_backend->stats().graph_replays - replays_before, 20);
  }
  EXPECT_GE(graphed_backend->stats().graphs_captured, 1);
  EXPECT_EQ(eager_backend->stats().graph_replays, 0);
}

// Every lossless mode's greedy output on the bundled target: on the GPU, each equals the GPU's
// AR output (lossless on the same backend), and the GPU's AR output is the CPU's.
TEST_F(CudaModelTest, LosslessModesGreedyOutputMatchesTheCpu) {
  const std::string dir = kModels + "tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled target";
  auto cpu = LoadModelDir(dir);
  auto gpu = LoadModelDir(dir, {.device = Device::kCuda});
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  const std::string drafter_dir = kModels + "tandem-drafter";
  absl::StatusOr<LoadedModel> cpu_drafter = absl::NotFoundError("no drafter");
  absl::StatusOr<LoadedModel> gpu_drafter = absl::NotFoundError("no drafter");
  if (std::filesystem::exists(drafter_dir + "/config.json")) {
    cpu_drafter = LoadModelDir(drafter_dir);
    gpu_drafter = LoadModelDir(drafter_dir, {.device = Device::kCuda});
    ASSERT_TRUE(cpu_drafter.ok() && gpu_drafter.ok());
  }
  LocalGenerator cpu_gen(&*cpu), gpu_gen(&*gpu);
  auto first_divergence = [](const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    size_t i = 0;
    while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
    return i;
  };
  const std::string prompt = "def fibonacci(n):";
  GenerateOptions ar;
  ar.max_tokens = 32;
  auto cpu_ar = cpu_gen.Generate(prompt, ar);
  auto gpu_ar = gpu_gen.Generate(prompt, ar);
  ASSERT_TRUE(cpu_ar.ok() && gpu_ar.ok()) << gpu_ar.status();
  EXPECT_EQ(gpu_ar->tokens, cpu_ar->tokens)
      << "ar: first divergence at token " << first_divergence(gpu_ar->tokens, cpu_ar->tokens);
  for (const std::string& mode : ImplementedModes()) {
    if (mode == "ar") continue;
    SCOPED_TRACE(mode);
    GenerateOptions options = ar;
    options.mode = mode;
    options.drafter = gpu_drafter.ok() ? &*gpu_drafter : &*gpu;
    auto got = gpu_gen.Generate(prompt, options);
    if (!got.ok()) {
      // A mode this model cannot run (e.g. one that needs an adapter) fails on the CPU too.
      options.drafter = cpu_drafter.ok() ? &*cpu_drafter : &*cpu;
      EXPECT_FALSE(cpu_gen.Generate(prompt, options).ok()) << got.status();
      continue;
    }
    if (!got->lossless) continue;
    EXPECT_EQ(got->tokens, gpu_ar->tokens) << mode << ": first divergence from AR at token "
                                           << first_divergence(got->tokens, gpu_ar->tokens);
  }
}

// Collects one request's committed tokens; the test thread waits for the last event.
class TokenSink : public SequenceSink {
 public:
  void OnEvent(SequenceEvent event) override {
    absl::MutexLock lock(&mu_);
    tokens_.insert(tokens_.end(), event.tokens.begin(), event.tokens.end());
    if (!event.error.ok()) error_ = event.error;
    if (event.finish != FinishReason::kNone || !event.error.ok()) done_ = true;
  }
  bool Wait() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(120));
  }
  std::vector<int32_t> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Status error() const {
    absl::MutexLock lock(&mu_);
    return error_;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_;
  absl::Status error_;
  bool done_ = false;
};

// The worker actor with continuous batching: several greedy requests at once (prefill chunks,
// batched decode steps that replay CUDA graphs) give the CPU engine's tokens, per lossless mode
// that runs without a drafter service. The `ar` rows sample on the device (the engine asks the
// model for tokens, not logits), so this also checks device argmax against the CPU engine.
// Then the same under a JSON schema: the rows come back as logits, masked by the grammar on the
// host.
TEST_F(CudaModelTest, EngineBatchesGiveTheCpuEnginesGreedyTokens) {
  const std::string dir = kModels + "tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled target";
  auto cpu = LoadModelDir(dir);
  auto gpu = LoadModelDir(dir, {.device = Device::kCuda});
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << gpu.status();
  const std::vector<std::string> prompts = {"def add(a, b):", "The capital of France is",
                                            "for i in range(10):", "import numpy as np\n",
                                            "Once upon a time"};
  const GrammarSpec schema{.kind = GrammarSpec::Kind::kJsonSchema,
                           .text = R"({"type": "object", "properties": {"ok": {"type": "boolean"},
                                       "n": {"type": "integer"}}, "required": ["ok", "n"]})"};
  for (const bool structured : {false, true}) {
    for (const std::string mode : {"ar", "jacobi", "self_spec"}) {
      SCOPED_TRACE(mode + (structured ? " json_schema" : ""));
      std::vector<std::vector<int32_t>> outputs[2];
      for (int device = 0; device < 2; ++device) {
        EngineOptions options;
        options.kv_tokens = 8192;
        options.default_mode = "ar";
        auto engine = Engine::Create(device == 0 ? &*cpu : &*gpu, options, nullptr);
        ASSERT_TRUE(engine.ok()) << engine.status();
        std::vector<std::shared_ptr<TokenSink>> sinks;
        for (const std::string& prompt : prompts) {
          SequenceRequest request;
          request.prompt = prompt;
          request.mode = mode;
          request.max_tokens = 24;
          if (structured) request.grammar = schema;
          sinks.push_back(std::make_shared<TokenSink>());
          auto submitted = (*engine)->Submit(std::move(request), sinks.back());
          if (!submitted.ok()) break;  // a mode the engine does not run: both devices skip it
        }
        for (const auto& sink : sinks) {
          ASSERT_TRUE(sink->Wait());
          EXPECT_TRUE(sink->error().ok()) << sink->error();
          outputs[device].push_back(sink->tokens());
        }
      }
      ASSERT_EQ(outputs[0].size(), outputs[1].size());
      for (size_t i = 0; i < outputs[0].size(); ++i) {
        size_t first = 0;
        while (first < outputs[0][i].size() && first < outputs[1][i].size() &&
               outputs[0][i][first] == outputs[1][i][first]) {
          ++first;
        }
        EXPECT_EQ(outputs[1][i], outputs[0][i])
            << "prompt " << i << ": first divergence at token " << first;
      }
    }
  }
}

}  // namespace
}  // namespace tandem
