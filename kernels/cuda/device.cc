#include "kernels/cuda/device.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace tandem::kernels::cuda {

int DeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    // Clears the last error where the runtime allows it (a failed initialisation is sticky).
    cudaGetLastError();
    return 0;
  }
  return count;
}

absl::Status CudaErrorToStatus(cudaError_t error, const char* expression, const char* file,
                               int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  std::string message = absl::StrCat(expression, " failed at ", file, ":", line, ": ",
                                     cudaGetErrorName(error), " (", cudaGetErrorString(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInitializationError:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevice:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace tandem::kernels::cuda
