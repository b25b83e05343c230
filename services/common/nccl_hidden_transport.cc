#include "services/common/nccl_hidden_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <deque>
#include <iostream>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace tandem {

namespace {

// The warm-up payload: proves the path end to end before the drafter says ready.
constexpr std::array<uint8_t, 16> kMagic = {'t', 'a', 'n', 'd', 'e', 'm', '-', 'h',
                                            'i', 'd', 'd', 'e', 'n', '-', 'v', '1'};
constexpr absl::Duration kPoll = absl::Microseconds(100);
constexpr absl::Duration kFinalizeTimeout = absl::Seconds(5);

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorString(error)));
}

absl::Status NcclError(ncclResult_t result, absl::string_view what, ncclComm_t comm) {
  if (result == ncclSuccess) return absl::OkStatus();
  const char* last = ncclGetLastError(comm);
  return absl::UnavailableError(absl::StrCat(
      what, ": NCCL error ", ncclGetErrorString(result), last != nullptr && last[0] ? " (" : "",
      last != nullptr ? last : "", last != nullptr && last[0] ? ")" : ""));
}

absl::StatusOr<ncclUniqueId> ToUniqueId(const std::string& bytes) {
  ncclUniqueId id;
  if (bytes.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(
        absl::StrCat("an ncclUniqueId has ", sizeof(id.internal), " bytes, not ", bytes.size()));
  }
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  return id;
}

// One side of the 2-rank communicator, used by its endpoint's thread only (but Abort, which
// NCCL allows from another thread to unblock a hung operation, is not needed: every wait here
// polls and gives up by itself).
class Link {
 public:
  Link() = default;
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
  ~Link() { Close(/*failed=*/!ok_); }

  // Joins the communicator as `rank` on `device` (a nonblocking init, polled until done).
  absl::Status Init(const std::string& unique_id, int rank, int device, absl::Time deadline,
                    const std::atomic<bool>& stop) {
    absl::StatusOr<ncclUniqueId> id = ToUniqueId(unique_id);
    if (!id.ok()) return id.status();
    if (absl::Status s = CudaError(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
    if (absl::Status s =
            CudaError(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "stream");
        !s.ok()) {
      return s;
    }
    if (absl::Status s =
            CudaError(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "event");
        !s.ok()) {
      return s;
    }
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    const ncclResult_t started = ncclCommInitRankConfig(&comm_, 2, *id, rank, &config);
    if (started != ncclSuccess && started != ncclInProgress) {
      return NcclError(started, "ncclCommInitRankConfig", comm_);
    }
    return Settle("joining the communicator", deadline, stop);
  }

  // Sends (rank 0) or receives (rank 1) `bytes` at device `buffer` on the link's stream and
  // waits until the transfer completed.
  absl::Status Transfer(bool send, void* buffer, size_t bytes, absl::Time deadline,
                        const std::atomic<bool>& stop) {
    const ncclResult_t issued =
        send ? ncclSend(buffer, bytes, ncclUint8, 1 - rank(), comm_, stream_)
             : ncclRecv(buffer, bytes, ncclUint8, 1 - rank(), comm_, stream_);
    if (issued != ncclSuccess && issued != ncclInProgress) {
      return NcclError(issued, send ? "ncclSend" : "ncclRecv", comm_);
    }
    if (absl::Status s = Settle(send ? "issuing ncclSend" : "issuing ncclRecv", deadline, stop);
        !s.ok()) {
      return s;
    }
    return Sync(deadline, stop);
  }

  // Waits for everything issued on the stream, watching the communicator for errors.
  absl::Status Sync(absl::Time deadline, const std::atomic<bool>& stop) {
    if (absl::Status s = CudaError(cudaEventRecord(done_, stream_), "cudaEventRecord"); !s.ok()) {
      return s;
    }
    while (true) {
      const cudaError_t query = cudaEventQuery(done_);
      if (query == cudaSuccess) return absl::OkStatus();
      if (query != cudaErrorNotReady) return CudaError(query, "waiting for the transfer");
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        return NcclError(async, "the communicator failed", comm_);
      }
      if (stop) return absl::CancelledError("the stream ended");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError("the peer did not complete the transfer in time");
      }
      absl::SleepFor(kPoll);
    }
  }

  cudaStream_t stream() const { return stream_; }

  // The link failed: later Close aborts rather than finalizes.
  void MarkFailed() { ok_ = false; }

  // Finalizes and destroys the communicator, or aborts it after a failure (or when finalizing
  // does not finish in time).
  void Close(bool failed) {
    if (comm_ != nullptr) {
      bool clean = false;
      const ncclResult_t finalizing = failed ? ncclInternalError : ncclCommFinalize(comm_);
      if (finalizing == ncclSuccess || finalizing == ncclInProgress) {
        const absl::Time deadline = absl::Now() + kFinalizeTimeout;
        while (absl::Now() < deadline) {
          ncclResult_t state = ncclSuccess;
          ncclCommGetAsyncError(comm_, &state);
          if (state == ncclSuccess) {
            clean = true;
            break;
          }
          if (state != ncclInProgress) break;
          absl::SleepFor(kPoll);
        }
      }
      if (clean) {
        ncclCommDestroy(comm_);
      } else {
        ncclCommAbort(comm_);
      }
      comm_ = nullptr;
    }
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    done_ = nullptr;
    stream_ = nullptr;
  }

 private:
  int rank() const {
    int rank = 0;
    ncclCommUserRank(comm_, &rank);
    return rank;
  }

  // Polls a nonblocking communicator until its last call finished.
  absl::Status Settle(absl::string_view what, absl::Time deadline, const std::atomic<bool>& stop) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t queried = ncclCommGetAsyncError(comm_, &state);
      if (queried != ncclSuccess) return NcclError(queried, what, comm_);
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return NcclError(state, what, comm_);
      if (stop) return absl::CancelledError("the stream ended");
      if (absl::Now() > deadline) {
        return absl::DeadlineExceededError(absl::StrCat(what, " took too long"));
      }
      absl::SleepFor(kPoll);
    }
  }

  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  bool ok_ = true;
};

// A device buffer and its pinned host staging, grown on demand (used by one thread).
class Staging {
 public:
  ~Staging() {
    if (device_ != nullptr) cudaFree(device_);
    if (host_ != nullptr) cudaFreeHost(host_);
  }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= capacity_) return absl::OkStatus();
    if (device_ != nullptr) cudaFree(device_);
    if (host_ != nullptr) cudaFreeHost(host_);
    device_ = nullptr;
    host_ = nullptr;
    capacity_ = 0;
    if (absl::Status s = CudaError(cudaMalloc(&device_, bytes), "cudaMalloc"); !s.ok()) return s;
    if (absl::Status s = CudaError(cudaMallocHost(&host_, bytes), "cudaMallocHost"); !s.ok()) {
      return s;
    }
    capacity_ = bytes;
    return absl::OkStatus();
  }
  void* device() const { return device_; }
  void* host() const { return host_; }

 private:
  void* device_ = nullptr;
  void* host_ = nullptr;
  size_t capacity_ = 0;
};

absl::Time After(double seconds) { return absl::Now() + absl::Seconds(seconds); }

// Sends the warm-up payload (rank 0) or receives and checks it (rank 1).
absl::Status WarmUp(Link& link, bool send, Staging& staging, absl::Time deadline,
                    const std::atomic<bool>& stop) {
  if (absl::Status s = staging.Reserve(kMagic.size()); !s.ok()) return s;
  if (send) {
    std::memcpy(staging.host(), kMagic.data(), kMagic.size());
  } else {
    std::memset(staging.host(), 0, kMagic.size());
  }
  if (absl::Status s = CudaError(cudaMemcpyAsync(staging.device(), staging.host(), kMagic.size(),
                                                 cudaMemcpyHostToDevice, link.stream()),
                                 "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = link.Transfer(send, staging.device(), kMagic.size(), deadline, stop);
      !s.ok()) {
    return s;
  }
  if (send) return absl::OkStatus();
  if (absl::Status s = CudaError(cudaMemcpyAsync(staging.host(), staging.device(), kMagic.size(),
                                                 cudaMemcpyDeviceToHost, link.stream()),
                                 "cudaMemcpyAsync");
      !s.ok()) {
    return s;
  }
  if (absl::Status s = link.Sync(deadline, stop); !s.ok()) return s;
  if (std::memcmp(staging.host(), kMagic.data(), kMagic.size()) != 0) {
    return absl::DataLossError("the warm-up transfer arrived corrupted");
  }
  return absl::OkStatus();
}

// Joins the communicator as `rank` and exchanges the warm-up payload (rank 0, the verifier,
// sends), both within one setup deadline.
absl::Status JoinAndWarmUp(Link& link, Staging& staging, const std::string& unique_id, int rank,
                           const NcclHiddenOptions& options, const std::atomic<bool>& stop) {
  const absl::Time deadline = After(options.setup_timeout_seconds);
  if (absl::Status s = link.Init(unique_id, rank, options.device, deadline, stop); !s.ok()) {
    return s;
  }
  return WarmUp(link, /*send=*/rank == 0, staging, deadline, stop);
}

// Verifier side (rank 0).
class NcclSender final : public HiddenSender, public NcclPeerLink {
 public:
  NcclSender(std::string unique_id, NcclHiddenOptions options,
             std::function<void(absl::Status)> on_status)
      : unique_id_(std::move(unique_id)),
        options_(std::move(options)),
        on_status_(std::move(on_status)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~NcclSender() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      stop_flag_ = true;
    }
    thread_.join();
  }

  HiddenTransportKind kind() const override {
    absl::MutexLock lock(&mu_);
    return ActiveLocked() ? HiddenTransportKind::kNccl : HiddenTransportKind::kBytes;
  }

  void Encode(const HiddenRows& rows, v1::HiddenStates* wire) override {
    // Rows whose values do not fill their shape go as bytes, where the drafter rejects them:
    // by NCCL the receiver would wait for a payload of the announced size.
    const size_t values = static_cast<size_t>(std::max(rows.layers, 0)) *
                          static_cast<size_t>(std::max(rows.tokens, 0)) *
                          static_cast<size_t>(std::max(rows.hidden_size, 0));
    absl::MutexLock lock(&mu_);
    if (!ActiveLocked() || rows.bf16.size() != values) {
      HiddenRowsToWire(rows, wire);
      return;
    }
    wire->set_num_layers(rows.layers);
    wire->set_num_tokens(rows.tokens);
    wire->set_hidden_size(rows.hidden_size);
    wire->set_offset(rows.offset);
    wire->set_transport(v1::HIDDEN_TRANSPORT_NCCL);
    queue_.push_back(rows.bf16);
  }

  void PeerStatus(const v1::HiddenTransportStatus& status) override {
    absl::MutexLock lock(&mu_);
    if (status.ready()) {
      peer_ready_ = true;
    } else if (failure_.ok()) {
      failure_ = absl::UnavailableError(absl::StrCat("the drafter: ", status.error()));
    }
  }

 private:
  bool ActiveLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return local_ready_ && peer_ready_ && failure_.ok();
  }

  // Records the first failure and reports it, unless the endpoint is being shut down.
  void Fail(absl::Status status) {
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) {
        failure_ = status;
        report = !stop_;
      }
      queue_.clear();
    }
    if (report) on_status_(std::move(status));
  }

  void Run() {
    Link link;
    Staging staging;
    absl::Status setup = JoinAndWarmUp(link, staging, unique_id_, /*rank=*/0, options_, stop_flag_);
    if (!setup.ok()) {
      link.MarkFailed();
      link.Close(/*failed=*/true);
      Fail(std::move(setup));
      WaitForStop();
      return;
    }
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      local_ready_ = true;
      report = !stop_;
    }
    if (report) on_status_(absl::OkStatus());
    while (true) {
      std::vector<uint16_t> payload;
      {
        absl::MutexLock lock(&mu_);
        auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || !queue_.empty() || !failure_.ok();
        };
        mu_.Await(absl::Condition(&work));
        if (stop_) return;
        if (!failure_.ok()) break;
        payload = std::move(queue_.front());
        queue_.pop_front();
      }
      if (absl::Status sent = Send(link, staging, payload); !sent.ok()) {
        link.MarkFailed();
        Fail(absl::UnavailableError(absl::StrCat("sending hidden states: ", sent.message())));
        break;
      }
    }
    // Failed (here or by the drafter's word): abort now, so that a transfer the peer still
    // waits for fails there too.
    link.MarkFailed();
    link.Close(/*failed=*/true);
    WaitForStop();
  }

  absl::Status Send(Link& link, Staging& staging, const std::vector<uint16_t>& payload) {
    const size_t bytes = payload.size() * sizeof(uint16_t);
    if (bytes == 0) return absl::OkStatus();
    if (absl::Status s = staging.Reserve(bytes); !s.ok()) return s;
    std::memcpy(staging.host(), payload.data(), bytes);
    if (absl::Status s = CudaError(cudaMemcpyAsync(staging.device(), staging.host(), bytes,
                                                   cudaMemcpyHostToDevice, link.stream()),
                                   "cudaMemcpyAsync");
        !s.ok()) {
      return s;
    }
    return link.Transfer(/*send=*/true, staging.device(), bytes,
                         After(options_.transfer_timeout_seconds), stop_flag_);
  }

  void WaitForStop() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stop_));
  }

  const std::string unique_id_;
  const NcclHiddenOptions options_;
  const std::function<void(absl::Status)> on_status_;
  // Read by the thread's polling loops: a copy of stop_ they can see without the lock.
  std::atomic<bool> stop_flag_{false};

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool local_ready_ ABSL_GUARDED_BY(mu_) = false;
  bool peer_ready_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::deque<std::vector<uint16_t>> queue_ ABSL_GUARDED_BY(mu_);  // payloads in wire order

  std::thread thread_;  // last: starts after the fields it reads
};

// Drafter side (rank 1).
class NcclReceiver final : public HiddenReceiver {
 public:
  NcclReceiver(std::string unique_id, NcclHiddenOptions options,
               std::function<void(absl::Status)> on_status)
      : unique_id_(std::move(unique_id)),
        options_(std::move(options)),
        on_status_(std::move(on_status)) {
    thread_ = std::thread([this] { Run(); });
  }

  ~NcclReceiver() override { Shutdown(); }

  HiddenTransportKind kind() const override { return HiddenTransportKind::kNccl; }

  void Receive(const v1::HiddenStates* wire, Done done) override {
    Item item{.done = std::move(done)};
    if (wire != nullptr) {
      item.nccl = wire->transport() == v1::HIDDEN_TRANSPORT_NCCL;
      item.shape = HiddenRows{.layers = wire->num_layers(),
                              .tokens = wire->num_tokens(),
                              .hidden_size = wire->hidden_size(),
                              .offset = wire->offset()};
      if (!item.nccl) item.bytes = HiddenRowsFromWire(*wire);
    }
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      // A message with nothing ahead of it and nothing to wait for keeps its place inline.
      if (item.nccl || undelivered_ > 0) {
        ++undelivered_;
        queue_.push_back(std::move(item));
        return;
      }
    }
    item.done(std::move(item.bytes));
  }

  void Shutdown() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      stop_flag_ = true;
      queue_.clear();
    }
    absl::MutexLock join(&join_mu_);
    if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
  }

 private:
  struct Item {
    Done done;
    bool nccl = false;
    HiddenRows shape;  // NCCL: the announced shape
    absl::StatusOr<HiddenRows> bytes = HiddenRows{};
  };

  // Records the first failure and reports it, unless the endpoint is being shut down.
  void Fail(absl::Status status) {
    bool report = false;
    {
      absl::MutexLock lock(&mu_);
      if (failure_.ok()) {
        failure_ = status;
        report = !stop_;
      }
    }
    if (report) on_status_(std::move(status));
  }

  void Run() {
    Link link;
    Staging staging;
    absl::Status setup = JoinAndWarmUp(link, staging, unique_id_, /*rank=*/1, options_, stop_flag_);
    if (setup.ok()) {
      bool report = false;
      {
        absl::MutexLock lock(&mu_);
        report = !stop_;
      }
      if (report) on_status_(absl::OkStatus());
    } else {
      link.MarkFailed();
      link.Close(/*failed=*/true);
      Fail(std::move(setup));
    }
    while (true) {
      Item item;
      absl::Status failure;
      {
        absl::MutexLock lock(&mu_);
        auto work = [this]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
        mu_.Await(absl::Condition(&work));
        if (stop_) return;
        item = std::move(queue_.front());
        queue_.pop_front();
        failure = failure_;
      }
      absl::StatusOr<HiddenRows> rows = std::move(item.bytes);
      if (item.nccl) {
        if (!failure.ok()) {
          rows = absl::UnavailableError(
              absl::StrCat("hidden states were sent by NCCL after it failed: ", failure.message()));
        } else {
          rows = Land(link, staging, item.shape);
          if (!rows.ok()) {
            link.MarkFailed();
            link.Close(/*failed=*/true);
            Fail(rows.status());
          }
        }
      }
      // The session concerned ends with the error; the stream goes on with bytes.
      item.done(std::move(rows));
      absl::MutexLock lock(&mu_);
      --undelivered_;
    }
  }

  // Receives one payload of `shape` into the device buffer and offers it to the device sink;
  // what the sink does not take is copied into host rows.
  absl::StatusOr<HiddenRows> Land(Link& link, Staging& staging, HiddenRows shape) {
    if (shape.layers < 0 || shape.tokens < 0 || shape.hidden_size < 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("hidden states of shape [%d, %d, %d] announced by NCCL", shape.layers,
                          shape.tokens, shape.hidden_size));
    }
    const size_t values = static_cast<size_t>(shape.layers) * static_cast<size_t>(shape.tokens) *
                          static_cast<size_t>(shape.hidden_size);
    const size_t bytes = values * sizeof(uint16_t);
    if (bytes == 0) return shape;
    if (absl::Status s = staging.Reserve(bytes); !s.ok()) return s;
    const absl::Time deadline = After(options_.transfer_timeout_seconds);
    if (absl::Status s =
            link.Transfer(/*send=*/false, staging.device(), bytes, deadline, stop_flag_);
        !s.ok()) {
      return absl::UnavailableError(absl::StrCat("receiving hidden states: ", s.message()));
    }
    if (options_.device_sink) {
      std::shared_ptr<const DeviceHiddenPayload> taken =
          options_.device_sink(DeviceHiddenRows{.layers = shape.layers,
                                                .tokens = shape.tokens,
                                                .hidden_size = shape.hidden_size,
                                                .offset = shape.offset,
                                                .bf16 = staging.device(),
                                                .stream = link.stream(),
                                                .device = options_.device});
      if (taken != nullptr) {
        shape.device = std::move(taken);
        return shape;
      }
    }
    if (absl::Status s = CudaError(cudaMemcpyAsync(staging.host(), staging.device(), bytes,
                                                   cudaMemcpyDeviceToHost, link.stream()),
                                   "cudaMemcpyAsync");
        !s.ok()) {
      return s;
    }
    if (absl::Status s = link.Sync(deadline, stop_flag_); !s.ok()) return s;
    shape.bf16.resize(values);
    std::memcpy(shape.bf16.data(), staging.host(), bytes);
    return shape;
  }

  const std::string unique_id_;
  const NcclHiddenOptions options_;
  const std::function<void(absl::Status)> on_status_;
  std::atomic<bool> stop_flag_{false};

  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  int undelivered_ ABSL_GUARDED_BY(mu_) = 0;  // queued or being delivered by the thread
  absl::Mutex join_mu_;                       // one Shutdown joins the thread

  std::thread thread_;  // last: starts after the fields it reads
};

}  // namespace

void ProbeHiddenNccl(HiddenTransportEnd* end) {
  end->nccl = false;
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    end->why_not =
        absl::StrCat("no CUDA device is visible (",
                     counted != cudaSuccess ? cudaGetErrorString(counted) : "0 devices", ")");
    cudaGetLastError();  // clear the sticky "no device" error for the rest of the process
    return;
  }
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) device = 0;
  cudaDeviceProp props{};
  if (const cudaError_t got = cudaGetDeviceProperties(&props, device); got != cudaSuccess) {
    end->why_not = absl::StrCat("cannot read CUDA device ", device, ": ", cudaGetErrorString(got));
    return;
  }
  std::string uuid;
  for (char byte : props.uuid.bytes) {
    absl::StrAppendFormat(&uuid, "%02x", static_cast<unsigned char>(byte));
  }
  int version = 0;
  if (ncclGetVersion(&version) != ncclSuccess) {
    end->why_not = "the NCCL library does not answer ncclGetVersion";
    return;
  }
  end->nccl = true;
  end->why_not.clear();
  end->gpu_uuid = uuid;
  end->device = device;
}

absl::StatusOr<std::string> NewHiddenNcclUniqueId() {
  ncclUniqueId id;
  if (absl::Status s = NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr); !s.ok()) {
    return s;
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<HiddenNcclSender> StartHiddenNcclSender(
    const std::string& unique_id, const NcclHiddenOptions& options,
    std::function<void(absl::Status)> on_status) {
  if (absl::StatusOr<ncclUniqueId> id = ToUniqueId(unique_id); !id.ok()) return id.status();
  auto sender = std::make_unique<NcclSender>(unique_id, options, std::move(on_status));
  NcclPeerLink* link = sender.get();
  return HiddenNcclSender{.sender = std::move(sender), .link = link};
}

absl::StatusOr<std::unique_ptr<HiddenReceiver>> StartHiddenNcclReceiver(
    const std::string& unique_id, const NcclHiddenOptions& options,
    std::function<void(absl::Status)> on_status) {
  if (absl::StatusOr<ncclUniqueId> id = ToUniqueId(unique_id); !id.ok()) return id.status();
  return std::unique_ptr<HiddenReceiver>(
      std::make_unique<NcclReceiver>(unique_id, options, std::move(on_status)));
}

}  // namespace tandem
