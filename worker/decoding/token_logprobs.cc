#include "worker/decoding/token_logprobs.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// log(sum(exp(row))), NaN entries left out; -inf for a row with no finite entry.
double LogSumExp(std::span<const float> row) {
  float max = -std::numeric_limits<float>::infinity();
  for (float x : row) {
    if (x > max) max = x;
  }
  if (!std::isfinite(max)) return max;
  double sum = 0;
  for (float x : row) {
    if (x > -std::numeric_limits<float>::infinity()) sum += std::exp(static_cast<double>(x) - max);
  }
  return max + std::log(sum);
}

}  // namespace

TokenLogprob RowLogprob(std::span<const float> row, int32_t token, int top) {
  const double lse = LogSumExp(row);
  const auto logprob = [&](int32_t id) {
    return static_cast<float>(static_cast<double>(row[static_cast<size_t>(id)]) - lse);
  };
  TokenLogprob out{.token = token, .logprob = logprob(token)};
  if (top > 0) {
    std::vector<int32_t> ids(row.size());
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    const auto first = [&](int32_t a, int32_t b) {
      const float x = row[static_cast<size_t>(a)];
      const float y = row[static_cast<size_t>(b)];
      return x > y || (x == y && a < b) || (std::isnan(y) && !std::isnan(x));
    };
    const size_t k = std::min(static_cast<size_t>(top), ids.size());
    std::partial_sort(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids.end(), first);
    for (size_t i = 0; i < k; ++i) out.top.emplace_back(ids[i], logprob(ids[i]));
  }
  return out;
}

absl::StatusOr<std::vector<TokenLogprob>> StepLogprobs(const DecodeState& state,
                                                       const StepPlan& plan,
                                                       const ExtendOutput& out, int vocab_size,
                                                       std::span<const int32_t> append, int top) {
  const size_t rows = plan.outputs.size();
  if (out.logits.size() != rows * static_cast<size_t>(vocab_size)) {
    return absl::InternalError("logprobs: the step returned no logits for its output rows");
  }
  const int length = static_cast<int>(state.tokens.size());
  const int end = length + static_cast<int>(append.size());
  // The sequence's final token at `position`, -1 past what is known.
  const auto final_token = [&](int position) -> int32_t {
    if (position < 0 || position >= end) return -1;
    return position < length ? state.tokens[static_cast<size_t>(position)]
                             : append[static_cast<size_t>(position - length)];
  };
  // Whether plan token i's row was computed in the final context of position positions[i] + 1:
  // everything it attends to lies at or before its position and is the final token there.
  const auto in_final_context = [&](int i) {
    const int position = plan.positions[static_cast<size_t>(i)];
    for (size_t j = 0; j < plan.tokens.size(); ++j) {
      if (!plan.visible.Sees(i, static_cast<int>(j))) continue;
      const int p = plan.positions[j];
      if (p > position || plan.tokens[j] != final_token(p)) return false;
    }
    return true;
  };
  std::vector<TokenLogprob> logprobs;
  logprobs.reserve(append.size());
  for (size_t k = 0; k < append.size(); ++k) {
    const int previous = length + static_cast<int>(k) - 1;
    int found = -1;
    for (size_t r = 0; r < rows && found < 0; ++r) {
      const int i = plan.outputs[r];
      if (plan.positions[static_cast<size_t>(i)] == previous && in_final_context(i)) {
        found = static_cast<int>(r);
      }
    }
    if (found < 0) {
      return absl::InternalError(absl::StrCat(
          "logprobs: no output row of the step holds the context of token ", previous + 1,
          " (a mode whose tokens do not come from the target's AR "
          "rows has no logprobs)"));
    }
    const std::span<const float> row = LogitsRow(out, found, vocab_size);
    logprobs.push_back(RowLogprob(row, append[k], top));
  }
  return logprobs;
}

}  // namespace tandem
