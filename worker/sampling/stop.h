// Stop conditions over a streamed generation: stop tokens, stop strings and max tokens.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

enum class FinishReason { kNone, kStop, kLength, kCancelled };
std::string_view FinishReasonName(FinishReason reason);  // "", "stop", "length", "cancelled"

struct StopConditions {
  std::vector<int32_t> stop_token_ids;  // including the model's EOS ids
  std::vector<std::string> stop_strings;
  int max_tokens = 0;  // > 0
  // Stop tokens end the stream only after this many tokens, stop strings only once this many
  // tokens are out (vLLM's min_tokens; the sampler keeps stop tokens from being drawn before).
  int min_tokens = 0;
};

// Feeds committed tokens and their text deltas one token at a time. Text that could still be
// the start of a stop string is held back, so a stop string never reaches the client; the stop
// string itself is not emitted.
class StopChecker {
 public:
  explicit StopChecker(StopConditions conditions);

  struct Step {
    std::string text;  // text safe to emit now
    FinishReason finish = FinishReason::kNone;
  };
  // `token` is the next committed token, `text` its text delta. After a finishing step, further
  // calls are not allowed.
  Step Push(int32_t token, std::string_view text);
  // End of stream for another reason (e.g. cancellation): releases held-back text.
  std::string Flush();

  int tokens_seen() const { return tokens_seen_; }

 private:
  StopConditions conditions_;
  std::string held_;
  int tokens_seen_ = 0;
  bool finished_ = false;
};

}  // namespace tandem
