#include "worker/sampling/stop.h"

#include <algorithm>
#include <utility>

namespace tandem {

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
  }
  return "";
}

StopChecker::StopChecker(StopConditions conditions) : conditions_(std::move(conditions)) {
  // An empty stop string would match before any text; it cannot be meant.
  std::erase_if(conditions_.stop_strings, [](const std::string& s) { return s.empty(); });
}

// Invariant: no stop string occurs in held_, and every emitted byte is outside any possible
// future match. The second holds because the longest suffix of held_ that is a proper prefix of
// a stop string is always kept back: a match that later completes must start inside it (a
// suffix of the whole text that is a prefix of a stop string stays one when text is appended).
// Matching is byte-wise, so a stop string split inside a UTF-8 character across tokens is still
// found; since a stop string starts on a character boundary, so does every cut.
StopChecker::Step StopChecker::Push(int32_t token, std::string_view text) {
  Step step;
  if (finished_) return step;
  ++tokens_seen_;

  // A stop token ends the stream without its own text; what was held back is ordinary output.
  if (tokens_seen_ > conditions_.min_tokens &&
      std::find(conditions_.stop_token_ids.begin(), conditions_.stop_token_ids.end(), token) !=
          conditions_.stop_token_ids.end()) {
    step.text = std::exchange(held_, {});
    step.finish = FinishReason::kStop;
    finished_ = true;
    return step;
  }

  const size_t old_size = held_.size();
  held_.append(text);

  // Stop at the match that ends first, as a character-at-a-time reader would; among matches
  // ending at the same byte, the one starting first. This makes the result independent of how
  // the text is split into tokens. Any match must end in the new text.
  size_t match_start = std::string::npos;
  size_t match_end = std::string::npos;
  for (const std::string& stop : conditions_.stop_strings) {
    const size_t from = old_size >= stop.size() ? old_size - stop.size() + 1 : 0;
    const size_t start = held_.find(stop, from);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    if (end < match_end || (end == match_end && start < match_start)) {
      match_start = start;
      match_end = end;
    }
  }
  if (match_start != std::string::npos && tokens_seen_ >= conditions_.min_tokens) {
    held_.resize(match_start);
    step.text = std::exchange(held_, {});
    step.finish = FinishReason::kStop;
    finished_ = true;
    return step;
  }

  // The max_tokens-th token's text is part of the output; nothing is left to hold back for.
  if (conditions_.max_tokens > 0 && tokens_seen_ >= conditions_.max_tokens) {
    step.text = std::exchange(held_, {});
    step.finish = FinishReason::kLength;
    finished_ = true;
    return step;
  }

  size_t hold = 0;
  const std::string_view held_view = held_;
  for (const std::string& stop : conditions_.stop_strings) {
    const size_t longest = std::min(stop.size() - 1, held_view.size());
    for (size_t length = longest; length > hold; --length) {
      if (held_view.ends_with(std::string_view(stop).substr(0, length))) {
        hold = length;
        break;
      }
    }
  }
  step.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return step;
}

std::string StopChecker::Flush() {
  finished_ = true;
  return std::exchange(held_, {});
}

}  // namespace tandem
