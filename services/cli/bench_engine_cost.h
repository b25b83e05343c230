// The engine benchmark's extend-cost table: what a step of several rows costs next to a decode
// step of the same run. Batch 1 with extends of 1, 2, 4, 8, 16 and 32 tokens (a speculative
// verify of that many tokens), and batch 2 to 16 decode, each as a ratio to the 1-token step,
// beside two floors a step cannot beat: the bytes it must read (weights once, each sequence's
// K/V) at the memory's read bandwidth, and the FLOPs it must do at the cores' multiply-add peak.
// Speculation pays on a machine as far as a k-token verify stays near the decode step; the floors
// say how near it could be.
//
// The points run interleaved (every point once per round, rounds repeated), so that a change in
// the machine's state over the run moves them all alike.
#pragma once

#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "worker/model/transformer.h"

namespace tandem::cli {

struct ExtendCostSpec {
  int context = 512;  // committed tokens of every sequence (K/V randomized, not computed)
  int reps = 5;       // timed rounds (after two warm-up rounds)
};

// What the floors are computed from, measured by the caller in the same run.
struct StepFloors {
  double weight_bytes = 0;      // bytes of weights one step reads
  double kv_element_bytes = 4;  // bytes of one K or V element
  double read_bandwidth = 0;    // bytes/s the memory delivers to a reader; 0 = no bandwidth floor
  double peak_flops = 0;        // FLOP/s; 0 = no compute floor
  double matmul_params = 0;     // weights in matrix products (the LM head included)
};

struct ExtendCostPoint {
  int batch = 0, extend = 0;
  double step_ms = 0;             // median
  double bandwidth_floor_ms = 0;  // 0: not known
  double compute_floor_ms = 0;    // 0: not known
};

// The points in order: batch 1 x extends 1..32, then batch 2..16 x 1. Fails if the model has
// fewer than context + 32 positions.
absl::StatusOr<std::vector<ExtendCostPoint>> MeasureExtendCost(Transformer& model,
                                                               const ExtendCostSpec& spec,
                                                               const StepFloors& floors);

// {"context", "read_bandwidth_gbs", "peak_gflops", "points": [{batch, extend, rows, step_ms,
// ratio, bandwidth_floor_ms, compute_floor_ms, floor_ratio}]}; null when empty.
nlohmann::json ExtendCostJson(const std::vector<ExtendCostPoint>& points, int context,
                              const StepFloors& floors);

void PrintExtendCost(const std::vector<ExtendCostPoint>& points, int context,
                     const StepFloors& floors);

}  // namespace tandem::cli
