// The CUDA backend's sampling and draft verification on the device against the host's
// (worker/sampling): device-sampled tokens against SampleToken, eager and after graph replay; a
// seeded `ar` run against host sampling of the same GPU logits; device verification against
// VerifyDraft on the same logits; `spec` with device verification against `ar` and against
// host verification. Every test skips without a GPU.
#include <algorithm>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/model/cuda_test_support.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/runner.h"
#include "worker/decoding/spec.h"
#include "worker/model/cuda/cuda_transformer.h"
#include "worker/model/transformer.h"
#include "worker/sampling/sampling.h"

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

// Mixed per-row settings for device sampling: greedy rows and sampled rows of every filter.
SampleRequest MixedRequest(int row, int step) {
  SampleRequest r;
  r.position = static_cast<uint64_t>(1000 * row + step);
  r.params.seed = 77 + row;
  switch (row % 5) {
    case 0:
      break;  // greedy
    case 1:
      r.params.temperature = 1.0f;
      break;
    case 2:
      r.params.temperature = 0.8f;
      r.params.top_k = 10;
      break;
    case 3:
      r.params.temperature = 1.2f;
      r.params.top_p = 0.9f;
      r.purpose = RngPurpose::kResample;
      break;
    default:
      r.params.temperature = 0.7f;
      r.params.top_k = 40;
      r.params.top_p = 0.95f;
      r.params.min_p = 0.02f;
      break;
  }
  return r;
}

// The device sampler against worker/sampling SampleToken on the same (device) logits, over
// batched multi-output extends (eager path): greedy rows exactly; sampled rows equal except
// where u lands within float rounding of a CDF boundary (kernels/cuda/sampling.cuh), which is
// counted and bounded. Asking for tokens only gives the same tokens.
TEST_F(CudaModelTest, DeviceSampledTokensMatchTheHostSampler) {
  ModelConfig config = TinyConfig(false);
  config.vocab_size = 4099;  // a real sampler workload: many rows over a wide vocabulary
  const ModelWeights weights = RandomWeights(config, 9, 0.2f);
  auto gpu = Transformer::FromWeights(config, weights);
  ASSERT_TRUE(gpu->UseDevice({.device = Device::kCuda, .cuda_graphs = false}).ok());
  std::mt19937 rng(13);
  std::uniform_int_distribution<int32_t> token(0, config.vocab_size - 1);
  int greedy_rows = 0, sampled_rows = 0, sampled_mismatches = 0;
  for (int step = 0; step < 12; ++step) {
    KvCache both_kv(gpu->KvOptions(1024, 16)), only_kv(gpu->KvOptions(1024, 16));
    Runner both{gpu.get(), &both_kv}, only{gpu.get(), &only_kv};
    std::vector<std::vector<int32_t>> tokens(4), positions(4), outputs(4);
    std::vector<std::vector<SampleRequest>> samples(4);
    int row = 0;
    for (int e = 0; e < 4; ++e) {
      const int n = 3 + 4 * e;
      for (int i = 0; i < n; ++i) tokens[e].push_back(token(rng));
      positions[e] = Iota(0, n);
      for (int i = e % 2; i < n; i += 2) {
        outputs[e].push_back(i);
        samples[e].push_back(MixedRequest(row++, step));
      }
    }
    std::vector<Extend> with_logits, tokens_only;
    for (int e = 0; e < 4; ++e) {
      Extend x{.seq = e,
               .tokens = tokens[e],
               .positions = positions[e],
               .outputs = outputs[e],
               .samples = samples[e]};
      with_logits.push_back(x);
      x.return_logits = false;
      tokens_only.push_back(x);
    }
    auto got = both.Run(with_logits);
    auto alone = only.Run(tokens_only);
    ASSERT_TRUE(got.ok() && alone.ok()) << got.status() << alone.status();
    for (int e = 0; e < 4; ++e) {
      const size_t k = outputs[e].size();
      ASSERT_EQ((*got)[e].tokens.size(), k);
      ASSERT_EQ((*got)[e].logits.size(), k * config.vocab_size);
      EXPECT_TRUE((*alone)[e].logits.empty());
      EXPECT_EQ((*alone)[e].tokens, (*got)[e].tokens);
      for (size_t i = 0; i < k; ++i) {
        const std::span<const float> logits((*got)[e].logits.data() + i * config.vocab_size,
                                            config.vocab_size);
        const SampleRequest& r = samples[e][i];
        const int32_t want = SampleToken(logits, r.params, r.position, r.purpose);
        if (r.params.greedy()) {
          ++greedy_rows;
          EXPECT_EQ((*got)[e].tokens[i], want)
              << "step " << step << " extend " << e << " row " << i;
        } else {
          ++sampled_rows;
          sampled_mismatches += (*got)[e].tokens[i] != want;
        }
      }
    }
  }
  EXPECT_GT(greedy_rows, 0);
  EXPECT_GT(sampled_rows, 100);
  // A boundary case needs u within ~1e-6 of a CDF step: expected count ~0 here; allow 1%.
  EXPECT_LE(sampled_mismatches, sampled_rows / 100)
      << sampled_mismatches << " of " << sampled_rows << " sampled rows differ";
}

// Decode steps with sample requests on the graph path (sampling launched after the replay)
// give the eager path's tokens: exactly where the batch fills its bucket (bit-identical
// logits), and the host sampler's tokens on the graph's own logits otherwise.
TEST_F(CudaModelTest, GraphReplaySamplesLikeEagerLaunches) {
  ModelConfig config = TinyConfig(true);
  config.vocab_size = 1031;
  const ModelWeights weights = RandomWeights(config, 6, 0.2f);
  auto graphed = Transformer::FromWeights(config, weights);
  auto eager = Transformer::FromWeights(config, weights);
  ASSERT_TRUE(graphed->UseDevice({.device = Device::kCuda, .cuda_graphs = true}).ok());
  ASSERT_TRUE(eager->UseDevice({.device = Device::kCuda, .cuda_graphs = false}).ok());
  auto* graphed_backend = dynamic_cast<CudaTransformer*>(graphed->backend());
  ASSERT_NE(graphed_backend, nullptr);
  std::mt19937 rng(8);
  int sampled_rows = 0, sampled_mismatches = 0;
  for (int batch : {1, 3, 8}) {
    SCOPED_TRACE(batch);
    KvCache gkv(graphed->KvOptions(4096, 16)), ekv(eager->KvOptions(4096, 16));
    Runner g{graphed.get(), &gkv}, e{eager.get(), &ekv};
    absl::StatusOr<std::vector<std::vector<int32_t>>> prefilled =
        PrefillBoth(g, e, batch, 4, 7, config.vocab_size, rng);
    ASSERT_TRUE(prefilled.ok()) << prefilled.status();
    const std::vector<std::vector<int32_t>>& prompts = *prefilled;
    const std::vector<int32_t> last = {0};
    const int64_t replays_before = graphed_backend->stats().graph_replays;
    std::vector<int32_t> next(batch, 1);
    for (int step = 0; step < 16; ++step) {
      std::vector<std::vector<int32_t>> tok(batch), pos(batch);
      std::vector<std::vector<SampleRequest>> req(batch);
      std::vector<Extend> graph_extends, eager_extends;
      for (int s = 0; s < batch; ++s) {
        tok[s] = {next[s]};
        pos[s] = {static_cast<int32_t>(prompts[s].size()) + step};
        req[s] = {MixedRequest(s, step)};
        // The graph path returns logits too (to check against the host); eager tokens only.
        graph_extends.push_back(
            {.seq = s, .tokens = tok[s], .positions = pos[s], .outputs = last, .samples = req[s]});
        eager_extends.push_back({.seq = s,
                                 .tokens = tok[s],
                                 .positions = pos[s],
                                 .outputs = last,
                                 .samples = req[s],
                                 .return_logits = false});
      }
      auto got = g.Run(graph_extends);
      auto want = e.Run(eager_extends);
      ASSERT_TRUE(got.ok() && want.ok()) << got.status() << want.status();
      const bool exact_bucket = CudaTransformer::GraphBucket(batch) == batch;
      for (int s = 0; s < batch; ++s) {
        ASSERT_EQ((*got)[s].tokens.size(), 1u);
        ASSERT_EQ((*want)[s].tokens.size(), 1u);
        EXPECT_TRUE((*want)[s].logits.empty());
        const int32_t host =
            SampleToken((*got)[s].logits, req[s][0].params, req[s][0].position, req[s][0].purpose);
        if (exact_bucket) {
          EXPECT_EQ((*got)[s].tokens[0], (*want)[s].tokens[0]) << "step " << step << " seq " << s;
        }
        if (req[s][0].params.greedy()) {
          EXPECT_EQ((*got)[s].tokens[0], host) << "step " << step << " seq " << s;
        } else {
          ++sampled_rows;
          sampled_mismatches += (*got)[s].tokens[0] != host;
        }
        // Both caches continue with the graph's token, so the sequences stay identical.
        next[s] = (*got)[s].tokens[0];
        ASSERT_TRUE(gkv.Commit(s, last).ok());
        ASSERT_TRUE(ekv.Commit(s, last).ok());
      }
    }
    EXPECT_EQ(graphed_backend->stats().graph_replays - replays_before, 16);
  }
  EXPECT_LE(sampled_mismatches, std::max(1, sampled_rows / 100))
      << sampled_mismatches << " of " << sampled_rows << " sampled rows differ";
}

// A seeded `ar` run on the GPU, whose tokens the device samples, against a host loop over the
// same GPU forwards that downloads the logits and samples with SampleToken: equal (a mismatch
// would need a draw within float rounding of a CDF boundary, see kernels/cuda/sampling.cuh).
TEST_F(CudaModelTest, SeededArRunOnTheDeviceEqualsHostSampling) {
  const std::string dir = kModels + "tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled target";
  auto gpu = LoadModelDir(dir, {.device = Device::kCuda});
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  Transformer& model = *gpu->model;
  const std::vector<int32_t> prompt = PromptIds(dir);
  ASSERT_FALSE(prompt.empty());
  for (const SamplingParams& params :
       {SamplingParams{.temperature = 0.8f, .seed = 3},
        SamplingParams{.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 11}}) {
    SCOPED_TRACE(params.seed);
    std::unique_ptr<DecodingMode> mode = std::make_unique<ArMode>(model.config().vocab_size);
    RunOptions options;
    options.max_tokens = 32;
    options.sampling = params;
    KvCache run_kv(model.KvOptions(1024, 16));
    absl::StatusOr<RunStats> got = RunSequence(model, run_kv, 1, *mode, prompt, options);
    ASSERT_TRUE(got.ok()) << got.status();

    KvCache kv(model.KvOptions(1024, 16));
    ASSERT_TRUE(kv.AddSequence(1).ok());
    std::vector<int32_t> seq = prompt, want;
    int kv_len = 0;
    while (want.size() < 32) {
      std::vector<int32_t> tokens(seq.begin() + kv_len, seq.end());
      const std::vector<int32_t> positions = Iota(kv_len, static_cast<int>(tokens.size()));
      const std::vector<int32_t> outputs = {static_cast<int32_t>(tokens.size()) - 1};
      ASSERT_TRUE(kv.Reserve(1, static_cast<int>(tokens.size())).has_value());
      Extend e{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
      auto out = model.Forward({&e, 1}, kv);
      ASSERT_TRUE(out.ok()) << out.status();
      ASSERT_TRUE(kv.Commit(1, Iota(0, static_cast<int>(tokens.size()))).ok());
      kv_len = static_cast<int>(seq.size());
      const int32_t next = SampleToken((*out)[0].logits, params, seq.size());
      seq.push_back(next);
      want.push_back(next);
    }
    EXPECT_EQ(got->tokens, want);
  }
}

// Device verification of drafts (sample requests with drafts; kernels/cuda/verify.cuh) against
// worker/sampling VerifyDraft on the same device logits, over multi-output extends mixing
// greedy and sampled rows, drafts that are the row's argmax, random drafts and plain samples:
// greedy rows exactly (token and verdict); sampled rows equal except where a draw lies within
// float rounding of its threshold, which is counted and bounded. Tokens-only runs agree.
void ExpectDeviceVerificationMatchesTheHost(Transformer& gpu, int steps) {
  const int vocab = gpu.config().vocab_size;
  std::mt19937 rng(29);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  int greedy_rows = 0, sampled_rows = 0, sampled_mismatches = 0, accepted = 0, rejected = 0;
  std::vector<float> scratch;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(step);
    KvCache ref_kv(gpu.KvOptions(1024, 16)), both_kv(gpu.KvOptions(1024, 16)),
        only_kv(gpu.KvOptions(1024, 16));
    Runner ref{&gpu, &ref_kv}, both{&gpu, &both_kv}, only{&gpu, &only_kv};
    const int n = 48;
    std::vector<int32_t> tokens(n);
    for (auto& t : tokens) t = token(rng);
    const std::vector<int32_t> positions = Iota(0, n), outputs = Iota(8, n - 8);
    const Extend plain{.seq = 1, .tokens = tokens, .positions = positions, .outputs = outputs};
    auto reference = ref.Run({plain});
    ASSERT_TRUE(reference.ok()) << reference.status();
    std::vector<SampleRequest> samples;
    for (size_t i = 0; i < outputs.size(); ++i) {
      SampleRequest r = MixedRequest(static_cast<int>(i), step);
      const std::span<const float> row((*reference)[0].logits.data() + i * vocab, vocab);
      switch (i % 3) {
        case 0:
          r.draft = Argmax(row);
          break;
        case 1:
          r.draft = token(rng);
          break;
        default:
          break;  // a plain sample, as a run's bonus row
      }
      samples.push_back(r);
    }
    Extend x = plain;
    x.samples = samples;
    auto got = both.Run({x});
    x.return_logits = false;
    auto alone = only.Run({x});
    ASSERT_TRUE(got.ok() && alone.ok()) << got.status() << alone.status();
    const ExtendOutput& out = (*got)[0];
    ASSERT_EQ(out.tokens.size(), samples.size());
    ASSERT_EQ(out.accepted.size(), samples.size());
    ASSERT_EQ(out.logits.size(), samples.size() * vocab);
    EXPECT_TRUE((*alone)[0].logits.empty());
    EXPECT_EQ((*alone)[0].tokens, out.tokens);
    EXPECT_EQ((*alone)[0].accepted, out.accepted);
    for (size_t i = 0; i < samples.size(); ++i) {
      const std::span<const float> row(out.logits.data() + i * vocab, vocab);
      const SampleRequest& r = samples[i];
      bool ok = true;
      const int32_t want = r.draft >= 0
                               ? VerifyDraft(row, r.draft, r.params, r.position, &ok, &scratch)
                               : SampleToken(row, r.params, r.position, r.purpose);
      if (r.draft >= 0) (ok ? accepted : rejected) += 1;
      if (r.params.greedy()) {
        ++greedy_rows;
        EXPECT_EQ(out.tokens[i], want) << "row " << i;
        EXPECT_EQ(out.accepted[i], ok ? 1 : 0) << "row " << i;
      } else {
        ++sampled_rows;
        sampled_mismatches += out.tokens[i] != want || out.accepted[i] != (ok ? 1 : 0);
      }
    }
  }
  EXPECT_GT(greedy_rows, 0);
  EXPECT_GT(accepted, 0);
  EXPECT_GT(rejected, 0);
  EXPECT_LE(sampled_mismatches, std::max(1, sampled_rows / 100))
      << sampled_mismatches << " of " << sampled_rows << " sampled rows differ";
}

TEST_F(CudaModelTest, DeviceVerificationMatchesTheHost) {
  {
    SCOPED_TRACE("tiny");
    ModelConfig config = TinyConfig(false);
    config.vocab_size = 4099;
    auto gpu = Transformer::FromWeights(config, RandomWeights(config, 5, 0.2f));
    ASSERT_TRUE(gpu->UseDevice({.device = Device::kCuda, .cuda_graphs = false}).ok());
    ExpectDeviceVerificationMatchesTheHost(*gpu, 8);
  }
  const std::string dir = kModels + "tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) return;
  SCOPED_TRACE("tandem-target");
  auto gpu = Transformer::Load(dir);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->UseDevice({.device = Device::kCuda}).ok());
  ExpectDeviceVerificationMatchesTheHost(**gpu, 4);
}

// Runs SpecMode with its plans as made (the model verifies the drafts) or with the sample
// requests dropped and the logits downloaded (the host verifies them).
class HostVerifiedSpec : public DecodingMode {
 public:
  explicit HostVerifiedSpec(std::unique_ptr<DecodingMode> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return inner_->name(); }
  bool lossless() const override { return inner_->lossless(); }
  StepPlan Plan(const DecodeState& state) override {
    StepPlan plan = inner_->Plan(state);
    plan.samples.clear();
    plan.return_logits = true;
    return plan;
  }
  absl::StatusOr<StepResult> Consume(const DecodeState& state, const StepPlan& plan,
                                     const ExtendOutput& out) override {
    return inner_->Consume(state, plan, out);
  }

 private:
  std::unique_ptr<DecodingMode> inner_;
};

// spec on the bundled target with device verification: greedy output equals AR's; seeded
// output equals the same run verified on the host over the downloaded logits.
TEST_F(CudaModelTest, SpecWithDeviceVerificationMatchesArAndHostVerification) {
  const std::string dir = kModels + "tandem-target";
  if (!std::filesystem::exists(dir + "/config.json")) GTEST_SKIP() << "no bundled target";
  auto target = Transformer::Load(dir);
  ASSERT_TRUE(target.ok()) << target.status();
  ASSERT_TRUE((*target)->UseDevice({.device = Device::kCuda}).ok());
  const std::string drafter_dir = kModels + "tandem-drafter";
  absl::StatusOr<std::unique_ptr<Transformer>> drafter =
      std::filesystem::exists(drafter_dir + "/config.json")
          ? Transformer::Load(drafter_dir)
          : absl::StatusOr<std::unique_ptr<Transformer>>(absl::NotFoundError("no drafter"));
  if (drafter.ok()) {
    ASSERT_TRUE((*drafter)->UseDevice({.device = Device::kCuda}).ok());
  }
  Transformer& model = **target;
  Transformer& draft_model = drafter.ok() ? **drafter : model;
  const int vocab = model.config().vocab_size;
  const int context = model.config().max_position_embeddings;
  const std::vector<int32_t> prompt = PromptIds(dir);
  ASSERT_FALSE(prompt.empty());
  auto spec = [&] {
    return std::make_unique<SpecMode>(4, std::make_unique<InProcessArDrafter>(&draft_model, 1024),
                                      vocab, context);
  };
  auto run = [&](DecodingMode& mode, const SamplingParams& sampling) {
    RunOptions options;
    options.max_tokens = 32;
    options.sampling = sampling;
    KvCache kv(model.KvOptions(1024, 16));
    return RunSequence(model, kv, 1, mode, prompt, options);
  };
  ArMode ar(vocab);
  auto want = run(ar, {});
  auto device_spec = spec();
  auto got = run(*device_spec, {});
  ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
  EXPECT_EQ(got->tokens, want->tokens);
  EXPECT_GT(got->drafted, 0);
  for (const SamplingParams& params :
       {SamplingParams{.temperature = 0.8f, .seed = 3},
        SamplingParams{.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 11}}) {
    SCOPED_TRACE(params.seed);
    auto on_device = spec();
    HostVerifiedSpec on_host(spec());
    auto device_run = run(*on_device, params);
    auto host_run = run(on_host, params);
    ASSERT_TRUE(device_run.ok() && host_run.ok()) << device_run.status() << host_run.status();
    EXPECT_EQ(device_run->tokens, host_run->tokens);
    EXPECT_EQ(device_run->accepted, host_run->accepted);
  }
}

}  // namespace
}  // namespace tandem
