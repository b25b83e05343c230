#include "worker/decoding/drafter.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/sampling/sampling.h"

namespace tandem {

namespace {

constexpr SeqId kDraftSeq = 0;

}  // namespace

absl::StatusOr<BlockDraft> Drafter::DraftBlock(std::span<const int32_t> tokens,
                                               std::span<const int32_t> block, int gamma) {
  const int size = static_cast<int>(block.size());
  int prefix = 0;
  while (prefix < size && block[prefix] != kUndecodedSlot) ++prefix;
  BlockDraft draft;
  for (int s = prefix; s < size; ++s) {
    if (block[s] != kUndecodedSlot) return draft;  // not a prefix: nothing left to right
  }
  gamma = std::min(gamma, size - prefix);
  if (gamma <= 0) return draft;
  std::vector<int32_t> context(tokens.begin(), tokens.end());
  context.insert(context.end(), block.begin(), block.begin() + prefix);
  TANDEM_ASSIGN_OR_RETURN(std::vector<int32_t> drafts, Draft(context, gamma));
  if (static_cast<int>(drafts.size()) > gamma) drafts.resize(gamma);
  for (size_t r = 0; r < drafts.size(); ++r) draft.slots.push_back(prefix + static_cast<int>(r));
  draft.tokens = std::move(drafts);
  return draft;
}

InProcessArDrafter::InProcessArDrafter(Transformer* model, int capacity)
    : model_(model), capacity_(capacity), kv_(model->KvOptions(capacity)) {
  // A fresh cache always has room for its one sequence.
  (void)kv_.AddSequence(kDraftSeq);
}

absl::StatusOr<int32_t> InProcessArDrafter::Feed(std::span<const int32_t> tokens) {
  const int n = static_cast<int>(tokens.size());
  const int start = static_cast<int>(cached_.size());
  if (!kv_.Reserve(kDraftSeq, n)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "drafter KV cache (", capacity_, " tokens) has no room for ", start + n, " tokens"));
  }
  std::vector<int32_t> positions(n);
  for (int i = 0; i < n; ++i) positions[i] = start + i;
  const int32_t last = n - 1;
  Extend extend{.seq = kDraftSeq,
                .tokens = tokens,
                .positions = positions,
                .visible = Visibility::Causal(),
                .outputs = {&last, 1}};
  TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out, model_->Forward({&extend, 1}, kv_));
  ++stats_.forwards;
  stats_.fed_tokens += n;
  std::vector<int32_t> keep(n);
  for (int i = 0; i < n; ++i) keep[i] = i;
  TANDEM_RETURN_IF_ERROR(kv_.Commit(kDraftSeq, keep));
  cached_.insert(cached_.end(), tokens.begin(), tokens.end());
  return Argmax(out[0].logits);
}

absl::StatusOr<std::vector<int32_t>> InProcessArDrafter::Draft(std::span<const int32_t> tokens,
                                                               int gamma) {
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
  // Draft j (0-based) comes from the forward over position n - 1 + j, and the cache then holds
  // n + j tokens: both must stay within their limits.
  int limit = capacity_ - n + 1;
  const int context = model_->config().max_position_embeddings;
  if (context > 0) limit = std::min(limit, context - n + 1);
  gamma = std::min(gamma, limit);
  std::vector<int32_t> drafts;
  if (gamma <= 0) return drafts;

  // Keep the longest cached prefix of `tokens`, but at least one token must be fed to get the
  // logits after the last one.
  size_t common = 0;
  while (common < cached_.size() && common < tokens.size() && cached_[common] == tokens[common]) {
    ++common;
  }
  common = std::min(common, tokens.size() - 1);
  if (common < cached_.size()) {
    TANDEM_RETURN_IF_ERROR(kv_.Truncate(kDraftSeq, static_cast<int>(common)));
    cached_.resize(common);
  }
  stats_.reused_tokens += static_cast<int64_t>(common);

  std::span<const int32_t> feed = tokens.subspan(common);
  int32_t next = 0;
  for (int j = 0; j < gamma; ++j) {
    absl::StatusOr<int32_t> token = Feed(feed);
    if (!token.ok()) {
      // The cache may be out of step with cached_ now; start over next call.
      (void)kv_.Truncate(kDraftSeq, 0);
      cached_.clear();
      return token.status();
    }
    next = *token;
    drafts.push_back(next);
    feed = {&next, 1};
  }
  stats_.drafted += static_cast<int64_t>(drafts.size());
  return drafts;
}

}  // namespace tandem
