#include "services/drafter/drafter_service.h"

#include <unistd.h>

#include <bit>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/version.h"
#include "services/drafter/chain_outbox.h"

namespace tandem {

namespace {

namespace v1 = ::tandem::v1;

static_assert(std::endian::native == std::endian::little,
              "hidden states travel as little-endian bf16 and are copied as they are");

// The wire's hidden states as rows (the engine checks their shape against what it asked for).
absl::StatusOr<HiddenRows> ToRows(const v1::HiddenStates& wire) {
  if (wire.bf16().size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("hidden states of ", wire.bf16().size(), " bytes are not whole bf16 values"));
  }
  HiddenRows rows{.layers = wire.num_layers(),
                  .tokens = wire.num_tokens(),
                  .hidden_size = wire.hidden_size(),
                  .offset = wire.offset(),
                  .bf16 = std::vector<uint16_t>(wire.bf16().size() / 2)};
  if (!rows.bf16.empty()) std::memcpy(rows.bf16.data(), wire.bf16().data(), wire.bf16().size());
  return rows;
}

grpc::Status ToGrpc(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

// One verifier's Draft stream. Deletes itself in OnDone.
//
// Writes start from the engine thread (a new chain) and from OnWriteDone (the next queued one);
// the outbox grants one at a time, and Finish only once no write is in flight, so the reactor
// is alive whenever a granted write starts.
class DraftStream final : public grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain> {
 public:
  DraftStream(DraftEngine* engine, size_t max_queued)
      : engine_(engine), shared_(std::make_shared<Shared>(max_queued)) {
    shared_->stream = this;
    stream_id_ = engine_->AddStream([shared = shared_](DraftChain chain) {
      // Runs on the engine thread, possibly after OnDone: the outbox is closed by then and
      // grants nothing, so `stream` is only used while it is alive.
      ChainOutbox::Action action = shared->outbox.Push(std::move(chain));
      if (action.write || action.finish) shared->stream->Apply(std::move(action));
    });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The verifier closed its side or the call ended: its sessions go with it.
      engine_->RemoveStream(stream_id_);
      Apply(shared_->outbox.Close(absl::OkStatus()));
      return;
    }
    Dispatch(in_);
    // Once finished (a reader that fell too far behind) nothing more is read.
    if (!shared_->outbox.closed()) StartRead(&in_);
  }

  void OnWriteDone(bool ok) override { Apply(shared_->outbox.WriteDone(ok)); }

  void OnCancel() override {
    engine_->RemoveStream(stream_id_);
    Apply(shared_->outbox.Close(absl::CancelledError("the draft stream was cancelled")));
  }

  void OnDone() override {
    engine_->RemoveStream(stream_id_);
    delete this;
  }

 private:
  struct Shared {
    explicit Shared(size_t max_queued) : outbox(max_queued) {}
    ChainOutbox outbox;
    DraftStream* stream = nullptr;
  };

  void Apply(ChainOutbox::Action action) {
    if (action.write) {
      const DraftChain& c = *action.write;
      out_.Clear();
      out_.set_session(c.session);
      out_.set_from(c.from);
      out_.mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
      out_.mutable_slots()->Add(c.slots.begin(), c.slots.end());
      if (!c.error.ok()) out_.set_error(c.error.ToString());
      StartWrite(&out_);
    }
    if (action.finish) Finish(ToGrpc(*action.finish));
  }

  // Converts the wire message and hands it to the engine, which validates it.
  void Dispatch(const v1::DraftClientMessage& m) {
    switch (m.kind_case()) {
      case v1::DraftClientMessage::kOpen: {
        absl::StatusOr<HiddenRows> hidden = ToRows(m.open().hidden());
        if (!hidden.ok()) {
          engine_->Reject(stream_id_, m.session(), hidden.status());
          break;
        }
        engine_->Open(stream_id_, m.session(),
                      std::vector<int32_t>(m.open().tokens().begin(), m.open().tokens().end()),
                      m.open().gamma(), std::move(*hidden), m.open().block_size());
        break;
      }
      case v1::DraftClientMessage::kAdvance: {
        absl::StatusOr<HiddenRows> hidden = ToRows(m.advance().hidden());
        if (!hidden.ok()) {
          engine_->Reject(stream_id_, m.session(), hidden.status());
          break;
        }
        engine_->Advance(
            stream_id_, m.session(), m.advance().offset(),
            std::vector<int32_t>(m.advance().append().begin(), m.advance().append().end()),
            m.advance().gamma(), std::move(*hidden));
        break;
      }
      case v1::DraftClientMessage::kClose:
        engine_->Close(stream_id_, m.session());
        break;
      case v1::DraftClientMessage::KIND_NOT_SET:
        engine_->Reject(stream_id_, m.session(),
                        absl::InvalidArgumentError(
                            absl::StrCat("a message for session ", m.session(),
                                         " carries no open, advance or close (a newer client?)")));
        break;
    }
  }

  DraftEngine* engine_;
  std::shared_ptr<Shared> shared_;
  uint64_t stream_id_ = 0;
  v1::DraftClientMessage in_;
  v1::DraftChain out_;  // the write in flight
};

}  // namespace

DrafterService::DrafterService(DraftEngine* engine, DrafterServiceOptions options)
    : engine_(engine), options_(std::move(options)) {}

grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain>* DrafterService::Draft(
    grpc::CallbackServerContext* /*context*/) {
  return new DraftStream(engine_, options_.max_queued_chains);
}

grpc::ServerUnaryReactor* DrafterService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::WorkerInfoRequest* /*request*/,
                                                  v1::WorkerInfo* info) {
  const ModelConfig& config = engine_->model_config();
  info->set_role("drafter");
  info->set_model(options_.model_id);
  info->add_modes("ar");
  info->set_max_context(config.max_position_embeddings);
  info->set_vocab_size(config.vocab_size);
  info->set_version(VersionString());
  info->set_worker_id(options_.worker_id);
  for (int32_t layer : engine_->options().hidden_layers) info->add_hidden_layers(layer);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DrafterService::GetLoad(grpc::CallbackServerContext* context,
                                                  const v1::WorkerLoadRequest* /*request*/,
                                                  v1::WorkerLoad* load) {
  const DraftEngineStats stats = engine_->Stats();
  load->set_worker_id(options_.worker_id);
  load->set_running_sequences(stats.sessions);
  load->set_queued_sequences(0);
  load->set_kv_usage_ratio(stats.kv_usage_ratio);
  load->set_kv_free_tokens(stats.kv_free_tokens);
  load->set_steps(stats.forwards);
  load->set_step_seconds_ewma(stats.step_seconds_ewma);
  load->set_batch_tokens_ewma(stats.batch_tokens_ewma);
  load->set_preemptions(stats.evictions);
  load->set_draining(draining_);
  load->set_sessions(stats.sessions);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

std::string MakeWorkerId(const std::string& role) {
  char host[256] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device random;
  return absl::StrFormat("%s-%s-%d-%08x", role, host[0] ? host : "localhost",
                         static_cast<int>(getpid()), random());
}

}  // namespace tandem
