#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <atomic>
#include <cstring>
#include <thread>

namespace tandem::kernels::cpu {

namespace {

std::atomic<int> cpu_threads{0};  // 0: not set (all cores)

// y[n] = beta * y + alpha * w[n, k] · x[k], rows split across the OpenMP pool. Batch-1 decode
// lives on this product; OpenBLAS' threaded GEMV wakes its own thread pool on every call, which
// costs a measurable share of a step made of ~50 small products.
void Gemv(const float* w, const float* x, float* y, int n, int k, float alpha, float beta) {
  const long work = static_cast<long>(n) * k;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (work > (1 << 16))
  for (int r = 0; r < n; ++r) {
    const float* row = w + static_cast<size_t>(r) * k;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int i = 0; i < k; ++i) acc += row[i] * x[i];
    // beta == 0 must not read y: it may hold garbage (0 * NaN is NaN).
    y[r] = beta == 0.0f ? alpha * acc : beta * y[r] + alpha * acc;
  }
}

}  // namespace

void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k) {
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r)
      std::memcpy(y + static_cast<size_t>(r) * n, bias, sizeof(float) * n);
  }
  const float beta = bias != nullptr ? 1.0f : 0.0f;
  if (m == 1) {
    // OpenBLAS does not route m == 1 GEMMs to GEMV; the GEMV kernel is the bandwidth-bound path
    // batch-1 decode lives on.
    Gemv(w, x, y, n, k, 1.0f, beta);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x, k, w, k, beta, y, n);
}

void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha) {
  if (m == 1) {
    Gemv(w, x, y, n, k, alpha, 1.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, alpha, x, k, w, k, 1.0f, y, n);
}

void SetBlasThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = threads > 0 ? threads : 1;
  openblas_set_num_threads(threads);
  omp_set_num_threads(threads);
  cpu_threads.store(threads, std::memory_order_relaxed);
}

int CpuThreads() {
  const int threads = cpu_threads.load(std::memory_order_relaxed);
  return threads > 0 ? threads : omp_get_num_procs();
}

int BlasThreads() { return openblas_get_num_threads(); }

}  // namespace tandem::kernels::cpu
