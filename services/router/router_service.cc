#include "services/router/router_service.h"

#include <atomic>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "services/router/request_decode.h"

namespace tandem {

namespace {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// One Generate call. Two reactors drive it: the server side (this) writing to the client, and
// `upstream_` reading from the verifier. They take turns, so at most one of read and write is
// in flight and no lock is needed:
//
//   upstream read done (ok) -> StartWrite -> write done (ok) -> next upstream read ...
//   upstream read done (!ok), or write done (!ok: the client is gone) -> upstream OnDone
//   -> Finish with the upstream status -> server OnDone.
//
// The upstream call carries a hold until the relay will start no more reads, so its OnDone
// never races a read being started. The object deletes itself after both OnDones.
class RelayCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RelayCall(router::AdmissionGate* admission) : admission_(admission) {}

  // Ends the call at once (nothing upstream).
  void Fail(const grpc::Status& status) {
    refs_.store(1, std::memory_order_relaxed);
    Finish(status);
  }

  void Relay(router::VerifierPool* pool, size_t verifier, v1::Verifier::Stub* stub,
             v1::VerifyRequest request, std::chrono::system_clock::time_point deadline) {
    pool_ = pool;
    verifier_ = verifier;
    request_ = std::move(request);
    if (deadline != std::chrono::system_clock::time_point::max()) {
      upstream_context_.set_deadline(deadline);
    }
    stub->async()->Generate(&upstream_context_, &request_, &upstream_);
    upstream_.AddHold();
    upstream_.StartRead(&response_);
    upstream_.StartCall();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      // The client is gone: stop the verifier's work and read no more.
      upstream_context_.TryCancel();
      upstream_.RemoveHold();
      return;
    }
    upstream_.StartRead(&response_);
  }

  void OnCancel() override { upstream_context_.TryCancel(); }

  void OnDone() override { Unref(); }

 private:
  class Upstream final : public grpc::ClientReadReactor<v1::GenerateResponse> {
   public:
    explicit Upstream(RelayCall* call) : call_(call) {}
    void OnReadDone(bool ok) override { call_->OnUpstreamRead(ok); }
    void OnDone(const grpc::Status& status) override { call_->OnUpstreamDone(status); }

   private:
    RelayCall* call_;
  };

  ~RelayCall() override {
    if (admission_ != nullptr) admission_->Release();
  }

  void OnUpstreamRead(bool ok) {
    if (!ok) {
      upstream_.RemoveHold();  // the stream ended; OnUpstreamDone has its status
      return;
    }
    bool own_buffer = false;
    out_.Clear();  // serialization wants an empty buffer; the previous write has completed
    grpc::Status serialized =
        grpc::SerializationTraits<v1::GenerateResponse>::Serialize(response_, &out_, &own_buffer);
    if (!serialized.ok()) {
      failure_ =
          grpc::Status(grpc::StatusCode::INTERNAL,
                       "the router could not serialize a response: " + serialized.error_message());
      upstream_context_.TryCancel();
      upstream_.RemoveHold();
      return;
    }
    StartWrite(&out_);
  }

  void OnUpstreamDone(const grpc::Status& status) {
    pool_->Release(verifier_);
    // A verifier that cannot be reached is out until a poll finds it again.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) pool_->SetHealthy(verifier_, false);
    Finish(failure_.ok() ? status : failure_);
    Unref();
  }

  void Unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  router::AdmissionGate* admission_;  // released when the call ends; null when not admitted
  router::VerifierPool* pool_ = nullptr;
  size_t verifier_ = 0;
  grpc::ClientContext upstream_context_;
  v1::VerifyRequest request_;
  v1::GenerateResponse response_;  // the upstream message being relayed
  grpc::ByteBuffer out_;           // its bytes, being written to the client
  grpc::Status failure_;           // a router-side failure that overrides the upstream status
  Upstream upstream_{this};
  std::atomic<int> refs_{2};  // the server reactor and the upstream reactor
};

}  // namespace

RouterService::RouterService(router::VerifierPool* pool, std::vector<v1::Verifier::Stub*> stubs,
                             RouterOptions options)
    : pool_(pool),
      stubs_(std::move(stubs)),
      options_(std::move(options)),
      admission_(options_.max_in_flight) {}

grpc::ServerWriteReactor<grpc::ByteBuffer>* RouterService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  absl::StatusOr<v1::GenerateRequest> request = DecodeGenerateRequest(*raw);
  if (!request.ok()) {
    auto* call = new RelayCall(nullptr);
    call->Fail(ToGrpcStatus(request.status()));
    return call;
  }
  absl::StatusOr<router::ModelDescription> model = pool_->ResolveModel(request->model());
  absl::Status checked =
      model.ok() ? router::CheckRequest(ToRouterRequest(*request), *model) : model.status();
  if (!checked.ok()) {
    auto* call = new RelayCall(nullptr);
    call->Fail(ToGrpcStatus(checked));
    return call;
  }
  if (!admission_.TryAdmit()) {
    auto* call = new RelayCall(nullptr);
    call->Fail(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                            absl::StrCat("router is at capacity (", admission_.limit(),
                                         " requests in flight); retry later")));
    return call;
  }
  auto* call = new RelayCall(&admission_);
  absl::StatusOr<size_t> verifier = pool_->Acquire(model->id, request->mode());
  if (!verifier.ok()) {
    call->Fail(ToGrpcStatus(verifier.status()));
    return call;
  }
  v1::VerifyRequest upstream;
  *upstream.mutable_request() = std::move(*request);
  // "" named the only model; the verifier gets its id.
  upstream.mutable_request()->set_model(model->id);
  upstream.set_drafter(options_.drafter);
  call->Relay(pool_, *verifier, stubs_[*verifier], std::move(upstream), context->deadline());
  return call;
}

grpc::ServerUnaryReactor* RouterService::ListModels(grpc::CallbackServerContext* context,
                                                    const v1::ListModelsRequest* /*request*/,
                                                    v1::ListModelsResponse* reply) {
  for (const router::ModelDescription& model : pool_->Models()) {
    v1::ModelInfo* info = reply->add_models();
    info->set_id(model.id);
    for (const std::string& mode : model.modes) info->add_modes(mode);
    info->set_max_context(model.max_context);
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace tandem
