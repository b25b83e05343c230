#include "worker/decoding/diffusion_drafter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/decoding/verify.h"

namespace tandem {

namespace {

constexpr SeqId kDraftSeq = 0;

}  // namespace

DiffusionDrafter::DiffusionDrafter(Transformer* model, int32_t mask_token, int capacity)
    : model_(model), mask_token_(mask_token), capacity_(capacity), kv_(model->KvOptions(capacity)) {
  // A fresh cache always has room for its one sequence.
  (void)kv_.AddSequence(kDraftSeq);
}

absl::StatusOr<std::vector<int32_t>> DiffusionDrafter::Draft(std::span<const int32_t> tokens,
                                                             int gamma) {
  if (gamma <= 0) return std::vector<int32_t>();
  const std::vector<int32_t> block(gamma, kUndecodedSlot);
  TANDEM_ASSIGN_OR_RETURN(BlockDraft draft, DraftBlock(tokens, block, gamma));
  // The block's slots in position order; a slot past the context ends the drafts.
  std::vector<int32_t> by_slot(gamma, kUndecodedSlot);
  for (int r = 0; r < draft.size(); ++r) by_slot[draft.slots[r]] = draft.tokens[r];
  const auto end = std::find(by_slot.begin(), by_slot.end(), kUndecodedSlot);
  return std::vector<int32_t>(by_slot.begin(), end);
}

absl::StatusOr<BlockDraft> DiffusionDrafter::DraftBlock(std::span<const int32_t> tokens,
                                                        std::span<const int32_t> block, int gamma) {
  ++stats_.calls;
  const int n = static_cast<int>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("drafter got an empty sequence");
  const int vocab = model_->config().vocab_size;
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", t, " is outside the drafter's vocabulary of ", vocab));
    }
  }
  for (int32_t t : block) {
    if (t != kUndecodedSlot && (t < 0 || t >= vocab)) {
      return absl::InvalidArgumentError(
          absl::StrCat("block slot token ", t, " is outside the drafter's vocabulary of ", vocab));
    }
  }
  // Block slot s sits at position n + s: it must fit the cache and the context.
  int limit = capacity_ - n;
  const int context = model_->config().max_position_embeddings;
  if (context > 0) limit = std::min(limit, context - n);
  const int size = std::min(static_cast<int>(block.size()), limit);
  BlockDraft draft;
  if (size <= 0 || gamma <= 0) return draft;
  std::vector<int32_t> state(block.begin(), block.begin() + size);
  for (int32_t& t : state) {
    if (t == kUndecodedSlot) t = mask_token_;
  }
  std::vector<uint8_t> undecoded(size);
  for (int s = 0; s < size; ++s) undecoded[s] = block[s] == kUndecodedSlot;

  size_t common = 0;
  while (common < cached_.size() && common < tokens.size() && cached_[common] == tokens[common]) {
    ++common;
  }
  if (common < cached_.size()) {
    TANDEM_RETURN_IF_ERROR(kv_.Truncate(kDraftSeq, static_cast<int>(common)));
    cached_.resize(common);
  }
  stats_.reused_tokens += static_cast<int64_t>(common);

  std::span<const int32_t> feed = tokens.subspan(common);
  std::vector<int32_t> extend_tokens;
  std::vector<int32_t> positions;
  std::vector<int32_t> outputs;
  std::vector<int32_t> keep;
  auto fail = [&](absl::Status status) {
    // The cache may be out of step with cached_ now; start over next call.
    (void)kv_.Truncate(kDraftSeq, 0);
    cached_.clear();
    return status;
  };
  while (draft.size() < gamma &&
         std::find(undecoded.begin(), undecoded.end(), 1) != undecoded.end()) {
    // [uncached sequence tokens, causal | the block, seeing the sequence and every slot]
    const int f = static_cast<int>(feed.size());
    const int m = f + size;
    extend_tokens.assign(feed.begin(), feed.end());
    extend_tokens.insert(extend_tokens.end(), state.begin(), state.end());
    positions.resize(m);
    for (int i = 0; i < m; ++i) positions[i] = static_cast<int>(common) + i;
    Visibility visible = Visibility::Explicit(m);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < (i < f ? i + 1 : m); ++j) visible.Allow(i, j);
    }
    outputs.clear();
    for (int s = 0; s < size; ++s) {
      if (undecoded[s]) outputs.push_back(f + s);
    }
    if (!kv_.Reserve(kDraftSeq, m)) {
      return fail(absl::ResourceExhaustedError(absl::StrCat(
          "drafter KV cache (", capacity_, " tokens) has no room for ", common + m, " tokens")));
    }
    Extend extend{.seq = kDraftSeq,
                  .tokens = extend_tokens,
                  .positions = positions,
                  .visible = visible,
                  .outputs = outputs};
    absl::StatusOr<std::vector<ExtendOutput>> out = model_->Forward({&extend, 1}, kv_);
    if (!out.ok()) return fail(out.status());
    ++stats_.forwards;
    stats_.fed_tokens += m;
    // Only the sequence tokens' causal KV is kept.
    keep.resize(f);
    for (int i = 0; i < f; ++i) keep[i] = i;
    if (absl::Status committed = kv_.Commit(kDraftSeq, keep); !committed.ok()) {
      return fail(committed);
    }
    cached_.insert(cached_.end(), feed.begin(), feed.end());
    common += f;
    feed = {};
    // The most confident undecoded slot is decoded at this draft step.
    int best_slot = -1;
    int32_t best_token = 0;
    float best_confidence = -1.0f;
    for (size_t r = 0; r < outputs.size(); ++r) {
      int32_t token = 0;
      const float confidence =
          SlotConfidence(LogitsRow((*out)[0], static_cast<int>(r), vocab), mask_token_, &token);
      if (best_slot < 0 || confidence > best_confidence) {
        best_confidence = confidence;
        best_slot = outputs[r] - f;
        best_token = token;
      }
    }
    state[best_slot] = best_token;
    undecoded[best_slot] = 0;
    draft.slots.push_back(best_slot);
    draft.tokens.push_back(best_token);
  }
  stats_.drafted += draft.size();
  return draft;
}

}  // namespace tandem
