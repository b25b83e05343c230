#include "kernels/cpu/gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "kernels/cpu/rows_gemm.h"

namespace tandem::kernels::cpu {

namespace {

std::atomic<int> cpu_threads{0};  // 0: not set (all cores)

// One thread pool for every CPU op: OpenBLAS runs single-threaded, called from the ops' OpenMP
// workers. Two pools in one step (OpenBLAS's for some products, OpenMP's for the others and for
// attention) spin against each other for the same cores: a verify step's products ran at a
// fraction of their speed next to OpenMP work. Set once, when the library loads.
const bool kBlasSingleThreaded = [] {
  openblas_set_num_threads(1);
  return true;
}();

// y[m, n] = alpha * x[m, k] · w[n, k]^T + beta * y with single-threaded OpenBLAS calls, the
// output columns split across the pool in blocks of 64 (each thread's weight rows are its own).
void ParallelGemm(const float* x, const float* w, float* y, int m, int n, int k, float alpha,
                  float beta) {
  constexpr int kColumnBlock = 64;
  const int blocks = (n + kColumnBlock - 1) / kColumnBlock;
  const long work = static_cast<long>(m) * n * k;
#pragma omp parallel num_threads(CpuThreads()) if (work > (1 << 20))
  {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    const int c0 = std::min(n, blocks * t / threads * kColumnBlock);
    const int c1 = std::min(n, blocks * (t + 1) / threads * kColumnBlock);
    if (c1 > c0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, c1 - c0, k, alpha, x, k,
                  w + static_cast<size_t>(c0) * k, k, beta, y + c0, n);
    }
  }
}

}  // namespace

void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k) {
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r)
      std::memcpy(y + static_cast<size_t>(r) * n, bias, sizeof(float) * n);
  }
  const float beta = bias != nullptr ? 1.0f : 0.0f;
  if (m <= kRowsMaxM) {
    // Decode and verify steps: the weights read once for all rows (rows_gemm.h). OpenBLAS does
    // not route m == 1 to its GEMV and packs the weights for few rows.
    InvokeRows({.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .ldy = n, .beta = beta});
    return;
  }
  ParallelGemm(x, w, y, m, n, k, 1.0f, beta);
}

void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha) {
  if (m <= kRowsMaxM) {
    InvokeRows(
        {.x = x, .w = w, .y = y, .m = m, .n = n, .k = k, .ldy = n, .alpha = alpha, .beta = 1.0f});
    return;
  }
  ParallelGemm(x, w, y, m, n, k, alpha, 1.0f);
}

void SetBlasThreads(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = threads > 0 ? threads : 1;
  (void)kBlasSingleThreaded;
  omp_set_num_threads(threads);
  cpu_threads.store(threads, std::memory_order_relaxed);
}

int CpuThreads() {
  const int threads = cpu_threads.load(std::memory_order_relaxed);
  return threads > 0 ? threads : omp_get_num_procs();
}

int BlasThreads() { return CpuThreads(); }

}  // namespace tandem::kernels::cpu
