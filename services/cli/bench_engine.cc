// `tandem bench engine`: how close the CPU engine runs to the machine's limits, measured side by
// side in one run: decode against memory bandwidth, prefill against the BLAS it calls.
#include "services/cli/bench_engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "worker/model/transformer.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A Qwen3-style model of about 124M parameters at 12 layers.
ModelConfig SyntheticConfig(int layers) {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.model_type = "qwen3";
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_layers = layers;
  c.num_heads = 12;
  c.num_kv_heads = 4;
  c.head_dim = 64;
  c.qk_norm = true;
  c.max_position_embeddings = 4096;
  c.rope_theta = 1000000.0f;
  return c;
}

// Copies `bytes` between two buffers, STREAM convention: a copy of N bytes moves 2N (read +
// write). Threads copy disjoint chunks, as many threads as the engine uses. Returns seconds.
class Copier {
 public:
  Copier(size_t bytes, int threads) : src_(bytes, 1), dst_(bytes, 0), threads_(threads) {}
  double TimeOne() {
    const auto t = Clock::now();
    const size_t bytes = src_.size();
#pragma omp parallel for num_threads(threads_) schedule(static)
    for (int part = 0; part < threads_; ++part) {
      const size_t lo = bytes * part / threads_, hi = bytes * (part + 1) / threads_;
      std::memcpy(dst_.data() + lo, src_.data() + lo, hi - lo);
    }
    return Since(t);
  }
  double MovedBytes() const { return 2.0 * src_.size(); }

  // Reads the source buffer once (an integer sum the compiler vectorises). Returns seconds. A
  // roofline for kernels that only read, like the decode GEMVs, beside the copy.
  double TimeRead() {
    const auto t = Clock::now();
    const size_t words = src_.size() / sizeof(uint64_t);
    const auto* data = reinterpret_cast<const uint64_t*>(src_.data());
    uint64_t total = 0;
#pragma omp parallel for num_threads(threads_) schedule(static) reduction(+ : total)
    for (int part = 0; part < threads_; ++part) {
      const size_t lo = words * part / threads_, hi = words * (part + 1) / threads_;
      uint64_t acc = 0;
#pragma omp simd reduction(+ : acc)
      for (size_t i = lo; i < hi; ++i) acc += data[i];
      total += acc;
    }
    sink_ += total;  // keeps the reads observable
    return Since(t);
  }
  double ReadBytes() const { return static_cast<double>(src_.size()); }

 private:
  std::vector<char> src_, dst_;
  int threads_;
  uint64_t sink_ = 0;
};

double SgemmFlops(int m, int n, int k) {
  std::vector<float> x(static_cast<size_t>(m) * k, 0.01f), w(static_cast<size_t>(n) * k, 0.02f),
      y(static_cast<size_t>(m) * n);
  std::vector<double> times;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t = Clock::now();
    kernels::cpu::Linear(x.data(), w.data(), nullptr, y.data(), m, n, k);
    times.push_back(Since(t));
  }
  return 2.0 * m * n * k / Median(times);
}

}  // namespace

int RunBenchEngine(const BenchEngineArgs& args) {
  kernels::cpu::SetBlasThreads(args.threads);
  const int threads = kernels::cpu::BlasThreads();
  omp_set_num_threads(threads);
  const ModelConfig config = SyntheticConfig(args.layers);
  auto model = Transformer::FromWeights(config, RandomWeights(config, 7));
  absl::StatusOr<DeviceOptions> device = ResolveDevice(args.device, args.cuda_graphs);
  if (!device.ok()) {
    std::fprintf(stderr, "bench engine: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  if (absl::Status moved = model->UseDevice(*device); !moved.ok()) {
    std::fprintf(stderr, "bench engine: --device: %s\n", moved.ToString().c_str());
    return 1;
  }
  const ModelWeights& w = model->weights();
  const double params = static_cast<double>(w.ParameterCount());
  const double step_bytes = static_cast<double>(w.StepBytes());

  const int context = args.prefill_tokens + args.decode_steps + 8;
  KvCache kv(model->KvOptions(2 * context));
  // Prefill: one extend of the whole prompt, logits for the last token only.
  std::vector<int32_t> prompt(args.prefill_tokens), positions(args.prefill_tokens);
  for (int i = 0; i < args.prefill_tokens; ++i) {
    prompt[i] = (i * 7919) % config.vocab_size;
    positions[i] = i;
  }
  std::vector<double> prefill_times;
  for (int rep = 0; rep < 3; ++rep) {
    const SeqId seq = rep;
    (void)kv.AddSequence(seq);
    (void)kv.Reserve(seq, args.prefill_tokens);
    const std::vector<int32_t> out = {args.prefill_tokens - 1};
    Extend e{.seq = seq, .tokens = prompt, .positions = positions, .outputs = out};
    const auto t = Clock::now();
    auto r = model->Forward({&e, 1}, kv);
    prefill_times.push_back(Since(t));
    if (!r.ok()) {
      std::fprintf(stderr, "bench engine: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (rep > 0) kv.RemoveSequence(seq);
  }
  std::vector<int32_t> all(args.prefill_tokens);
  for (int i = 0; i < args.prefill_tokens; ++i) all[i] = i;
  (void)kv.Commit(0, all);

  // Decode: batch 1, one token per forward on top of the prompt. Each decode step alternates
  // with one weight-sized memcpy, so both see the same machine state (the machine may be
  // shared and noisy); the ratio of their medians is the bandwidth efficiency.
  Copier copier(static_cast<size_t>(step_bytes), threads);
  std::vector<double> step_times, copy_times, read_times;
  int32_t token = 1;
  for (int s = 0; s < args.decode_steps + 3; ++s) {
    const int pos = kv.CommittedLength(0);
    (void)kv.Reserve(0, 1);
    const std::vector<int32_t> tok = {token}, p = {pos}, out = {0};
    Extend e{.seq = 0, .tokens = tok, .positions = p, .outputs = out};
    const auto t = Clock::now();
    auto r = model->Forward({&e, 1}, kv);
    const double dt = Since(t);
    if (!r.ok()) return 1;
    (void)kv.Commit(0, std::vector<int32_t>{0});
    token = static_cast<int32_t>(std::max_element((*r)[0].logits.begin(), (*r)[0].logits.end()) -
                                 (*r)[0].logits.begin());
    const double copy = copier.TimeOne();
    const double read = copier.TimeRead();
    if (s >= 3) {  // the first steps warm caches and thread pools
      step_times.push_back(dt);
      copy_times.push_back(copy);
      read_times.push_back(read);
    }
  }
  const double step = Median(step_times);
  const double copy_bw = copier.MovedBytes() / Median(copy_times);
  const double read_bw = copier.ReadBytes() / Median(read_times);
  const double weight_bw = step_bytes / step;

  // Prefill FLOPs: 2 per weight per token in the matrix products (embedding lookup excluded),
  // plus causal attention (QK^T and PV over on average T/2 keys).
  const double matmul_params = params - static_cast<double>(w.embed.size()) +
                               (w.lm_head.empty() ? static_cast<double>(w.embed.size()) : 0.0);
  const double t_tokens = args.prefill_tokens;
  // Logits are computed for the last token only.
  const double head = static_cast<double>(config.vocab_size) * config.hidden_size;
  const double attn_flops = 2.0 * 2.0 * config.num_layers * config.num_heads * config.head_dim *
                            t_tokens * (t_tokens + 1) / 2.0;
  const double prefill_flops = 2.0 * (matmul_params - head) * t_tokens + 2.0 * head + attn_flops;
  const double prefill = Median(prefill_times);
  const double sgemm =
      SgemmFlops(args.prefill_tokens, config.intermediate_size * 2, config.hidden_size);

  nlohmann::json j = {
      {"threads", threads},
      {"model",
       {{"parameters", params},
        {"layers", config.num_layers},
        {"hidden", config.hidden_size},
        {"weight_bytes_per_step", step_bytes}}},
      {"decode",
       {{"batch", 1},
        {"context", args.prefill_tokens},
        {"steps", args.decode_steps},
        {"step_seconds", step},
        {"tokens_per_second", 1.0 / step},
        {"weight_bandwidth_gbs", weight_bw / 1e9},
        {"copy_bandwidth_gbs", copy_bw / 1e9},
        {"bandwidth_efficiency", weight_bw / copy_bw},
        {"read_bandwidth_gbs", read_bw / 1e9},
        {"read_efficiency", weight_bw / read_bw}}},
      {"prefill",
       {{"tokens", args.prefill_tokens},
        {"seconds", prefill},
        {"gflops", prefill_flops / prefill / 1e9},
        {"sgemm_gflops", sgemm / 1e9},
        {"ratio_to_sgemm", prefill_flops / prefill / sgemm}}},
  };
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf(
      "tandem bench engine  (synthetic fp32 model, %.1fM parameters, %d layers, %d threads)\n\n",
      params / 1e6, config.num_layers, threads);
  std::printf("%-34s %14s\n", "metric", "value");
  std::printf("%-34s %14.2f\n", "decode tokens/s (batch 1)", 1.0 / step);
  std::printf("%-34s %14.2f\n", "decode step ms", step * 1e3);
  std::printf("%-34s %14.2f\n", "weight read GB/s", weight_bw / 1e9);
  std::printf("%-34s %14.2f\n", "memcpy GB/s (read+write)", copy_bw / 1e9);
  std::printf("%-34s %14.3f\n", "bandwidth efficiency", weight_bw / copy_bw);
  std::printf("%-34s %14.2f\n", "read-only GB/s (sum over buffer)", read_bw / 1e9);
  std::printf("%-34s %14.3f\n", "weight read / read-only", weight_bw / read_bw);
  std::printf("%-34s %14.2f\n", "prefill GFLOP/s", prefill_flops / prefill / 1e9);
  std::printf("%-34s %14.2f\n", "sgemm GFLOP/s (same shape class)", sgemm / 1e9);
  std::printf("%-34s %14.3f\n", "prefill / sgemm", prefill_flops / prefill / sgemm);
  return 0;
}

}  // namespace tandem::cli
