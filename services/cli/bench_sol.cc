#include "services/cli/bench_sol.h"

#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "services/cli/bench_prompts.h"
#include "services/cli/locate.h"
#include "worker/decoding/decoding_mode.h"
#include "worker/decoding/diffusion_sampler.h"
#include "worker/decoding/diffusion_sol.h"
#include "worker/engine/local_generator.h"

namespace tandem::cli {

namespace {

constexpr int kMaxBlockSize = 64;
constexpr int kMaxDepth = 4;
constexpr int kMaxProbes = 1'000'000;

// Sums over the blocks of one (block length, category).
struct Totals {
  int prompts = 0;
  int blocks = 0;
  int tokens = 0;  // blocks x block length
  int greedy_forwards = 0;
  int greedy_exact = 0;  // blocks
  int sol_forwards = 0;
  int sol_exact = 0;
  int64_t probes = 0;
  int over_budget = 0;             // blocks
  std::vector<int> rule_forwards;  // per Rule
  std::vector<int> rule_agree;     // slots equal to the target's

  explicit Totals(size_t rules) : rule_forwards(rules, 0), rule_agree(rules, 0) {}

  void Add(const Totals& o) {
    prompts += o.prompts;
    blocks += o.blocks;
    tokens += o.tokens;
    greedy_forwards += o.greedy_forwards;
    greedy_exact += o.greedy_exact;
    sol_forwards += o.sol_forwards;
    sol_exact += o.sol_exact;
    probes += o.probes;
    over_budget += o.over_budget;
    for (size_t i = 0; i < rule_forwards.size(); ++i) {
      rule_forwards[i] += o.rule_forwards[i];
      rule_agree[i] += o.rule_agree[i];
    }
  }
};

double Ratio(double a, double b) { return b > 0 ? a / b : 0.0; }

// A threshold rule of the `diffusion` mode: by confidence, or by the trained sampler.
struct Rule {
  bool sampler = false;
  float threshold = 0;

  std::string name() const { return sampler ? "sampler" : "confidence"; }
};

// The sequence of one prompt: its prefix's KV, and forwards of blocks after it.
class Sequence {
 public:
  Sequence(Transformer& model, int capacity, int32_t mask)
      : model_(model), kv_(model.KvOptions(capacity)), mask_(mask) {}

  absl::Status Start(std::span<const int32_t> prompt) {
    TANDEM_RETURN_IF_ERROR(kv_.AddSequence(kSeq));
    return Append(prompt);
  }

  // One forward of the pathway on `block` at the next positions (every slot sees the prefix
  // and the whole block, as the `diffusion` mode plans it); its KV is dropped again. With a
  // sampler, each prediction's score is the sampler's probability.
  absl::StatusOr<std::vector<SlotPrediction>> Denoise(std::span<const int32_t> block,
                                                      const DiffusionSampler* sampler) {
    const int n = static_cast<int>(block.size());
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), length_);
    Visibility visible = Visibility::Explicit(n);
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) visible.Allow(i, j);
    }
    std::vector<int32_t> outputs;
    for (int i = 0; i < n; ++i) {
      if (block[i] == mask_) outputs.push_back(i);
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out,
                            Forward(block, positions, visible, outputs));
    TANDEM_RETURN_IF_ERROR(kv_.Commit(kSeq, {}));
    const int vocab = model_.config().vocab_size;
    std::vector<SlotPrediction> predictions(n);
    if (sampler == nullptr) {
      for (size_t r = 0; r < outputs.size(); ++r) {
        predictions[outputs[r]] = PredictSlot(LogitsRow(out[0], static_cast<int>(r), vocab), mask_);
      }
      return predictions;
    }
    std::vector<SlotSummary> summaries;
    for (size_t r = 0; r < outputs.size(); ++r) {
      summaries.push_back(SummarizeSlot(LogitsRow(out[0], static_cast<int>(r), vocab), mask_));
    }
    TANDEM_ASSIGN_OR_RETURN(std::vector<float> p, sampler->Score(block, summaries));
    for (size_t r = 0; r < outputs.size(); ++r) {
      const SlotSummary& s = summaries[r];  // its top-1 is PredictSlot's prediction
      predictions[outputs[r]] = {
          .token = s.top[0], .confidence = s.prob[0], .score = p[outputs[r]]};
    }
    return predictions;
  }

  // Appends `tokens` to the prefix (causal KV, as the `diffusion` mode's refresh writes it).
  absl::Status Append(std::span<const int32_t> tokens) {
    const int n = static_cast<int>(tokens.size());
    std::vector<int32_t> positions(n);
    std::iota(positions.begin(), positions.end(), length_);
    TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out,
                            Forward(tokens, positions, Visibility::Causal(), {}));
    std::vector<int32_t> keep(n);
    std::iota(keep.begin(), keep.end(), 0);
    TANDEM_RETURN_IF_ERROR(kv_.Commit(kSeq, keep));
    length_ += n;
    return absl::OkStatus();
  }

  int length() const { return length_; }

 private:
  static constexpr SeqId kSeq = 0;

  absl::StatusOr<std::vector<ExtendOutput>> Forward(std::span<const int32_t> tokens,
                                                    std::span<const int32_t> positions,
                                                    Visibility visible,
                                                    std::span<const int32_t> outputs) {
    if (!kv_.Reserve(kSeq, static_cast<int>(tokens.size()))) {
      return absl::ResourceExhaustedError("KV cache has no room for the block");
    }
    Extend extend{.seq = kSeq,
                  .tokens = tokens,
                  .positions = positions,
                  .visible = std::move(visible),
                  .outputs = outputs};
    return model_.Forward({&extend, 1}, kv_);
  }

  Transformer& model_;
  KvCache kv_;
  int32_t mask_;
  int length_ = 0;
};

struct Job {
  const BenchSolArgs* args;
  Transformer* model;
  const DiffusionSampler* sampler;  // null: the model has none
  std::vector<Rule> rules;
  int32_t mask;
  std::vector<int32_t> eos;
};

// Every block of one prompt's continuation at block length `block_size`, into `totals`.
absl::Status RunPrompt(const Job& job, std::span<const int32_t> prompt, int block_size,
                       Totals* totals) {
  const int max_positions = job.model->config().max_position_embeddings;
  const int blocks = (job.args->max_tokens + block_size - 1) / block_size;
  const int prompt_len = static_cast<int>(prompt.size());
  Sequence seq(*job.model, prompt_len + (blocks + 1) * block_size, job.mask);
  TANDEM_RETURN_IF_ERROR(seq.Start(prompt));
  ++totals->prompts;
  const BlockDenoiser denoise = [&seq](std::span<const int32_t> block) {
    return seq.Denoise(block, nullptr);
  };
  const BlockDenoiser sampled = [&seq, &job](std::span<const int32_t> block) {
    return seq.Denoise(block, job.sampler);
  };
  for (int b = 0; b < blocks; ++b) {
    if (max_positions > 0 && seq.length() + block_size > max_positions) break;
    TANDEM_ASSIGN_OR_RETURN(BlockRun serial, SerialDenoise(denoise, block_size, job.mask));
    const std::vector<int32_t>& target = serial.tokens;
    TANDEM_ASSIGN_OR_RETURN(BlockRun greedy, GreedyAcceptance(denoise, target, job.mask));
    TANDEM_ASSIGN_OR_RETURN(
        BlockRun sol, DynamicCompaction(denoise, target, job.mask,
                                        {.depth = job.args->depth, .probes = job.args->probes}));
    ++totals->blocks;
    totals->tokens += block_size;
    totals->greedy_forwards += greedy.forwards;
    totals->greedy_exact += greedy.exact ? 1 : 0;
    totals->sol_forwards += sol.forwards;
    totals->sol_exact += sol.exact ? 1 : 0;
    totals->probes += sol.probes;
    totals->over_budget += sol.over_budget ? 1 : 0;
    for (size_t r = 0; r < job.rules.size(); ++r) {
      const Rule& rule = job.rules[r];
      TANDEM_ASSIGN_OR_RETURN(BlockRun run, ThresholdDenoise(rule.sampler ? sampled : denoise,
                                                             block_size, job.mask, rule.threshold));
      totals->rule_forwards[r] += run.forwards;
      for (int i = 0; i < block_size; ++i) {
        totals->rule_agree[r] += run.tokens[i] == target[i] ? 1 : 0;
      }
    }
    TANDEM_RETURN_IF_ERROR(seq.Append(target));
    const bool ended = std::any_of(target.begin(), target.end(), [&](int32_t token) {
      return std::find(job.eos.begin(), job.eos.end(), token) != job.eos.end();
    });
    if (ended) break;
  }
  return absl::OkStatus();
}

absl::Status CheckArgs(const BenchSolArgs& args) {
  if (args.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-tokens must be positive, got ", args.max_tokens));
  }
  if (args.block_sizes.empty()) return absl::InvalidArgumentError("--blocks is empty");
  for (int b : args.block_sizes) {
    if (b < 1 || b > kMaxBlockSize) {
      return absl::InvalidArgumentError(
          absl::StrCat("--blocks: each block length must be in [1, ", kMaxBlockSize, "], got ", b));
    }
  }
  for (const auto& [flag, values] : {std::pair{"--thresholds", &args.thresholds},
                                     std::pair{"--sampler-thresholds", &args.sampler_thresholds}}) {
    for (float t : *values) {
      if (!(t >= 0.0f && t <= 1.0f)) {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, ": each threshold must be in [0, 1], got ", t));
      }
    }
  }
  if (args.depth < 1 || args.depth > kMaxDepth) {
    return absl::InvalidArgumentError(
        absl::StrCat("--depth must be in [1, ", kMaxDepth, "], got ", args.depth));
  }
  if (args.probes < 0 || args.probes > kMaxProbes) {
    return absl::InvalidArgumentError(
        absl::StrCat("--probes must be in [0, ", kMaxProbes, "], got ", args.probes));
  }
  return absl::OkStatus();
}

nlohmann::json RowJson(const Job& job, int block_size, const std::string& category,
                       const Totals& t) {
  nlohmann::json rules = nlohmann::json::array();
  for (size_t i = 0; i < job.rules.size(); ++i) {
    rules.push_back({{"rule", job.rules[i].name()},
                     {"threshold", job.rules[i].threshold},
                     {"forwards", t.rule_forwards[i]},
                     {"tpf", Ratio(t.tokens, t.rule_forwards[i])},
                     {"agreement", Ratio(t.rule_agree[i], t.tokens)}});
  }
  return {{"block_size", block_size},
          {"category", category},
          {"prompts", t.prompts},
          {"blocks", t.blocks},
          {"tokens", t.tokens},
          {"greedy",
           {{"forwards", t.greedy_forwards},
            {"tpf", Ratio(t.tokens, t.greedy_forwards)},
            {"exact_blocks", t.greedy_exact}}},
          {"compaction",
           {{"forwards", t.sol_forwards},
            {"tpf", Ratio(t.tokens, t.sol_forwards)},
            {"exact_blocks", t.sol_exact},
            {"probes", t.probes},
            {"over_budget_blocks", t.over_budget}}},
          {"rules", rules}};
}

constexpr const char* kNotes[] = {
    "target: per block, serial denoising (one slot per forward, the most confident): block "
    "length forwards; the continuation is that target, block after block.",
    "TPF: block slots / committing forwards, from the all-masked block. greedy: every slot whose "
    "argmax is the target's; SOL: the longest confidence-ranked safe subset (recursive dynamic "
    "compaction), the ceiling. exact: blocks that end at the target.",
    "probes/blk: compaction's safety-check forwards per block (not in its TPF); over: blocks "
    "where a check ran out of --probes and counted as unsafe.",
    "rules: the diffusion mode's, each forward commits the most confident slot and every slot "
    "whose confidence (or trained sampler probability) reaches the threshold; agree: slots equal "
    "to the target's.",
};

void PrintTables(const Job& job, const std::map<std::pair<int, std::string>, Totals>& rows) {
  std::printf(
      "| block | category | blocks | greedy TPF | exact | SOL TPF | exact | probes/blk | over |\n"
      "|---:|---|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const auto& [key, t] : rows) {
    std::printf("| %d | %s | %d | %.2f | %.0f%% | %.2f | %.0f%% | %.1f | %d |\n", key.first,
                key.second.c_str(), t.blocks, Ratio(t.tokens, t.greedy_forwards),
                100 * Ratio(t.greedy_exact, t.blocks), Ratio(t.tokens, t.sol_forwards),
                100 * Ratio(t.sol_exact, t.blocks), Ratio(static_cast<double>(t.probes), t.blocks),
                t.over_budget);
  }
  std::printf("\n| block | rule | threshold | TPF | agree |\n|---:|---|---:|---:|---:|\n");
  for (const auto& [key, t] : rows) {
    if (key.second != "all") continue;
    for (size_t i = 0; i < job.rules.size(); ++i) {
      std::printf("| %d | %s | %.2f | %.2f | %.1f%% |\n", key.first, job.rules[i].name().c_str(),
                  job.rules[i].threshold, Ratio(t.tokens, t.rule_forwards[i]),
                  100 * Ratio(t.rule_agree[i], t.tokens));
    }
  }
  std::printf("\n");
  for (const char* note : kNotes) std::printf("- %s\n", note);
}

}  // namespace

int RunBenchSol(const BenchSolArgs& args) {
  kernels::cpu::SetBlasThreads(args.threads);
  omp_set_num_threads(kernels::cpu::BlasThreads());
  if (absl::Status ok = CheckArgs(args); !ok.ok()) {
    std::fprintf(stderr, "bench sol: %s\n", std::string(ok.message()).c_str());
    return 1;
  }
  const absl::StatusOr<std::string> model_dir = FindModelDir(args.model_dir);
  if (!model_dir.ok()) {
    std::fprintf(stderr, "bench sol: %s\n", std::string(model_dir.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<std::vector<Prompt>> prompts =
      LoadBenchPrompts(*model_dir, args.prompts_file, args.prompts);
  if (!prompts.ok()) {
    std::fprintf(stderr, "bench sol: %s\n", prompts.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<DeviceOptions> device = ResolveDevice(args.device);
  if (!device.ok()) {
    std::fprintf(stderr, "bench sol: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  absl::StatusOr<LoadedModel> model = LoadModelDir(*model_dir, *device);
  if (!model.ok()) {
    std::fprintf(stderr, "bench sol: %s\n", model.status().ToString().c_str());
    return 1;
  }
  const ModelConfig& config = model->model->config();
  if (!config.diffusion.mask_token_id) {
    std::fprintf(stderr,
                 "bench sol: %s has no diffusion pathway (no mask_token_id in config.json and "
                 "no <|mask|> in tokenizer.json); use a block-diffusion model\n",
                 model_dir->c_str());
    return 1;
  }
  Job job{.args = &args,
          .model = model->model.get(),
          .sampler = model->sampler.get(),
          .rules = {},
          .mask = *config.diffusion.mask_token_id,
          .eos = {config.eos_token_ids.begin(), config.eos_token_ids.end()}};
  for (float t : args.thresholds) job.rules.push_back({.sampler = false, .threshold = t});
  if (job.sampler != nullptr) {
    for (int b : args.block_sizes) {
      if (b > job.sampler->max_block()) {
        std::fprintf(stderr,
                     "bench sol: --blocks: %d is longer than the trained sampler's blocks (at "
                     "most %d)\n",
                     b, job.sampler->max_block());
        return 1;
      }
    }
    for (float t : args.sampler_thresholds) job.rules.push_back({.sampler = true, .threshold = t});
  }
  std::vector<std::vector<int32_t>> ids;
  for (const Prompt& p : *prompts) {
    absl::StatusOr<std::vector<int32_t>> encoded = model->tokenizer->Encode(p.text);
    if (!encoded.ok() || encoded->empty()) {
      std::fprintf(stderr, "bench sol: prompt from %s does not tokenize: %s\n", p.source.c_str(),
                   encoded.ok() ? "empty" : encoded.status().ToString().c_str());
      return 1;
    }
    ids.push_back(std::move(*encoded));
  }

  const absl::Time start = absl::Now();
  // (block length, category) -> totals; category "all" sums every prompt.
  std::map<std::pair<int, std::string>, Totals> rows;
  for (int block_size : args.block_sizes) {
    for (size_t p = 0; p < prompts->size(); ++p) {
      Totals one(job.rules.size());
      if (absl::Status ran = RunPrompt(job, ids[p], block_size, &one); !ran.ok()) {
        std::fprintf(stderr, "bench sol: block %d, prompt from %s: %s\n", block_size,
                     (*prompts)[p].source.c_str(), ran.ToString().c_str());
        return 1;
      }
      for (const std::string& category : {std::string("all"), (*prompts)[p].category}) {
        rows.try_emplace({block_size, category}, job.rules.size()).first->second.Add(one);
      }
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);

  if (args.json) {
    nlohmann::json out = {{"model", *model_dir},
                          {"device", DeviceName(device->device)},
                          {"max_tokens", args.max_tokens},
                          {"depth", args.depth},
                          {"probes", args.probes},
                          {"sampler", job.sampler != nullptr},
                          {"seconds", seconds},
                          {"rows", nlohmann::json::array()}};
    for (const auto& [key, t] : rows) out["rows"].push_back(RowJson(job, key.first, key.second, t));
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::printf(
      "tandem bench sol  (model %s, %zu prompts, up to %d new tokens, compaction depth %d, %d "
      "probes per block, %s, %.1f s)\n\n",
      model_dir->c_str(), prompts->size(), args.max_tokens, args.depth, args.probes,
      job.sampler != nullptr ? "trained sampler" : "no trained sampler", seconds);
  PrintTables(job, rows);
  return 0;
}

}  // namespace tandem::cli
