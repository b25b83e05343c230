#include "services/verifier/verifier_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "services/common/logit_adjust_proto.h"
#include "services/common/proto_decode.h"
#include "worker/sampling/sampling.h"

namespace tandem {

namespace {

// Events a stream may hold before the engine stops stepping its sequence.
constexpr size_t kMaxQueuedResponses = 8;
// The largest Generate request (gRPC's default receive limit, which the server keeps): a
// migrated request's committed tokens at a 128k context take well under 1 MiB.
constexpr size_t kMaxVerifyRequestBytes = 4 << 20;

// A token's bytes for a logprob entry; empty for an id the tokenizer cannot decode.
std::string TokenBytes(const Tokenizer& tokenizer, int32_t id) {
  absl::StatusOr<std::string> bytes = tokenizer.Decode({&id, 1});
  return bytes.ok() ? *std::move(bytes) : std::string();
}

void ToProto(const TokenLogprob& l, const Tokenizer& tokenizer, v1::TokenLogprob* out) {
  out->set_token_id(l.token);
  if (l.has_logprob) out->set_logprob(l.logprob);
  out->set_token(TokenBytes(tokenizer, l.token));
  for (const auto& [id, logprob] : l.top) {
    v1::TopLogprob* top = out->add_top();
    top->set_token_id(id);
    top->set_logprob(logprob);
    top->set_token(TokenBytes(tokenizer, id));
  }
}

v1::GenerateResponse ToResponse(const SequenceEvent& event, const Tokenizer& tokenizer) {
  v1::GenerateResponse response;
  response.mutable_token_ids()->Add(event.tokens.begin(), event.tokens.end());
  for (const TokenLogprob& l : event.logprobs) ToProto(l, tokenizer, response.add_logprobs());
  for (const TokenLogprob& l : event.prompt_logprobs) {
    ToProto(l, tokenizer, response.add_prompt_logprobs());
  }
  response.set_text(event.text);
  response.set_mode(event.mode);
  response.set_lossy(!event.lossless);
  if (event.finish != FinishReason::kNone) {
    response.set_finish_reason(std::string(FinishReasonName(event.finish)));
    const SequenceUsage& usage = event.usage;
    v1::Usage* out = response.mutable_usage();
    out->set_prompt_tokens(usage.prompt_tokens);
    out->set_completion_tokens(usage.completion_tokens);
    out->set_target_forwards(usage.forwards);
    out->set_draft_tokens(usage.drafted);
    out->set_accepted_tokens(usage.accepted);
    out->set_preemptions(usage.preemptions);
    out->set_cached_tokens(usage.cached_tokens);
    out->set_draft_steps(usage.draft_steps);
    out->set_drafts_ready(usage.drafts_ready);
    out->set_drafts_waited(usage.drafts_waited);
    out->set_drafts_from_branch(usage.drafts_from_branch);
    v1::Timings* timings = response.mutable_timings();
    timings->set_queue_seconds(usage.queue_seconds);
    timings->set_time_to_first_token_seconds(usage.ttft_seconds);
    timings->set_total_seconds(usage.total_seconds);
  }
  return response;
}

absl::Time ToAbslTime(std::chrono::system_clock::time_point deadline) {
  if (deadline == std::chrono::system_clock::time_point::max()) return absl::InfiniteFuture();
  return absl::FromChrono(deadline);
}

class GenerateReactor;

// The engine's view of one stream. Outlives the reactor when the engine still holds it; events
// after the stream is gone are dropped.
class StreamSink final : public SequenceSink {
 public:
  StreamSink(ServiceMetrics* metrics, std::string mode, const Tokenizer* tokenizer)
      : recorder_(metrics, std::move(mode)), tokenizer_(tokenizer) {}

  void Attach(GenerateReactor* reactor) {
    absl::MutexLock lock(&mu_);
    reactor_ = reactor;
  }
  void Detach() {
    absl::MutexLock lock(&mu_);
    reactor_ = nullptr;
  }

  void OnEvent(SequenceEvent event) override;
  bool Backlogged() const override {
    absl::MutexLock lock(&mu_);
    return queue_.size() >= kMaxQueuedResponses;
  }

  // Called by the reactor when a write completed.
  void OnWriteDone(bool ok);

 private:
  // Starts the next write or finishes the call; mu_ held.
  void Pump() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  GenerateReactor* reactor_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::deque<grpc::ByteBuffer> queue_ ABSL_GUARDED_BY(mu_);  // serialized GenerateResponses
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;  // the last event arrived
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool broken_ ABSL_GUARDED_BY(mu_) = false;  // a write failed
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  RequestRecorder recorder_ ABSL_GUARDED_BY(mu_);
  const Tokenizer* tokenizer_;  // the engine's; it outlives every stream
};

class GenerateReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GenerateReactor(Engine* engine, std::shared_ptr<StreamSink> sink)
      : engine_(engine), sink_(std::move(sink)) {
    sink_->Attach(this);
  }

  // The engine's id of this stream's sequence, once submitted. A cancel that came first is
  // passed on now.
  void set_sequence(uint64_t id) {
    sequence_.store(id);
    if (cancelled_.load()) engine_->Cancel(id);
  }

  void OnWriteDone(bool ok) override { sink_->OnWriteDone(ok); }
  // The client went away or the deadline passed: the engine ends the sequence between steps,
  // and its last event finishes the call.
  void OnCancel() override {
    cancelled_.store(true);
    if (const uint64_t id = sequence_.load(); id != 0) engine_->Cancel(id);
  }
  void OnDone() override {
    sink_->Detach();
    if (const uint64_t id = sequence_.load(); id != 0) engine_->Cancel(id);
    delete this;
  }

 private:
  Engine* engine_;
  std::shared_ptr<StreamSink> sink_;
  std::atomic<uint64_t> sequence_{0};
  std::atomic<bool> cancelled_{false};
};

void StreamSink::OnEvent(SequenceEvent event) {
  absl::MutexLock lock(&mu_);
  recorder_.set_mode(event.mode);
  recorder_.OnChunk(static_cast<int>(event.tokens.size()));
  if (!event.error.ok()) {
    recorder_.Finish(event.error.code(), event.usage.forwards);
  } else if (event.finish != FinishReason::kNone) {
    recorder_.Finish(event.finish == FinishReason::kCancelled ? absl::StatusCode::kCancelled
                                                              : absl::StatusCode::kOk,
                     event.usage.forwards);
  }
  if (reactor_ == nullptr || ended_) return;
  if (broken_) {
    ended_ = event.finish != FinishReason::kNone || !event.error.ok();
    Pump();
    return;
  }
  const bool last = event.finish != FinishReason::kNone || !event.error.ok();
  if (!event.error.ok()) {
    ended_ = true;
    final_status_ = ToGrpcStatus(event.error);
  } else {
    // Empty intermediate events (a step that committed nothing visible) are not worth a write.
    if (last || !event.tokens.empty() || !event.text.empty() || !event.prompt_logprobs.empty()) {
      bool own_buffer = false;
      grpc::ByteBuffer& out = queue_.emplace_back();
      grpc::SerializationTraits<v1::GenerateResponse>::Serialize(ToResponse(event, *tokenizer_),
                                                                 &out, &own_buffer);
    }
    if (last) ended_ = true;
  }
  Pump();
}

void StreamSink::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) {
    // The client is gone: nothing more is written; the call finishes with the sequence, which
    // OnCancel has already asked the engine to end.
    queue_.clear();
    broken_ = true;
  }
  Pump();
}

void StreamSink::Pump() {
  if (reactor_ == nullptr || writing_ || finished_) return;
  if (!queue_.empty() && !broken_) {
    writing_ = true;
    reactor_->StartWrite(&queue_.front());
    // The message must stay alive until the write completes; pop it then.
    return;
  }
  if (ended_) {
    finished_ = true;
    reactor_->Finish(final_status_);
  }
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// The mode label of a request the engine has not resolved yet: a name this build implements,
// "auto", or "unknown" (a client's arbitrary string must not become a label value).
std::string RequestedModeLabel(const std::string& mode) {
  if (mode.empty() || mode == "auto") return "auto";
  for (const std::string& known : ImplementedModes()) {
    if (mode == known) return mode;
  }
  return "unknown";
}

// The jacobi, nsp, isd and simsd knobs of `given` over `options`; InvalidArgument naming the
// field for a value no mode could honour (each mode checks the rest when it is created).
absl::Status ApplyModeOptions(const v1::ModeOptions& given, ModeOptions* options) {
  auto bad = [](auto&&... parts) { return absl::InvalidArgumentError(absl::StrCat(parts...)); };
  if (given.jacobi_spawn_ratio() != 0) {
    if (!(given.jacobi_spawn_ratio() > 0 && given.jacobi_spawn_ratio() <= 1)) {
      return bad("jacobi_spawn_ratio must be in (0, 1], got ", given.jacobi_spawn_ratio());
    }
    options->jacobi_spawn_ratio = given.jacobi_spawn_ratio();
  }
  if (given.has_jacobi_pool_size()) {
    if (given.jacobi_pool_size() < 0) {
      return bad("jacobi_pool_size must be >= 0 (0 = off), got ", given.jacobi_pool_size());
    }
    options->jacobi_pool_size = given.jacobi_pool_size();
  }
  if (given.jacobi_candidates() != 0) {
    if (given.jacobi_candidates() < 0) {
      return bad("jacobi_candidates must be >= 0, got ", given.jacobi_candidates());
    }
    options->jacobi_candidates = given.jacobi_candidates();
  }
  if (given.has_jacobi_prompt_lookup())
    options->jacobi_prompt_lookup = given.jacobi_prompt_lookup();
  if (given.nsp_block() != 0) {
    if (given.nsp_block() < 0) return bad("nsp_block must be positive, got ", given.nsp_block());
    options->nsp_block = given.nsp_block();
  }
  if (given.has_nsp_tau()) {
    if (!(given.nsp_tau() >= 0 && given.nsp_tau() <= 1)) {
      return bad("nsp_tau must be in [0, 1], got ", given.nsp_tau());
    }
    options->nsp_tau = given.nsp_tau();
  }
  if (!given.nsp_confidence().empty()) {
    if (given.nsp_confidence() != "logit" && given.nsp_confidence() != "entropy") {
      return bad("nsp_confidence must be 'logit' or 'entropy', got '", given.nsp_confidence(), "'");
    }
    options->nsp_confidence = given.nsp_confidence();
  }
  if (given.has_nsp_verify()) options->nsp_verify = given.nsp_verify();
  if (given.nsp_quadratic()) options->nsp_quadratic = true;
  if (given.isd_stride() != 0) {
    if (given.isd_stride() < 2) return bad("isd_stride must be >= 2, got ", given.isd_stride());
    options->isd_stride = given.isd_stride();
  }
  if (given.has_isd_tau()) {
    if (!(given.isd_tau() >= 0) || std::isinf(given.isd_tau())) {
      return bad("isd_tau must be a finite number >= 0 (0 = lossless), got ", given.isd_tau());
    }
    options->isd_tau = given.isd_tau();
  }
  if (given.has_isd_argmax_proposals()) {
    options->isd_argmax_proposals = given.isd_argmax_proposals();
  }
  if (given.simsd_gamma() != 0) {
    if (given.simsd_gamma() < 0) {
      return bad("simsd_gamma must be positive (0 = the block size), got ", given.simsd_gamma());
    }
    options->simsd_gamma = given.simsd_gamma();
  }
  return absl::OkStatus();
}

// The engine's constraint for a response_format (generate.proto); InvalidArgument naming it for
// an unknown type or a schema where none belongs or none is given.
absl::StatusOr<std::optional<GrammarSpec>> ToGrammarSpec(const v1::ResponseFormat& format) {
  const std::string& type = format.type();
  std::optional<GrammarSpec> spec;
  if (!type.empty() && type != "text") {
    TANDEM_ASSIGN_OR_RETURN(GrammarSpec::Kind kind, GrammarKindOf(type));
    spec = GrammarSpec{.kind = kind, .text = format.schema()};
  }
  const bool takes_schema = spec.has_value() && spec->kind != GrammarSpec::Kind::kJsonObject;
  if (!takes_schema && !format.schema().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "response_format type '", type, "' takes no schema (json_schema or structural_tag do)"));
  }
  if (takes_schema && format.schema().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("response_format ", type, " needs its schema (response_format.schema)"));
  }
  return spec;
}

}  // namespace

absl::StatusOr<SequenceRequest> ToSequenceRequest(const v1::VerifyRequest& verify,
                                                  const VerifierIdentity& identity,
                                                  const ModelConfig& config,
                                                  const ModeOptions& defaults) {
  const v1::GenerateRequest& request = verify.request();
  if (!request.model().empty() && request.model() != identity.model_id) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unknown model '", request.model(), "'; this verifier serves '", identity.model_id, "'"));
  }
  SequenceRequest out;
  out.request_id = request.request_id();
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      if (request.prompt().empty()) return absl::InvalidArgumentError("prompt is empty");
      out.prompt = request.prompt();
      break;
    case v1::GenerateRequest::kChat:
      if (request.chat().messages().empty()) {
        return absl::InvalidArgumentError("chat has no messages");
      }
      for (const v1::ChatMessage& message : request.chat().messages()) {
        if (message.role() != "system" && message.role() != "user" &&
            message.role() != "assistant" && message.role() != "tool") {
          return absl::InvalidArgumentError(
              absl::StrCat("chat message role must be system, user, assistant or tool, got '",
                           message.role(), "'"));
        }
        out.chat.push_back(ChatTurn{message.role(), message.content(), message.tool_calls(),
                                    message.tool_call_id()});
      }
      out.chat_tools = request.chat().tools();
      break;
    case v1::GenerateRequest::kTokenIds:
      if (request.token_ids().ids().empty()) {
        return absl::InvalidArgumentError("token_ids is empty");
      }
      out.prompt_ids.assign(request.token_ids().ids().begin(), request.token_ids().ids().end());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      return absl::InvalidArgumentError("the request has no input: set prompt, chat or token_ids");
  }
  if (request.max_tokens() < 0 || (request.max_tokens() == 0 && !request.echo())) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_tokens must be positive (0 only with echo), got ", request.max_tokens()));
  }
  if (request.max_tokens() > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_tokens ", request.max_tokens(),
                                                   " exceeds the model's context of ",
                                                   config.max_position_embeddings, " tokens"));
  }
  out.max_tokens = request.max_tokens();
  const v1::SamplingParams& sampling = request.sampling();
  // The wire's conventions: top_k 0 or -1 is off, top_p 0 is off (1 natively); then the
  // engine's own ranges (CheckSamplingParams, as Engine::Submit applies them too).
  if (sampling.top_k() < -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("top_k must be >= 0 (0 or -1 = off), got ", sampling.top_k()));
  }
  out.sampling.temperature = sampling.temperature();
  out.sampling.top_k = std::max(0, sampling.top_k());
  out.sampling.top_p = sampling.top_p() == 0 ? 1.0f : sampling.top_p();
  out.sampling.min_p = sampling.min_p();
  if (absl::Status checked = CheckSamplingParams(out.sampling); !checked.ok()) return checked;
  // Unseeded requests still need a seed; the router sets one so that a migrated request
  // continues the same random stream.
  out.sampling.seed = sampling.has_seed() ? sampling.seed() : absl::ToUnixNanos(absl::Now());
  out.stop_strings.assign(request.stop().begin(), request.stop().end());
  for (const std::string& stop : out.stop_strings) {
    if (stop.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  out.stop_token_ids.assign(request.stop_token_ids().begin(), request.stop_token_ids().end());
  out.ignore_eos = request.ignore_eos();
  // Checked by Engine::Submit, against the vocabulary.
  out.adjust = ToLogitAdjust(request);
  out.logprobs = request.logprobs();
  out.top_logprobs = request.top_logprobs();
  out.echo = request.echo();
  TANDEM_ASSIGN_OR_RETURN(out.grammar, ToGrammarSpec(request.response_format()));
  out.mode = request.mode();
  out.committed.assign(verify.committed_token_ids().begin(), verify.committed_token_ids().end());
  out.drafter = verify.drafter();

  ModeOptions options = defaults;
  const v1::ModeOptions& given = verify.mode_options();
  if (given.spec_gamma() != 0) {
    if (given.spec_gamma() < -1) {
      return absl::InvalidArgumentError(
          absl::StrCat("spec_gamma must be -1 (AR steps) or positive, got ", given.spec_gamma()));
    }
    options.spec_gamma = given.spec_gamma() < 0 ? 0 : given.spec_gamma();
    out.spec_gamma_pinned = true;
  }
  // Every bound (block-like options up to --max-mode-block, the step budget) is
  // CheckModeOptions', which Engine::Submit applies to the merged options; a negative block
  // option is refused here already, not taken for "the model's".
  for (const auto& [field, value] :
       {std::pair<const char*, int>{"self_spec_draft_len", given.self_spec_draft_len()},
        {"diffusion_block_size", given.diffusion_block_size()},
        {"jacobi_block_size", given.jacobi_block_size()},
        {"jacobi_blocks", given.jacobi_blocks()}}) {
    if (value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, " must be positive (0 = the verifier's default), got ", value));
    }
  }
  if (given.jacobi_block_size() != 0) options.jacobi_block_size = given.jacobi_block_size();
  if (given.jacobi_blocks() != 0) options.jacobi_blocks = given.jacobi_blocks();
  if (given.self_spec_draft_len() != 0) options.self_spec_draft_len = given.self_spec_draft_len();
  if (given.quadratic_lambda() != 0) options.quadratic_lambda = given.quadratic_lambda();
  if (given.diffusion_block_size() != 0) {
    options.diffusion_block_size = given.diffusion_block_size();
  }
  if (given.diffusion_threshold() != 0) options.diffusion_threshold = given.diffusion_threshold();
  if (given.diffusion_sampler() != 0) {
    options.diffusion_sampler = given.diffusion_sampler();  // CheckModeOptions bounds it
  }
  absl::Status more = ApplyModeOptions(given, &options);
  if (!more.ok()) return more;
  out.mode_options = options;
  return out;
}

VerifierService::VerifierService(Engine* engine, VerifierIdentity identity,
                                 ModeOptions mode_defaults, ServiceMetrics* metrics,
                                 absl::Duration watchdog, ApiKeys peers)
    : engine_(engine),
      identity_(std::move(identity)),
      mode_defaults_(mode_defaults),
      metrics_(metrics),
      watchdog_(watchdog),
      peers_(std::move(peers)) {}

namespace {

bool StalledPast(const EngineLoad& load, absl::Duration watchdog) {
  return watchdog > absl::ZeroDuration() && load.stalled_seconds >= absl::ToDoubleSeconds(watchdog);
}

}  // namespace

bool VerifierService::Stalled() const { return StalledPast(engine_->Load(), watchdog_); }

grpc::ServerWriteReactor<grpc::ByteBuffer>* VerifierService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  v1::VerifyRequest request;
  const absl::Status decoded = DecodeProto(*raw, kMaxVerifyRequestBytes, "verifier", &request);
  const std::string mode = RequestedModeLabel(request.request().mode());
  auto sink = std::make_shared<StreamSink>(metrics_, mode, engine_->model().tokenizer.get());
  auto* reactor = new GenerateReactor(engine_, sink);
  if (grpc::Status auth = peers_.CheckGrpc(*context); !auth.ok()) {
    RequestRecorder(metrics_, mode).Finish(absl::StatusCode::kUnauthenticated);
    reactor->Finish(auth);
    return reactor;
  }
  if (!decoded.ok()) {
    RequestRecorder(metrics_, mode).Finish(decoded.code());
    reactor->Finish(ToGrpcStatus(decoded));
    return reactor;
  }
  absl::StatusOr<SequenceRequest> native =
      ToSequenceRequest(request, identity_, engine_->model().model->config(), mode_defaults_);
  if (!native.ok()) {
    RequestRecorder(metrics_, mode).Finish(native.status().code());
    reactor->Finish(ToGrpcStatus(native.status()));
    return reactor;
  }
  native->deadline = ToAbslTime(context->deadline());
  absl::StatusOr<uint64_t> id = engine_->Submit(*std::move(native), sink);
  if (!id.ok()) {
    RequestRecorder(metrics_, mode).Finish(id.status().code());
    reactor->Finish(ToGrpcStatus(id.status()));
    return reactor;
  }
  reactor->set_sequence(*id);
  return reactor;
}

grpc::ServerUnaryReactor* VerifierService::GetInfo(grpc::CallbackServerContext* context,
                                                   const v1::WorkerInfoRequest* /*request*/,
                                                   v1::WorkerInfo* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = peers_.CheckGrpc(*context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const ModelConfig& config = engine_->model().model->config();
  reply->set_role("verifier");
  reply->set_model(identity_.model_id);
  for (const std::string& mode : ImplementedModes()) reply->add_modes(mode);
  reply->set_max_context(config.max_position_embeddings);
  reply->set_vocab_size(config.vocab_size);
  reply->set_version(VersionString());
  reply->set_worker_id(identity_.worker_id);
  reply->set_default_mode(identity_.default_mode);
  reply->set_tool_call_syntax(ToolCallSyntaxName(identity_.tool_call_syntax));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* VerifierService::GetLoad(grpc::CallbackServerContext* context,
                                                   const v1::WorkerLoadRequest* /*request*/,
                                                   v1::WorkerLoad* reply) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = peers_.CheckGrpc(*context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const EngineLoad load = engine_->Load();
  reply->set_worker_id(identity_.worker_id);
  reply->set_running_sequences(load.running);
  reply->set_queued_sequences(load.queued);
  reply->set_kv_usage_ratio(load.kv_usage_ratio);
  reply->set_kv_free_tokens(load.kv_free_tokens);
  reply->set_steps(load.steps);
  reply->set_step_seconds_ewma(load.step_seconds_ewma);
  reply->set_batch_tokens_ewma(load.batch_tokens_ewma);
  reply->set_preemptions(load.preemptions);
  reply->set_draining(load.draining);
  reply->set_stalled_seconds(load.stalled_seconds);
  reply->set_stalled(StalledPast(load, watchdog_));
  reply->set_request_tokens(load.cost.request_tokens);
  for (const StepTimePoint& point : load.cost.step_times) {
    v1::StepTime* out = reply->add_step_times();
    out->set_batch_tokens(point.batch_tokens);
    out->set_step_seconds(point.step_seconds);
    out->set_samples(point.samples);
  }
  for (const auto& [mode, points] : load.cost.modes) {
    v1::ModeCost* cost = reply->add_mode_costs();
    cost->set_mode(mode);
    for (const ModeLoadPoint& point : points) {
      v1::ModeLoad* out = cost->add_points();
      out->set_sequences(point.sequences);
      out->set_tokens_per_step(point.tokens_per_step);
      out->set_extend_tokens(point.extend_tokens);
      out->set_wait_seconds(point.wait_seconds);
      out->set_step_seconds(point.step_seconds);
      out->set_start_seconds(point.start_seconds);
      out->set_samples(point.samples);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
