// A typed device allocation (cudaMalloc / cudaFree) that grows on request, for the CUDA backend.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/status.h"
#include "kernels/cuda/device.h"

namespace tandem::cuda_backend {

template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  DeviceArray& operator=(DeviceArray&& other) noexcept {
    if (this != &other) {
      Release();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  ~DeviceArray() { Release(); }

  // Makes room for at least `count` elements; a larger allocation replaces the old one (its
  // contents are lost; cudaFree waits for work still using it).
  absl::Status Reserve(size_t count) {
    if (count <= size_ && data_ != nullptr) return absl::OkStatus();
    Release();
    void* raw = nullptr;
    TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&raw, (count > 0 ? count : 1) * sizeof(T)));
    data_ = static_cast<T*>(raw);
    size_ = count;
    return absl::OkStatus();
  }

  // Synchronous upload of `count` elements (allocating as needed).
  absl::Status Upload(const T* host, size_t count) {
    if (absl::Status status = Reserve(count); !status.ok()) return status;
    if (count > 0) {
      TANDEM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(data_, host, count * sizeof(T), cudaMemcpyHostToDevice));
    }
    return absl::OkStatus();
  }

  // Upload ordered on `stream` into the existing allocation (count <= size()). From pageable
  // host memory the call returns once the data are staged, so `host` may change afterwards.
  absl::Status UploadAsync(const T* host, size_t count, cudaStream_t stream) {
    if (count == 0) return absl::OkStatus();
    if (count > size_) return absl::InternalError("device upload larger than its buffer");
    TANDEM_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(data_, host, count * sizeof(T), cudaMemcpyHostToDevice, stream));
    return absl::OkStatus();
  }

  T* get() const { return data_; }
  size_t size() const { return size_; }
  size_t bytes() const { return size_ * sizeof(T); }

 private:
  void Release() {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    size_ = 0;
  }
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem::cuda_backend
