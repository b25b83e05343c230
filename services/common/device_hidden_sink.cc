// The device sink of NCCL hidden-state payloads for a drafter whose model runs on the GPU
// (NewDeviceHiddenSink, services/common/hidden_transport.h); built with the CUDA backend only.
//
// A pool of device buffers per sink: each payload the receiver offers is copied device to device
// into a pool buffer on the receiver's stream, and the buffer's event is recorded after the copy
// (ready). A reader (DeviceHiddenPayload::Read) queues its reads on the pool's stream behind
// that event and the event is recorded again after them; the buffer goes back to the pool when
// the payload is dropped, and its next fill waits for that event on the filling stream. So a
// buffer is never rewritten before its reads ran, and a payload dropped unread (its session
// ended first) only waits for its own fill.
#include <cuda_runtime.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "services/common/hidden_transport.h"

namespace tandem {

namespace {

// Free buffers kept for reuse; more are freed as they come back.
constexpr size_t kMaxFreeBuffers = 16;
// Buffers are allocated in sizes of powers of two from this many bytes on.
constexpr size_t kMinBufferBytes = size_t{64} << 10;

absl::Status CudaError(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": CUDA error ", cudaGetErrorString(error)));
}

// Makes `device` the calling thread's current device for the scope.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) {
      status_ = cudaSetDevice(device);
      changed_ = status_ == cudaSuccess && previous_ >= 0;
    }
  }
  ~DeviceScope() {
    if (changed_) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  bool changed_ = false;
  cudaError_t status_ = cudaSuccess;
};

struct Buffer {
  void* data = nullptr;
  size_t bytes = 0;
  cudaEvent_t last_use = nullptr;  // recorded after the buffer's last fill or read
};

// Waits for the buffer's last use and frees it (on its device, current here).
void Free(Buffer& buffer) {
  if (buffer.last_use != nullptr) {
    cudaEventSynchronize(buffer.last_use);
    cudaEventDestroy(buffer.last_use);
  }
  if (buffer.data != nullptr) cudaFree(buffer.data);
  buffer = Buffer{};
}

class Pool {
 public:
  static absl::StatusOr<std::shared_ptr<Pool>> Create(int device) {
    DeviceScope scope(device);
    if (absl::Status s = CudaError(scope.status(), "cudaSetDevice"); !s.ok()) return s;
    auto pool = std::shared_ptr<Pool>(new Pool(device));
    if (absl::Status s = CudaError(cudaStreamCreateWithFlags(&pool->stream_, cudaStreamNonBlocking),
                                   "cudaStreamCreate");
        !s.ok()) {
      return s;
    }
    return pool;
  }

  ~Pool() {
    DeviceScope scope(device_);
    absl::MutexLock lock(&mu_);
    for (Buffer& buffer : free_) Free(buffer);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // The smallest free buffer of at least `bytes`, or a new one (the pool's device is current).
  absl::StatusOr<Buffer> Take(size_t bytes) {
    {
      absl::MutexLock lock(&mu_);
      auto best = free_.end();
      for (auto it = free_.begin(); it != free_.end(); ++it) {
        if (it->bytes >= bytes && (best == free_.end() || it->bytes < best->bytes)) best = it;
      }
      if (best != free_.end()) {
        Buffer buffer = *best;
        free_.erase(best);
        return buffer;
      }
    }
    Buffer buffer;
    buffer.bytes = std::max(kMinBufferBytes, std::bit_ceil(bytes));
    if (absl::Status s = CudaError(cudaMalloc(&buffer.data, buffer.bytes), "cudaMalloc"); !s.ok()) {
      buffer.data = nullptr;
      return s;
    }
    if (absl::Status s = CudaError(
            cudaEventCreateWithFlags(&buffer.last_use, cudaEventDisableTiming), "cudaEventCreate");
        !s.ok()) {
      buffer.last_use = nullptr;
      Free(buffer);
      return s;
    }
    return buffer;
  }

  // Takes `buffer` back; its reuse waits for its last_use event.
  void Give(Buffer buffer) {
    {
      absl::MutexLock lock(&mu_);
      if (free_.size() < kMaxFreeBuffers) {
        free_.push_back(buffer);
        return;
      }
    }
    DeviceScope scope(device_);
    Free(buffer);
  }

 private:
  explicit Pool(int device) : device_(device) {}

  const int device_;
  cudaStream_t stream_ = nullptr;  // where readers queue their reads
  absl::Mutex mu_;
  std::vector<Buffer> free_ ABSL_GUARDED_BY(mu_);
};

class Payload final : public DeviceHiddenPayload {
 public:
  Payload(std::shared_ptr<Pool> pool, Buffer buffer) : pool_(std::move(pool)), buffer_(buffer) {}
  ~Payload() override { pool_->Give(buffer_); }

  int device() const override { return pool_->device(); }

  absl::Status Read(const Reader& read) const override {
    DeviceScope scope(pool_->device());
    if (absl::Status s = CudaError(scope.status(), "cudaSetDevice"); !s.ok()) return s;
    if (absl::Status s = CudaError(cudaStreamWaitEvent(pool_->stream(), buffer_.last_use, 0),
                                   "waiting for the hidden states on the GPU");
        !s.ok()) {
      return s;
    }
    absl::Status status = read(buffer_.data, pool_->stream());
    // Whatever `read` queued on the stream (or ordered before its later work) comes before the
    // buffer's next fill.
    absl::Status recorded =
        CudaError(cudaEventRecord(buffer_.last_use, pool_->stream()), "cudaEventRecord");
    if (!recorded.ok()) {
      // The buffer cannot be reused safely without its event: wait here instead.
      cudaStreamSynchronize(pool_->stream());
    }
    return status.ok() ? recorded : status;
  }

 private:
  std::shared_ptr<Pool> pool_;
  Buffer buffer_;
};

// Copies `rows` into a pool buffer on their stream; null (the host path) when they are on
// another device or the copy cannot be queued.
std::shared_ptr<const DeviceHiddenPayload> TakeRows(const std::shared_ptr<Pool>& pool,
                                                    const DeviceHiddenRows& rows) {
  if (rows.device != pool->device() || rows.bf16 == nullptr || rows.layers <= 0 ||
      rows.tokens <= 0 || rows.hidden_size <= 0) {
    return nullptr;
  }
  const size_t bytes = static_cast<size_t>(rows.layers) * static_cast<size_t>(rows.tokens) *
                       static_cast<size_t>(rows.hidden_size) * sizeof(uint16_t);
  DeviceScope scope(pool->device());
  if (scope.status() != cudaSuccess) return nullptr;
  absl::StatusOr<Buffer> buffer = pool->Take(bytes);
  if (!buffer.ok()) {
    std::fprintf(stderr, "tandem: hidden states pass through the host: %s\n",
                 std::string(buffer.status().message()).c_str());
    return nullptr;
  }
  auto stream = static_cast<cudaStream_t>(rows.stream);
  absl::Status queued =
      CudaError(cudaStreamWaitEvent(stream, buffer->last_use, 0), "cudaStreamWaitEvent");
  if (queued.ok()) {
    queued =
        CudaError(cudaMemcpyAsync(buffer->data, rows.bf16, bytes, cudaMemcpyDeviceToDevice, stream),
                  "cudaMemcpyAsync");
  }
  if (queued.ok()) {
    queued = CudaError(cudaEventRecord(buffer->last_use, stream), "cudaEventRecord");
  }
  if (!queued.ok()) {
    // Whatever was queued finishes before the buffer goes back.
    cudaStreamSynchronize(stream);
    pool->Give(*buffer);
    std::fprintf(stderr, "tandem: hidden states pass through the host: %s\n",
                 std::string(queued.message()).c_str());
    return nullptr;
  }
  return std::make_shared<Payload>(pool, *buffer);
}

}  // namespace

absl::StatusOr<DeviceHiddenSink> NewDeviceHiddenSink() {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess || count == 0) {
    cudaGetLastError();  // clear the sticky "no device" error
    return absl::FailedPreconditionError(
        absl::StrCat("hidden states cannot stay on a GPU: no CUDA device is visible (",
                     counted != cudaSuccess ? cudaGetErrorString(counted) : "0 devices", ")"));
  }
  int device = 0;
  if (absl::Status s = CudaError(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) {
    return absl::FailedPreconditionError(s.message());
  }
  absl::StatusOr<std::shared_ptr<Pool>> pool = Pool::Create(device);
  if (!pool.ok()) return absl::FailedPreconditionError(pool.status().message());
  return DeviceHiddenSink{.device = device,
                          .take = [pool = *std::move(pool)](const DeviceHiddenRows& rows) {
                            return TakeRows(pool, rows);
                          }};
}

}  // namespace tandem
