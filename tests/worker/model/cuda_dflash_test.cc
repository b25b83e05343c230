// The CUDA backend of the DFlash drafter (DFlashModel::UseDevice({Device::kCuda})) against its
// fp32 CPU forward: block logits and greedy drafts on random drafters (layer counts, block
// sizes, anchors, contexts built in pieces, grown past their first allocation, truncated and
// rebuilt) and on the bundled drafter with its target (the target on the CPU, and on CUDA with
// its device embeddings and head shared); contexts appended from device rows against the same
// rows from the host; contexts on the wrong device refused; and spec's greedy output with the
// drafter on CUDA against the target's AR output. Every test skips without a GPU.
#include "worker/model/cuda/cuda_dflash.h"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cuda/device.h"
#include "nlohmann/json.hpp"
#include "tests/support/source_dir.h"
#include "tests/worker/decoding/tiny_models.h"
#include "worker/decoding/ar.h"
#include "worker/decoding/modes.h"
#include "worker/decoding/spec.h"
#include "worker/model/dflash.h"

namespace tandem {
namespace {

using testing::TinyArch;

const std::string kModels = test_support::SourceDir() + "/models/";

class CudaDFlashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda::DeviceCount() == 0) GTEST_SKIP() << "no CUDA device visible";
  }
};

// Logit error bound, measured. bf16 keeps 8 significant bits (relative rounding <= 2^-9, about
// 0.2%), and the CUDA path rounds the taps, the context feature, the context K/V, every
// projection's output and the residual stream after every add. A logit is a sum over hidden
// units of products of such values: the roundings do not cancel in the worst case and compound
// through fc, the norms and up to three layers. The reference is the CPU's fp32 forward, itself
// exact to ~1e-6, of the same bf16-valued weights (RandomDFlash; rounding these random
// drafters' weights alone moves their fp32 logits by up to 0.081 of the largest). Measured on an
// H200: up to 0.064 of the largest logit (3 layers, blocks of 4 and 8; 2 layers stay under
// 0.05), hence 0.08. The target's CUDA test, one model of larger weights, keeps 0.05.
constexpr double kLogitTolerance = 0.08;

// max |got - want| over all values, relative to max |want|.
double RelativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double max_diff = 0, max_abs = 1e-6;
  for (size_t i = 0; i < want.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
  }
  return max_diff / max_abs;
}

// A random drafter for `target`: `layers` Qwen3 layers, blocks of `block`, up to three clean
// tokens, taps of the embeddings, the middle and the last target layer; bf16-valued weights.
std::unique_ptr<DFlashModel> RandomDFlash(const Transformer* target, int layers, int block,
                                          uint64_t seed) {
  DFlashConfig d;
  d.model = target->config();
  d.model.arch = Arch::kQwen3;
  d.model.num_layers = layers;
  d.model.qk_norm = true;
  d.model.attention_bias = d.model.o_proj_bias = d.model.mlp_bias = false;
  d.block_size = block;
  d.mask_token_id = d.model.vocab_size - 1;
  d.target_layer_ids = {0, 1, target->config().num_layers};
  d.max_anchor = std::min(3, block - 1);
  DFlashWeights w = RandomDFlashWeights(d, seed, 0.35f);
  // bf16 values, as the device holds them: both backends compute with the same weights.
  auto round = [](std::vector<float>& v) {
    for (float& x : v) x = __bfloat162float(__float2bfloat16(x));
  };
  round(w.fc);
  round(w.hidden_norm);
  round(w.final_norm);
  for (LayerWeights& l : w.layers) {
    for (std::vector<float>* v : testing::LayerVectors(l)) round(*v);
  }
  absl::StatusOr<std::unique_ptr<DFlashModel>> model =
      DFlashModel::Create(std::move(d), std::move(w), target);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

// A second model with `model`'s configuration and weights, for `target`.
std::unique_ptr<DFlashModel> Copy(const DFlashModel& model, const Transformer* target) {
  absl::StatusOr<std::unique_ptr<DFlashModel>> copy =
      DFlashModel::Create(model.config(), model.weights(), target);
  EXPECT_TRUE(copy.ok()) << copy.status();
  return copy.ok() ? std::move(*copy) : nullptr;
}

// Random taps [k, n, hidden], rounded to bf16 values (so host and device rows are the same).
std::vector<float> RandomRows(const DFlashModel& model, int n, std::mt19937& rng) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> rows(model.config().target_layer_ids.size() * static_cast<size_t>(n) *
                          model.hidden_size());
  for (float& x : rows) x = __bfloat162float(__float2bfloat16(normal(rng)));
  return rows;
}

// Taps [k, n, h] of tokens [from, to) out of taps [k, total, h].
std::vector<float> Slice(const std::vector<float>& rows, int k, int total, int h, int from,
                         int to) {
  std::vector<float> out;
  for (int l = 0; l < k; ++l) {
    const float* base = rows.data() + static_cast<size_t>(l) * total * h;
    out.insert(out.end(), base + static_cast<size_t>(from) * h, base + static_cast<size_t>(to) * h);
  }
  return out;
}

struct DraftCounts {
  int compared = 0;  // draft slots decided beyond the row's CPU/CUDA difference
  int slots = 0;
};

// Every anchor's block on the two contexts (same rows): logits within the bound, the device
// argmax equal to the argmax of the logits the device returns, and the drafts equal to the
// CPU's in every slot whose CPU top-two gap exceeds twice the row's largest CPU/CUDA logit
// difference e (then no other token can overtake the CPU's: each moves by at most e). Closer
// slots are ties at bf16 precision and may go either way.
void CompareBlocks(const DFlashModel& cpu, const DFlashContext& cpu_context, const DFlashModel& gpu,
                   const DFlashContext& gpu_context, std::mt19937& rng, DraftCounts& counts) {
  ASSERT_EQ(cpu_context.length(), gpu_context.length());
  const DFlashConfig& c = cpu.config();
  const int vocab = c.model.vocab_size;
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int a = 1; a <= c.max_anchor; ++a) {
    SCOPED_TRACE(::testing::Message() << "context " << cpu_context.length() << " anchor " << a);
    std::vector<int32_t> clean(a);
    for (int32_t& t : clean) t = token(rng);
    auto want = cpu.BlockLogits(cpu_context, clean);
    auto got = gpu.BlockLogits(gpu_context, clean);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want->size());
    EXPECT_LE(RelativeError(*got, *want), kLogitTolerance);
    auto drafts = gpu.Draft(gpu_context, clean);
    ASSERT_TRUE(drafts.ok()) << drafts.status();
    ASSERT_EQ(drafts->size(), static_cast<size_t>(c.block_size - a));
    for (int j = a; j < c.block_size; ++j) {
      const float* g = got->data() + static_cast<size_t>(j) * vocab;
      EXPECT_EQ((*drafts)[j - a], std::max_element(g, g + vocab) - g) << "slot " << j;
      const float* w = want->data() + static_cast<size_t>(j) * vocab;
      double e = 0;
      for (int v = 0; v < vocab; ++v) e = std::max(e, std::fabs(static_cast<double>(g[v]) - w[v]));
      std::vector<float> row(w, w + vocab);
      std::partial_sort(row.begin(), row.begin() + 2, row.end(), std::greater<float>());
      ++counts.slots;
      if (row[0] - row[1] <= 2 * e) continue;
      EXPECT_EQ((*drafts)[j - a], std::max_element(w, w + vocab) - w) << "slot " << j;
      ++counts.compared;
    }
  }
}

TEST_F(CudaDFlashTest, RandomDrafterMatchesTheCpu) {
  DraftCounts counts;
  for (TinyArch arch : {TinyArch::kQwen2, TinyArch::kQwen3}) {  // untied head, tied head
    std::unique_ptr<Transformer> target = testing::TinyModel(arch, 11);
    for (int layers : {1, 2, 3}) {
      for (int block : {2, 4, 8}) {
        SCOPED_TRACE(::testing::Message() << "layers " << layers << " block " << block);
        std::unique_ptr<DFlashModel> cpu = RandomDFlash(target.get(), layers, block, 100 + layers);
        ASSERT_NE(cpu, nullptr);
        std::unique_ptr<DFlashModel> gpu = Copy(*cpu, target.get());
        ASSERT_NE(gpu, nullptr);
        ASSERT_TRUE(gpu->UseDevice({.device = Device::kCuda}).ok());
        EXPECT_EQ(gpu->device(), Device::kCuda);
        const int k = static_cast<int>(cpu->config().target_layer_ids.size());
        const int h = cpu->hidden_size();
        std::mt19937 rng(layers * 10 + block);
        // 320 rows: past the first device allocation (256 rows plus the block), so the context
        // storage grows with rows to keep.
        const int total = 320;
        const std::vector<float> rows = RandomRows(*cpu, total, rng);
        DFlashContext cpu_context, gpu_context;
        CompareBlocks(*cpu, cpu_context, *gpu, gpu_context, rng, counts);
        int at = 0;
        for (int n : {1, 4, 0, 27, 230, 58}) {
          const std::vector<float> piece = Slice(rows, k, total, h, at, at + n);
          ASSERT_TRUE(cpu->AppendContext(cpu_context, piece, n).ok());
          ASSERT_TRUE(gpu->AppendContext(gpu_context, piece, n).ok());
          at += n;
          EXPECT_TRUE(gpu_context.on_device());
          CompareBlocks(*cpu, cpu_context, *gpu, gpu_context, rng, counts);
        }
        ASSERT_EQ(gpu_context.length(), total);
        // Truncate and append other rows: the block sees the new rows only.
        for (int keep : {100, 0}) {
          DFlashModel::TruncateContext(cpu_context, keep);
          DFlashModel::TruncateContext(gpu_context, keep);
          CompareBlocks(*cpu, cpu_context, *gpu, gpu_context, rng, counts);
          const std::vector<float> other = RandomRows(*cpu, 9, rng);
          ASSERT_TRUE(cpu->AppendContext(cpu_context, other, 9).ok());
          ASSERT_TRUE(gpu->AppendContext(gpu_context, other, 9).ok());
          CompareBlocks(*cpu, cpu_context, *gpu, gpu_context, rng, counts);
        }
        // The context rows themselves: bf16 K/V against fp32.
        std::vector<std::vector<float>> ck, cv, gk, gv;
        ASSERT_TRUE(cpu->ReadContext(cpu_context, ck, cv).ok());
        ASSERT_TRUE(gpu->ReadContext(gpu_context, gk, gv).ok());
        ASSERT_EQ(gk.size(), ck.size());
        for (size_t l = 0; l < ck.size(); ++l) {
          ASSERT_EQ(gk[l].size(), ck[l].size());
          EXPECT_LE(RelativeError(gk[l], ck[l]), kLogitTolerance) << "layer " << l;
          EXPECT_LE(RelativeError(gv[l], cv[l]), kLogitTolerance) << "layer " << l;
        }
      }
    }
  }
  std::printf(
      "[ dflash   ] %d of %d draft slots decided beyond the CPU/CUDA difference, all "
      "equal\n",
      counts.compared, counts.slots);
  // Random drafters with large weights give peaked logits: a good share of the slots is
  // decided (a bf16 difference is far below a typical top-two gap).
  EXPECT_GT(counts.compared * 4, counts.slots);
}

// Device rows (the future device transport's entry point) give the same context as the same
// bf16 rows from the host, bit for bit: the host path uploads them as bf16 and runs the same
// kernels. The caller overwrites its rows on its stream right after each call, which the
// stream ordering must keep away from the reads.
TEST_F(CudaDFlashTest, DeviceRowsEqualHostRows) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 3);
  std::unique_ptr<DFlashModel> model = RandomDFlash(target.get(), 2, 4, 9);
  ASSERT_NE(model, nullptr);
  ASSERT_TRUE(model->UseDevice({.device = Device::kCuda}).ok());
  const int k = static_cast<int>(model->config().target_layer_ids.size());
  const int h = model->hidden_size();
  std::mt19937 rng(4);
  const int total = 300;
  const std::vector<float> rows = RandomRows(*model, total, rng);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const size_t capacity = static_cast<size_t>(k) * total * h;
  void* allocated = nullptr;
  ASSERT_EQ(cudaMalloc(&allocated, capacity * sizeof(__nv_bfloat16)), cudaSuccess);
  auto* device_rows = static_cast<__nv_bfloat16*>(allocated);
  DFlashContext from_host, from_device;
  int at = 0;
  for (int n : {3, 0, 1, 40, 256}) {
    const std::vector<float> piece = Slice(rows, k, total, h, at, at + n);
    ASSERT_TRUE(model->AppendContext(from_host, piece, n).ok());
    std::vector<__nv_bfloat16> bf16(piece.size());
    for (size_t i = 0; i < piece.size(); ++i) bf16[i] = __float2bfloat16(piece[i]);
    ASSERT_EQ(cudaMemcpyAsync(device_rows, bf16.data(), bf16.size() * sizeof(__nv_bfloat16),
                              cudaMemcpyHostToDevice, stream),
              cudaSuccess);
    ASSERT_TRUE(model->AppendContextDevice(from_device, device_rows, n, stream).ok());
    // Overwritten in stream order: must not reach the context.
    ASSERT_EQ(cudaMemsetAsync(device_rows, 0x7f, capacity * sizeof(__nv_bfloat16), stream),
              cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    at += n;
  }
  ASSERT_EQ(from_device.length(), total);
  EXPECT_TRUE(from_device.on_device());
  std::vector<std::vector<float>> hk, hv, dk, dv;
  ASSERT_TRUE(model->ReadContext(from_host, hk, hv).ok());
  ASSERT_TRUE(model->ReadContext(from_device, dk, dv).ok());
  EXPECT_EQ(hk, dk);
  EXPECT_EQ(hv, dv);
  const std::vector<int32_t> clean = {5, 7};
  auto a = model->BlockLogits(from_host, clean);
  auto b = model->BlockLogits(from_device, clean);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  // Argument checks of the device entry point.
  EXPECT_EQ(model->AppendContextDevice(from_device, nullptr, 2, stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(model->AppendContextDevice(from_device, device_rows, -1, stream).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(from_device.length(), total);
  cudaFree(device_rows);
  cudaStreamDestroy(stream);
}

// A context keeps its rows on the device they were appended on: a non-empty one on another
// device is refused, an empty one follows the model.
TEST_F(CudaDFlashTest, ContextsOnAnotherDeviceAreRefused) {
  std::unique_ptr<Transformer> target = testing::TinyModel(TinyArch::kQwen3, 5);
  std::unique_ptr<DFlashModel> model = RandomDFlash(target.get(), 1, 4, 2);
  ASSERT_NE(model, nullptr);
  std::mt19937 rng(1);
  const std::vector<float> rows = RandomRows(*model, 3, rng);
  const std::vector<int32_t> clean = {1};
  DFlashContext on_cpu;
  ASSERT_TRUE(model->AppendContext(on_cpu, rows, 3).ok());
  ASSERT_TRUE(model->UseDevice({.device = Device::kCuda}).ok());
  EXPECT_EQ(model->AppendContext(on_cpu, rows, 3).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(model->BlockLogits(on_cpu, clean).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(on_cpu.length(), 3);
  DFlashModel::TruncateContext(on_cpu, 0);
  ASSERT_TRUE(model->AppendContext(on_cpu, rows, 3).ok());  // empty: rebound to the GPU
  EXPECT_TRUE(on_cpu.on_device());
  EXPECT_TRUE(model->Draft(on_cpu, clean).ok());
  // Another CUDA model's context, and this model's after it left the GPU.
  std::unique_ptr<DFlashModel> other = Copy(*model, target.get());
  ASSERT_TRUE(other->UseDevice({.device = Device::kCuda}).ok());
  EXPECT_EQ(other->BlockLogits(on_cpu, clean).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(model->UseDevice({.device = Device::kCpu}).ok());
  EXPECT_EQ(model->AppendContext(on_cpu, rows, 3).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<std::vector<float>> keys, values;
  EXPECT_EQ(model->ReadContext(on_cpu, keys, values).code(), absl::StatusCode::kFailedPrecondition);
}

// The bundled drafter on its target's taps: CUDA against the CPU, with the target on the CPU
// (the drafter uploads the target's embeddings and head) and on CUDA (it shares the target's).
TEST_F(CudaDFlashTest, BundledDrafterMatchesTheCpu) {
  const std::string fixture_path = kModels + "tandem-dflash/fixtures/drafts.json";
  if (!std::filesystem::exists(fixture_path)) GTEST_SKIP() << "no bundled DFlash drafter";
  auto target = Transformer::Load(kModels + "tandem-target");
  auto cuda_target = Transformer::Load(kModels + "tandem-target");
  ASSERT_TRUE(target.ok() && cuda_target.ok());
  ASSERT_TRUE((*cuda_target)->UseDevice({.device = Device::kCuda}).ok());
  auto cpu = DFlashModel::Load(kModels + "tandem-dflash", target->get());
  auto gpu = DFlashModel::Load(kModels + "tandem-dflash", target->get());
  auto shared = DFlashModel::Load(kModels + "tandem-dflash", cuda_target->get());
  ASSERT_TRUE(cpu.ok() && gpu.ok() && shared.ok());
  ASSERT_TRUE((*gpu)->UseDevice({.device = Device::kCuda}).ok());
  ASSERT_TRUE((*shared)->UseDevice({.device = Device::kCuda}).ok());
  std::ifstream in(fixture_path);
  const nlohmann::json fixture = nlohmann::json::parse(in);
  const DFlashConfig& c = (*cpu)->config();
  const int h = c.model.hidden_size, k = static_cast<int>(c.target_layer_ids.size());
  std::mt19937 rng(6);
  DraftCounts counts;
  int cases = 0;
  for (const nlohmann::json& prompt : fixture["prompts"]) {
    const std::vector<int32_t> tokens = prompt["tokens"].get<std::vector<int32_t>>();
    const int n = static_cast<int>(tokens.size());
    KvCache kv((*target)->KvOptions(n + 16, 16));
    ASSERT_TRUE(kv.AddSequence(1).ok());
    ASSERT_TRUE(kv.Reserve(1, n).has_value());
    std::vector<int32_t> positions(n);
    for (int i = 0; i < n; ++i) positions[i] = i;
    Extend extend{
        .seq = 1, .tokens = tokens, .positions = positions, .hidden_layers = c.target_layer_ids};
    auto out = (*target)->Forward({&extend, 1}, kv);
    ASSERT_TRUE(out.ok()) << out.status();
    // The whole prompt's rows in two pieces, then blocks at every anchor.
    const int split = n / 3;
    DFlashContext cc, gc, sc;
    for (auto [from, to] : {std::pair{0, split}, std::pair{split, n}}) {
      const std::vector<float> piece = Slice((*out)[0].hidden, k, n, h, from, to);
      ASSERT_TRUE((*cpu)->AppendContext(cc, piece, to - from).ok());
      ASSERT_TRUE((*gpu)->AppendContext(gc, piece, to - from).ok());
      ASSERT_TRUE((*shared)->AppendContext(sc, piece, to - from).ok());
    }
    CompareBlocks(**cpu, cc, **gpu, gc, rng, counts);
    CompareBlocks(**cpu, cc, **shared, sc, rng, counts);
    DFlashModel::TruncateContext(cc, split);
    DFlashModel::TruncateContext(gc, split);
    DFlashModel::TruncateContext(sc, split);
    CompareBlocks(**cpu, cc, **gpu, gc, rng, counts);
    CompareBlocks(**cpu, cc, **shared, sc, rng, counts);
    ++cases;
  }
  std::printf("[ dflash   ] bundled: %d prompts, %d of %d draft slots compared, all equal\n", cases,
              counts.compared, counts.slots);
  EXPECT_GT(cases, 0);
  EXPECT_GT(counts.compared, 0);
}

RunOptions Greedy(int max_tokens) {
  RunOptions run;
  run.max_tokens = max_tokens;
  return run;
}

// spec with the drafter on CUDA is lossless: its greedy output equals the target's AR output,
// with the target on the CPU and on CUDA; and the drafts do get accepted.
TEST_F(CudaDFlashTest, SpecGreedyOutputEqualsAr) {
  struct Case {
    std::string name;
    std::unique_ptr<Transformer> target;
    std::unique_ptr<DFlashModel> dflash;
    std::vector<std::vector<int32_t>> prompts;
  };
  std::vector<Case> cases;
  for (bool target_on_cuda : {false, true}) {
    Case tiny;
    tiny.name = target_on_cuda ? "tiny, target on cuda" : "tiny, target on cpu";
    tiny.target = testing::TinyModel(TinyArch::kQwen3, 7);
    if (target_on_cuda) {
      ASSERT_TRUE(tiny.target->UseDevice({.device = Device::kCuda}).ok());
    }
    tiny.dflash = testing::TinyDFlash(tiny.target.get(), 45, 5);
    ASSERT_NE(tiny.dflash, nullptr);
    tiny.prompts = testing::TestPrompts(tiny.target->config().vocab_size, 6, 3);
    cases.push_back(std::move(tiny));
    const std::string fixture_path = kModels + "tandem-dflash/fixtures/drafts.json";
    if (!std::filesystem::exists(fixture_path)) continue;
    Case bundled;
    bundled.name = target_on_cuda ? "bundled, target on cuda" : "bundled, target on cpu";
    auto target = Transformer::Load(kModels + "tandem-target");
    ASSERT_TRUE(target.ok()) << target.status();
    bundled.target = std::move(*target);
    if (target_on_cuda) {
      ASSERT_TRUE(bundled.target->UseDevice({.device = Device::kCuda}).ok());
    }
    auto dflash = DFlashModel::Load(kModels + "tandem-dflash", bundled.target.get());
    ASSERT_TRUE(dflash.ok()) << dflash.status();
    bundled.dflash = std::move(*dflash);
    std::ifstream in(fixture_path);
    const nlohmann::json fixture = nlohmann::json::parse(in);
    for (const nlohmann::json& p : fixture["prompts"]) {
      const auto tokens = p["tokens"].get<std::vector<int32_t>>();
      bundled.prompts.emplace_back(tokens.begin(), tokens.begin() + p["prompt_len"].get<int>());
    }
    cases.push_back(std::move(bundled));
  }
  for (Case& c : cases) {
    SCOPED_TRACE(c.name);
    ASSERT_TRUE(c.dflash->UseDevice({.device = Device::kCuda}).ok());
    int64_t drafted = 0, accepted = 0;
    for (const std::vector<int32_t>& prompt : c.prompts) {
      ArMode ar(c.target->config().vocab_size);
      auto want = testing::RunOnce(*c.target, ar, prompt, Greedy(40));
      ASSERT_TRUE(want.ok()) << want.status();
      ModeOptions options;
      options.spec_gamma = c.dflash->config().block_size - 1;
      options.spec_dflash = c.dflash.get();
      auto mode = CreateMode("spec", options, c.target->config(), SamplingParams{});
      ASSERT_TRUE(mode.ok()) << mode.status();
      auto got = testing::RunOnce(*c.target, **mode, prompt, Greedy(40));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->tokens, want->tokens);
      const auto& spec = dynamic_cast<const SpecMode&>(**mode);
      EXPECT_EQ(spec.stats().drafter_failures, 0) << spec.stats().last_drafter_error;
      drafted += got->drafted;
      accepted += got->accepted;
    }
    std::printf("[ dflash   ] %s: %lld of %lld drafts accepted\n", c.name.c_str(),
                static_cast<long long>(accepted), static_cast<long long>(drafted));
    EXPECT_GT(drafted, 0);
    // The trained drafter's drafts get accepted (random weights may miss every time).
    if (c.name.starts_with("bundled")) {
      EXPECT_GT(accepted * 10, drafted);
    }
  }
}

}  // namespace
}  // namespace tandem
