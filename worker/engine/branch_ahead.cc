#include "worker/engine/branch_ahead.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

namespace tandem {

DraftAlternative TopTwo(std::span<const float> logits) {
  DraftAlternative alt;
  int32_t first = -1;
  float top = -std::numeric_limits<float>::infinity();
  float runner_up = top;
  for (size_t i = 0; i < logits.size(); ++i) {
    const float x = logits[i];
    if (x > top) {
      runner_up = top;
      alt.second = first;
      top = x;
      first = static_cast<int32_t>(i);
    } else if (x > runner_up) {
      runner_up = x;
      alt.second = static_cast<int32_t>(i);
    }
  }
  if (first < 0) return {};
  double sum = 0;
  for (const float x : logits) {
    if (x > -std::numeric_limits<float>::infinity()) sum += std::exp(static_cast<double>(x - top));
  }
  alt.p1 = static_cast<float>(1.0 / sum);
  alt.p2 = alt.second >= 0
               ? static_cast<float>(std::exp(static_cast<double>(runner_up - top)) / sum)
               : 0.0f;
  return alt;
}

std::vector<int> LikelyRejections(std::span<const DraftAlternative> alternatives, int gamma,
                                  int branches) {
  std::vector<std::pair<double, int>> scored;
  double reach = 1.0;  // the probability that drafts 1..j are all accepted
  const int n = std::min(gamma, static_cast<int>(alternatives.size()));
  for (int j = 0; j < n; ++j) {
    const DraftAlternative& a = alternatives[static_cast<size_t>(j)];
    const double score = reach * a.p2;
    if (a.second >= 0 && score > 0) scored.emplace_back(score, j);
    reach *= a.p1;
  }
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<int> outcomes;
  for (size_t i = 0; i < scored.size() && static_cast<int>(i) < branches; ++i) {
    outcomes.push_back(scored[i].second);
  }
  return outcomes;
}

}  // namespace tandem
