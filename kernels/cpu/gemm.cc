#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstring>
#include <thread>

namespace tandem::kernels::cpu {

void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k) {
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r)
      std::memcpy(y + static_cast<size_t>(r) * n, bias, sizeof(float) * n);
  }
  const float beta = bias != nullptr ? 1.0f : 0.0f;
  if (m == 1) {
    // OpenBLAS does not route m == 1 GEMMs to GEMV; the GEMV kernel is the bandwidth-bound path
    // batch-1 decode lives on.
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, x, 1, beta, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, n);
}

void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha) {
  if (m == 1) {
    cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, alpha, w, k, x, 1, 1.0f, y, 1);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, x, k, w, k, 1.0f, y, n);
}

void SetBlasThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  openblas_set_num_threads(threads > 0 ? threads : 1);
}

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace tandem::kernels::cpu
