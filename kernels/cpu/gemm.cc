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

// Products in slabs of at most kRowsMaxM input rows on rows_gemm.h: each slab reads the weights
// once; each row's sums are the one-row product's.
void Slabs(const float* x, const float* w, float* y, int m, int n, int k, float alpha, float beta) {
  for (int r0 = 0; r0 < m; r0 += kRowsMaxM) {
    InvokeRows({.x = x + static_cast<size_t>(r0) * k,
                .w = w,
                .y = y + static_cast<size_t>(r0) * n,
                .m = std::min(kRowsMaxM, m - r0),
                .n = n,
                .k = k,
                .ldy = n,
                .alpha = alpha,
                .beta = beta});
  }
}

}  // namespace

void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k) {
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r)
      std::memcpy(y + static_cast<size_t>(r) * n, bias, sizeof(float) * n);
  }
  Slabs(x, w, y, m, n, k, 1.0f, bias != nullptr ? 1.0f : 0.0f);
}

void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha) {
  Slabs(x, w, y, m, n, k, alpha, 1.0f);
}

void BlasLinear(const float* x, const float* w, float* y, int m, int n, int k) {
  constexpr int kColumnBlock = 64;
  const int blocks = (n + kColumnBlock - 1) / kColumnBlock;
  const long work = static_cast<long>(m) * n * k;
#pragma omp parallel num_threads(CpuThreads()) if (work > (1 << 20))
  {
    const int t = omp_get_thread_num(), threads = omp_get_num_threads();
    const int c0 = std::min(n, blocks * t / threads * kColumnBlock);
    const int c1 = std::min(n, blocks * (t + 1) / threads * kColumnBlock);
    if (c1 > c0) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, c1 - c0, k, 1.0f, x, k,
                  w + static_cast<size_t>(c0) * k, k, 0.0f, y + c0, n);
    }
  }
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
