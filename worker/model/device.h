// Which backend runs a model's forward: the fp32 CPU engine or the CUDA ops (bf16 on a GPU).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cpu/packed_gemm.h"

namespace tandem {

enum class Device { kCpu, kCuda };

struct DeviceOptions {
  Device device = Device::kCpu;
  // kCuda: capture decode steps (every extend one causal token) as CUDA graphs per batch-size
  // bucket and replay them; false runs every step with eager launches.
  bool cuda_graphs = true;
  // How the CPU forward holds the products' weights (ModelWeights::PackForCpu): fp32, or bf16
  // (half the bytes a step reads; the products accumulate in fp32). Models load with it.
  kernels::cpu::WeightType cpu_weights = kernels::cpu::WeightType::kF32;
};

// "cpu" or "cuda"; anything else is InvalidArgument naming the accepted values.
absl::StatusOr<Device> ParseDevice(std::string_view name);
std::string_view DeviceName(Device device);

// True when this binary was built with the CUDA backend (-DTANDEM_CUDA=ON and nvcc found).
bool CudaBackendBuilt();

// OK when models can run on `device` here. kCuda: FailedPrecondition in a build without CUDA,
// Unavailable when no CUDA device is visible.
absl::Status CheckDeviceAvailable(Device device);

// Device-to-device copies between two GPU buffers of `bytes`, timed with CUDA events on a stream
// of its own: the memory bandwidth a decode step's weight reads are measured against (STREAM
// convention: a copy of N bytes moves 2N, read plus write). UNAVAILABLE without a CUDA device,
// FAILED_PRECONDITION in a build without CUDA, RESOURCE_EXHAUSTED when the buffers do not fit.
class DeviceCopyTimer {
 public:
  static absl::StatusOr<std::unique_ptr<DeviceCopyTimer>> Create(size_t bytes);
  ~DeviceCopyTimer();
  DeviceCopyTimer(const DeviceCopyTimer&) = delete;
  DeviceCopyTimer& operator=(const DeviceCopyTimer&) = delete;

  // Seconds of one copy (the GPU's time between events around it).
  absl::StatusOr<double> TimeOne();
  double MovedBytes() const { return 2.0 * static_cast<double>(bytes_); }

 private:
  struct Resources;
  DeviceCopyTimer(size_t bytes, std::unique_ptr<Resources> resources);
  size_t bytes_;
  std::unique_ptr<Resources> resources_;
};

// What the binaries' --device / --cuda-graphs / --cpu-weights flags resolve to: ParseDevice,
// then CheckDeviceAvailable, so "--device cuda" without a GPU fails before any model is loaded,
// and ParseWeightType.
absl::StatusOr<DeviceOptions> ResolveDevice(std::string_view name, bool cuda_graphs = true,
                                            std::string_view cpu_weights = "f32");
// The --cpu-weights flag's help, the same on every binary that has it.
inline constexpr char kCpuWeightsHelp[] =
    "How the CPU forward holds the products' weights: f32, or bf16 (half the bytes a step reads; "
    "fp32 accumulation)";

}  // namespace tandem
