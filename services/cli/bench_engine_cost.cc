#include "services/cli/bench_engine_cost.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/cli/bench_engine_grid.h"

namespace tandem::cli {

namespace {

// (batch, extend) of every point, in the order they are printed.
std::vector<std::pair<int, int>> Shapes() {
  std::vector<std::pair<int, int>> shapes;
  for (int extend : {1, 2, 4, 8, 16, 32}) shapes.push_back({1, extend});
  for (int batch : {2, 4, 8, 16}) shapes.push_back({batch, 1});
  return shapes;
}

constexpr int kMaxExtend = 32;
constexpr int kMaxBatch = 16;
constexpr int kWarmupRounds = 2;

// The floors of one point. Each of the batch x extend rows runs every matrix product (a verify
// step samples every row) and attends over its sequence's context and the extend's tokens before
// it; the weights are read once, each sequence's K/V once.
void SetFloors(const ModelConfig& c, const ExtendCostSpec& spec, const StepFloors& f,
               ExtendCostPoint& p) {
  const double rows = static_cast<double>(p.batch) * p.extend;
  const double keys = spec.context + (p.extend + 1) / 2.0;  // per row, on average
  const double attention =
      4.0 * c.num_layers * c.num_heads * static_cast<double>(c.head_dim) * keys * rows;
  const double flops = 2.0 * f.matmul_params * rows + attention;
  const double kv_bytes = 2.0 * p.batch * (spec.context + p.extend) * c.num_layers *
                          c.num_kv_heads * static_cast<double>(c.head_dim) * f.kv_element_bytes;
  if (f.read_bandwidth > 0) {
    p.bandwidth_floor_ms = (f.weight_bytes + kv_bytes) / f.read_bandwidth * 1e3;
  }
  if (f.peak_flops > 0) p.compute_floor_ms = flops / f.peak_flops * 1e3;
}

double Floor(const ExtendCostPoint& p) {
  return std::max(p.bandwidth_floor_ms, p.compute_floor_ms);
}

}  // namespace

absl::StatusOr<std::vector<ExtendCostPoint>> MeasureExtendCost(Transformer& model,
                                                               const ExtendCostSpec& spec,
                                                               const StepFloors& floors) {
  const ModelConfig& c = model.config();
  if (spec.context < 1 || spec.context + kMaxExtend > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("extend cost: context ", spec.context, " + ",
                                                   kMaxExtend, " tokens must fit the model's ",
                                                   c.max_position_embeddings, " positions"));
  }
  if (spec.reps < 1 || spec.reps > 1000) {
    return absl::InvalidArgumentError("extend cost: reps must be in [1, 1000]");
  }
  const int64_t tokens = static_cast<int64_t>(kMaxBatch) * (spec.context + kMaxExtend);
  KvCache kv(model.KvOptions(tokens));
  if (absl::Status filled = kv.storage().Randomize(4321, 1.0f); !filled.ok()) return filled;
  StepRunner runner(model, kv);
  std::vector<SeqId> seqs;
  for (int s = 0; s < kMaxBatch; ++s) {
    if (absl::Status added = runner.AddContext(s, spec.context); !added.ok()) return added;
    seqs.push_back(s);
  }
  const std::vector<std::pair<int, int>> shapes = Shapes();
  std::vector<std::vector<double>> ms(shapes.size());
  for (int round = 0; round < spec.reps + kWarmupRounds; ++round) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const auto [batch, extend] = shapes[i];
      absl::StatusOr<double> t =
          runner.Step(std::span<const SeqId>(seqs.data(), batch), extend, /*commit=*/false);
      if (!t.ok()) return t.status();
      if (round >= kWarmupRounds) ms[i].push_back(*t * 1e3);
    }
  }
  std::vector<ExtendCostPoint> points;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::sort(ms[i].begin(), ms[i].end());
    ExtendCostPoint p{
        .batch = shapes[i].first, .extend = shapes[i].second, .step_ms = ms[i][ms[i].size() / 2]};
    SetFloors(c, spec, floors, p);
    points.push_back(p);
  }
  return points;
}

nlohmann::json ExtendCostJson(const std::vector<ExtendCostPoint>& points, int context,
                              const StepFloors& floors) {
  if (points.empty()) return nullptr;
  const ExtendCostPoint& decode = points.front();
  auto opt = [](double v) { return v > 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::json rows = nlohmann::json::array();
  for (const ExtendCostPoint& p : points) {
    rows.push_back({{"batch", p.batch},
                    {"extend", p.extend},
                    {"rows", p.batch * p.extend},
                    {"step_ms", p.step_ms},
                    {"ratio", p.step_ms / decode.step_ms},
                    {"bandwidth_floor_ms", opt(p.bandwidth_floor_ms)},
                    {"compute_floor_ms", opt(p.compute_floor_ms)},
                    {"floor_ratio",
                     Floor(decode) > 0 ? opt(Floor(p) / Floor(decode)) : nlohmann::json(nullptr)}});
  }
  return {{"context", context},
          {"read_bandwidth_gbs", opt(floors.read_bandwidth / 1e9)},
          {"peak_gflops", opt(floors.peak_flops / 1e9)},
          {"points", rows}};
}

void PrintExtendCost(const std::vector<ExtendCostPoint>& points, int context,
                     const StepFloors& floors) {
  if (points.empty()) return;
  const ExtendCostPoint& decode = points.front();
  std::printf(
      "\nextend cost at context %d (interleaved rounds, medians; / decode: over the 1 x 1 "
      "step)\n",
      context);
  std::printf("floors: weights + K/V at %.1f GB/s read", floors.read_bandwidth / 1e9);
  if (floors.peak_flops > 0) {
    std::printf(", FLOPs at %.1f GFLOP/s (multiply-add peak)", floors.peak_flops / 1e9);
  } else {
    std::printf(" (no compute floor on this device)");
  }
  std::printf("; floor / decode: the best a step could do next to a decode step\n");
  std::printf("%14s %5s %9s %9s %12s %15s %15s\n", "batch x extend", "rows", "step ms", "/ decode",
              "bw floor ms", "compute floor ms", "floor / decode");
  for (const ExtendCostPoint& p : points) {
    const std::string shape = absl::StrCat(p.batch, " x ", p.extend);
    std::printf("%14s %5d %9.3f %9.2f %12.3f %15.3f", shape.c_str(), p.batch * p.extend, p.step_ms,
                p.step_ms / decode.step_ms, p.bandwidth_floor_ms, p.compute_floor_ms);
    if (Floor(decode) > 0) {
      std::printf(" %15.2f\n", Floor(p) / Floor(decode));
    } else {
      std::printf(" %15s\n", "-");
    }
  }
}

}  // namespace tandem::cli
