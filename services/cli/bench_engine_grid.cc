#include "services/cli/bench_engine_grid.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tandem::cli {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Values of |K| and |V| of the order a real model's have after its norms.
constexpr float kKvHalfWidth = 1.0f;

absl::Status SortedPositive(std::vector<int>& values, const char* flag, int at_most) {
  std::sort(values.begin(), values.end());
  values.erase(std::unique(values.begin(), values.end()), values.end());
  for (int v : values) {
    if (v <= 0 || v > at_most) {
      return absl::InvalidArgumentError(
          absl::StrCat(flag, " values must be in [1, ", at_most, "], got ", v));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int32_t StepRunner::Token(SeqId seq, int position) const {
  const uint64_t mixed =
      static_cast<uint64_t>(seq) * 7919u + static_cast<uint64_t>(position) * 104729u + 17u;
  return static_cast<int32_t>(mixed % static_cast<uint64_t>(model_.config().vocab_size));
}

absl::StatusOr<double> StepRunner::Prefill(SeqId seq, int tokens) {
  if (absl::Status added = kv_.AddSequence(seq); !added.ok()) return added;
  if (!kv_.Reserve(seq, tokens)) return absl::ResourceExhaustedError("KV cache full at prefill");
  std::vector<int32_t> ids(tokens), positions(tokens);
  for (int i = 0; i < tokens; ++i) {
    ids[i] = Token(seq, i);
    positions[i] = i;
  }
  const std::vector<int32_t> out = {tokens - 1};
  const std::vector<SampleRequest> sample = {SampleRequest{.position = uint64_t(tokens)}};
  Extend e{.seq = seq, .tokens = ids, .positions = positions, .outputs = out, .samples = sample};
  e.return_logits = false;
  const auto t = Clock::now();
  absl::StatusOr<std::vector<ExtendOutput>> r = model_.Forward({&e, 1}, kv_);
  const double seconds = Since(t);
  if (!r.ok()) return r.status();
  last_token_[seq] = (*r)[0].tokens.at(0);
  std::vector<int32_t> all(tokens);
  std::iota(all.begin(), all.end(), 0);
  if (absl::Status committed = kv_.Commit(seq, all); !committed.ok()) return committed;
  return seconds;
}

absl::Status StepRunner::AddContext(SeqId seq, int context) {
  if (absl::Status added = kv_.AddSequence(seq); !added.ok()) return added;
  if (!kv_.Reserve(seq, context)) return absl::ResourceExhaustedError("KV cache full");
  std::vector<int32_t> all(context);
  std::iota(all.begin(), all.end(), 0);
  last_token_[seq] = Token(seq, context);
  return kv_.Commit(seq, all);
}

absl::StatusOr<double> StepRunner::Step(std::span<const SeqId> seqs, int extend, bool commit) {
  const size_t n = seqs.size();
  std::vector<std::vector<int32_t>> ids(n), positions(n);
  std::vector<std::vector<SampleRequest>> samples(n);
  std::vector<int32_t> outputs(extend);
  std::iota(outputs.begin(), outputs.end(), 0);
  std::vector<Extend> batch(n);
  for (size_t i = 0; i < n; ++i) {
    const SeqId seq = seqs[i];
    const std::optional<int> first = kv_.Reserve(seq, extend);
    if (!first) return absl::ResourceExhaustedError("KV cache full at a step");
    ids[i].resize(extend);
    positions[i].resize(extend);
    samples[i].resize(extend);
    for (int j = 0; j < extend; ++j) {
      ids[i][j] = j == 0 ? last_token_[seq] : Token(seq, *first + j);
      positions[i][j] = *first + j;
      samples[i][j].position = static_cast<uint64_t>(*first + j + 1);
    }
    // Row j verifies the token row j + 1 carries, as a speculative verify step does.
    for (int j = 0; j + 1 < extend; ++j) samples[i][j].draft = ids[i][j + 1];
    batch[i] = Extend{.seq = seq,
                      .tokens = ids[i],
                      .positions = positions[i],
                      .outputs = outputs,
                      .samples = samples[i],
                      .return_logits = false};
  }
  const auto t = Clock::now();
  absl::StatusOr<std::vector<ExtendOutput>> r = model_.Forward(batch, kv_);
  const double seconds = Since(t);
  if (!r.ok()) return r.status();
  if (commit) {
    const std::vector<int32_t> keep = {0};
    for (size_t i = 0; i < n; ++i) {
      last_token_[seqs[i]] = (*r)[i].tokens.at(0);
      if (absl::Status committed = kv_.Commit(seqs[i], keep); !committed.ok()) return committed;
    }
  }
  return seconds;
}

absl::StatusOr<GridSpec> MakeGridSpec(const BenchEngineArgs& args) {
  GridSpec spec;
  spec.batches = args.grid_batches;
  spec.extends = args.grid_extends;
  spec.contexts = args.grid_contexts;
  spec.reps = args.grid_reps;
  if (spec.batches.empty()) return spec;
  // The CUDA backend's graph buckets end at 64 sequences; larger batches run eagerly, which is
  // allowed, but the grid is for the decode loads a verifier sees.
  if (absl::Status s = SortedPositive(spec.batches, "--grid-batches", 1024); !s.ok()) return s;
  if (absl::Status s = SortedPositive(spec.extends, "--grid-extends", 64); !s.ok()) return s;
  if (absl::Status s = SortedPositive(spec.contexts, "--grid-contexts", 1 << 20); !s.ok()) {
    return s;
  }
  if (spec.extends.empty() || spec.contexts.empty()) {
    return absl::InvalidArgumentError("--grid-extends and --grid-contexts must not be empty");
  }
  if (spec.reps <= 0 || spec.reps > 1000) {
    return absl::InvalidArgumentError("--grid-reps must be in [1, 1000]");
  }
  return spec;
}

absl::StatusOr<GridResult> MeasureGrid(Transformer& model, const GridSpec& spec) {
  GridResult result;
  if (spec.batches.empty()) return result;
  const int max_extend = spec.extends.back();
  for (const int context : spec.contexts) {
    if (context + max_extend > model.config().max_position_embeddings) {
      result.notes.push_back(absl::StrCat("context ", context, " skipped: past the model's ",
                                          model.config().max_position_embeddings, " positions"));
      continue;
    }
    // The largest batch whose KV cache fits; smaller batches when the pools cannot be made.
    std::unique_ptr<KvCache> kv;
    size_t fit = spec.batches.size();
    while (fit > 0) {
      const int64_t tokens = static_cast<int64_t>(spec.batches[fit - 1]) * (context + max_extend);
      kv = std::make_unique<KvCache>(model.KvOptions(tokens));
      absl::Status filled = kv->storage().Randomize(1234 + context, kKvHalfWidth);
      if (filled.ok()) break;
      kv.reset();
      if (!absl::IsResourceExhausted(filled)) return filled;
      --fit;
    }
    if (fit < spec.batches.size()) {
      result.notes.push_back(absl::StrCat("context ", context, ": the KV cache for batch ",
                                          spec.batches[fit],
                                          " and up did not fit in memory; those points skipped"));
    }
    std::vector<SeqId> seqs;
    if (fit > 0) {
      StepRunner runner(model, *kv);
      for (int s = 0; s < spec.batches[fit - 1]; ++s) {
        if (absl::Status added = runner.AddContext(s, context); !added.ok()) return added;
        seqs.push_back(s);
      }
      for (size_t b = 0; b < fit; ++b) {
        const std::span<const SeqId> batch(seqs.data(), spec.batches[b]);
        for (const int extend : spec.extends) {
          std::vector<double> ms;
          for (int rep = 0; rep < spec.reps + 2; ++rep) {
            absl::StatusOr<double> t = runner.Step(batch, extend, /*commit=*/false);
            if (!t.ok()) return t.status();
            if (rep >= 2) ms.push_back(*t * 1e3);  // two warm-up steps (graph capture)
          }
          std::sort(ms.begin(), ms.end());
          result.points.push_back(
              {context, spec.batches[b], extend, ms[ms.size() / 2], ms.front(), ms.back(), false});
        }
      }
    }
    for (size_t b = fit; b < spec.batches.size(); ++b) {
      for (const int extend : spec.extends) {
        result.points.push_back({context, spec.batches[b], extend, 0, 0, 0, true});
      }
    }
  }
  return result;
}

nlohmann::json GridJson(const GridResult& grid) {
  if (grid.points.empty() && grid.notes.empty()) return nullptr;
  nlohmann::json points = nlohmann::json::array();
  nlohmann::json verify_cost = nlohmann::json::object();
  for (const GridPoint& p : grid.points) {
    if (p.skipped) {
      points.push_back({{"context", p.context},
                        {"batch", p.batch},
                        {"extend", p.extend},
                        {"skipped", "out of memory"}});
      continue;
    }
    points.push_back({{"context", p.context},
                      {"batch", p.batch},
                      {"extend", p.extend},
                      {"step_ms", p.median_ms},
                      {"min_ms", p.min_ms},
                      {"max_ms", p.max_ms}});
  }
  for (const GridPoint& decode : grid.points) {
    if (decode.skipped || decode.batch != 1 || decode.extend != 1) continue;
    nlohmann::json per_extend = nlohmann::json::object();
    for (const GridPoint& p : grid.points) {
      if (p.skipped || p.batch != 1 || p.context != decode.context) continue;
      per_extend[std::to_string(p.extend)] = p.median_ms / decode.median_ms;
    }
    verify_cost[std::to_string(decode.context)] = per_extend;
  }
  return {{"points", points}, {"verify_cost", verify_cost}, {"notes", grid.notes}};
}

void PrintGrid(const GridResult& grid) {
  std::vector<int> contexts, extends;
  for (const GridPoint& p : grid.points) {
    if (std::find(contexts.begin(), contexts.end(), p.context) == contexts.end()) {
      contexts.push_back(p.context);
    }
    if (std::find(extends.begin(), extends.end(), p.extend) == extends.end()) {
      extends.push_back(p.extend);
    }
  }
  for (const int context : contexts) {
    std::printf("\nstep ms at context %d (median; batch down, extend across)\n%8s", context,
                "batch");
    for (int e : extends) std::printf(" %9d", e);
    int row_batch = -1;
    for (const GridPoint& p : grid.points) {
      if (p.context != context) continue;
      if (p.batch != row_batch) {
        std::printf("\n%8d", p.batch);
        row_batch = p.batch;
      }
      if (p.skipped) {
        std::printf(" %9s", "oom");
      } else {
        std::printf(" %9.3f", p.median_ms);
      }
    }
    std::printf("\n");
  }
  for (const std::string& note : grid.notes) std::printf("note: %s\n", note.c_str());
}

}  // namespace tandem::cli
