#include "worker/decoding/runner.h"

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/decoding/logit_adjust_step.h"

namespace tandem {

absl::StatusOr<RunStats> RunSequence(Transformer& model, KvCache& kv, SeqId seq, DecodingMode& mode,
                                     std::span<const int32_t> prompt, const RunOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (options.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive, got ", options.max_tokens));
  }
  TANDEM_RETURN_IF_ERROR(CheckLogitAdjust(options.adjust, model.config().vocab_size));
  TANDEM_RETURN_IF_ERROR(kv.AddSequence(seq));
  absl::Cleanup remove = [&] { kv.RemoveSequence(seq); };

  RunStats stats;
  std::vector<int32_t> tokens(prompt.begin(), prompt.end());
  int kv_len = 0;
  const bool adjusted = options.adjust.active();
  TokenHistory history;
  std::unique_ptr<GrammarCursor> grammar;
  if (options.adjust.grammar != nullptr) {
    grammar =
        std::make_unique<GrammarCursor>(options.adjust.grammar, options.adjust.min_tokens_ban);
  }
  while (true) {
    if (options.cancelled && options.cancelled()) {
      stats.finish = FinishReason::kCancelled;
      break;
    }
    DecodeState state{.tokens = tokens,
                      .prompt_len = static_cast<int>(prompt.size()),
                      .kv_len = kv_len,
                      .budget = options.max_tokens - static_cast<int>(stats.tokens.size()),
                      .sampling = &options.sampling};
    StepPlan plan = mode.Plan(state);
    if (adjusted) ReturnLogits(&plan);
    const int n = static_cast<int>(plan.tokens.size());
    if (!kv.Reserve(seq, n)) {
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache has no room for ", n, " more tokens of sequence ", seq));
    }
    Extend extend{.seq = seq,
                  .tokens = plan.tokens,
                  .positions = plan.positions,
                  .visible = plan.visible,
                  .outputs = plan.outputs,
                  .lora_gate = plan.lora_gate,
                  .hidden_layers = plan.hidden_layers,
                  .samples = plan.samples,
                  .return_logits = plan.return_logits};
    TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out, model.Forward({&extend, 1}, kv));
    ++stats.forwards;
    if (adjusted) {
      TANDEM_RETURN_IF_ERROR(AdjustStepLogits(options.adjust, state, plan,
                                              model.config().vocab_size, &history, grammar.get(),
                                              &out[0]));
    }
    TANDEM_ASSIGN_OR_RETURN(StepResult result, mode.Consume(state, plan, out[0]));
    TANDEM_RETURN_IF_ERROR(CheckStep(state, plan, result, mode.name()));
    TANDEM_RETURN_IF_ERROR(kv.Commit(seq, result.keep));
    kv_len += static_cast<int>(result.keep.size());
    if (result.drafted > 0) ++stats.steps_with_drafts;
    stats.drafted += result.drafted;
    stats.accepted += result.accepted;
    for (int32_t token : result.append) {
      tokens.push_back(token);
      stats.tokens.push_back(token);
      if (options.on_token && options.on_token(token)) {
        stats.finish = FinishReason::kStop;
        break;
      }
      if (static_cast<int>(stats.tokens.size()) >= options.max_tokens) {
        stats.finish = FinishReason::kLength;
        break;
      }
    }
    if (stats.finish != FinishReason::kNone) break;
  }
  return stats;
}

}  // namespace tandem
