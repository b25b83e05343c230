// Which backend runs a model's forward: the fp32 CPU engine or the CUDA ops (bf16 on a GPU).
#pragma once

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tandem {

enum class Device { kCpu, kCuda };

struct DeviceOptions {
  Device device = Device::kCpu;
  // kCuda: capture decode steps (every extend one causal token) as CUDA graphs per batch-size
  // bucket and replay them; false runs every step with eager launches.
  bool cuda_graphs = true;
};

// "cpu" or "cuda"; anything else is InvalidArgument naming the accepted values.
absl::StatusOr<Device> ParseDevice(std::string_view name);
std::string_view DeviceName(Device device);

// True when this binary was built with the CUDA backend (-DTANDEM_CUDA=ON and nvcc found).
bool CudaBackendBuilt();

// OK when models can run on `device` here. kCuda: FailedPrecondition in a build without CUDA,
// Unavailable when no CUDA device is visible.
absl::Status CheckDeviceAvailable(Device device);

// What the binaries' --device / --cuda-graphs flags resolve to: ParseDevice, then
// CheckDeviceAvailable, so "--device cuda" without a GPU fails before any model is loaded.
absl::StatusOr<DeviceOptions> ResolveDevice(std::string_view name, bool cuda_graphs = true);

}  // namespace tandem
