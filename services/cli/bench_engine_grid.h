// The engine benchmark's step runner and its step-time grid: every batch size x extend length x
// context length, each point a forward of `batch` sequences that each extend by `extend` tokens
// on top of `context` committed ones, with the shape of a speculative verify step (a token
// sampled from every row, each row but the last verifying the next row's token as a draft; an
// extend of 1 is a plain decode step). The router's cost model and the crossover analysis read
// this grid: a k-token verify against a decode step, at each load.
#pragma once

#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_engine.h"
#include "worker/kv/kv_cache.h"
#include "worker/model/transformer.h"

namespace tandem::cli {

// Runs timed forwards of a model on a KV cache (greedy, tokens sampled on the model's device).
class StepRunner {
 public:
  StepRunner(Transformer& model, KvCache& kv) : model_(model), kv_(kv) {}

  // Adds `seq` and extends it by a `tokens`-token prompt (one forward, a token sampled from the
  // last row), committed. Returns the forward's seconds.
  absl::StatusOr<double> Prefill(SeqId seq, int tokens);

  // Adds `seq` with `context` committed tokens without computing them (their K/V rows are
  // whatever the storage holds: KvStorage::Randomize them first).
  absl::Status AddContext(SeqId seq, int context);

  // One forward in which each of `seqs` extends by `extend` tokens after its committed ones
  // (the verify shape above); `commit` keeps the first token (a decode step: extend 1). Returns
  // the forward's seconds (host to host: uploads, launches or graph replay, the sampled tokens'
  // download).
  absl::StatusOr<double> Step(std::span<const SeqId> seqs, int extend, bool commit);

 private:
  int32_t Token(SeqId seq, int position) const;

  Transformer& model_;
  KvCache& kv_;
  std::unordered_map<SeqId, int32_t> last_token_;  // the last token each sequence sampled
};

struct GridSpec {
  std::vector<int> batches, extends, contexts;  // ascending; empty batches: no grid
  int reps = 5;
};

struct GridPoint {
  int context = 0, batch = 0, extend = 0;
  double median_ms = 0, min_ms = 0, max_ms = 0;
  bool skipped = false;  // the KV cache for this batch at this context did not fit
};

struct GridResult {
  std::vector<GridPoint> points;
  std::vector<std::string> notes;  // e.g. which contexts ran with fewer batches, and why
};

// Validates and sorts the grid options of `args`.
absl::StatusOr<GridSpec> MakeGridSpec(const BenchEngineArgs& args);

// Every point of `spec` on `model` (one KV cache per context, its pools randomized).
absl::StatusOr<GridResult> MeasureGrid(Transformer& model, const GridSpec& spec);

// {"points": [...], "verify_cost": {context: {extend: step(batch 1, extend) / step(batch 1, 1)}},
// "notes": [...]}; null without a grid.
nlohmann::json GridJson(const GridResult& grid);

// A table per context: batches down, extends across, median ms.
void PrintGrid(const GridResult& grid);

}  // namespace tandem::cli
