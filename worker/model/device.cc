#include "worker/model/device.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/device.h"
#endif

namespace tandem {

absl::StatusOr<Device> ParseDevice(std::string_view name) {
  if (name == "cpu") return Device::kCpu;
  if (name == "cuda") return Device::kCuda;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown device '", std::string(name), "'; expected 'cpu' or 'cuda'"));
}

std::string_view DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

bool CudaBackendBuilt() {
#ifdef TANDEM_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::Status CheckDeviceAvailable(Device device) {
  if (device == Device::kCpu) return absl::OkStatus();
#ifdef TANDEM_HAVE_CUDA
  if (kernels::cuda::DeviceCount() == 0) {
    return absl::UnavailableError(
        "no CUDA device is visible (no GPU, no driver, or CUDA_VISIBLE_DEVICES "
        "hides them)");
  }
  return absl::OkStatus();
#else
  return absl::FailedPreconditionError(
      "this build has no CUDA backend (configure with -DTANDEM_CUDA=ON on a "
      "machine with nvcc)");
#endif
}

absl::StatusOr<DeviceOptions> ResolveDevice(std::string_view name, bool cuda_graphs,
                                            std::string_view cpu_weights) {
  absl::StatusOr<Device> device = ParseDevice(name);
  if (!device.ok()) return device.status();
  if (absl::Status available = CheckDeviceAvailable(*device); !available.ok()) return available;
  absl::StatusOr<kernels::cpu::WeightType> weights = kernels::cpu::ParseWeightType(cpu_weights);
  if (!weights.ok()) return weights.status();
  return DeviceOptions{.device = *device, .cuda_graphs = cuda_graphs, .cpu_weights = *weights};
}

#ifdef TANDEM_HAVE_CUDA
struct DeviceCopyTimer::Resources {
  void* src = nullptr;
  void* dst = nullptr;
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr;
  cudaEvent_t stop = nullptr;
  ~Resources() {
    if (stream != nullptr) cudaStreamSynchronize(stream);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
    if (stream != nullptr) cudaStreamDestroy(stream);
    if (src != nullptr) cudaFree(src);
    if (dst != nullptr) cudaFree(dst);
  }
};

absl::StatusOr<std::unique_ptr<DeviceCopyTimer>> DeviceCopyTimer::Create(size_t bytes) {
  if (absl::Status available = CheckDeviceAvailable(Device::kCuda); !available.ok()) {
    return available;
  }
  auto r = std::make_unique<Resources>();
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&r->src, bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMalloc(&r->dst, bytes));
  // Not zeros: the copy engine's speed does not depend on the data, but nothing here should
  // be measured over zeros.
  TANDEM_CUDA_RETURN_IF_ERROR(cudaMemset(r->src, 0x5A, bytes));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&r->stream, cudaStreamNonBlocking));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r->start));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventCreate(&r->stop));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return std::unique_ptr<DeviceCopyTimer>(new DeviceCopyTimer(bytes, std::move(r)));
}

absl::StatusOr<double> DeviceCopyTimer::TimeOne() {
  Resources& r = *resources_;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.start, r.stream));
  TANDEM_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(r.dst, r.src, bytes_, cudaMemcpyDeviceToDevice, r.stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventRecord(r.stop, r.stream));
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(r.stop));
  float ms = 0.0f;
  TANDEM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, r.start, r.stop));
  return static_cast<double>(ms) * 1e-3;
}
#else
struct DeviceCopyTimer::Resources {};

absl::StatusOr<std::unique_ptr<DeviceCopyTimer>> DeviceCopyTimer::Create(size_t /*bytes*/) {
  return CheckDeviceAvailable(Device::kCuda);
}

absl::StatusOr<double> DeviceCopyTimer::TimeOne() {
  return absl::FailedPreconditionError("this build has no CUDA backend");
}
#endif

DeviceCopyTimer::DeviceCopyTimer(size_t bytes, std::unique_ptr<Resources> resources)
    : bytes_(bytes), resources_(std::move(resources)) {}

DeviceCopyTimer::~DeviceCopyTimer() = default;

}  // namespace tandem
