// `tandem bench engine`: how close the engine runs to the machine's limits, measured side by
// side in one run: decode against memory bandwidth, prefill against the BLAS it calls, and the
// step-time grid (services/cli/bench_engine_grid.h).
#include "services/cli/bench_engine.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/rows_gemm.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_engine_cost.h"
#include "services/cli/bench_engine_grid.h"
#include "worker/model/device.h"
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

// The synthetic model: "small" is Qwen3-style with about 124M parameters at 12 layers (fp32 on
// the CPU: 500 MB read per decode step); "qwen3-8b" is Qwen3-8B's shape (8.2B parameters, 15 GB
// read per bf16 decode step).
absl::StatusOr<ModelConfig> ShapeConfig(const std::string& shape, int layers) {
  ModelConfig c;
  c.arch = Arch::kQwen3;
  c.model_type = "qwen3";
  c.qk_norm = true;
  c.rope_theta = 1000000.0f;
  c.rms_norm_eps = 1e-6f;
  if (shape == "small") {
    c.vocab_size = 32000;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_layers = 12;
    c.num_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.max_position_embeddings = 4096;
  } else if (shape == "qwen3-8b") {
    c.vocab_size = 151936;
    c.hidden_size = 4096;
    c.intermediate_size = 12288;
    c.num_layers = 36;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_position_embeddings = 40960;
  } else {
    return absl::InvalidArgumentError("unknown --shape '" + shape +
                                      "'; expected 'small' or 'qwen3-8b'");
  }
  if (layers < 0) return absl::InvalidArgumentError("--layers must be >= 0 (0 = the shape's)");
  if (layers > 0) c.num_layers = layers;
  return c;
}

// Copies `bytes` between two host buffers, STREAM convention: a copy of N bytes moves 2N (read +
// write). Threads copy disjoint chunks, as many threads as the engine uses. Returns seconds.
class HostCopier {
 public:
  HostCopier(size_t bytes, int threads) : src_(bytes, 1), dst_(bytes, 0), threads_(threads) {}
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

// The copy the decode steps alternate with: host memcpy on the CPU (weight-sized, plus the
// read-only sum), a device-to-device copy on a GPU (1 GiB: far above the L2, and the 8B model's
// 15 GB twice over would not fit beside it).
class CopyProbe {
 public:
  static absl::StatusOr<CopyProbe> Create(Device device, size_t weight_bytes, int threads) {
    CopyProbe probe;
    if (device == Device::kCuda) {
      auto timer = DeviceCopyTimer::Create(std::min<size_t>(weight_bytes, size_t{1} << 30));
      if (!timer.ok()) return timer.status();
      probe.device_ = std::move(*timer);
    } else {
      probe.host_ = std::make_unique<HostCopier>(weight_bytes, threads);
    }
    return probe;
  }
  // One copy's seconds and, on the host, one read-only pass's (left alone on a GPU).
  absl::Status Time(double* copy, double* read) {
    if (device_ != nullptr) {
      absl::StatusOr<double> t = device_->TimeOne();
      if (!t.ok()) return t.status();
      *copy = *t;
      return absl::OkStatus();
    }
    *copy = host_->TimeOne();
    *read = host_->TimeRead();
    return absl::OkStatus();
  }
  double MovedBytes() const { return device_ ? device_->MovedBytes() : host_->MovedBytes(); }
  double ReadBytes() const { return host_ ? host_->ReadBytes() : 0.0; }

 private:
  std::unique_ptr<HostCopier> host_;
  std::unique_ptr<DeviceCopyTimer> device_;
};

double SgemmFlops(int m, int n, int k) {
  std::vector<float> x(static_cast<size_t>(m) * k, 0.01f), w(static_cast<size_t>(n) * k, 0.02f),
      y(static_cast<size_t>(m) * n);
  std::vector<double> times;
  for (int rep = 0; rep < 7; ++rep) {
    const auto t = Clock::now();
    kernels::cpu::BlasLinear(x.data(), w.data(), y.data(), m, n, k);
    times.push_back(Since(t));
  }
  return 2.0 * m * n * k / Median(times);
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "bench engine: %s\n", status.ToString().c_str());
  return 1;
}

struct DecodeResult {
  double step = 0, copy_bandwidth = 0;
  double read_bandwidth = 0;  // host only; 0 on a GPU
};

// Batch-1 decode on top of the committed prompt of sequence 0, one token per forward (its
// sampled token fed back); each step alternates with one copy so both see the same machine
// state (the machine may be shared and noisy). Medians after 3 warm-up steps.
absl::StatusOr<DecodeResult> MeasureDecode(StepRunner& runner, CopyProbe& copier, int steps) {
  std::vector<double> step_times, copy_times, read_times;
  const SeqId seqs[] = {0};
  for (int s = 0; s < steps + 3; ++s) {
    absl::StatusOr<double> dt = runner.Step(seqs, 1, /*commit=*/true);
    if (!dt.ok()) return dt.status();
    double copy = 0, read = 0;
    if (absl::Status timed = copier.Time(&copy, &read); !timed.ok()) return timed;
    if (s < 3) continue;  // the first steps warm caches, thread pools and graphs
    step_times.push_back(*dt);
    copy_times.push_back(copy);
    if (read > 0) read_times.push_back(read);
  }
  DecodeResult r;
  r.step = Median(step_times);
  r.copy_bandwidth = copier.MovedBytes() / Median(copy_times);
  if (!read_times.empty()) r.read_bandwidth = copier.ReadBytes() / Median(read_times);
  return r;
}

}  // namespace

int RunBenchEngine(const BenchEngineArgs& args) {
  kernels::cpu::SetBlasThreads(args.threads);
  const int threads = kernels::cpu::BlasThreads();
  omp_set_num_threads(threads);
  if (args.decode_steps <= 0 || args.prefill_tokens <= 0) {
    return Fail(absl::InvalidArgumentError("--decode-steps and --prefill-tokens must be > 0"));
  }
  absl::StatusOr<ModelConfig> shape = ShapeConfig(args.shape, args.layers);
  if (!shape.ok()) return Fail(shape.status());
  const ModelConfig& config = *shape;
  absl::StatusOr<GridSpec> grid_spec = MakeGridSpec(args);
  if (!grid_spec.ok()) return Fail(grid_spec.status());
  absl::StatusOr<DeviceOptions> device =
      ResolveDevice(args.device, args.cuda_graphs, args.cpu_weights);
  if (!device.ok()) {
    std::fprintf(stderr, "bench engine: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  const bool cuda = device->device == Device::kCuda;
  const auto setup_start = Clock::now();
  // The small model keeps the weights earlier runs measured (and PERF.md records); larger ones
  // are drawn on every core.
  // On a GPU the host weights only feed the bf16 upload: kept in fp32, their bytes below count
  // as fp32 before the halving for bf16.
  auto model = Transformer::FromWeights(
      config, args.shape == "small" ? RandomWeights(config, 7) : BenchmarkWeights(config, 7),
      cuda ? kernels::cpu::WeightType::kF32 : device->cpu_weights);
  if (absl::Status moved = model->UseDevice(*device); !moved.ok()) {
    std::fprintf(stderr, "bench engine: --device: %s\n", moved.ToString().c_str());
    return 1;
  }
  const double setup_seconds = Since(setup_start);
  const ModelWeights& w = model->weights();
  const double params = static_cast<double>(w.ParameterCount());
  // StepBytes counts the host weights as packed (fp32, or bf16 with --cpu-weights bf16; always
  // fp32 next to a GPU, see above); the CUDA backend holds and reads them in bf16.
  const double bytes_per_param = cuda ? 2.0 : 4.0;
  const double step_bytes = static_cast<double>(w.StepBytes()) / sizeof(float) * bytes_per_param;

  const int context = args.prefill_tokens + args.decode_steps + 8;
  KvCache kv(model->KvOptions(2 * context));
  StepRunner runner(*model, kv);
  // Prefill: one extend of the whole prompt, a token sampled from the last row only.
  std::vector<double> prefill_times;
  for (int rep = 0; rep < 3; ++rep) {
    const SeqId seq = rep;
    absl::StatusOr<double> t = runner.Prefill(seq, args.prefill_tokens);
    if (!t.ok()) return Fail(t.status());
    prefill_times.push_back(*t);
    if (rep > 0) kv.RemoveSequence(seq);
  }

  absl::StatusOr<CopyProbe> copier =
      CopyProbe::Create(device->device, static_cast<size_t>(step_bytes), threads);
  if (!copier.ok()) return Fail(copier.status());
  absl::StatusOr<DecodeResult> decode = MeasureDecode(runner, *copier, args.decode_steps);
  if (!decode.ok()) return Fail(decode.status());
  const double step = decode->step;
  const double weight_bw = step_bytes / step;

  // Prefill FLOPs: 2 per weight per token in the matrix products (embedding lookup excluded),
  // plus causal attention (QK^T and PV over on average T/2 keys).
  // (The model's matrices are packed: a tied head is counted once, as the head.)
  const double matmul_params =
      params - (w.head_tied ? 0.0 : static_cast<double>(config.vocab_size) * config.hidden_size);
  const double t_tokens = args.prefill_tokens;
  // A token is sampled from the last row only: the head runs for that row alone.
  const double head = static_cast<double>(config.vocab_size) * config.hidden_size;
  const double attn_flops = 2.0 * 2.0 * config.num_layers * config.num_heads * config.head_dim *
                            t_tokens * (t_tokens + 1) / 2.0;
  const double prefill_flops = 2.0 * (matmul_params - head) * t_tokens + 2.0 * head + attn_flops;
  const double prefill = Median(prefill_times);
  // The prefill against OpenBLAS sgemm at the same shape class (the reference: the engine's
  // products run on packed_gemm.h).
  const double sgemm =
      cuda ? 0.0
           : SgemmFlops(args.prefill_tokens, config.intermediate_size * 2, config.hidden_size);

  // The grid last: it replaces the decode run's KV cache with its own.
  kv.RemoveSequence(0);
  absl::StatusOr<GridResult> grid = MeasureGrid(*model, *grid_spec);
  if (!grid.ok()) return Fail(grid.status());
  // The extend-cost table, its floors from this run's bandwidth and the cores' peak.
  StepFloors floors{.weight_bytes = step_bytes,
                    .kv_element_bytes = cuda ? 2.0 : 4.0,
                    .read_bandwidth = cuda ? decode->copy_bandwidth : decode->read_bandwidth,
                    .peak_flops = cuda || !args.extend_cost ? 0.0 : kernels::cpu::RowsPeakFlops(),
                    .matmul_params = matmul_params};
  const ExtendCostSpec cost_spec{
      .context = args.grid_contexts.empty() ? 512 : args.grid_contexts.front(),
      .reps = args.grid_reps};
  std::vector<ExtendCostPoint> cost;
  if (args.extend_cost) {
    absl::StatusOr<std::vector<ExtendCostPoint>> measured =
        MeasureExtendCost(*model, cost_spec, floors);
    if (!measured.ok()) return Fail(measured.status());
    cost = std::move(*measured);
  }

  // Figures a device does not measure (0) print as null.
  auto opt = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  const double read_bw = decode->read_bandwidth;
  const double read_ratio = read_bw > 0 ? weight_bw / read_bw : 0.0;
  const double sgemm_ratio = sgemm > 0 ? prefill_flops / prefill / sgemm : 0.0;
  nlohmann::json j = {
      {"device", DeviceName(device->device)},
      {"cuda_graphs", cuda && args.cuda_graphs},
      {"cpu_weights", cuda ? "" : std::string(kernels::cpu::WeightTypeName(device->cpu_weights))},
      {"threads", threads},
      {"setup_seconds", setup_seconds},
      {"model",
       {{"shape", args.shape},
        {"parameters", params},
        {"layers", config.num_layers},
        {"hidden", config.hidden_size},
        {"intermediate", config.intermediate_size},
        {"heads", config.num_heads},
        {"kv_heads", config.num_kv_heads},
        {"head_dim", config.head_dim},
        {"vocab", config.vocab_size},
        {"bytes_per_parameter",
         cuda || device->cpu_weights == kernels::cpu::WeightType::kBf16 ? 2.0 : 4.0},
        {"weight_bytes_per_step", step_bytes}}},
      {"decode",
       {{"batch", 1},
        {"context", args.prefill_tokens},
        {"steps", args.decode_steps},
        {"step_seconds", step},
        {"tokens_per_second", 1.0 / step},
        {"weight_bandwidth_gbs", weight_bw / 1e9},
        {"copy_bandwidth_gbs", decode->copy_bandwidth / 1e9},
        {"bandwidth_efficiency", weight_bw / decode->copy_bandwidth},
        {"read_bandwidth_gbs", opt(read_bw / 1e9)},
        {"read_efficiency", opt(read_ratio)}}},
      {"prefill",
       {{"tokens", args.prefill_tokens},
        {"seconds", prefill},
        {"gflops", prefill_flops / prefill / 1e9},
        {"sgemm_gflops", opt(sgemm / 1e9)},
        {"ratio_to_sgemm", opt(sgemm_ratio)}}},
      {"grid", GridJson(*grid)},
      {"extend_cost", ExtendCostJson(cost, cost_spec.context, floors)},
  };
  if (args.json) {
    std::printf("%s\n", j.dump(2).c_str());
    return 0;
  }
  std::printf("tandem bench engine  (synthetic %s model '%s', %.1fM parameters, %d layers, %s)\n\n",
              cuda ? "bf16" : "fp32", args.shape.c_str(), params / 1e6, config.num_layers,
              cuda ? "cuda" : (std::to_string(threads) + " threads").c_str());
  std::printf("%-34s %14s\n", "metric", "value");
  std::printf("%-34s %14.2f\n", "decode tokens/s (batch 1)", 1.0 / step);
  std::printf("%-34s %14.2f\n", "decode step ms", step * 1e3);
  std::printf("%-34s %14.2f\n", "weight read GB/s", weight_bw / 1e9);
  std::printf("%-34s %14.2f\n", cuda ? "device copy GB/s (read+write)" : "memcpy GB/s (read+write)",
              decode->copy_bandwidth / 1e9);
  std::printf("%-34s %14.3f\n", "bandwidth efficiency", weight_bw / decode->copy_bandwidth);
  if (read_bw > 0) {
    std::printf("%-34s %14.2f\n", "read-only GB/s (sum over buffer)", read_bw / 1e9);
    std::printf("%-34s %14.3f\n", "weight read / read-only", read_ratio);
  }
  std::printf("%-34s %14.2f\n", "prefill GFLOP/s", prefill_flops / prefill / 1e9);
  if (sgemm > 0) {
    std::printf("%-34s %14.2f\n", "OpenBLAS sgemm GFLOP/s (same class)", sgemm / 1e9);
    std::printf("%-34s %14.3f\n", "prefill / sgemm", sgemm_ratio);
  }
  PrintGrid(*grid);
  PrintExtendCost(cost, cost_spec.context, floors);
  return 0;
}

}  // namespace tandem::cli
