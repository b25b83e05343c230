#include "services/verifier/grpc_draft_channel.h"

#include <atomic>
#include <bit>
#include <chrono>
#include <deque>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tandem/v1/drafter.grpc.pb.h"

namespace tandem {

namespace v1 = ::tandem::v1;

// State shared by the channel and its stream reactor (which may outlive the channel's calls
// until OnDone).
struct GrpcDraftChannel::Core {
  std::string address;
  ChainCallback on_chain;
  size_t max_queued = 0;
  std::unique_ptr<v1::Drafter::Stub> stub;
  grpc::ClientContext context;
  Stream* stream = nullptr;  // set before the call starts; valid until `done`
  std::atomic<bool> healthy{true};
  absl::Notification done;  // the reactor's OnDone ran

  absl::Mutex mu;
  std::deque<v1::DraftClientMessage> queue ABSL_GUARDED_BY(mu);  // behind the write in flight
  bool write_in_flight ABSL_GUARDED_BY(mu) = false;
  bool broken ABSL_GUARDED_BY(mu) = false;
  std::unordered_set<uint64_t> open ABSL_GUARDED_BY(mu);  // sessions whose chains we deliver

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
      v1::DraftClientMessage message, const std::function<void()>& update);
  // The write in flight completed; the next message to write, if any.
  std::optional<v1::DraftClientMessage> NextWrite();
  // Ends the channel for good and reports an error to every open session (unless `quiet`).
  void Break(const std::string& reason, bool quiet = false);
  // Delivers a chain read from the stream if its session is still open here.
  void Deliver(DraftChain chain);
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
      core_->Break("the stream ended");
      return;
    }
    DraftChain chain{.session = in_.session(),
                     .from = in_.from(),
                     .tokens = std::vector<int32_t>(in_.tokens().begin(), in_.tokens().end()),
                     .slots = std::vector<int32_t>(in_.slots().begin(), in_.slots().end())};
    if (!in_.error().empty()) {
      chain.error =
          absl::UnavailableError(absl::StrCat("drafter at ", core_->address, ": ", in_.error()));
    }
    core_->Deliver(std::move(chain));
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      core_->Break("a write failed");
      return;
    }
    if (std::optional<v1::DraftClientMessage> next = core_->NextWrite()) Write(std::move(*next));
  }

  void OnDone(const grpc::Status& status) override {
    core_->Break(absl::StrCat("the stream ended: ", status.error_message()));
    std::shared_ptr<Core> core = std::move(core_);
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

static_assert(std::endian::native == std::endian::little,
              "hidden states travel as little-endian bf16 and are copied as they are");

void ToWire(const HiddenRows& rows, v1::HiddenStates* wire) {
  wire->set_num_layers(rows.layers);
  wire->set_num_tokens(rows.tokens);
  wire->set_hidden_size(rows.hidden_size);
  wire->set_offset(rows.offset);
  wire->set_bf16(reinterpret_cast<const char*>(rows.bf16.data()),
                 rows.bf16.size() * sizeof(uint16_t));
}

}  // namespace

absl::StatusOr<std::optional<v1::DraftClientMessage>> GrpcDraftChannel::Core::Enqueue(
    v1::DraftClientMessage message, const std::function<void()>& update) {
  bool overflow = false;
  {
    absl::MutexLock lock(&mu);
    if (broken) {
      return absl::UnavailableError(
          absl::StrCat("the draft stream to ", address, " is broken; open a new channel"));
    }
    if (update) update();
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
    Break(absl::StrCat("more than ", max_queued, " messages are waiting for it to read"));
  }
  return absl::UnavailableError(absl::StrCat("the drafter at ", address,
                                             " stopped reading its draft stream; the channel "
                                             "is closed"));
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

void GrpcDraftChannel::Core::Break(const std::string& reason, bool quiet) {
  std::unordered_set<uint64_t> sessions;
  {
    absl::MutexLock lock(&mu);
    if (broken) return;
    broken = true;
    healthy = false;
    queue.clear();
    sessions.swap(open);
  }
  context.TryCancel();
  if (quiet) return;
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
                                                           size_t max_queued) {
  auto core = std::make_shared<Core>();
  core->address = std::move(address);
  core->on_chain = std::move(on_chain);
  core->max_queued = max_queued;
  core->stub = v1::Drafter::NewStub(std::move(channel));
  core->stream = new Stream(core);
  core->stream->Start();
  core->info_context.set_deadline(std::chrono::system_clock::now() + kInfoDeadline);
  // The destructor waits for the call to end, so the core outlives the callback.
  Core* raw = core.get();
  raw->stub->async()->GetInfo(&raw->info_context, &raw->info_request, &raw->info,
                              [raw](grpc::Status status) {
                                if (status.ok()) {
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
  core_->Break("the channel was closed", /*quiet=*/true);
  core_->stream->ReleaseHold();
  core_->done.WaitForNotification();
  core_->info_done.WaitForNotification();
}

absl::Status GrpcDraftChannel::Open(uint64_t session, std::span<const int32_t> tokens, int gamma,
                                    const HiddenRows& hidden, int block_size) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_open()->mutable_tokens()->Add(tokens.begin(), tokens.end());
  message.mutable_open()->set_gamma(gamma);
  message.mutable_open()->set_block_size(block_size);
  if (!hidden.empty()) ToWire(hidden, message.mutable_open()->mutable_hidden());
  Core* core = core_.get();
  auto write = core->Enqueue(std::move(message), [core, session]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    core->open.insert(session);
  });
  if (!write.ok()) return write.status();
  if (*write) core->stream->Write(std::move(**write));
  return absl::OkStatus();
}

absl::Status GrpcDraftChannel::Advance(uint64_t session, int offset,
                                       std::span<const int32_t> append, int gamma,
                                       const HiddenRows& hidden) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_advance()->set_offset(offset);
  message.mutable_advance()->mutable_append()->Add(append.begin(), append.end());
  message.mutable_advance()->set_gamma(gamma);
  if (!hidden.empty()) ToWire(hidden, message.mutable_advance()->mutable_hidden());
  auto write = core_->Enqueue(std::move(message), nullptr);
  if (!write.ok()) return write.status();
  if (*write) core_->stream->Write(std::move(**write));
  return absl::OkStatus();
}

void GrpcDraftChannel::Close(uint64_t session) {
  v1::DraftClientMessage message;
  message.set_session(session);
  message.mutable_close();
  Core* core = core_.get();
  auto write = core->Enqueue(std::move(message), [core, session]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    core->open.erase(session);
  });
  if (write.ok() && *write) core->stream->Write(std::move(**write));
}

bool GrpcDraftChannel::healthy() const { return core_->healthy; }

std::vector<int32_t> GrpcDraftChannel::hidden_layers() const {
  absl::MutexLock lock(&core_->info_mu);
  return core_->hidden_layers;
}

bool GrpcDraftChannel::WaitForInfo(absl::Duration timeout) const {
  return core_->info_done.WaitForNotificationWithTimeout(timeout);
}

DraftChannelFactory MakeGrpcDraftChannelFactory(ClientTlsFlags tls) {
  return [tls = std::move(tls)](const std::string& address, DraftChannel::ChainCallback on_chain)
             -> absl::StatusOr<std::unique_ptr<DraftChannel>> {
    absl::StatusOr<std::shared_ptr<grpc::Channel>> channel = MakeChannel(address, tls);
    if (!channel.ok()) return channel.status();
    return std::unique_ptr<DraftChannel>(
        GrpcDraftChannel::Create(std::move(*channel), address, std::move(on_chain)));
  };
}

}  // namespace tandem
