#include "services/verifier/grpc_draft_channel.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <deque>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "services/common/metrics.h"
#include "tandem/v1/drafter.grpc.pb.h"

namespace tandem {

namespace v1 = ::tandem::v1;

// State shared by the channel and its stream reactor (which may outlive the channel's calls
// until OnDone).
struct GrpcDraftChannel::Core {
  std::string address;
  ChainCallback on_chain;
  size_t max_queued = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Drafter::Stub> stub;
  grpc::ClientContext context;
  Stream* stream = nullptr;  // set before the call starts; valid until `done`
  std::atomic<bool> healthy{true};
  absl::Notification done;  // the reactor's OnDone ran

  absl::Mutex mu;
  std::deque<v1::DraftClientMessage> queue ABSL_GUARDED_BY(mu);  // behind the write in flight
  bool write_in_flight ABSL_GUARDED_BY(mu) = false;
  bool broken ABSL_GUARDED_BY(mu) = false;
  std::string broken_reason ABSL_GUARDED_BY(mu);
  std::unordered_set<uint64_t> open ABSL_GUARDED_BY(mu);  // sessions whose chains we deliver

  // Hidden states: encoded under `mu`, so that NCCL payloads go in the order of the writes.
  DraftHiddenTransportOptions hidden_options;
  std::unique_ptr<HiddenSender> hidden_sender ABSL_GUARDED_BY(mu) =
      std::make_unique<BytesHiddenSender>();
  NcclPeerLink* nccl_link ABSL_GUARDED_BY(mu) = nullptr;  // part of `hidden_sender`
  // kPending: setup sent, bytes until the drafter says ready; kFailed: bytes for good.
  enum class Nccl { kOff, kPending, kReady, kFailed };
  Nccl nccl ABSL_GUARDED_BY(mu) = Nccl::kOff;
  bool nccl_required ABSL_GUARDED_BY(mu) = false;

  // Serialises deliveries to `on_chain`, so a session's error chain is its last one.
  absl::Mutex delivery_mu;

  // The drafter's GetInfo call, made once at creation.
  grpc::ClientContext info_context;
  v1::WorkerInfoRequest info_request;
  v1::WorkerInfo info;
  absl::Notification info_done;
  mutable absl::Mutex info_mu;
  std::vector<int32_t> hidden_layers ABSL_GUARDED_BY(info_mu);

  // Queues `message` (after `update` ran under the lock); returns the message to write now when
  // no write was in flight.
  absl::StatusOr<std::optional<v1::DraftClientMessage>> Enqueue(
      v1::DraftClientMessage message, const std::function<void(v1::DraftClientMessage&)>& update);
  // Queues `message` and writes it when nothing is in flight; an error when the stream broke.
  absl::Status Send(v1::DraftClientMessage message,
                    const std::function<void(v1::DraftClientMessage&)>& update);
  // The write in flight completed; the next message to write, if any.
  std::optional<v1::DraftClientMessage> NextWrite();
  // Ends the channel for good and reports an error to every open session (unless `quiet`).
  // `kind` labels tandem_draft_stream_breaks_total (ended, write_failed, backlog,
  // hidden_transport); a quiet break (the channel's own close) is neither logged nor counted.
  void Break(const char* kind, const std::string& reason, bool quiet = false);
  // Delivers a chain read from the stream if its session is still open here.
  void Deliver(DraftChain chain);

  // The drafter's GetInfo said it wants hidden states: chooses their transport and, for NCCL,
  // sends the setup and starts joining the communicator.
  void SetUpHiddenTransport(const HiddenTransportEnd& drafter);
  // The drafter's answer to the setup.
  void OnPeerTransportStatus(const v1::HiddenTransportStatus& status);
  // This side's NCCL endpoint is ready (OK) or failed.
  void OnLocalTransportStatus(const absl::Status& status);
  // NCCL will not (or no longer) carry this stream's hidden states: bytes from now on, or the
  // channel breaks when NCCL was required.
  void NcclFailed(const std::string& reason);
  void Log(const std::string& line) const {
    std::fprintf(stderr, "%s: draft stream to %s: %s\n", hidden_options.log_name.c_str(),
                 address.c_str(), line.c_str());
  }
  void Count(const char* transport) const {
    if (hidden_options.metrics != nullptr) {
      hidden_options.metrics->AddHiddenTransportStream(transport);
    }
  }
};

class GrpcDraftChannel::Stream final
    : public grpc::ClientBidiReactor<v1::DraftClientMessage, v1::DraftChain> {
 public:
  explicit Stream(std::shared_ptr<Core> core) : core_(std::move(core)) {}

  void Start() {
    core_->stub->async()->Draft(&core_->context, this);
    // Writes start from the verifier's threads, outside any reaction: the hold keeps OnDone
    // (and the reactor's deletion) away until the channel is destroyed.
    AddHold();
    StartRead(&in_);
    StartCall();
  }

  // Only with the write slot granted by Enqueue or NextWrite.
  void Write(v1::DraftClientMessage message) {
    out_ = std::move(message);
    StartWrite(&out_);
  }

  void ReleaseHold() { RemoveHold(); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      core_->Break("ended", "the stream ended (the drafter closed it or the connection was lost)");
      return;
    }
    if (in_.has_hidden_transport()) {
      core_->OnPeerTransportStatus(in_.hidden_transport());
      StartRead(&in_);
      return;
    }
    DraftChain chain{.session = in_.session(),
                     .from = in_.from(),
                     .tokens = std::vector<int32_t>(in_.tokens().begin(), in_.tokens().end()),
                     .slots = std::vector<int32_t>(in_.slots().begin(), in_.slots().end()),
                     .branch = in_.branch()};
    if (!in_.error().empty()) {
      chain.error =
          absl::UnavailableError(absl::StrCat("drafter at ", core_->address, ": ", in_.error()));
    }
    core_->Deliver(std::move(chain));
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      core_->Break("write_failed", "a write failed");
      return;
    }
    if (std::optional<v1::DraftClientMessage> next = core_->NextWrite()) Write(std::move(*next));
  }

  void OnDone(const grpc::Status& status) override {
    core_->Break("ended", absl::StrCat("the stream ended: ", status.error_message()));
    // OnDone runs once the channel's destructor released the hold, and that destructor keeps
    // its reference to the core until `done`: drop ours first, so the core (and the
    // grpc::Channel it holds) is never destroyed on this gRPC callback thread. gRPC 1.51 tears
    // down its shared callback completion queue when the last channel using it goes, and doing
    // that from one of that queue's own threads crashes the process.
    Core* core = core_.get();
    core_.reset();
    delete this;
    core->done.Notify();
  }

 private:
  std::shared_ptr<Core> core_;
  v1::DraftChain in_;
  v1::DraftClientMessage out_;  // the write in flight
};

namespace {

constexpr auto kInfoDeadline = std::chrono::seconds(10);

}  // namespace

absl::StatusOr<std::optional<v1::DraftClientMessage>> GrpcDraftChannel::Core::Enqueue(
    v1::DraftClientMessage message, const std::function<void(v1::DraftClientMessage&)>& update) {
  bool overflow = false;
  {
    absl::MutexLock lock(&mu);
    if (broken) {
      return absl::UnavailableError(absl::StrCat("the draft stream to ", address, " is broken (",
                                                 broken_reason, "); open a new channel"));
    }
    if (update) update(message);
    if (!write_in_flight) {
      write_in_flight = true;
      return std::optional<v1::DraftClientMessage>(std::move(message));
    }
    if (queue.size() < max_queued) {
      queue.push_back(std::move(message));
      return std::optional<v1::DraftClientMessage>();
    }
    overflow = true;
  }
  if (overflow) {
    Break("backlog",
          absl::StrCat("more than ", max_queued, " messages are waiting for it to read"));
  }
  return absl::UnavailableError(absl::StrCat("the drafter at ", address,
                                             " stopped reading its draft stream; the channel "
                                             "is closed"));
}

absl::Status GrpcDraftChannel::Core::Send(
    v1::DraftClientMessage message, const std::function<void(v1::DraftClientMessage&)>& update) {
  auto write = Enqueue(std::move(message), update);
  if (!write.ok()) return write.status();
  if (*write) stream->Write(std::move(**write));
  return absl::OkStatus();
}

std::optional<v1::DraftClientMessage> GrpcDraftChannel::Core::NextWrite() {
  absl::MutexLock lock(&mu);
  if (broken || queue.empty()) {
    write_in_flight = false;
    return std::nullopt;
  }
  v1::DraftClientMessage next = std::move(queue.front());
  queue.pop_front();
  return next;
}

void GrpcDraftChannel::Core::Break(const char* kind, const std::string& reason, bool quiet) {
  std::unordered_set<uint64_t> sessions;
  {
    absl::MutexLock lock(&mu);
    if (broken) return;
    broken = true;
    broken_reason = reason;
    // Counted before it shows as unhealthy: whoever sees healthy() false sees the break counted.
    if (!quiet && hidden_options.metrics != nullptr) {
      hidden_options.metrics->AddDraftStreamBreak(kind);
    }
    healthy = false;
    queue.clear();
    sessions.swap(open);
  }
  context.TryCancel();
  if (quiet) return;
  // Visible: its sequences now decode without drafts (as AR steps) until a new channel opens.
  Log(absl::StrCat("broke (", reason, "); its ", sessions.size(),
                   " open sessions decode without drafts from now on"));
  absl::MutexLock lock(&delivery_mu);
  for (uint64_t session : sessions) {
    on_chain(DraftChain{
        .session = session,
        .error = absl::UnavailableError(
            absl::StrCat("draft stream to ", address, " broke (", reason, "); no more drafts")),
    });
  }
}

void GrpcDraftChannel::Core::Deliver(DraftChain chain) {
  absl::MutexLock delivery(&delivery_mu);
  {
    absl::MutexLock lock(&mu);
    auto it = open.find(chain.session);
    // A session closed here (or already ended) may still have chains on the wire.
    if (it == open.end()) return;
    if (!chain.error.ok()) open.erase(it);
  }
  on_chain(std::move(chain));
}

std::unique_ptr<GrpcDraftChannel> GrpcDraftChannel::Create(std::shared_ptr<grpc::Channel> channel,
                                                           std::string address,
                                                           ChainCallback on_chain,
                                                           size_t max_queued,
                                                           DraftHiddenTransportOptions hidden) {
  auto core = std::make_shared<Core>();
  core->hidden_options = std::move(hidden);
  core->address = std::move(address);
  core->on_chain = std::move(on_chain);
  core->max_queued = max_queued;
  core->channel = channel;
  core->stub = v1::Drafter::NewStub(std::move(channel));
  core->stream = new Stream(core);
  core->stream->Start();
  core->info_context.set_deadline(std::chrono::system_clock::now() + kInfoDeadline);
  // The destructor waits for the call to end, so the core outlives the callback.
  Core* raw = core.get();
  raw->stub->async()->GetInfo(&raw->info_context, &raw->info_request, &raw->info,
                              [raw](grpc::Status status) {
                                if (status.ok()) {
                                  // Before the layers are published, so that the setup is
                                  // on the stream ahead of any hidden states.
                                  if (raw->info.hidden_layers_size() > 0) {
                                    raw->SetUpHiddenTransport(FromInfo(raw->info));
                                  }
                                  absl::MutexLock lock(&raw->info_mu);
                                  raw->hidden_layers.assign(raw->info.hidden_layers().begin(),
                                                            raw->info.hidden_layers().end());
                                }
                                raw->info_done.Notify();
                              });
  return std::unique_ptr<GrpcDraftChannel>(new GrpcDraftChannel(std::move(core)));
}

GrpcDraftChannel::GrpcDraftChannel(std::shared_ptr<Core> core) : core_(std::move(core)) {}

GrpcDraftChannel::~GrpcDraftChannel() {
  core_->info_context.TryCancel();
  core_->Break("closed", "the channel was closed", /*quiet=*/true);
  core_->stream->ReleaseHold();
  core_->done.WaitForNotification();
  core_->info_done.WaitForNotification();
  // Stops the NCCL endpoint's thread (its callbacks use the core) and ends its communicator.
  std::unique_ptr<HiddenSender> sender;
  {
    absl::MutexLock lock(&core_->mu);
    sender = std::move(core_->hidden_sender);
    core_->nccl_link = nullptr;
  }
  sender.reset();
}

absl::Status GrpcDraftChannel::Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                                    const HiddenRows& hidden, int block_size,
                                    const std::optional<DraftGrammar>& grammar) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_open()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  message.mutable_open()->set_gamma(gamma);
  message.mutable_open()->set_block_size(block_size);
  if (grammar.has_value()) {
    v1::DraftOpen* open = message.mutable_open();
    open->set_grammar_type(GrammarTypeName(grammar->spec.kind));
    open->set_grammar_schema(grammar->spec.text);
    open->set_prompt_len(grammar->prompt_len);
    open->mutable_stop_token_ids()->Add(grammar->stop_tokens.begin(), grammar->stop_tokens.end());
  }
  // The open carries every token, so its rows' pieces after the first are rows alone.
  const int length = static_cast<int>(tokens.size());
  std::vector<HiddenPiece> pieces = SplitHiddenRows(length, 0, hidden, kMaxHiddenBytesPerMessage);
  Core* core = core_.get();
  const HiddenRows& first = pieces.front().rows;
  absl::Status sent =
      core->Send(std::move(message),
                 [core, session, &first](v1::DraftClientMessage& m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                   core->open.insert(session);
                   if (!first.empty()) {
                     core->hidden_sender->Encode(first, m.mutable_open()->mutable_hidden());
                   }
                 });
  for (size_t i = 1; i < pieces.size() && sent.ok(); ++i) {
    sent = SendAdvance(session, length, {}, 0, pieces[i].rows);
  }
  return sent;
}

absl::Status GrpcDraftChannel::Advance(uint64_t session, int offset,
                                       std::span<const int32_t> append, int gamma,
                                       const HiddenRows& hidden) {
  const std::vector<HiddenPiece> pieces =
      SplitHiddenRows(offset, static_cast<int>(append.size()), hidden, kMaxHiddenBytesPerMessage);
  absl::Status sent;
  for (size_t i = 0; i < pieces.size() && sent.ok(); ++i) {
    const HiddenPiece& p = pieces[i];
    const bool last = i + 1 == pieces.size();
    sent = SendAdvance(session, offset + p.append_begin,
                       append.subspan(p.append_begin, p.append_end - p.append_begin),
                       last ? gamma : 0, p.rows);
  }
  return sent;
}

absl::Status GrpcDraftChannel::SendAdvance(uint64_t session, int offset,
                                           std::span<const int32_t> append, int gamma,
                                           const HiddenRows& hidden) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_advance()->set_offset(offset);
  message.mutable_advance()->mutable_append()->Add(append.begin(), append.end());
  message.mutable_advance()->set_gamma(gamma);
  if (hidden.empty()) return core_->Send(std::move(message), nullptr);
  Core* core = core_.get();
  return core->Send(std::move(message),
                    [core, &hidden](v1::DraftClientMessage& m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                      core->hidden_sender->Encode(hidden, m.mutable_advance()->mutable_hidden());
                    });
}

std::vector<HiddenPiece> SplitHiddenRows(int have, int append, const HiddenRows& rows,
                                         size_t max_bytes) {
  const size_t token_bytes =
      static_cast<size_t>(rows.layers) * static_cast<size_t>(rows.hidden_size) * sizeof(uint16_t);
  std::vector<HiddenPiece> pieces;
  if (rows.device != nullptr || rows.tokens <= 1 ||
      token_bytes * static_cast<size_t>(rows.tokens) <= max_bytes) {
    pieces.push_back(HiddenPiece{.append_begin = 0, .append_end = append, .rows = rows});
    return pieces;
  }
  const int per_piece = static_cast<int>(std::max<size_t>(1, max_bytes / token_bytes));
  const size_t row_values = static_cast<size_t>(rows.hidden_size);
  int sent = 0;  // tokens of `append` in earlier pieces
  for (int first = 0; first < rows.tokens; first += per_piece) {
    const int count = std::min(per_piece, rows.tokens - first);
    HiddenRows piece{.layers = rows.layers,
                     .tokens = count,
                     .hidden_size = rows.hidden_size,
                     .offset = rows.offset + first};
    piece.bf16.reserve(static_cast<size_t>(rows.layers) * count * row_values);
    for (int layer = 0; layer < rows.layers; ++layer) {
      const auto begin =
          rows.bf16.begin() +
          static_cast<std::ptrdiff_t>(
              (static_cast<size_t>(layer) * rows.tokens + static_cast<size_t>(first)) * row_values);
      piece.bf16.insert(piece.bf16.end(), begin,
                        begin + static_cast<std::ptrdiff_t>(count * row_values));
    }
    // A row goes with its token or after it: the tokens up to this piece's last row.
    const int needed = std::clamp(piece.offset + count - have, sent, append);
    pieces.push_back(
        HiddenPiece{.append_begin = sent, .append_end = needed, .rows = std::move(piece)});
    sent = needed;
  }
  pieces.back().append_end = append;
  return pieces;
}

void GrpcDraftChannel::Close(uint64_t session) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_close();
  Core* core = core_.get();
  core->Send(std::move(message), [core, session](v1::DraftClientMessage&)
                                     ABSL_NO_THREAD_SAFETY_ANALYSIS { core->open.erase(session); })
      .IgnoreError();
}

bool GrpcDraftChannel::healthy() const { return core_->healthy; }

bool GrpcDraftChannel::connected() const {
  // try_to_connect: a channel that went idle or failed starts connecting again now.
  return core_->channel->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY;
}

std::vector<int32_t> GrpcDraftChannel::hidden_layers() const {
  absl::MutexLock lock(&core_->info_mu);
  return core_->hidden_layers;
}

bool GrpcDraftChannel::WaitForInfo(absl::Duration timeout) const {
  return core_->info_done.WaitForNotificationWithTimeout(timeout);
}

HiddenTransportKind GrpcDraftChannel::hidden_transport() const {
  absl::MutexLock lock(&core_->mu);
  return core_->hidden_sender != nullptr ? core_->hidden_sender->kind()
                                         : HiddenTransportKind::kBytes;
}

void GrpcDraftChannel::Core::SetUpHiddenTransport(const HiddenTransportEnd& drafter) {
  const HiddenTransportChoice choice = ChooseHiddenTransport(hidden_options.local, drafter);
  v1::DraftClientMessage setup;
  setup.mutable_hidden_transport()->set_reason(choice.reason);
  if (choice.failed) {
    Log(absl::StrCat("hidden states cannot travel: ", choice.reason));
    Count("failed");
    Break("hidden_transport", absl::StrCat("hidden-state transport: ", choice.reason));
    return;
  }
  if (choice.kind == HiddenTransportKind::kBytes) {
    // Bytes need no setup message: the stream stays as an older verifier's.
    Log(absl::StrCat("hidden states go as in-stream bytes: ", choice.reason));
    Count("bytes");
    return;
  }
  const bool required = hidden_options.local.mode == HiddenTransportMode::kNccl ||
                        drafter.mode == HiddenTransportMode::kNccl;
  {
    // Pending before the endpoint starts: its failure may be reported at once.
    absl::MutexLock lock(&mu);
    nccl_required = required;
    nccl = Nccl::kPending;
  }
  absl::StatusOr<std::string> id = NewHiddenNcclUniqueId();
  if (!id.ok()) {
    NcclFailed(absl::StrCat("cannot make an ncclUniqueId: ", id.status().message()));
    return;
  }
  NcclHiddenOptions options = hidden_options.nccl;
  options.device = std::max(hidden_options.local.device, 0);
  absl::StatusOr<HiddenNcclSender> started = StartHiddenNcclSender(
      *id, options, [this](absl::Status status) { OnLocalTransportStatus(status); });
  if (!started.ok()) {
    NcclFailed(absl::StrCat("cannot start NCCL: ", started.status().message()));
    return;
  }
  {
    absl::MutexLock lock(&mu);
    hidden_sender = std::move(started->sender);
    if (nccl == Nccl::kFailed) return;  // the endpoint failed already (and said so)
    nccl_link = started->link;
  }
  Log(absl::StrCat("hidden states will go by NCCL once both sides joined (", choice.reason,
                   "); in-stream bytes until then"));
  setup.mutable_hidden_transport()->set_transport(v1::HIDDEN_TRANSPORT_NCCL);
  setup.mutable_hidden_transport()->set_nccl_unique_id(*id);
  Send(std::move(setup), nullptr).IgnoreError();
}

void GrpcDraftChannel::Core::OnPeerTransportStatus(const v1::HiddenTransportStatus& status) {
  if (!status.ready()) {
    NcclFailed(absl::StrCat("the drafter: ", status.error()));
    return;
  }
  {
    absl::MutexLock lock(&mu);
    if (nccl != Nccl::kPending || status.transport() != v1::HIDDEN_TRANSPORT_NCCL) return;
    nccl = Nccl::kReady;
    nccl_link->PeerStatus(status);
  }
  Log("hidden states now go by NCCL");
  Count("nccl");
}

void GrpcDraftChannel::Core::OnLocalTransportStatus(const absl::Status& status) {
  if (!status.ok()) NcclFailed(std::string(status.message()));
}

void GrpcDraftChannel::Core::NcclFailed(const std::string& reason) {
  bool required = false;
  {
    absl::MutexLock lock(&mu);
    if (nccl == Nccl::kFailed || nccl == Nccl::kOff) return;
    nccl = Nccl::kFailed;
    required = nccl_required;
    if (nccl_link != nullptr) {
      // The sender stops using NCCL for good: later hidden states go as bytes.
      v1::HiddenTransportStatus failed;
      failed.set_transport(v1::HIDDEN_TRANSPORT_NCCL);
      failed.set_error(reason);
      nccl_link->PeerStatus(failed);
    }
  }
  if (required) {
    Log(absl::StrCat("NCCL failed and --hidden-transport nccl forbids bytes: ", reason));
    Count("failed");
    Break("hidden_transport", absl::StrCat("NCCL hidden-state transport failed: ", reason));
    return;
  }
  Log(absl::StrCat("NCCL failed (", reason, "); hidden states go as in-stream bytes"));
  Count("bytes");
}

DraftChannelFactory MakeGrpcDraftChannelFactory(ClientFlags tls,
                                                DraftHiddenTransportOptions hidden) {
  return
      [tls = std::move(tls), hidden = std::move(hidden)](
          const std::string& address,
          DraftChannel::ChainCallback on_chain) -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
        absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, tls);
        if (!channel.ok()) return channel.status();
        return std::unique_ptr<DraftChannel>(GrpcDraftChannel::Create(
            std::move(*channel), address, std::move(on_chain), /*max_queued=*/4096, hidden));
      };
}

}  // namespace tandem
