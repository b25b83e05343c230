#include "worker/decoding/diffusion_sol.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

SlotPrediction PredictSlot(std::span<const float> logits, int32_t mask_token) {
  SlotPrediction p;
  float top = -std::numeric_limits<float>::infinity();
  for (size_t v = 0; v < logits.size(); ++v) {
    if (static_cast<int32_t>(v) == mask_token) continue;
    if (p.token < 0 || logits[v] > top) {
      top = logits[v];
      p.token = static_cast<int32_t>(v);
    }
  }
  double sum = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (static_cast<int32_t>(v) == mask_token) continue;
    sum += std::exp(static_cast<double>(logits[v]) - top);
  }
  p.confidence = sum > 0 ? static_cast<float>(1.0 / sum) : 0.0f;
  p.score = p.confidence;
  return p;
}

namespace {

bool AnyMasked(std::span<const int32_t> block, int32_t mask) {
  return std::find(block.begin(), block.end(), mask) != block.end();
}

// One forward on `block`, with its predictions checked against the block's size.
absl::StatusOr<std::vector<SlotPrediction>> Denoise(const BlockDenoiser& denoise,
                                                    std::span<const int32_t> block, int32_t mask) {
  TANDEM_ASSIGN_OR_RETURN(std::vector<SlotPrediction> p, denoise(block));
  if (p.size() != block.size()) {
    return absl::InternalError(
        absl::StrCat("denoiser returned ", p.size(), " predictions for a block of ", block.size()));
  }
  for (size_t i = 0; i < block.size(); ++i) {
    if (block[i] == mask && (p[i].token < 0 || p[i].token == mask)) {
      return absl::InternalError(
          absl::StrCat("denoiser predicted no real token for masked slot ", i));
    }
  }
  return p;
}

// The most confident masked slot (the first of equals).
int MostConfident(std::span<const int32_t> block, std::span<const SlotPrediction> p, int32_t mask) {
  int best = -1;
  for (size_t i = 0; i < block.size(); ++i) {
    if (block[i] != mask) continue;
    if (best < 0 || p[i].confidence > p[best].confidence) best = static_cast<int>(i);
  }
  return best;
}

absl::Status CheckBlock(int block_size, int32_t mask) {
  if (block_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("block size must be >= 1, got ", block_size));
  }
  if (mask < 0) return absl::InvalidArgumentError("the mask token must be a token id");
  return absl::OkStatus();
}

// The decode behind GreedyAcceptance (depth 0) and DynamicCompaction (depth >= 1).
class TargetSearch {
 public:
  TargetSearch(const BlockDenoiser& denoise, std::span<const int32_t> target, int32_t mask,
               int probes)
      : denoise_(denoise), target_(target), mask_(mask), probes_left_(probes) {}

  // Decodes `block` until no slot is masked with the scheme of `depth`. A `check` run is a
  // safety check: each forward is a probe drawn from the budget, and it gives up (false) at its
  // first commit off the target or when the budget is spent. Returns whether it ended at the
  // target; `forwards` counts the committing forwards of a run that is not a check.
  absl::StatusOr<bool> Decode(std::vector<int32_t>& block, int depth, bool check, int* forwards) {
    bool on_target = true;
    while (AnyMasked(block, mask_)) {
      if (check) {
        if (probes_left_ <= 0) {
          over_budget_ = true;
          return false;
        }
        --probes_left_;
        ++probes_;
      } else {
        ++*forwards;
      }
      TANDEM_ASSIGN_OR_RETURN(std::vector<SlotPrediction> p, Denoise(denoise_, block, mask_));
      std::vector<int> matched;
      for (size_t i = 0; i < block.size(); ++i) {
        if (block[i] == mask_ && p[i].token == target_[i]) matched.push_back(static_cast<int>(i));
      }
      if (matched.empty()) {
        if (check) return false;
        const int best = MostConfident(block, p, mask_);
        block[best] = p[best].token;  // off the target: the run can no longer be exact
        on_target = false;
        continue;
      }
      std::stable_sort(matched.begin(), matched.end(),
                       [&](int a, int b) { return p[a].confidence > p[b].confidence; });
      int take = static_cast<int>(matched.size());
      if (depth > 0 && take > 1) {
        TANDEM_ASSIGN_OR_RETURN(take, LongestSafePrefix(block, matched, depth));
      }
      for (int i = 0; i < take; ++i) block[matched[i]] = target_[matched[i]];
    }
    return on_target && std::equal(block.begin(), block.end(), target_.begin(), target_.end());
  }

  int probes() const { return probes_; }
  bool over_budget() const { return over_budget_; }

 private:
  // Whether committing the first `n` of `ranked` is safe: the scheme one level shallower ends
  // at the target from there.
  absl::StatusOr<bool> Safe(const std::vector<int32_t>& block, const std::vector<int>& ranked,
                            int n, int depth) {
    std::vector<int32_t> trial = block;
    for (int i = 0; i < n; ++i) trial[ranked[i]] = target_[ranked[i]];
    int unused = 0;
    return Decode(trial, depth - 1, /*check=*/true, &unused);
  }

  // The longest safe prefix of `ranked` (1 when no longer one is), by binary search.
  absl::StatusOr<int> LongestSafePrefix(const std::vector<int32_t>& block,
                                        const std::vector<int>& ranked, int depth) {
    const int n = static_cast<int>(ranked.size());
    TANDEM_ASSIGN_OR_RETURN(bool all, Safe(block, ranked, n, depth));
    if (all) return n;
    int lo = 1;
    int hi = n - 1;
    while (lo < hi) {
      const int mid = (lo + hi + 1) / 2;
      TANDEM_ASSIGN_OR_RETURN(bool safe, Safe(block, ranked, mid, depth));
      if (safe) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  }

  const BlockDenoiser& denoise_;
  std::span<const int32_t> target_;
  int32_t mask_;
  int probes_left_;
  int probes_ = 0;
  bool over_budget_ = false;
};

absl::StatusOr<BlockRun> SearchTarget(const BlockDenoiser& denoise, std::span<const int32_t> target,
                                      int32_t mask, int depth, int probes) {
  TANDEM_RETURN_IF_ERROR(CheckBlock(static_cast<int>(target.size()), mask));
  if (AnyMasked(target, mask)) {
    return absl::InvalidArgumentError("the target block holds the mask token");
  }
  TargetSearch search(denoise, target, mask, probes);
  BlockRun run;
  run.tokens.assign(target.size(), mask);
  TANDEM_ASSIGN_OR_RETURN(run.exact, search.Decode(run.tokens, depth, false, &run.forwards));
  run.probes = search.probes();
  run.over_budget = search.over_budget();
  return run;
}

}  // namespace

absl::StatusOr<BlockRun> SerialDenoise(const BlockDenoiser& denoise, int block_size,
                                       int32_t mask_token) {
  return ThresholdDenoise(denoise, block_size, mask_token, std::numeric_limits<float>::infinity());
}

absl::StatusOr<BlockRun> ThresholdDenoise(const BlockDenoiser& denoise, int block_size,
                                          int32_t mask_token, float threshold) {
  TANDEM_RETURN_IF_ERROR(CheckBlock(block_size, mask_token));
  BlockRun run;
  run.tokens.assign(block_size, mask_token);
  while (AnyMasked(run.tokens, mask_token)) {
    ++run.forwards;
    TANDEM_ASSIGN_OR_RETURN(std::vector<SlotPrediction> p,
                            Denoise(denoise, run.tokens, mask_token));
    const int best = MostConfident(run.tokens, p, mask_token);
    std::vector<int> commit;
    for (int i = 0; i < block_size; ++i) {
      if (run.tokens[i] == mask_token && (i == best || p[i].score >= threshold)) {
        commit.push_back(i);
      }
    }
    for (int i : commit) run.tokens[i] = p[i].token;
  }
  return run;
}

absl::StatusOr<BlockRun> GreedyAcceptance(const BlockDenoiser& denoise,
                                          std::span<const int32_t> target, int32_t mask_token) {
  return SearchTarget(denoise, target, mask_token, /*depth=*/0, /*probes=*/0);
}

absl::StatusOr<BlockRun> DynamicCompaction(const BlockDenoiser& denoise,
                                           std::span<const int32_t> target, int32_t mask_token,
                                           const CompactionOptions& options) {
  if (options.depth < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("compaction depth must be >= 1, got ", options.depth));
  }
  if (options.probes < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("compaction probe budget must be >= 0, got ", options.probes));
  }
  return SearchTarget(denoise, target, mask_token, options.depth, options.probes);
}

}  // namespace tandem
