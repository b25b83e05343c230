#include "worker/decoding/jacobi.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tandem {

namespace {

// Prompt lookup searches this many latest tokens for an earlier occurrence of the seed token;
// it runs a few times per step, so its cost must not grow with the context.
constexpr int kLookupWindow = 4096;

// Latest earlier occurrences (index j <= size - 2, so a token follows) of `seed` in `tokens`:
// `bigram` also has `before` just ahead of it; -1 where none.
struct Occurrence {
  int bigram = -1;
  int unigram = -1;
};
Occurrence FindEarlier(std::span<const int32_t> tokens, int32_t before, int32_t seed) {
  Occurrence found;
  const int size = static_cast<int>(tokens.size());
  for (int j = size - 2; j >= std::max(0, size - 1 - kLookupWindow); --j) {
    if (tokens[j] != seed) continue;
    if (found.unigram < 0) found.unigram = j;
    if (j > 0 && tokens[j - 1] == before) {
      found.bigram = j;
      break;
    }
  }
  return found;
}

constexpr int kMaxPendingWithCandidates = 256;
constexpr int kMaxBlocks = 8;
constexpr int kMaxCandidates = 16;
constexpr int kMaxPoolSize = 1 << 16;

}  // namespace

absl::Status ValidateJacobiOptions(const JacobiOptions& o) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (o.block_size < 1 || o.block_size > kMaxJacobiDraftTokens) {
    return bad("jacobi_block_size must be in [1, ", kMaxJacobiDraftTokens, "], got ", o.block_size);
  }
  if (o.blocks < 1 || o.blocks > kMaxBlocks) {
    return bad("jacobi_blocks must be in [1, ", kMaxBlocks, "], got ", o.blocks);
  }
  if (!(o.spawn_ratio > 0.0f && o.spawn_ratio <= 1.0f)) {
    return bad("jacobi_spawn_ratio must be in (0, 1], got ", o.spawn_ratio);
  }
  if (o.pool_size < 0 || o.pool_size > kMaxPoolSize) {
    return bad("jacobi_pool_size must be in [0, ", kMaxPoolSize, "], got ", o.pool_size);
  }
  if (o.candidates < 0 || o.candidates > kMaxCandidates) {
    return bad("jacobi_candidates must be in [0, ", kMaxCandidates, "], got ", o.candidates);
  }
  const int candidates = (o.pool_size > 0 ? o.candidates : 0) + (o.prompt_lookup ? 1 : 0);
  if ((o.blocks + candidates) * o.block_size > kMaxJacobiDraftTokens) {
    return bad("jacobi_block_size * (jacobi_blocks + jacobi_candidates + jacobi_prompt_lookup) = ",
               (o.blocks + candidates) * o.block_size, " draft tokens per step; at most ",
               kMaxJacobiDraftTokens, " are allowed");
  }
  return absl::OkStatus();
}

JacobiMode::JacobiMode(const JacobiOptions& options, int vocab_size, int max_positions)
    : options_(options),
      vocab_size_(vocab_size),
      max_positions_(max_positions),
      // The epsilon keeps ratios like 0.3 * 10 (3.0000001f) from rounding up a whole token.
      spawn_threshold_(std::max(
          1, static_cast<int>(std::ceil(options.spawn_ratio * options.block_size - 1e-4f)))),
      pool_(options.candidates > 0 ? options.pool_size : 0) {}

void JacobiMode::Reset(const DecodeState& state) {
  base_ = static_cast<int>(state.tokens.size());
  last_token_ = state.tokens.back();
  ra_start_ = base_;
  pseudo_.clear();
  chain_.clear();
  pool_.Clear();
}

bool JacobiMode::Frozen(int chain_index) const {
  // Tokens in the RA window are always verified and re-predicted.
  if (chain_index < options_.block_size) return false;
  const int q = base_ + chain_index;
  for (const PseudoBlock& b : pseudo_) {
    if (q >= b.start && q < b.start + options_.block_size) return q - b.start < b.accepted;
  }
  return false;
}

void JacobiMode::Pad(std::span<const int32_t> tokens, size_t length) {
  const int size = static_cast<int>(tokens.size());
  while (chain_.size() < length) {
    const int32_t seed = chain_.empty() ? tokens.back() : chain_.back();
    // The token before the seed, in the sequence followed by the chain.
    const int32_t before = chain_.size() >= 2   ? chain_[chain_.size() - 2]
                           : chain_.size() == 1 ? tokens.back()
                           : size >= 2          ? tokens[size - 2]
                                                : -1;
    const size_t need = length - chain_.size();
    const Occurrence earlier = FindEarlier(tokens, before, seed);
    std::vector<std::vector<int32_t>> recycled;
    if (earlier.bigram < 0) recycled = pool_.Lookup(seed, 1);
    if (!recycled.empty()) {
      const std::vector<int32_t>& run = recycled.front();
      chain_.insert(chain_.end(), run.begin(), run.begin() + std::min(need, run.size()));
      continue;
    }
    const int found = earlier.bigram >= 0 ? earlier.bigram : earlier.unigram;
    if (found >= 0) {
      const size_t take = std::min(need, static_cast<size_t>(size - found - 1));
      chain_.insert(chain_.end(), tokens.begin() + found + 1, tokens.begin() + found + 1 + take);
      continue;
    }
    chain_.push_back(seed);
  }
}

StepPlan JacobiMode::Plan(const DecodeState& state) {
  const int t = static_cast<int>(state.tokens.size());
  if (base_ != t || state.tokens.back() != last_token_) Reset(state);
  const int n = options_.block_size;

  // The chain covers the RA window and every block span.
  const size_t needed =
      static_cast<size_t>(std::max(n, ra_start_ + (1 + static_cast<int>(pseudo_.size())) * n - t));
  Pad(state.tokens, needed);
  if (chain_.size() > needed) chain_.resize(needed);

  // Drafts past budget - 1 could never be kept; positions must stay below max_positions.
  int limit = state.budget - 1;
  if (max_positions_ > 0) limit = std::min(limit, max_positions_ - t);
  limit = std::max(limit, 0);

  layout_ = Layout{};
  StepPlan plan;
  AppendPending(state, &plan);
  const int pending = static_cast<int>(plan.tokens.size());
  const int chain = std::min(static_cast<int>(needed), limit);
  const int window = std::min(n, chain);
  layout_.pending = pending;
  layout_.chain = chain;
  layout_.window = window;
  layout_.frozen.resize(chain);
  for (int c = 0; c < chain; ++c) {
    plan.tokens.push_back(chain_[c]);
    plan.positions.push_back(t + c);
    layout_.frozen[c] = Frozen(c) ? 1 : 0;
  }

  // Candidates need an explicit mask, quadratic in the extend; a long pending run (a prefill)
  // skips them for that step.
  if (window > 0 && pending <= kMaxPendingWithCandidates) {
    std::vector<std::vector<int32_t>> runs;
    if (options_.prompt_lookup && t >= 2) {
      // What followed the latest earlier occurrence of the last two tokens.
      const Occurrence earlier =
          FindEarlier(state.tokens, state.tokens[t - 2], state.tokens[t - 1]);
      if (earlier.bigram >= 0) {
        const int end = std::min(t, earlier.bigram + 1 + window);
        runs.emplace_back(state.tokens.begin() + earlier.bigram + 1, state.tokens.begin() + end);
      }
    }
    const int max_candidates = options_.candidates + static_cast<int>(runs.size());
    if (pool_.capacity() > 0) {
      for (std::vector<int32_t>& run : pool_.Lookup(state.tokens.back(), pool_.capacity())) {
        runs.push_back(std::move(run));
      }
    }
    for (std::vector<int32_t>& run : runs) {
      if (static_cast<int>(layout_.candidates.size()) >= max_candidates) break;
      if (static_cast<int>(run.size()) > window) run.resize(window);
      // A candidate the RA window already contains, or a repeat, cannot win.
      if (std::equal(run.begin(), run.end(), chain_.begin())) continue;
      if (std::ranges::any_of(layout_.candidates,
                              [&](const Candidate& c) { return c.tokens == run; })) {
        continue;
      }
      Candidate candidate{.offset = static_cast<int>(plan.tokens.size()), .tokens = run};
      for (size_t j = 0; j < run.size(); ++j) {
        plan.tokens.push_back(run[j]);
        plan.positions.push_back(t + static_cast<int>(j));
      }
      layout_.candidates.push_back(std::move(candidate));
    }
  }
  layout_.size = static_cast<int>(plan.tokens.size());
  stats_.candidates_verified += static_cast<int64_t>(layout_.candidates.size());

  // Pending tokens and the chain are one causal run; candidates branch off the pending tokens.
  if (!layout_.candidates.empty()) {
    plan.visible = Visibility::Explicit(layout_.size);
    for (int i = 0; i < pending + chain; ++i) {
      for (int j = 0; j <= i; ++j) plan.visible.Allow(i, j);
    }
    for (const Candidate& c : layout_.candidates) {
      for (int i = c.offset; i < c.offset + static_cast<int>(c.tokens.size()); ++i) {
        for (int j = 0; j < pending; ++j) plan.visible.Allow(i, j);
        for (int j = c.offset; j <= i; ++j) plan.visible.Allow(i, j);
      }
    }
  }

  // Logits after the last pending token, after every chain token whose successor is
  // re-predicted, and after every candidate token.
  layout_.row.assign(layout_.size, -1);
  auto output = [&](int index) {
    layout_.row[index] = static_cast<int>(plan.outputs.size());
    plan.outputs.push_back(index);
  };
  output(pending - 1);
  for (int c = 0; c < chain; ++c) {
    if (layout_.frozen[c]) ++stats_.frozen_fed;
    if (layout_.frozen[c] && c + 1 < chain && layout_.frozen[c + 1]) continue;
    output(pending + c);
  }
  for (const Candidate& c : layout_.candidates) {
    for (size_t j = 0; j < c.tokens.size(); ++j) output(c.offset + static_cast<int>(j));
  }
  return plan;
}

void JacobiMode::RecordRejected(int32_t last_token, int accepted) {
  if (pool_.capacity() <= 0) return;
  const int window = layout_.window;
  const int n = options_.block_size;
  for (int i = accepted - 1; i + 1 < window; ++i) {
    const int32_t key = i < 0 ? last_token : chain_[i];
    const int end = std::min(i + 1 + n, window);
    pool_.Add(key, std::span<const int32_t>(chain_).subspan(i + 1, end - i - 1));
  }
}

void JacobiMode::UpdateBlocks() {
  const int n = options_.block_size;
  while (base_ >= ra_start_ + n) {
    ra_start_ += n;
    if (!pseudo_.empty()) {
      pseudo_.erase(pseudo_.begin());
      ++stats_.promotions;
    }
  }
  const int blocks = 1 + static_cast<int>(pseudo_.size());
  if (blocks >= options_.blocks) return;
  bool ready = base_ - ra_start_ >= spawn_threshold_;
  for (const PseudoBlock& b : pseudo_) ready = ready || b.accepted >= spawn_threshold_;
  if (ready) {
    pseudo_.push_back({.start = ra_start_ + blocks * n, .accepted = 0});
    ++stats_.spawns;
  }
}

absl::StatusOr<StepResult> JacobiMode::Consume(const DecodeState& state, const StepPlan& plan,
                                               const ExtendOutput& out) {
  if (state.sampling != nullptr && !state.sampling->greedy()) {
    return absl::InvalidArgumentError("jacobi decodes greedily; use temperature 0");
  }
  const int t = static_cast<int>(state.tokens.size());
  if (base_ != t || static_cast<int>(plan.tokens.size()) != layout_.size ||
      plan.outputs.size() * static_cast<size_t>(vocab_size_) != out.logits.size()) {
    return absl::InternalError(
        absl::StrCat("jacobi: Consume got a plan of ", plan.tokens.size(), " tokens and ",
                     out.logits.size(), " logits for a sequence of ", t, "; the last Plan made ",
                     layout_.size, " tokens for a sequence of ", base_));
  }
  const int pending = layout_.pending;
  const int chain = layout_.chain;
  const int window = layout_.window;
  auto predict = [&](int index) -> int32_t {
    const int row = layout_.row[index];
    return row < 0 ? -1 : Argmax(LogitsRow(out, row, vocab_size_));
  };

  // main[c] = argmax at sequence index t + c given chain tokens before c (-1 = not computed).
  std::vector<int32_t> main(chain + 1);
  main[0] = predict(pending - 1);
  for (int c = 0; c < chain; ++c) main[c + 1] = predict(pending + c);
  int main_accepted = 0;
  while (main_accepted < window && chain_[main_accepted] == main[main_accepted]) ++main_accepted;

  int winner = -1;  // candidate index, -1 = RA window
  int accepted = main_accepted;
  std::vector<std::vector<int32_t>> candidate_pred(layout_.candidates.size());
  for (size_t i = 0; i < layout_.candidates.size(); ++i) {
    const Candidate& c = layout_.candidates[i];
    const int len = static_cast<int>(c.tokens.size());
    std::vector<int32_t>& pred = candidate_pred[i];
    pred.resize(len + 1);
    pred[0] = main[0];
    for (int j = 0; j < len; ++j) pred[j + 1] = predict(c.offset + j);
    int k = 0;
    while (k < len && c.tokens[k] == pred[k]) ++k;
    if (k > accepted) {
      winner = static_cast<int>(i);
      accepted = k;
    }
  }
  const std::vector<int32_t>& branch_pred = winner < 0 ? main : candidate_pred[winner];

  StepResult result;
  for (int i = 0; i < pending; ++i) result.keep.push_back(i);
  const int branch_offset = winner < 0 ? pending : layout_.candidates[winner].offset;
  for (int j = 0; j < accepted; ++j) {
    result.keep.push_back(branch_offset + j);
    result.append.push_back(branch_pred[j]);  // equals the accepted draft token
  }
  result.append.push_back(branch_pred[accepted]);
  result.drafted = window;
  result.accepted = accepted;

  // Pseudo-acceptance: the longest prefix of each pseudo-active block that is frozen already
  // or equals its prediction given the (unverified) chain before it.
  for (PseudoBlock& b : pseudo_) {
    const int first = b.start - t;  // >= 1: RA's span holds t
    if (first >= chain) continue;
    int k = 0;
    while (k < options_.block_size && first + k < chain) {
      const int c = first + k;
      if (!layout_.frozen[c] && (main[c] < 0 || chain_[c] != main[c])) break;
      ++k;
    }
    b.accepted = k;
  }
  RecordRejected(state.tokens.back(), main_accepted);

  // Jacobi update of the chain past the new sequence end t + accepted + 1.
  std::vector<int32_t> next;
  const int winner_len =
      winner < 0 ? 0 : static_cast<int>(layout_.candidates[winner].tokens.size());
  const int upper = std::max(chain + 1, static_cast<int>(chain_.size()));
  for (int c = accepted + 1; c < upper; ++c) {
    int32_t guess = -1;
    if (c <= winner_len) {
      guess = branch_pred[c];
    } else if (c < chain && layout_.frozen[c]) {
      guess = chain_[c];
    } else if (c <= chain && main[c] >= 0) {
      guess = main[c];
    } else if (c < static_cast<int>(chain_.size())) {
      guess = chain_[c];
    }
    if (guess < 0) break;
    next.push_back(guess);
  }
  chain_ = std::move(next);
  base_ = t + accepted + 1;
  last_token_ = result.append.back();
  ++stats_.steps;
  if (winner >= 0) ++stats_.candidate_wins;
  UpdateBlocks();
  return result;
}

}  // namespace tandem
