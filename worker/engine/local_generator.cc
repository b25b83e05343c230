#include "worker/engine/local_generator.h"

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/decoding/drafter.h"
#include "worker/decoding/runner.h"
#include "worker/template/chat_tools.h"

namespace tandem {

absl::StatusOr<LoadedModel> LoadModelDir(const std::string& dir, const DeviceOptions& device,
                                         const std::string& merge_lora) {
  LoadedModel loaded;
  loaded.dir = dir;
  TANDEM_ASSIGN_OR_RETURN(loaded.model, Transformer::Load(dir, device.cpu_weights, merge_lora));
  if (device.device != Device::kCpu) TANDEM_RETURN_IF_ERROR(loaded.model->UseDevice(device));
  TANDEM_ASSIGN_OR_RETURN(loaded.tokenizer, Tokenizer::FromFile(dir + "/tokenizer.json"));
  TANDEM_ASSIGN_OR_RETURN(loaded.chat_template, ChatTemplate::FromModelDir(dir));
  if (std::filesystem::exists(dir + "/sampler/config.json")) {
    TANDEM_ASSIGN_OR_RETURN(loaded.sampler,
                            DiffusionSampler::Load(dir + "/sampler", loaded.model->config()));
  }
  return loaded;
}

absl::StatusOr<std::string> ApplyChat(const LoadedModel& model, std::span<const ChatTurn> turns,
                                      std::string_view tools) {
  if (model.chat_template == nullptr) return ApplyChatMlWithTools(turns, tools);
  absl::StatusOr<std::string> text = model.chat_template->Apply(turns, true, tools);
  if (!text.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's chat template refused the conversation: ", text.status().message()));
  }
  return text;
}

absl::Status AttachLoraAdapter(LoadedModel& model, const std::string& dir) {
  TANDEM_ASSIGN_OR_RETURN(LoraAdapter adapter, LoadLoraAdapter(dir, model.model->config()));
  model.model->SetLoraAdapter(std::move(adapter));
  return absl::OkStatus();
}

namespace {

// The model's end-of-sequence tokens, the chat ends the tokenizer has, and the request's own.
StopConditions StopsOf(const ModelConfig& config, const Tokenizer& tokenizer,
                       const GenerateOptions& options, int max_tokens) {
  StopConditions stop;
  stop.stop_token_ids = config.eos_token_ids;
  for (const char* name : {"<|im_end|>", "<|endoftext|>"}) {
    if (auto id = tokenizer.TokenId(name)) stop.stop_token_ids.push_back(*id);
  }
  stop.stop_token_ids.insert(stop.stop_token_ids.end(), options.extra_stop_token_ids.begin(),
                             options.extra_stop_token_ids.end());
  stop.stop_strings = options.stop_strings;
  stop.max_tokens = max_tokens;
  return stop;
}

}  // namespace

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
  ModeOptions mode_options = options.mode_options;
  if (options.drafter != nullptr) mode_options.spec_drafter = options.drafter->model.get();
  mode_options.spec_dflash = options.dflash_drafter;
  mode_options.sampler_model = model_->sampler.get();
  TANDEM_ASSIGN_OR_RETURN(std::unique_ptr<DecodingMode> mode,
                          CreateMode(options.mode, mode_options, config, options.sampling));
  GenerateResult result;
  result.mode = std::string(mode->name());
  result.lossless = mode->lossless();
  std::string text = prompt;
  if (options.chat) {
    const ChatTurn turn{"user", prompt};
    TANDEM_ASSIGN_OR_RETURN(text, ApplyChat(*model_, {&turn, 1}));
  }
  TANDEM_ASSIGN_OR_RETURN(result.prompt_ids, tokenizer.Encode(text));
  const int prompt_len = static_cast<int>(result.prompt_ids.size());
  const int context = config.max_position_embeddings;
  if (prompt_len + 1 > context) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt has ", prompt_len, " tokens; the model's context is ", context));
  }
  const int max_tokens = std::min(options.max_tokens, context - prompt_len);

  const StopConditions stops = StopsOf(config, tokenizer, options, max_tokens);
  StopChecker checker(stops);
  IncrementalDetokenizer detok(tokenizer);

  absl::Status stream_status;
  FinishReason text_finish = FinishReason::kNone;
  auto emit = [&](const std::string& piece) {
    if (piece.empty()) return;
    result.text += piece;
    if (on_text) on_text(piece);
  };
  std::chrono::steady_clock::time_point start;  // set just before the run
  bool first_token = true;
  RunOptions run;
  run.max_tokens = max_tokens;
  run.sampling = options.sampling;
  run.adjust = options.adjust;
  run.adjust.min_tokens_ban = stops.stop_token_ids;  // what min_tokens holds back
  run.on_token = [&](int32_t token) {
    if (first_token) {
      first_token = false;
      result.first_token_seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    absl::StatusOr<std::string> delta = detok.Push({&token, 1});
    if (!delta.ok()) {
      stream_status = delta.status();
      return true;
    }
    StopChecker::Step step = checker.Push(token, *delta);
    emit(step.text);
    text_finish = step.finish;
    return step.finish != FinishReason::kNone;
  };
  // Modes may overshoot the context by a few drafts; the cache holds them all.
  KvCache kv(model_->model->KvOptions(prompt_len + max_tokens + 256));
  start = std::chrono::steady_clock::now();
  TANDEM_ASSIGN_OR_RETURN(RunStats stats,
                          RunSequence(*model_->model, kv, 0, *mode, result.prompt_ids, run));
  TANDEM_RETURN_IF_ERROR(stream_status);
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.tokens = std::move(stats.tokens);
  result.forwards = stats.forwards;
  result.drafted = stats.drafted;
  result.accepted = stats.accepted;
  result.steps_with_drafts = stats.steps_with_drafts;
  if (const DrafterStats* drafter = mode->drafter_stats()) {
    result.drafter_forwards = static_cast<int>(drafter->forwards);
  }
  result.finish = text_finish != FinishReason::kNone ? text_finish : stats.finish;
  if (result.finish != FinishReason::kStop) {
    // Text held back for a possible stop string, and a character cut by the length limit.
    emit(checker.Flush());
    emit(detok.Flush());
  }
  return result;
}

}  // namespace tandem
