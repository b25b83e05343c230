// Branch-ahead drafting (DraftEngineOptions::branches): which partial acceptances of a draft
// chain a drafter pre-drafts for while the verifier verifies it, from the drafter's own
// distribution.
//
// A verifier that checks the chain's first γ drafts d1..dγ accepts some prefix d1..dj and then
// puts its own token at position j + 1 (a correction when j < γ). When j = γ the chain already
// goes on past the bonus position (its lookahead); when j < γ the drafter has nothing ready and
// the verifier waits a drafter round trip. Branch-ahead drafts, for the likeliest j < γ, the
// continuation after d1..dj and the drafter's own second choice at j + 1 (the likeliest
// correction when dj+1 is refused), so such a step finds its next draft ready.
//
// Outcome j is scored from the drafter's probabilities as if they were the target's:
//   P(j) = p1(d1) ... p1(dj) * p2(j + 1)
// where p1 is the drafted token's probability and p2 the second choice's at that position.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace tandem {

// A drafted position's greedy token's probability and its runner-up.
struct DraftAlternative {
  float p1 = 0;         // probability of the drafted (top-1) token
  int32_t second = -1;  // the second most likely token (-1: unknown)
  float p2 = 0;         // its probability
};

// The top-1 probability and the runner-up of a row of logits (softmax; -inf entries, such as a
// grammar's masked tokens, have probability 0).
DraftAlternative TopTwo(std::span<const float> logits);

// The outcomes j (0-based: the first j drafts accepted, the runner-up at draft j) to pre-draft,
// likeliest first: at most `branches` of the first `gamma` positions of `alternatives` (the
// chain's drafts, in order), those with a known runner-up and a score above zero.
std::vector<int> LikelyRejections(std::span<const DraftAlternative> alternatives, int gamma,
                                  int branches);

}  // namespace tandem
