// The engine's front door, on callers' threads: a request checked and built into a sequence
// (its decoding mode, stops and logit adjustments) and posted to the step loop's mailbox.
// Engine::Impl's members (worker/engine/engine_impl.h); the step loop is engine.cc.
#include <memory>
#include <span>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/decoding/modes.h"
#include "worker/engine/engine_impl.h"

namespace tandem {

namespace {

absl::Status CheckTokenIds(std::span<const int32_t> ids, int vocab, const char* what) {
  for (int32_t t : ids) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " has token id ", t, " outside the vocabulary of ", vocab));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DecodingMode>> Engine::Impl::MakeMode(const std::string& name,
                                                                     const SequenceRequest& request,
                                                                     EngineSequence* seq) const {
  const ModelConfig& config = model_->model->config();
  if (!UsesDrafter(name)) {
    ModeOptions options = request.mode_options;
    options.sampler_model = model_->sampler.get();
    return CreateMode(name, options, config, request.sampling);
  }
  const std::string address = request.drafter.empty() ? options_.default_drafter : request.drafter;
  if (!drafters_ || address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("mode ", name,
                     " needs a drafter: name one in the request or start the verifier with a "
                     "default drafter address"));
  }
  // The drafter session drafts past the sequence; for block drafts (simsd) the sequence ends at
  // the block start, since a block's tokens join the sequence when it is finished. A γ the
  // mode's layout fixes is not the engine's cost model's to choose.
  TANDEM_ASSIGN_OR_RETURN(DraftingNeeds needs, DraftingNeedsOf(name, request.mode_options, config));
  seq->spec = true;
  seq->drafter_address = address;
  seq->gamma = needs.gamma;
  seq->step_gamma = needs.gamma;
  seq->gamma_pinned = needs.fixed_gamma || request.spec_gamma_pinned || !options_.adaptive_gamma;
  seq->block_size = needs.block_size;
  auto drafter = std::make_unique<ChainDrafter>(&seq->chain);
  seq->drafter = drafter.get();
  return CreateModeWithDrafter(name, request.mode_options, config, std::move(drafter));
}

absl::StatusOr<uint64_t> Engine::Impl::Submit(SequenceRequest request,
                                              std::shared_ptr<SequenceSink> sink) {
  if (draining_.load()) {
    return absl::FailedPreconditionError("the engine is draining and admits no new requests");
  }
  if (sink == nullptr) return absl::InvalidArgumentError("request has no sink for its events");
  TANDEM_ASSIGN_OR_RETURN(SeqPtr seq, BuildSequence(request));
  TANDEM_RETURN_IF_ERROR(CheckSamplingParams(request.sampling));
  TANDEM_RETURN_IF_ERROR(CheckLogitAdjust(request.adjust, model_->model->config().vocab_size));
  if (request.adjust.min_tokens > request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("min_tokens ", request.adjust.min_tokens,
                                                   " exceeds max_tokens ", request.max_tokens));
  }
  std::string mode_name = request.mode;
  if (mode_name.empty() || mode_name == "auto") mode_name = options_.default_mode;
  // Every client-controlled size is bounded before a mode exists to plan with it.
  TANDEM_RETURN_IF_ERROR(CheckModeOptions(
      mode_name, request.mode_options, model_->model->config(),
      {.max_block = options_.max_mode_block, .max_step_tokens = options_.max_batch_tokens}));
  TANDEM_ASSIGN_OR_RETURN(seq->mode, MakeMode(mode_name, request, seq.get()));
  seq->mode_name = std::string(seq->mode->name());
  seq->lossless = seq->mode->lossless();
  if (request.logprobs) {
    if (request.top_logprobs < 0 || request.top_logprobs > kMaxTopLogprobs) {
      return absl::InvalidArgumentError(absl::StrCat(
          "top_logprobs must be within [0, ", kMaxTopLogprobs, "], got ", request.top_logprobs));
    }
    if (!seq->lossless) {
      return absl::InvalidArgumentError(
          absl::StrCat("logprobs are the target's AR log-probabilities, which mode ",
                       seq->mode_name, " (lossy) does not compute; ask for a lossless mode"));
    }
    seq->top_logprobs = request.top_logprobs;
  }
  // The prompt's rows are the target's AR rows in every mode: echo needs no lossless mode.
  seq->echo = request.echo;
  seq->sampling = request.sampling;
  TANDEM_RETURN_IF_ERROR(SetUpStops(*seq, request));
  seq->deadline = request.deadline;
  seq->sink = std::move(sink);
  return Enqueue(std::move(seq));
}

absl::StatusOr<std::shared_ptr<EngineSequence>> Engine::Impl::BuildSequence(
    const SequenceRequest& request) {
  const int inputs = static_cast<int>(!request.prompt.empty()) +
                     static_cast<int>(!request.chat.empty()) +
                     static_cast<int>(!request.prompt_ids.empty());
  if (inputs == 0) {
    return absl::InvalidArgumentError(
        "request has an empty prompt: set prompt, chat or prompt_ids");
  }
  if (inputs > 1) {
    return absl::InvalidArgumentError(
        "request has several inputs: set exactly one of prompt, chat and prompt_ids");
  }
  if (request.max_tokens < 0 || (request.max_tokens == 0 && !request.echo)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive (0 only with echo), got ", request.max_tokens));
  }
  auto seq = std::make_shared<EngineSequence>();
  if (!request.prompt_ids.empty()) {
    seq->tokens = request.prompt_ids;
  } else {
    std::string text = request.prompt;
    if (!request.chat.empty()) {
      TANDEM_ASSIGN_OR_RETURN(text, ApplyChat(*model_, request.chat, request.chat_tools));
    }
    TANDEM_ASSIGN_OR_RETURN(seq->tokens, model_->tokenizer->Encode(text));
    if (seq->tokens.empty()) return absl::InvalidArgumentError("prompt encodes to no tokens");
  }
  const int vocab = model_->model->config().vocab_size;
  TANDEM_RETURN_IF_ERROR(CheckTokenIds(seq->tokens, vocab, "prompt_ids"));
  TANDEM_RETURN_IF_ERROR(CheckTokenIds(request.committed, vocab, "committed"));
  TANDEM_RETURN_IF_ERROR(CheckTokenIds(request.stop_token_ids, vocab, "stop_token_ids"));
  seq->prompt_len = static_cast<int>(seq->tokens.size());
  const int committed = static_cast<int>(request.committed.size());
  const int used = seq->prompt_len + committed;
  if (used + 1 > context_) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", seq->prompt_len, " tokens",
                     committed > 0 ? absl::StrCat(" and ", committed, " committed ones") : "",
                     "; the context holds ", context_, ", leaving no room for a new token"));
  }
  if (committed > 0 && committed >= request.max_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("the request already has ", committed,
                                                   " committed tokens of max_tokens ",
                                                   request.max_tokens));
  }
  seq->max_new = std::min(request.max_tokens - committed, context_ - used);
  seq->synthetic = request.synthetic;
  seq->migrated = committed > 0;
  return seq;
}

absl::Status Engine::Impl::SetUpStops(EngineSequence& seq, const SequenceRequest& request) {
  StopConditions stop;
  if (!request.ignore_eos) stop.stop_token_ids = stop_tokens_;
  stop.stop_token_ids.insert(stop.stop_token_ids.end(), request.stop_token_ids.begin(),
                             request.stop_token_ids.end());
  stop.stop_strings = request.stop_strings;
  stop.max_tokens = static_cast<int>(request.committed.size()) + seq.max_new;
  stop.min_tokens = request.adjust.min_tokens;
  seq.adjust = request.adjust;
  seq.adjust.min_tokens_ban = stop.stop_token_ids;
  if (request.grammar.has_value()) {
    if (stop.stop_token_ids.empty()) {
      return absl::InvalidArgumentError(
          "structured output ends the completion with a stop token where the grammar is "
          "complete: with ignore_eos, name one in stop_token_ids");
    }
    // A complete JSON document allows only a stop token, which min_tokens may still forbid.
    if (request.adjust.min_tokens > 0) {
      return absl::InvalidArgumentError(
          "min_tokens cannot be combined with structured output (the grammar decides where the "
          "completion ends)");
    }
    TANDEM_ASSIGN_OR_RETURN(seq.adjust.grammar, Grammars().Compile(*request.grammar));
    seq.grammar = std::make_unique<GrammarCursor>(seq.adjust.grammar, stop.stop_token_ids);
    seq.constraint =
        std::make_unique<GrammarConstraint>(seq.grammar.get(), &seq.tokens, seq.prompt_len);
    seq.grammar_spec = request.grammar;
  }
  seq.checker = std::make_unique<StopChecker>(std::move(stop));
  seq.detok = std::make_unique<IncrementalDetokenizer>(*model_->tokenizer);
  // Migrated tokens continue the stop-string and UTF-8 state silently: they were streamed.
  for (int32_t token : request.committed) {
    seq.tokens.push_back(token);
    TANDEM_ASSIGN_OR_RETURN(std::string delta, seq.detok->Push({&token, 1}));
    if (seq.replay_finish == FinishReason::kNone) {
      seq.replay_finish = seq.checker->Push(token, delta).finish;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Engine::Impl::Enqueue(SeqPtr seq) {
  if (queued_.fetch_add(1) >= options_.max_queued) {
    queued_.fetch_sub(1);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the engine's queue is full (", options_.max_queued, " requests); retry later"));
  }
  seq->id = next_id_.fetch_add(1);
  seq->submitted = absl::Now();
  const uint64_t id = seq->id;
  if (!mailbox_->Post(engine_message::Submit{std::move(seq)})) {
    queued_.fetch_sub(1);
    return absl::FailedPreconditionError("the engine is shutting down");
  }
  return id;
}

}  // namespace tandem
