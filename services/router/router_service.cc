#include "services/router/router_service.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "services/router/request_decode.h"

namespace tandem {

namespace {

// Whether a request needs the target's AR log-probabilities, which only lossless modes compute
// (structured output holds in every mode).
bool NeedsLossless(const v1::GenerateRequest& request) { return request.logprobs(); }

uint64_t NewSeed() {
  thread_local std::mt19937_64 generator{std::random_device{}()};
  return generator();
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// The mode label of a request before a verifier names its mode: a mode its model serves,
// "auto", or "unknown" (a client's arbitrary string must not become a label value).
std::string ModeLabel(const std::string& mode, const router::ModelDescription* model) {
  if (mode.empty() || mode == "auto") return "auto";
  if (model != nullptr) {
    for (const std::string& known : model->modes) {
      if (mode == known) return mode;
    }
  }
  return "unknown";
}

// What every call of one service shares.
struct RelayEnv {
  router::VerifierPool* pool = nullptr;
  VerifierStubs* stubs = nullptr;
  int max_migrations = 0;
  std::atomic<uint64_t>* migrations = nullptr;
};

// Whether a failed upstream stream is worth re-issuing elsewhere: the verifier went away (killed,
// restarted, its connection broke), or it began draining and refused the request. `streamed` is
// how many messages this attempt relayed; `client_gone` is true when the router itself cancelled
// the call because the client did.
bool Migratable(const grpc::Status& status, int streamed, bool client_gone) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::INTERNAL:
      return true;
    case grpc::StatusCode::CANCELLED:  // a verifier's server shutting down cancels its calls
      return !client_gone;
    case grpc::StatusCode::FAILED_PRECONDITION:  // "the engine is draining", before any token
      return streamed == 0;
    default:
      return false;
  }
}

// One Generate call. The server side (this) writes to the client; an Attempt reads one
// verifier's stream. They take turns, so at most one of read and write is in flight:
//
//   upstream read done (ok) -> StartWrite -> write done (ok) -> next upstream read ...
//   upstream read done (!ok), or write done (!ok: the client is gone) -> attempt OnDone
//   -> a migratable failure: a new Attempt on another verifier, reading on from the committed
//      tokens; otherwise Finish with the upstream status -> server OnDone.
//
// An attempt carries a hold until the relay will start no more reads on it, so its OnDone never
// races a read being started. Attempts live as long as the call (at most max_migrations + 1), so
// a late OnCancel may still touch the context of one that ended. The object deletes itself after
// the server's OnDone and the last attempt's OnDone.
class RelayCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RelayCall(router::AdmissionGate* admission) : admission_(admission) {}

  // Records the call's metrics in `metrics` (may be null) under `mode` until a verifier names
  // the mode that serves it.
  void Record(ServiceMetrics* metrics, std::string mode) {
    recorder_ = RequestRecorder(metrics, std::move(mode));
  }

  // Ends the call at once (nothing upstream).
  void Fail(const grpc::Status& status) {
    refs_.store(1, std::memory_order_relaxed);
    recorder_.Finish(static_cast<absl::StatusCode>(status.error_code()));
    ReleaseAdmission();
    Finish(status);
  }

  // Relays `request` from `verifier` (already acquired in the pool).
  void Relay(const RelayEnv& env, size_t verifier, v1::Verifier::Stub* stub,
             v1::VerifyRequest request, std::chrono::system_clock::time_point deadline) {
    env_ = env;
    request_ = std::move(request);
    deadline_ = deadline;
    StartAttempt(verifier, stub);
  }

  void OnWriteDone(bool ok) override {
    Attempt* attempt = current();
    if (!ok) {
      // The client is gone: stop the verifier's work and read no more.
      {
        absl::MutexLock lock(&mu_);
        client_gone_ = true;
      }
      attempt->context.TryCancel();
      attempt->RemoveHold();
      return;
    }
    attempt->StartRead(&attempt->response);
  }

  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    client_gone_ = true;
    if (current_ != nullptr) current_->context.TryCancel();
  }

  void OnDone() override { Unref(); }

 private:
  // One verifier's stream for this call.
  class Attempt final : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    Attempt(RelayCall* call, size_t verifier) : call_(call), verifier(verifier) {}
    void OnReadDone(bool ok) override { call_->OnUpstreamRead(this, ok); }
    void OnDone(const grpc::Status& status) override { call_->OnUpstreamDone(this, status); }

    RelayCall* const call_;
    const size_t verifier;
    grpc::ClientContext context;
    v1::VerifyRequest request;
    v1::GenerateResponse response;  // the upstream message being relayed
    int streamed = 0;               // messages relayed from this attempt
  };

  ~RelayCall() override { ReleaseAdmission(); }

  // Before Finish: a client that sees the status and calls again must find the slot free.
  void ReleaseAdmission() {
    if (admission_ != nullptr) admission_->Release();
    admission_ = nullptr;
  }

  Attempt* current() {
    absl::MutexLock lock(&mu_);
    return current_;
  }

  void StartAttempt(size_t verifier, v1::Verifier::Stub* stub) {
    auto owned = std::make_unique<Attempt>(this, verifier);
    Attempt* attempt = owned.get();
    attempt->request = request_;
    attempt->request.mutable_committed_token_ids()->Add(committed_.begin(), committed_.end());
    // The prompt a client asked to echo is streamed once, by the first verifier that sent it.
    if (prompt_echoed_) attempt->request.mutable_request()->set_echo(false);
    if (deadline_ != std::chrono::system_clock::time_point::max()) {
      attempt->context.set_deadline(deadline_);
    }
    stub->async()->Generate(&attempt->context, &attempt->request, attempt);
    attempt->AddHold();
    attempt->StartRead(&attempt->response);
    {
      // Current before the call starts: its first read may complete, and the client write's
      // OnWriteDone read from current(), before StartCall returns.
      absl::MutexLock lock(&mu_);
      attempts_.push_back(std::move(owned));
      current_ = attempt;
      // A cancellation that came while no attempt was current (applied when the call starts).
      if (client_gone_) attempt->context.TryCancel();
    }
    attempt->StartCall();
  }

  void OnUpstreamRead(Attempt* attempt, bool ok) {
    if (!ok) {
      attempt->RemoveHold();  // the stream ended; OnUpstreamDone has its status
      return;
    }
    ++attempt->streamed;
    v1::GenerateResponse& response = attempt->response;
    recorder_.set_mode(response.mode());
    recorder_.OnChunk(response.token_ids_size());
    committed_.insert(committed_.end(), response.token_ids().begin(), response.token_ids().end());
    if (response.prompt_logprobs_size() > 0) prompt_echoed_ = true;
    if (!response.finish_reason().empty()) {
      finished_ = true;
      // The verifier counts only what it produced; the client's usage covers the whole stream.
      const int earlier = attempt->request.committed_token_ids_size();
      if (earlier > 0 && response.has_usage()) {
        response.mutable_usage()->set_completion_tokens(response.usage().completion_tokens() +
                                                        earlier);
      }
    }
    bool own_buffer = false;
    out_.Clear();  // serialization wants an empty buffer; the previous write has completed
    grpc::Status serialized =
        grpc::SerializationTraits<v1::GenerateResponse>::Serialize(response, &out_, &own_buffer);
    if (!serialized.ok()) {
      failure_ =
          grpc::Status(grpc::StatusCode::INTERNAL,
                       "the router could not serialize a response: " + serialized.error_message());
      attempt->context.TryCancel();
      attempt->RemoveHold();
      return;
    }
    StartWrite(&out_);
  }

  void OnUpstreamDone(Attempt* attempt, const grpc::Status& status) {
    env_.pool->Release(attempt->verifier);
    bool client_gone;
    {
      absl::MutexLock lock(&mu_);
      client_gone = client_gone_;
    }
    const bool migratable = !status.ok() && failure_.ok() && !finished_ &&
                            Migratable(status, attempt->streamed, client_gone);
    // A verifier that cannot be reached or is draining is out until a poll finds it up again.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE || (migratable && !client_gone)) {
      env_.pool->SetHealthy(attempt->verifier, false);
    }
    if (migratable && migrations_done_ < env_.max_migrations &&
        std::chrono::system_clock::now() < deadline_) {
      const std::string mode = request_.request().mode();
      absl::StatusOr<size_t> next =
          env_.pool->Acquire(request_.request().model(), mode, {.avoid = attempt->verifier});
      v1::Verifier::Stub* stub = next.ok() ? env_.stubs->Get(*next) : nullptr;
      if (stub != nullptr) {
        ++migrations_done_;
        env_.migrations->fetch_add(1, std::memory_order_relaxed);
        std::fprintf(stderr,
                     "tandem-router: request '%s' moves from verifier %s to %s after %zu tokens "
                     "(%s: %s)\n",
                     request_.request().request_id().c_str(),
                     env_.pool->address(attempt->verifier).c_str(),
                     env_.pool->address(*next).c_str(), committed_.size(),
                     StatusCodeName(status.error_code()), status.error_message().c_str());
        StartAttempt(*next, stub);
        return;
      }
      if (next.ok()) env_.pool->Release(*next);
    }
    grpc::Status final_status = failure_.ok() ? status : failure_;
    // The stream broke after its last message: the client has the whole completion.
    if (!final_status.ok() && finished_ && failure_.ok() && !client_gone) {
      final_status = grpc::Status::OK;
    }
    {
      absl::MutexLock lock(&mu_);
      current_ = nullptr;
    }
    recorder_.Finish(static_cast<absl::StatusCode>(final_status.error_code()));
    ReleaseAdmission();
    Finish(final_status);
    Unref();
  }

  static const char* StatusCodeName(grpc::StatusCode code) {
    switch (code) {
      case grpc::StatusCode::UNAVAILABLE:
        return "UNAVAILABLE";
      case grpc::StatusCode::ABORTED:
        return "ABORTED";
      case grpc::StatusCode::INTERNAL:
        return "INTERNAL";
      case grpc::StatusCode::CANCELLED:
        return "CANCELLED";
      case grpc::StatusCode::FAILED_PRECONDITION:
        return "FAILED_PRECONDITION";
      default:
        return "error";
    }
  }

  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  // Released when the call ends (null then, and when not admitted); only the callback that
  // finishes the call touches it, then the destructor.
  router::AdmissionGate* admission_;
  RelayEnv env_;
  v1::VerifyRequest request_;  // as the first verifier got it
  std::chrono::system_clock::time_point deadline_ = std::chrono::system_clock::time_point::max();
  // Completion tokens relayed so far. Like the fields below, touched only by the callback that
  // holds the turn (a read, a write, or the end of an attempt), never two at once.
  std::vector<int32_t> committed_;
  bool finished_ = false;       // the message with finish_reason was relayed
  bool prompt_echoed_ = false;  // echo: the prompt's tokens were relayed
  int migrations_done_ = 0;
  RequestRecorder recorder_{nullptr};
  grpc::ByteBuffer out_;      // the message being written to the client
  grpc::Status failure_;      // a router-side failure that overrides the upstream status
  std::atomic<int> refs_{2};  // the server reactor and the chain of attempts

  absl::Mutex mu_;  // OnCancel comes on any thread, while an attempt may be replaced
  bool client_gone_ ABSL_GUARDED_BY(mu_) = false;
  Attempt* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<std::unique_ptr<Attempt>> attempts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

RouterService::RouterService(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                             RouterOptions options)
    : pool_(pool),
      owned_stubs_(std::make_unique<VerifierStubs>(std::move(stubs))),
      stubs_(owned_stubs_.get()),
      options_(std::move(options)),
      admission_(options_.max_in_flight) {}

RouterService::RouterService(router::VerifierPool* pool, VerifierStubs* stubs,
                             RouterOptions options)
    : pool_(pool),
      stubs_(stubs),
      options_(std::move(options)),
      admission_(options_.max_in_flight) {}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  // Every call is counted in the metrics, under the mode it asks for once that is known.
  std::string mode = "unknown";
  auto new_call = [this, &mode](router::AdmissionGate* admission) {
    auto* call = new RelayCall(admission);
    call->Record(options_.metrics, mode);
    return call;
  };
  if (grpc::Status auth = options_.api_keys.CheckGrpc(*context); !auth.ok()) {
    auto* call = new_call(nullptr);
    call->Fail(auth);
    return call;
  }
  absl::StatusOr<v1::GenerateRequest> request = DecodeGenerateRequest(*raw);
  if (!request.ok()) {
    auto* call = new_call(nullptr);
    call->Fail(ToGrpcStatus(request.status()));
    return call;
  }
  absl::StatusOr<router::ModelDescription> model = pool_->ResolveModel(request->model());
  mode = ModeLabel(request->mode(), model.ok() ? &*model : nullptr);
  absl::Status checked =
      model.ok() ? router::CheckRequest(ToRouterRequest(*request), *model) : model.status();
  if (!checked.ok()) {
    auto* call = new_call(nullptr);
    call->Fail(ToGrpcStatus(checked));
    return call;
  }
  if (!admission_.TryAdmit()) {
    auto* call = new_call(nullptr);
    call->Fail(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("router is at capacity (", admission_.limit(),
                                         " requests in flight); retry later")));
    return call;
  }
  auto* call = new_call(&admission_);
  const std::vector<uint64_t> prefix_keys =
      options_.prefix_affinity ? router::PrefixAffinity::Keys(AffinityText(model->id, *request))
                               : std::vector<uint64_t>();
  const std::optional<size_t> holder = affinity_.Find(prefix_keys);
  absl::StatusOr<size_t> verifier = pool_->Acquire(
      model->id, request->mode(),
      {.prefer = holder, .prefer_slack = options_.prefix_affinity_slack, .gain = GainOf(*request)});
  if (!verifier.ok()) {
    call->Fail(ToGrpcStatus(verifier.status()));
    return call;
  }
  if (!prefix_keys.empty()) {
    affinity_.Record(prefix_keys, *verifier);
    if (options_.metrics != nullptr) {
      options_.metrics->AddPrefixAffinity(!holder                ? "unknown"
                                          : *holder == *verifier ? "followed"
                                                                 : "overridden");
    }
  }
  v1::Verifier::Stub* stub = stubs_->Get(*verifier);
  if (stub == nullptr) {
    pool_->Release(*verifier);
    call->Fail(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("the router has no channel to verifier ",
                                         pool_->address(*verifier), "; retry later")));
    return call;
  }
  v1::VerifyRequest upstream;
  *upstream.mutable_request() = std::move(*request);
  // "" named the only model; the verifier gets its id.
  upstream.mutable_request()->set_model(model->id);
  // A migrated stream must sample what the first verifier would have: same seed.
  if (!upstream.request().sampling().has_seed()) {
    upstream.mutable_request()->mutable_sampling()->set_seed(NewSeed());
  }
  upstream.set_drafter(options_.drafter.empty() && options_.pick_drafter
                           ? options_.pick_drafter(model->id)
                           : options_.drafter);
  ChooseMode(*verifier, &upstream);

  const RelayEnv env{.pool = pool_,
                     .stubs = stubs_,
                     .max_migrations = options_.max_migrations,
                     .migrations = &migrations_};
  call->Relay(env, *verifier, stub, std::move(upstream), context->deadline());
  return call;
}

std::string RouterService::AffinityText(const std::string& model,
                                        const v1::GenerateRequest& request) {
  // The model first, then the input in the order the verifier reads it; separators that
  // prompts do not contain keep one message's end from reading as another's start. Only what
  // PrefixAffinity::Keys reads is copied.
  constexpr size_t kLimit =
      router::PrefixAffinity::kChunkBytes * router::PrefixAffinity::kMaxChunks;
  std::string text = model;
  text += '\0';
  auto add = [&text](std::string_view part) {
    if (text.size() < kLimit) text.append(part.substr(0, kLimit - text.size()));
  };
  switch (request.input_case()) {
    case v1::GenerateRequest::kPrompt:
      add(request.prompt());
      break;
    case v1::GenerateRequest::kChat:
      for (const v1::ChatMessage& message : request.chat().messages()) {
        if (text.size() >= kLimit) break;
        add(message.role());
        add("\x1f");
        add(message.content());
        add("\x1e");
      }
      break;
    case v1::GenerateRequest::kTokenIds:
      for (int32_t id : request.token_ids().ids()) {
        if (text.size() >= kLimit) break;
        add(std::string_view(reinterpret_cast<const char*>(&id), sizeof(id)));
      }
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  return text;
}

router::VerifierPool::Gain RouterService::GainOf(const v1::GenerateRequest& request) const {
  // A pinned mode's verifier is chosen by balancing alone: the gain estimates the best mode.
  if (options_.mode_policy == nullptr || (!request.mode().empty() && request.mode() != "auto")) {
    return nullptr;
  }
  const router::ModeRequestTraits traits{.greedy = request.sampling().temperature() <= 0,
                                         .lossless_only = NeedsLossless(request),
                                         .max_tokens = request.max_tokens()};
  const router::ModePolicy* policy = options_.mode_policy;
  return [policy, traits](const router::VerifierInfo& info, const router::VerifierLoad* load,
                          double streams) -> std::optional<double> {
    if (load == nullptr) return std::nullopt;
    // The same load measure as ChooseMode's, before and after this request.
    const double now = router::EstimatedSequences(load, streams);
    const std::optional<double> with = policy->BestGoodput(info.modes, load->cost, now + 1, traits);
    if (!with) return std::nullopt;
    if (now < 1) return *with;
    const std::optional<double> without = policy->BestGoodput(info.modes, load->cost, now, traits);
    if (!without) return std::nullopt;
    return *with - *without;
  };
}

void RouterService::ChooseMode(size_t verifier, v1::VerifyRequest* upstream) {
  v1::GenerateRequest& request = *upstream->mutable_request();
  if (!request.mode().empty() && request.mode() != "auto") {
    if (options_.metrics != nullptr) options_.metrics->AddModeDecision(request.mode(), "pinned");
    return;
  }
  if (options_.mode_policy == nullptr) {
    if (options_.metrics != nullptr) options_.metrics->AddModeDecision("auto", "default");
    return;
  }
  const std::optional<router::VerifierInfo> info = pool_->Info(verifier);
  const std::shared_ptr<const router::VerifierLoad> load = pool_->Load(verifier);
  const CostModel empty;
  // The router's own streams on the verifier (this one included: Acquire counted it), held at
  // their recent average while requests that replace finished ones arrive; the report adds
  // other routers' streams.
  const double sequences =
      std::max(1.0, router::EstimatedSequences(load.get(), pool_->Streams(verifier)));
  const router::ModeDecision decision = options_.mode_policy->Decide(
      pool_->address(verifier), info ? info->modes : std::vector<std::string>(),
      load != nullptr ? load->cost : empty, sequences,
      router::ModeRequestTraits{.greedy = request.sampling().temperature() <= 0,
                                .lossless_only = NeedsLossless(request),
                                .max_tokens = request.max_tokens()},
      info ? info->default_mode : std::string());
  // "auto" stays "auto" (no data and a verifier that names no default): its default runs it.
  if (decision.mode != "auto") request.set_mode(decision.mode);
  if (options_.metrics != nullptr) {
    options_.metrics->AddModeDecision(decision.mode, decision.reason);
    for (const auto& [mode, goodput] : decision.estimates) {
      options_.metrics->SetModeGoodputEstimate(mode, goodput);
    }
  }
}

grpc::ServerUnaryReactor* RouterService::ListModels(grpc::CallbackServerContext* context,
                                                    const v1::ListModelsRequest* /*request*/,
                                                    v1::ListModelsResponse* reply) {
  if (grpc::Status auth = options_.api_keys.CheckGrpc(*context); !auth.ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(auth);
    return reactor;
  }
  for (const router::ModelDescription& model : pool_->Models()) {
    v1::ModelInfo* info = reply->add_models();
    info->set_id(model.id);
    for (const std::string& mode : model.modes) info->add_modes(mode);
    info->set_max_context(model.max_context);
    info->set_tool_call_syntax(model.tool_call_syntax);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
