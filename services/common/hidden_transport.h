// How the target's hidden states travel from a verifier to a drafter on one Draft stream
// (proto/tandem/v1/drafter.proto, HiddenStates and HiddenTransportSetup).
//
// Two transports sit behind one sender / receiver interface, so the Draft channel and the
// drafter service do not care which one carries a message's rows:
//   - bytes: the rows ride in the message itself (HiddenStates.bf16). Always available and the
//     default until a stream has set up something else.
//   - nccl: the message carries the shape and a tag; the payload goes GPU to GPU by
//     ncclSend/ncclRecv on a 2-rank communicator (services/common/nccl_hidden_transport.h,
//     built with the CUDA backend only).
// ChooseHiddenTransport is the one policy deciding between them from both sides' capabilities
// and --hidden-transport flags; it is pure, so every case is tested without a GPU.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "tandem/v1/drafter.pb.h"
#include "tandem/v1/worker.pb.h"
#include "worker/engine/draft_channel.h"

namespace CLI {
class App;
}

namespace tandem {

// --hidden-transport: auto = NCCL when both sides can and their GPUs differ, else bytes;
// bytes = never NCCL; nccl = NCCL or a clear failure (at startup when this process cannot, per
// stream when its peer cannot).
enum class HiddenTransportMode { kAuto, kBytes, kNccl };
enum class HiddenTransportKind { kBytes, kNccl };

std::string_view HiddenTransportModeName(HiddenTransportMode mode);  // "auto" | "bytes" | "nccl"
std::string_view HiddenTransportKindName(HiddenTransportKind kind);  // "bytes" | "nccl"
absl::StatusOr<HiddenTransportMode> ParseHiddenTransportMode(std::string_view name);

// Adds --hidden-transport (env <env_prefix>_HIDDEN_TRANSPORT).
void AddHiddenTransportFlag(CLI::App& app, HiddenTransportMode* mode, std::string_view env_prefix);

// One side of a stream: its flag and whether (and on which GPU) it can use NCCL.
struct HiddenTransportEnd {
  HiddenTransportMode mode = HiddenTransportMode::kAuto;
  bool nccl = false;
  std::string why_not;   // when !nccl: why, in words
  std::string gpu_uuid;  // hex of cudaDeviceProp::uuid of the GPU it would use
  std::string hostname;
  int device = -1;  // this process only: the CUDA device it would use
};

// This process's side under `mode`: probes CUDA and NCCL when built with them (the current CUDA
// device, as the model uses it). Never fails: a side that cannot says why in `why_not`.
HiddenTransportEnd LocalHiddenTransport(HiddenTransportMode mode);
// The startup check of --hidden-transport: an error naming why when the flag is nccl and this
// process cannot use NCCL.
absl::Status CheckHiddenTransportFlag(const HiddenTransportEnd& local);

// WorkerInfo.hidden_transport and back. A peer that says nothing (an older binary) cannot.
v1::HiddenTransportInfo ToInfo(const HiddenTransportEnd& end);
HiddenTransportEnd FromInfo(const v1::WorkerInfo& info);

struct HiddenTransportChoice {
  HiddenTransportKind kind = HiddenTransportKind::kBytes;
  // NCCL was required (either side's flag) but is impossible: the stream's sessions fail with
  // `reason` instead of silently sending bytes.
  bool failed = false;
  std::string reason;  // why this choice, for logs and errors
};

// The transport of one stream between `verifier` and `drafter`.
HiddenTransportChoice ChooseHiddenTransport(const HiddenTransportEnd& verifier,
                                            const HiddenTransportEnd& drafter);

// The bytes transport's encoding: rows into the message, and back (exact, little-endian bf16).
void HiddenRowsToWire(const HiddenRows& rows, v1::HiddenStates* wire);
// Rows of a message whose transport is bytes; an error for a malformed one or one that says its
// payload comes by NCCL.
absl::StatusOr<HiddenRows> HiddenRowsFromWire(const v1::HiddenStates& wire);

// Verifier side of one stream.
//
// Thread-safety: Encode is called in the stream's message order, one call at a time (the
// channel calls it under the lock that orders its writes); it never blocks.
class HiddenSender {
 public:
  virtual ~HiddenSender() = default;
  // The transport the next Encode uses.
  virtual HiddenTransportKind kind() const = 0;
  // Puts non-empty `rows` on `wire` (or announces them there and sends the payload aside).
  virtual void Encode(const HiddenRows& rows, v1::HiddenStates* wire) = 0;
};

class BytesHiddenSender final : public HiddenSender {
 public:
  HiddenTransportKind kind() const override { return HiddenTransportKind::kBytes; }
  void Encode(const HiddenRows& rows, v1::HiddenStates* wire) override {
    HiddenRowsToWire(rows, wire);
  }
};

// Drafter side of one stream. Every message of the stream goes through Receive (with its hidden
// states, or null when it has none), so that messages whose payload arrives later keep their
// place: `done` runs in the order of the Receive calls, inline or later on the receiver's
// thread, with the rows (empty for null) or the error that ends that message's session.
//
// Thread-safety: Receive is called in stream order, one call at a time. Shutdown may be called
// from any thread; after it returns no `done` runs.
class HiddenReceiver {
 public:
  using Done = std::function<void(absl::StatusOr<HiddenRows>)>;
  virtual ~HiddenReceiver() = default;
  virtual HiddenTransportKind kind() const = 0;
  virtual void Receive(const v1::HiddenStates* wire, Done done) = 0;
  virtual void Shutdown() {}
};

class BytesHiddenReceiver final : public HiddenReceiver {
 public:
  HiddenTransportKind kind() const override { return HiddenTransportKind::kBytes; }
  void Receive(const v1::HiddenStates* wire, Done done) override;
};

// An NCCL payload landed on the receiver's GPU.
struct DeviceHiddenRows {
  int layers = 0;
  int tokens = 0;
  int hidden_size = 0;
  int offset = 0;
  const void* bf16 = nullptr;  // device memory, [layers, tokens, hidden_size] bfloat16
  void* stream = nullptr;      // the cudaStream_t on which `bf16` is ready
  int device = 0;              // the CUDA device `bf16` is on
};

// Receiver: sees every payload on the device (valid until it returns) before the copy to the
// host. A payload it returns replaces that copy: the message's callback gets the shape with the
// payload as HiddenRows::device (and empty bf16). Null leaves the payload to the host path.
using DeviceHiddenSinkFn =
    std::function<std::shared_ptr<const DeviceHiddenPayload>(const DeviceHiddenRows&)>;

// Settings of one NCCL endpoint.
struct NcclHiddenOptions {
  int device = 0;
  double setup_timeout_seconds = 60;     // communicator init and the warm-up transfer
  double transfer_timeout_seconds = 10;  // one payload, from the moment this side issued it
  // Receiver: for a drafter whose model runs on the receiver's GPU (see DeviceHiddenSinkFn).
  DeviceHiddenSinkFn device_sink;
};

// A device sink for a drafter whose model runs on CUDA device `device`.
struct DeviceHiddenSink {
  int device = -1;
  DeviceHiddenSinkFn take;  // empty: none
};

// The sink of a drafter whose DFlash model runs on the current CUDA device: each payload is
// copied device to device, in order on the receiver's stream, into a buffer of a pool the sink
// owns, and an event recorded there marks it ready; the payload handed on (HiddenRows::device)
// gives the buffer back to the pool when dropped, and the pool reuses it only after the reads
// queued through DeviceHiddenPayload::Read have run (buffers still held keep the pool alive).
// Payloads on another GPU are refused (host path). FailedPrecondition in a build without CUDA,
// or when no CUDA device is usable.
absl::StatusOr<DeviceHiddenSink> NewDeviceHiddenSink();

class NcclPeerLink {
 public:
  virtual ~NcclPeerLink() = default;
  // The drafter answered the setup (verifier side only).
  virtual void PeerStatus(const v1::HiddenTransportStatus& status) = 0;
};

// The NCCL transport's endpoints, or an error naming why they cannot exist here (a build
// without CUDA). `unique_id` is the ncclUniqueId of HiddenTransportSetup; `on_status` reports
// ready (OK) once the endpoint is usable, and a failure (setup or later) at most once; it runs
// on the endpoint's own thread. The sender's callback gets OK when its side is ready; the
// stream still sends bytes until the drafter's answer arrives (NcclPeerLink::PeerStatus).
// NewHiddenNcclUniqueId makes the id the verifier sends.
absl::StatusOr<std::string> NewHiddenNcclUniqueId();
struct HiddenNcclSender {
  std::unique_ptr<HiddenSender> sender;
  NcclPeerLink* link = nullptr;  // owned by `sender`
};
absl::StatusOr<HiddenNcclSender> StartHiddenNcclSender(const std::string& unique_id,
                                                       const NcclHiddenOptions& options,
                                                       std::function<void(absl::Status)> on_status);
absl::StatusOr<std::unique_ptr<HiddenReceiver>> StartHiddenNcclReceiver(
    const std::string& unique_id, const NcclHiddenOptions& options,
    std::function<void(absl::Status)> on_status);

}  // namespace tandem
