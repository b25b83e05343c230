// DraftEngine: branch-ahead drafting (DraftEngineOptions::branches; worker/engine/branch_ahead.h).
#include <algorithm>
#include <span>
#include <vector>

#include "worker/engine/draft_engine_loop.h"

namespace tandem {

// Branch-ahead: each chain at its lookahead (a fully accepted step finds its next drafts) that
// was not branched since its last Open/Advance gets branch sessions for its likeliest partial
// acceptances (LikelyRejections): the accepted drafts and the runner-up at the first refused
// one, drafted γ tokens on beside the other chains' drafting. Drafting them sooner measured
// worse: the lookahead a full acceptance needs then came late.
void DraftEngine::Loop::SpawnBranches() {
  for (auto& [key, s] : sessions_) {
    // Not under a grammar: a branch's correction is drafted without one.
    if (s.branched || s.block_size > 0 || s.grammar != nullptr || NeedsWork(s) ||
        s.chain_len() < s.gamma || s.alternatives.size() != s.tokens.size()) {
      continue;
    }
    s.branched = true;
    const std::span<const DraftAlternative> drafts =
        std::span<const DraftAlternative>(s.alternatives).subspan(s.final_len);
    for (int j : LikelyRejections(drafts, s.gamma, options_.branches)) {
      const int at = s.final_len + j;  // the refused draft's index
      Session& b = branches_[{s.stream, s.id, j}];
      b.stream = s.stream;
      b.id = s.id;
      b.gamma = s.gamma;
      b.is_branch = true;
      b.branch_from = s.final_len;
      b.tokens.assign(s.tokens.begin(), s.tokens.begin() + at);
      b.tokens.push_back(s.alternatives[at].second);
      b.final_len = static_cast<int>(b.tokens.size());
    }
  }
}

// Sends a branch to the verifier beside its parent's chain; the parent notes its path for hit
// counting.
void DraftEngine::Loop::SendBranch(Session& b) {
  auto parent = sessions_.find({b.stream, b.id});
  if (parent == sessions_.end() || parent->second.final_len != b.branch_from) return;
  parent->second.branch_paths.emplace_back(b.tokens.begin() + b.branch_from,
                                           b.tokens.begin() + b.final_len);
  ++stats_.branches;
  Send(b.stream,
       DraftChain{.session = b.id,
                  .from = b.branch_from,
                  .tokens = std::vector<int32_t>(b.tokens.begin() + b.branch_from, b.tokens.end()),
                  .branch = true});
}

void DraftEngine::Loop::DropBranches(uint64_t stream, uint64_t session) {
  auto it = branches_.lower_bound({stream, session, 0});
  while (it != branches_.end() && std::get<0>(it->first) == stream &&
         std::get<1>(it->first) == session) {
    if (it->second.resident) kv_.RemoveSequence(it->second.seq);
    it = branches_.erase(it);
  }
}

// An advance whose tokens took the path of a branch sent for this chain: the verifier had its
// next drafts ready.
void DraftEngine::Loop::CountBranchHit(Session& s, std::span<const int32_t> append) {
  for (const std::vector<int32_t>& path : s.branch_paths) {
    if (append.size() >= path.size() && std::equal(path.begin(), path.end(), append.begin())) {
      ++stats_.branch_hits;
      break;
    }
  }
  s.branch_paths.clear();
  s.branched = false;
}

}  // namespace tandem
