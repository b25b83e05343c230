// CUDA device discovery and CUDA-error -> absl::Status conversion for the kernels/cuda library.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace tandem::kernels::cuda {

// Number of CUDA devices this process can use. Returns 0, never an error, when there is no
// driver, no GPU, or CUDA_VISIBLE_DEVICES hides them all: a host without a GPU is a supported
// configuration (tests skip, the engine falls back to kernels/cpu). Note that a failed runtime
// initialisation (e.g. no driver) stays the thread's last CUDA error for the process lifetime.
int DeviceCount();

// OK for cudaSuccess; otherwise an error whose message names the failing expression, the source
// location and the CUDA error name and text, e.g.
//   "cudaMalloc(&p, n) failed at kernels/cuda/x.cu:12: cudaErrorMemoryAllocation (out of memory)".
// Out-of-memory maps to RESOURCE_EXHAUSTED, a missing driver or device to UNAVAILABLE, bad
// arguments to INVALID_ARGUMENT, everything else to INTERNAL.
absl::Status CudaErrorToStatus(cudaError_t error, const char* expression, const char* file,
                               int line);

}  // namespace tandem::kernels::cuda

// Evaluates a CUDA runtime call once and returns its error as an absl::Status from the enclosing
// function when it fails.
#define TANDEM_CUDA_RETURN_IF_ERROR(expr)                                                    \
  do {                                                                                       \
    const cudaError_t tandem_cuda_error_ = (expr);                                           \
    if (tandem_cuda_error_ != cudaSuccess) {                                                 \
      return ::tandem::kernels::cuda::CudaErrorToStatus(tandem_cuda_error_, #expr, __FILE__, \
                                                        __LINE__);                           \
    }                                                                                        \
  } while (false)
