#include "services/drafter/drafter_service.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/version.h"
#include "services/common/metrics.h"
#include "services/drafter/chain_outbox.h"

namespace tandem {

namespace {

namespace v1 = ::tandem::v1;

// A hidden-transport status travels through the outbox as a chain of this reserved session with
// `from` -1 (the engine's chains never have either), written as a DraftChain.hidden_transport.
constexpr uint64_t kTransportStatusSession = std::numeric_limits<uint64_t>::max();

DraftChain TransportStatusChain(const absl::Status& status) {
  return DraftChain{.session = kTransportStatusSession, .from = -1, .error = status};
}

bool IsTransportStatus(const DraftChain& chain) {
  return chain.session == kTransportStatusSession && chain.from == -1;
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
  DraftStream(DraftEngine* engine, const DrafterServiceOptions& options, std::string peer)
      : engine_(engine),
        options_(options),
        peer_(std::move(peer)),
        shared_(std::make_shared<Shared>(options.max_queued_chains)) {
    shared_->stream = this;
    stream_id_ = engine_->AddStream([shared = shared_](DraftChain chain) {
      // Runs on the engine thread, possibly after OnDone: the outbox is closed by then and
      // grants nothing, so `stream` is only used while it is alive.
      ChainOutbox::Action action = shared->outbox.Push(std::move(chain));
      if (action.write || action.finish) shared->stream->Apply(std::move(action));
    });
    StartRead(&in_);
  }

  ~DraftStream() override { ShutdownReceiver(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      // The verifier closed its side or the call ended: its sessions go with it.
      ShutdownReceiver();
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
    ShutdownReceiver();
    engine_->RemoveStream(stream_id_);
    Apply(shared_->outbox.Close(absl::CancelledError("the draft stream was cancelled")));
  }

  void OnDone() override {
    ShutdownReceiver();
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
    if (action.write && IsTransportStatus(*action.write)) {
      out_.Clear();
      v1::HiddenTransportStatus* status = out_.mutable_hidden_transport();
      status->set_transport(v1::HIDDEN_TRANSPORT_NCCL);
      status->set_ready(action.write->error.ok());
      status->set_error(std::string(action.write->error.message()));
      StartWrite(&out_);
    } else if (action.write) {
      const DraftChain& c = *action.write;
      out_.Clear();
      out_.set_session(c.session);
      out_.set_from(c.from);
      out_.mutable_tokens()->Add(c.tokens.begin(), c.tokens.end());
      out_.mutable_slots()->Add(c.slots.begin(), c.slots.end());
      out_.set_branch(c.branch);
      if (!c.error.ok()) out_.set_error(c.error.ToString());
      StartWrite(&out_);
    }
    if (action.finish) Finish(ToGrpc(*action.finish));
  }

  // The grammar an open asks to draft under, compiled (none without one, or when this drafter
  // does not compile grammars); InvalidArgument for one it cannot compile.
  absl::StatusOr<std::optional<DraftSessionGrammar>> SessionGrammar(const v1::DraftOpen& open) {
    if (open.grammar_type().empty() || options_.grammars == nullptr) return std::nullopt;
    absl::StatusOr<GrammarSpec::Kind> kind = GrammarKindOf(open.grammar_type());
    if (!kind.ok()) return kind.status();
    absl::StatusOr<std::shared_ptr<const Grammar>> compiled =
        options_.grammars->Compile({.kind = *kind, .text = open.grammar_schema()});
    if (!compiled.ok()) return compiled.status();
    return DraftSessionGrammar{.grammar = *std::move(compiled),
                               .prompt_len = open.prompt_len(),
                               .stop_tokens = std::vector<int32_t>(open.stop_token_ids().begin(),
                                                                   open.stop_token_ids().end())};
  }

  // Converts the wire message and hands it to the engine, which validates it. Every message
  // passes through the hidden-state receiver, which keeps them in order while an NCCL payload is
  // on its way.
  void Dispatch(const v1::DraftClientMessage& m) {
    if (!transport_known_ && ((m.has_open() && m.open().hidden().num_tokens() > 0) ||
                              (m.has_advance() && m.advance().hidden().num_tokens() > 0))) {
      // No setup came ahead of the first rows: bytes, as with an older verifier.
      transport_known_ = true;
      Log("hidden states arrive as in-stream bytes (the verifier set up no other transport)");
      Count("bytes");
    }
    DraftEngine* engine = engine_;
    const uint64_t stream = stream_id_;
    const uint64_t session = m.session();
    switch (m.kind_case()) {
      case v1::DraftClientMessage::kOpen: {
        absl::StatusOr<std::optional<DraftSessionGrammar>> grammar = SessionGrammar(m.open());
        Receive(&m.open().hidden(),
                [engine, stream, session,
                 tokens = std::vector<int32_t>(m.open().tokens().begin(), m.open().tokens().end()),
                 gamma = m.open().gamma(), block_size = m.open().block_size(),
                 grammar = std::move(grammar)](absl::StatusOr<HiddenRows> hidden) mutable {
                  if (!hidden.ok() || !grammar.ok()) {
                    engine->Reject(stream, session,
                                   hidden.ok() ? grammar.status() : hidden.status());
                    return;
                  }
                  engine->Open(stream, session, std::move(tokens), gamma, std::move(*hidden),
                               block_size, *std::move(grammar));
                });
        break;
      }
      case v1::DraftClientMessage::kAdvance: {
        Receive(&m.advance().hidden(),
                [engine, stream, session, offset = m.advance().offset(),
                 append =
                     std::vector<int32_t>(m.advance().append().begin(), m.advance().append().end()),
                 gamma = m.advance().gamma()](absl::StatusOr<HiddenRows> hidden) mutable {
                  if (!hidden.ok()) {
                    engine->Reject(stream, session, hidden.status());
                    return;
                  }
                  engine->Advance(stream, session, offset, std::move(append), gamma,
                                  std::move(*hidden));
                });
        break;
      }
      case v1::DraftClientMessage::kClose:
        Receive(nullptr, [engine, stream, session](absl::StatusOr<HiddenRows>) {
          engine->Close(stream, session);
        });
        break;
      case v1::DraftClientMessage::kHiddenTransport:
        SetUpHiddenTransport(m.hidden_transport());
        break;
      case v1::DraftClientMessage::KIND_NOT_SET:
        Receive(nullptr, [engine, stream, session](absl::StatusOr<HiddenRows>) {
          engine->Reject(stream, session,
                         absl::InvalidArgumentError(
                             absl::StrCat("a message for session ", session,
                                          " carries no open, advance or close (a newer client?)")));
        });
        break;
    }
  }

  void Receive(const v1::HiddenStates* wire, HiddenReceiver::Done done) {
    absl::MutexLock lock(&receiver_mu_);
    if (receiver_ != nullptr) receiver_->Receive(wire, std::move(done));
  }

  void ShutdownReceiver() {
    std::unique_ptr<HiddenReceiver> receiver;
    {
      absl::MutexLock lock(&receiver_mu_);
      receiver = std::move(receiver_);
    }
    if (receiver != nullptr) receiver->Shutdown();
  }

  void Log(const std::string& line) const {
    std::fprintf(stderr, "tandem-drafter: draft stream from %s: %s\n", peer_.c_str(), line.c_str());
  }

  void Count(const char* transport) const {
    if (options_.metrics != nullptr) options_.metrics->AddHiddenTransportStream(transport);
  }

  // The verifier's choice of hidden-state transport (HiddenTransportSetup).
  void SetUpHiddenTransport(const v1::HiddenTransportSetup& setup) {
    transport_known_ = true;
    if (setup.transport() != v1::HIDDEN_TRANSPORT_NCCL) {
      Log(absl::StrCat("hidden states arrive as in-stream bytes: ", setup.reason()));
      Count("bytes");
      return;
    }
    const HiddenTransportEnd& local = options_.hidden_transport;
    const bool required = local.mode == HiddenTransportMode::kNccl;
    absl::StatusOr<std::unique_ptr<HiddenReceiver>> started = absl::FailedPreconditionError(
        absl::StrCat("this drafter cannot use NCCL: ", local.why_not));
    if (local.nccl) {
      NcclHiddenOptions nccl = options_.nccl;
      nccl.device = std::max(local.device, 0);
      if (options_.device_sink.take) {
        if (options_.device_sink.device == nccl.device) {
          nccl.device_sink = options_.device_sink.take;
        } else {
          Log(absl::StrCat("hidden states received by NCCL on GPU ", nccl.device,
                           " pass through the host: the DFlash drafter runs on GPU ",
                           options_.device_sink.device));
        }
      }
      // The status callback runs on the receiver's thread, possibly after OnDone: like the
      // engine's chains, it only reaches the stream through the outbox.
      started = StartHiddenNcclReceiver(
          setup.nccl_unique_id(), nccl,
          [shared = shared_, metrics = options_.metrics, peer = peer_,
           required](absl::Status status) {
            if (status.ok()) {
              std::fprintf(stderr,
                           "tandem-drafter: draft stream from %s: hidden states now arrive by "
                           "NCCL\n",
                           peer.c_str());
              if (metrics != nullptr) metrics->AddHiddenTransportStream("nccl");
            } else {
              std::fprintf(stderr,
                           "tandem-drafter: draft stream from %s: NCCL failed (%s); hidden "
                           "states arrive as in-stream bytes\n",
                           peer.c_str(), std::string(status.message()).c_str());
              if (metrics != nullptr)
                metrics->AddHiddenTransportStream(required ? "failed" : "bytes");
            }
            ChainOutbox::Action action = shared->outbox.Push(TransportStatusChain(status));
            if (action.write || action.finish) shared->stream->Apply(std::move(action));
          });
    }
    if (!started.ok()) {
      Log(absl::StrCat("cannot receive hidden states by NCCL (", started.status().message(),
                       "); in-stream bytes"));
      Count(required ? "failed" : "bytes");
      Apply(shared_->outbox.Push(
          TransportStatusChain(absl::UnavailableError(std::string(started.status().message())))));
      return;
    }
    Log(absl::StrCat("joining the verifier's NCCL communicator (", setup.reason(), ")"));
    absl::MutexLock lock(&receiver_mu_);
    // Bytes deliveries are inline: nothing of the old receiver is pending.
    if (receiver_ != nullptr) receiver_ = *std::move(started);
  }

  DraftEngine* engine_;
  const DrafterServiceOptions& options_;  // the service's, which outlives its streams
  const std::string peer_;
  std::shared_ptr<Shared> shared_;
  uint64_t stream_id_ = 0;
  bool transport_known_ = false;  // logged and counted (read side only)
  absl::Mutex receiver_mu_;
  // Null once the stream ended (no message reaches the engine after that).
  std::unique_ptr<HiddenReceiver> receiver_ ABSL_GUARDED_BY(receiver_mu_) =
      std::make_unique<BytesHiddenReceiver>();
  v1::DraftClientMessage in_;
  v1::DraftChain out_;  // the write in flight
};

}  // namespace

DrafterService::DrafterService(DraftEngine* engine, DrafterServiceOptions options)
    : engine_(engine), options_(std::move(options)) {}

namespace {

// A Draft stream refused before it starts (a call without the cluster token).
class RefusedDraftStream final
    : public grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain> {
 public:
  explicit RefusedDraftStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

grpc::ServerBidiReactor<v1::DraftClientMessage, v1::DraftChain>* DrafterService::Draft(
    grpc::CallbackServerContext* context) {
  if (grpc::Status auth = options_.peers.CheckGrpc(*context); !auth.ok()) {
    return new RefusedDraftStream(auth);
  }
  return new DraftStream(engine_, options_, context->peer());
}

grpc::ServerUnaryReactor* DrafterService::GetInfo(grpc::CallbackServerContext* context,
                                                  const v1::WorkerInfoRequest* /*request*/,
                                                  v1::WorkerInfo* info) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = options_.peers.CheckGrpc(*context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
  const ModelConfig& config = engine_->model_config();
  info->set_role("drafter");
  info->set_model(options_.model_id);
  info->add_modes(engine_->drafting());
  info->set_max_context(config.max_position_embeddings);
  info->set_vocab_size(config.vocab_size);
  info->set_version(VersionString());
  info->set_worker_id(options_.worker_id);
  for (int32_t layer : engine_->options().hidden_layers) info->add_hidden_layers(layer);
  *info->mutable_hidden_transport() = ToInfo(options_.hidden_transport);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* DrafterService::GetLoad(grpc::CallbackServerContext* context,
                                                  const v1::WorkerLoadRequest* /*request*/,
                                                  v1::WorkerLoad* load) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (grpc::Status auth = options_.peers.CheckGrpc(*context); !auth.ok()) {
    reactor->Finish(auth);
    return reactor;
  }
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
