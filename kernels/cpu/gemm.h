// Matrix products on the CPU: few rows on our own kernel (rows_gemm.h), more through OpenBLAS.
#pragma once

namespace tandem::kernels::cpu {

// y[m, n] = x[m, k] · w[n, k]^T (+ bias[n])  — the layout of a Hugging Face Linear weight
// ([out_features, in_features]). m <= kRowsMaxM takes rows_gemm.h (the weights read once; batch
// invariant), more rows OpenBLAS. `bias` may be null.
void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k);

// y[m, n] += alpha * x[m, k] · w[n, k]^T
void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha);

// Threads the CPU ops may use (<= 0: all cores), in every thread of the process. Every op runs
// on one OpenMP pool (its loops name the count, since omp_set_num_threads would reach only the
// calling thread and the engine's forwards run on a thread of their own); OpenBLAS runs
// single-threaded inside it.
void SetBlasThreads(int threads);
int BlasThreads();  // = CpuThreads()
// The thread count the ops' OpenMP loops use: SetBlasThreads' value, all cores until it is called.
int CpuThreads();

}  // namespace tandem::kernels::cpu
