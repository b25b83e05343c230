#include "worker/engine/local_generator.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem {

namespace {

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

constexpr SeqId kSeq = 0;

}  // namespace

absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir) {
  LoadedModel loaded;
  loaded.dir = dir;
  TANDEM_ASSIGN_OR_RETURN(loaded.model, Transformer::Load(dir));
  TANDEM_ASSIGN_OR_RETURN(loaded.tokenizer, Tokenizer::FromFile(dir + "/tokenizer.json"));
  return loaded;
}

LocalGenerator::LocalGenerator(LoadedModel* model) : model_(model) {}

absl::StatusOr<GenerateResult> LocalGenerator::Generate(const std::string& prompt,
                                                        const GenerateOptions& options,
                                                        const TextSink& on_text) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt is empty");
  if (options.max_tokens <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive, got ", options.max_tokens));
  }
  const ModelConfig& config = model_->model->config();
  const Tokenizer& tokenizer = *model_->tokenizer;
  GenerateResult result;
  std::string text = prompt;
  if (options.chat) {
    const ChatTurn turn{"user", prompt};
    text = ApplyChatMl({&turn, 1});
  }
  TANDEM_ASSIGN_OR_RETURN(result.prompt_ids, tokenizer.Encode(text));
  const int prompt_len = static_cast<int>(result.prompt_ids.size());
  const int context = config.max_position_embeddings;
  if (prompt_len + 1 > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_len, " tokens; the model's context is ", context));
  }
  const int max_tokens = std::min(options.max_tokens, context - prompt_len);

  StopConditions stop;
  stop.stop_token_ids = config.eos_token_ids;
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tokenizer.TokenId(name)) stop.stop_token_ids.push_back(*id);
  }
  stop.stop_token_ids.insert(stop.stop_token_ids.end(), options.extra_stop_token_ids.begin(),
                             options.extra_stop_token_ids.end());
  stop.stop_strings = options.stop_strings;
  stop.max_tokens = max_tokens;
  StopChecker checker(std::move(stop));
  IncrementalDetokenizer detok(tokenizer);

  KvCache kv(model_->model->KvOptions(prompt_len + max_tokens));
  TANDEM_RETURN_IF_ERROR(kv.AddSequence(kSeq));
  std::vector<int32_t> tokens = result.prompt_ids;
  std::vector<int32_t> positions(tokens.size());
  for (int i = 0; i < prompt_len; ++i) positions[i] = i;
  auto start = std::chrono::steady_clock::now();
  while (true) {
    const int n = static_cast<int>(tokens.size());
    if (!kv.Reserve(kSeq, n)) return absl::InternalError("KV cache sized for the request is full");
    const std::vector<int32_t> outputs = {n - 1};
    Extend extend{.seq = kSeq, .tokens = tokens, .positions = positions, .outputs = outputs};
    TANDEM_ASSIGN_OR_RETURN(std::vector<ExtendOutput> out,
                            model_->model->Forward({&extend, 1}, kv));
    ++result.forwards;
    std::vector<int32_t> keep(n);
    for (int i = 0; i < n; ++i) keep[i] = i;
    TANDEM_RETURN_IF_ERROR(kv.Commit(kSeq, keep));
    if (result.forwards == 1) {
      result.prefill_seconds = Seconds(start);
      start = std::chrono::steady_clock::now();
    }
    const int position = kv.CommittedLength(kSeq);
    const int32_t token = SampleToken(out[0].logits, options.sampling, position);
    result.tokens.push_back(token);
    TANDEM_ASSIGN_OR_RETURN(std::string delta, detok.Push({&token, 1}));
    StopChecker::Step step = checker.Push(token, delta);
    if (!step.text.empty()) {
      result.text += step.text;
      if (on_text) on_text(step.text);
    }
    if (step.finish != FinishReason::kNone) {
      result.finish = step.finish;
      // A length cut can fall inside a UTF-8 character; show what is left of it.
      if (step.finish == FinishReason::kLength) {
        const std::string tail = detok.Flush();
        result.text += tail;
        if (on_text && !tail.empty()) on_text(tail);
      }
      break;
    }
    tokens = {token};
    positions = {position};
  }
  result.decode_seconds = Seconds(start);
  return result;
}

}  // namespace tandem
