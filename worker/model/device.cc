#include "worker/model/device.h"

#include <string>

#include "absl/strings/str_cat.h"

#ifdef TANDEM_HAVE_CUDA
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

absl::StatusOr<DeviceOptions> ResolveDevice(std::string_view name, bool cuda_graphs) {
  absl::StatusOr<Device> device = ParseDevice(name);
  if (!device.ok()) return device.status();
  if (absl::Status available = CheckDeviceAvailable(*device); !available.ok()) return available;
  return DeviceOptions{.device = *device, .cuda_graphs = cuda_graphs};
}

}  // namespace tandem
