#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "kernels/cpu/gemm.h"
#include "nlohmann/json.hpp"
#include "services/cli/commands.h"
#include "services/cli/locate.h"
#include "services/common/server.h"
#include "tandem/v1/generate.grpc.pb.h"
#include "worker/engine/local_generator.h"
#include "worker/model/device.h"
#include "worker/model/dflash.h"

namespace tandem::cli {

namespace {

struct GenerateArgs {
  std::string server;  // a router's host:port: generate there instead of in-process
  ClientFlags tls;
  bool mode_set = false;  // --mode was given (a server otherwise picks its own)
  bool seed_set = false;
  std::string model_dir;
  std::string drafter_dir;  // spec: the drafter model; may equal model_dir
  std::string lora_dir;     // isd, self_spec(_quadratic): LoRA adapter on the draft positions
  std::string merge_lora;   // PEFT adapter merged into the model's weights (every row)
  std::string prompt;
  std::string mode = "ar";
  ModeOptions mode_options;
  int max_tokens = 128;
  float temperature = 0.0f;
  int top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  uint64_t seed = 0;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  std::vector<std::string> stop;
  bool chat = false;
  bool json = false;
  int threads = 0;
  std::string device = "cpu";
  bool cuda_graphs = true;
  std::string cpu_weights = "f32";
};

int RunGenerate(const GenerateArgs& args) {
  kernels::cpu::SetBlasThreads(args.threads);
  absl::StatusOr<DeviceOptions> device =
      ResolveDevice(args.device, args.cuda_graphs, args.cpu_weights);
  if (!device.ok()) {
    std::fprintf(stderr, "tandem generate: --device: %s\n",
                 std::string(device.status().message()).c_str());
    return 1;
  }
  auto loaded = LoadModelDir(args.model_dir, *device, args.merge_lora);
  if (!loaded.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", loaded.status().ToString().c_str());
    return 1;
  }
  if (!args.lora_dir.empty()) {
    if (absl::Status attached = AttachLoraAdapter(*loaded, args.lora_dir); !attached.ok()) {
      std::fprintf(stderr, "tandem generate: --lora: %s\n", attached.ToString().c_str());
      return 1;
    }
  }
  GenerateOptions options;
  // spec and simsd without --drafter draft with DefaultDrafterDir (the bundled tandem-drafter
  // next to the target). Drafting with the target itself shares its weights (the drafter keeps
  // its own KV cache).
  const std::string drafter_dir =
      args.drafter_dir.empty() && (args.mode == "spec" || args.mode == "simsd")
          ? DefaultDrafterDir(args.model_dir)
          : args.drafter_dir;
  absl::StatusOr<LoadedModel> drafter;
  std::unique_ptr<DFlashModel> dflash;
  if (!drafter_dir.empty() && IsDFlashCheckpoint(drafter_dir)) {
    // A DFlash drafter drafts from the target's hidden states, with its embeddings and head.
    if (args.mode == "simsd") {
      std::fprintf(stderr, "tandem generate: a DFlash drafter (%s) works with --mode spec only\n",
                   drafter_dir.c_str());
      return 1;
    }
    absl::StatusOr<std::unique_ptr<DFlashModel>> made =
        DFlashModel::Load(drafter_dir, loaded->model.get());
    if (!made.ok()) {
      std::fprintf(stderr, "tandem generate: drafter: %s\n", made.status().ToString().c_str());
      return 1;
    }
    dflash = std::move(*made);
    options.dflash_drafter = dflash.get();
  } else if (!drafter_dir.empty() && drafter_dir != args.model_dir) {
    drafter = LoadModelDir(drafter_dir, *device);
    if (!drafter.ok()) {
      std::fprintf(stderr, "tandem generate: drafter: %s\n", drafter.status().ToString().c_str());
      return 1;
    }
    options.drafter = &*drafter;
  } else if (!drafter_dir.empty()) {
    options.drafter = &*loaded;
  }
  options.mode = args.mode;
  options.mode_options = args.mode_options;
  options.max_tokens = args.max_tokens;
  options.sampling = {.temperature = args.temperature,
                      .top_k = args.top_k,
                      .top_p = args.top_p,
                      .min_p = args.min_p,
                      .seed = args.seed};
  options.adjust.presence_penalty = args.presence_penalty;
  options.adjust.frequency_penalty = args.frequency_penalty;
  options.adjust.repetition_penalty = args.repetition_penalty;
  options.stop_strings = args.stop;
  options.chat = args.chat;
  LocalGenerator generator(&*loaded);
  auto stream = [&](std::string_view text) {
    if (args.json) return;
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  };
  auto result = generator.Generate(args.prompt, options, stream);
  if (!result.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", result.status().ToString().c_str());
    return 1;
  }
  const double seconds = result->seconds;
  const int n = static_cast<int>(result->tokens.size());
  // Decode: the tokens after the first over their time (the first comes with the prompt's forward).
  const double decode_seconds = seconds - result->first_token_seconds;
  const double decode_rate = n > 1 && decode_seconds > 0 ? (n - 1) / decode_seconds : 0.0;
  if (args.json) {
    nlohmann::json j = {
        {"text", result->text},
        {"tokens", result->tokens},
        {"prompt_tokens", result->prompt_ids.size()},
        {"completion_tokens", n},
        {"finish_reason", FinishReasonName(result->finish)},
        {"mode", result->mode},
        {"lossless", result->lossless},
        {"forwards", result->forwards},
        {"drafted_tokens", result->drafted},
        {"accepted_tokens", result->accepted},
        {"acceptance_rate",
         result->drafted > 0 ? static_cast<double>(result->accepted) / result->drafted : 0.0},
        {"drafter_forwards", result->drafter_forwards},
        {"tokens_per_forward",
         result->forwards > 0 ? static_cast<double>(n) / result->forwards : 0.0},
        {"seconds", seconds},
        {"tokens_per_second", seconds > 0 ? n / seconds : 0.0},
        {"first_token_seconds", result->first_token_seconds},
        {"decode_tokens_per_second", decode_rate},
    };
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    if (result->drafted > 0) {
      std::fprintf(stderr, "[drafts: %d of %d accepted (%.1f%%), %d drafter forwards]\n",
                   result->accepted, result->drafted, 100.0 * result->accepted / result->drafted,
                   result->drafter_forwards);
    }
    std::fprintf(stderr,
                 "[mode %s%s: %d prompt tokens, %d tokens (%s), %d forwards, %.2f tokens/forward, "
                 "%.1f tokens/s, first token %.1f ms, decode %.1f tokens/s]\n",
                 result->mode.c_str(), result->lossless ? "" : " (lossy)",
                 static_cast<int>(result->prompt_ids.size()), n,
                 std::string(FinishReasonName(result->finish)).c_str(), result->forwards,
                 result->forwards > 0 ? static_cast<double>(n) / result->forwards : 0.0,
                 seconds > 0 ? n / seconds : 0.0, result->first_token_seconds * 1e3, decode_rate);
  }
  return 0;
}

// Generates through a router's tandem.v1.Generation service. Blocking is fine here: this is a
// command-line client, not a service.
int RunRemoteGenerate(const GenerateArgs& args) {
  auto channel = MakeChannel(args.server, args.tls);
  if (!channel.ok()) {
    std::fprintf(stderr, "tandem generate: %s\n", channel.status().ToString().c_str());
    return 1;
  }
  auto stub = v1::Generation::NewStub(*channel);
  v1::GenerateRequest request;
  if (args.chat) {
    v1::ChatMessage* turn = request.mutable_chat()->add_messages();
    turn->set_role("user");
    turn->set_content(args.prompt);
  } else {
    request.set_prompt(args.prompt);
  }
  request.set_model(args.model_dir);
  request.set_mode(args.mode_set ? args.mode : "auto");
  request.set_max_tokens(args.max_tokens);
  v1::SamplingParams* sampling = request.mutable_sampling();
  sampling->set_temperature(args.temperature);
  sampling->set_top_k(args.top_k);
  sampling->set_top_p(args.top_p);
  sampling->set_min_p(args.min_p);
  if (args.seed_set) sampling->set_seed(args.seed);
  sampling->set_presence_penalty(args.presence_penalty);
  sampling->set_frequency_penalty(args.frequency_penalty);
  sampling->set_repetition_penalty(args.repetition_penalty);
  for (const std::string& stop : args.stop) request.add_stop(stop);

  const absl::Time start = absl::Now();
  grpc::ClientContext context;
  auto reader = stub->Generate(&context, request);
  v1::GenerateResponse chunk;
  std::string text;
  std::vector<int32_t> tokens;
  v1::GenerateResponse last;
  while (reader->Read(&chunk)) {
    text += chunk.text();
    tokens.insert(tokens.end(), chunk.token_ids().begin(), chunk.token_ids().end());
    if (!args.json) {
      std::fwrite(chunk.text().data(), 1, chunk.text().size(), stdout);
      std::fflush(stdout);
    }
    if (!chunk.finish_reason().empty()) last = chunk;
  }
  const grpc::Status status = reader->Finish();
  if (!status.ok()) {
    if (!args.json && !text.empty()) std::printf("\n");
    std::fprintf(
        stderr, "tandem generate: %s: %s: %s\n", args.server.c_str(),
        absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code())).c_str(),
        status.error_message().c_str());
    return 1;
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const v1::Usage& usage = last.usage();
  const int n = static_cast<int>(tokens.size());
  const int forwards = usage.target_forwards();
  if (args.json) {
    nlohmann::json j = {
        {"text", text},
        {"tokens", tokens},
        {"prompt_tokens", usage.prompt_tokens()},
        {"completion_tokens", usage.completion_tokens()},
        {"finish_reason", last.finish_reason()},
        {"mode", last.mode()},
        {"lossless", !last.lossy()},
        {"forwards", forwards},
        {"drafted_tokens", usage.draft_tokens()},
        {"accepted_tokens", usage.accepted_tokens()},
        {"acceptance_rate",
         usage.draft_tokens() > 0
             ? static_cast<double>(usage.accepted_tokens()) / usage.draft_tokens()
             : 0.0},
        {"tokens_per_forward", forwards > 0 ? static_cast<double>(n) / forwards : 0.0},
        {"queue_seconds", last.timings().queue_seconds()},
        {"time_to_first_token_seconds", last.timings().time_to_first_token_seconds()},
        {"seconds", seconds},
        {"tokens_per_second", seconds > 0 ? n / seconds : 0.0},
        {"server", args.server},
    };
    std::printf("%s\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::printf("\n");
    std::fflush(stdout);  // the completion before the summary on a shared terminal or pipe
    std::fprintf(stderr,
                 "[%s, mode %s%s: %d prompt tokens, %d tokens (%s), %d forwards, %.2f "
                 "tokens/forward, %.1f tokens/s]\n",
                 args.server.c_str(), last.mode().c_str(), last.lossy() ? " (lossy)" : "",
                 usage.prompt_tokens(), n, last.finish_reason().c_str(), forwards,
                 forwards > 0 ? static_cast<double>(n) / forwards : 0.0,
                 seconds > 0 ? n / seconds : 0.0);
  }
  return 0;
}

}  // namespace

void RegisterGenerate(CLI::App& app, int* exit_code) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand(
      "generate",
      "Generate text, streaming it to stdout: in-process from a model directory (--model: "
      "config.json, *.safetensors, tokenizer.json), or through a running cluster (--server)");
  cmd->add_option("--server", args->server,
                  "Router address host:port: generate there (--model then names the served "
                  "model, default: the only one)");
  AddClientTlsFlags(*cmd, &args->tls, "TANDEM");
  cmd->add_option("--model", args->model_dir, "Model directory (in-process)");
  cmd->add_option("prompt,--prompt", args->prompt, "Prompt text")->required();
  CLI::Option* mode =
      cmd->add_option("--mode", args->mode,
                      "Decoding mode: " + absl::StrJoin(ImplementedModes(), ", ") +
                          " (with --server also auto, the server's choice, its default)")
          ->capture_default_str();
  cmd->add_option("--jacobi-block", args->mode_options.jacobi_block_size,
                  "jacobi: tokens refined per iteration (n)")
      ->capture_default_str();
  cmd->add_option("--jacobi-blocks", args->mode_options.jacobi_blocks,
                  "jacobi: blocks in flight (K, multi-block decoding)")
      ->capture_default_str();
  cmd->add_option("--jacobi-spawn-ratio", args->mode_options.jacobi_spawn_ratio,
                  "jacobi: spawn a block when one has >= ceil(r n) accepted tokens (r)")
      ->capture_default_str();
  cmd->add_option("--jacobi-pool", args->mode_options.jacobi_pool_size,
                  "jacobi: n-grams kept for rejection recycling; 0 = off")
      ->capture_default_str();
  cmd->add_option("--jacobi-candidates", args->mode_options.jacobi_candidates,
                  "jacobi: recycled candidates verified per iteration")
      ->capture_default_str();
  cmd->add_flag("--jacobi-prompt-lookup", args->mode_options.jacobi_prompt_lookup,
                "jacobi: also verify a candidate found by prompt lookup (not part of pcLLM)");
  cmd->add_option("--diffusion-threshold", args->mode_options.diffusion_threshold,
                  "diffusion: unmask slots whose top-1 probability reaches this (0 = whole "
                  "block per forward)")
      ->capture_default_str();
  cmd->add_option("--diffusion-sampler", args->mode_options.diffusion_sampler,
                  "diffusion: unmask by the model's trained sampler (its sampler/ folder): slots "
                  "whose probability of being final reaches this; 0 = by --diffusion-threshold")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--nsp-block", args->mode_options.nsp_block,
                  "nsp: tokens predicted per step (D); 0 = the model's block size")
      ->capture_default_str();
  cmd->add_option("--nsp-tau", args->mode_options.nsp_tau,
                  "nsp: keep the longest prefix whose product of confidences reaches this")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--nsp-confidence", args->mode_options.nsp_confidence,
                  "nsp: token confidence, 'logit' (softmax probability) or 'entropy'")
      ->check(CLI::IsMember({"logit", "entropy"}))
      ->capture_default_str();
  cmd->add_flag("--nsp-verify", args->mode_options.nsp_verify,
                "nsp: verify the block with the AR pathway (self-speculative, lossless)");
  cmd->add_flag("--nsp-quadratic", args->mode_options.nsp_quadratic,
                "nsp: the verified variant with drafting and verification in one forward per "
                "step (lossless)");
  cmd->add_option("--self-spec-k", args->mode_options.self_spec_draft_len,
                  "self_spec: <|mask|> drafts per cycle; self_spec_quadratic: masks per group; "
                  "0 = the model's block size")
      ->capture_default_str();
  cmd->add_option("--quadratic-lambda", args->mode_options.quadratic_lambda,
                  "self_spec_quadratic: diffusion weight of the AR-diffusion ensemble verifier; "
                  "0 = AR verification (lossless), > 0 is lossy")
      ->check(CLI::Range(0.0f, 1.0f))
      ->capture_default_str();
  cmd->add_option("--isd-stride", args->mode_options.isd_stride,
                  "isd: tokens proposed per step (N: one exact token and N - 1 drafts)")
      ->capture_default_str();
  cmd->add_option("--isd-tau", args->mode_options.isd_tau,
                  "isd: relaxed acceptance min(1, (1 + tau) p / q); 0 = lossless, > 0 is lossy "
                  "when sampling")
      ->capture_default_str();
  cmd->add_option("--simsd-gamma", args->mode_options.simsd_gamma,
                  "simsd: drafts verified per step, at most the block size; 0 = the block size")
      ->capture_default_str();
  cmd->add_option("--lora", args->lora_dir,
                  "isd, self_spec, self_spec_quadratic: PEFT LoRA adapter directory run on the "
                  "draft (<|mask|>) positions only (R-ISD / NLD LoRA drafter); verification "
                  "keeps the base weights, so decoding stays lossless")
      ->each([args](const std::string&) { args->mode_options.lora_drafts = true; });
  cmd->add_option("--merge-lora", args->merge_lora,
                  "PEFT LoRA adapter directory merged into the model's weights at load: every "
                  "mode then runs the adapted model (e.g. the pcLLM adapter, which `jacobi` "
                  "decodes in fewer forwards), and lossless modes reproduce its AR output")
      ->check(CLI::ExistingDirectory);
  cmd->add_option(
      "--drafter", args->drafter_dir,
      "spec, simsd: drafter model directory (same tokenizer; may be the --model directory); "
      "a DFlash drafter checkpoint (architectures TandemDFlashDrafter) drafts blocks from the "
      "target's hidden states (spec only); "
      "default: tandem-drafter next to the model when present, else the model");
  cmd->add_option("--gamma", args->mode_options.spec_gamma,
                  "spec: draft tokens verified per step; 0 = AR steps")
      ->capture_default_str();
  cmd->add_option("--max-tokens", args->max_tokens, "Most tokens to generate")
      ->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "Sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", args->top_k, "Keep the k most likely tokens; 0 = off");
  cmd->add_option("--top-p", args->top_p, "Nucleus sampling mass; 1 = off");
  cmd->add_option("--min-p", args->min_p, "Drop tokens below min-p times the top probability");
  CLI::Option* seed = cmd->add_option("--seed", args->seed, "Seed of the counter-based sampler");
  cmd->add_option("--presence-penalty", args->presence_penalty,
                  "Subtracted once from the logit of each token already generated; [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--frequency-penalty", args->frequency_penalty,
                  "Subtracted from a token's logit per time it was generated; [-2, 2]")
      ->capture_default_str();
  cmd->add_option("--repetition-penalty", args->repetition_penalty,
                  "Divides the (positive) logits of prompt and generated tokens, multiplies "
                  "negative ones; 1 = off, (0, 10]")
      ->capture_default_str();
  cmd->add_option("--stop", args->stop, "Stop string (repeatable)");
  cmd->add_flag("--chat", args->chat, "Wrap the prompt as a user turn of the ChatML template");
  cmd->add_flag("--json", args->json,
                "Print one JSON object: text, tokens, forwards, tokens per forward, tokens/s");
  cmd->add_option("--threads", args->threads, "CPU threads for matrix products; 0 = all cores");
  cmd->add_option("--device", args->device,
                  "Where the model runs in-process: cpu (fp32) or cuda (bf16 GPU)")
      ->check(CLI::IsMember({"cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--cuda-graphs", args->cuda_graphs,
                  "With --device cuda: replay decode steps as CUDA graphs per batch-size bucket")
      ->capture_default_str();
  cmd->add_option("--cpu-weights", args->cpu_weights, kCpuWeightsHelp)
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->callback([args, exit_code, mode, seed] {
    args->mode_set = mode->count() > 0;
    args->seed_set = seed->count() > 0;
    if (!args->server.empty() && !args->lora_dir.empty()) {
      std::fprintf(stderr,
                   "tandem generate: --lora is in-process only (give the verifier --lora)\n");
      *exit_code = 2;
    } else if (!args->server.empty() && !args->merge_lora.empty()) {
      std::fprintf(stderr,
                   "tandem generate: --merge-lora is in-process only (give the verifier "
                   "--merge-lora)\n");
      *exit_code = 2;
    } else if (!args->server.empty()) {
      *exit_code = RunRemoteGenerate(*args);
    } else if (args->model_dir.empty()) {
      std::fprintf(stderr, "tandem generate: give --model DIR (in-process) or --server ADDR\n");
      *exit_code = 2;
    } else {
      *exit_code = RunGenerate(*args);
    }
  });
}

}  // namespace tandem::cli
