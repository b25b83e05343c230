// Matrix products over row-major weights on the CPU, on our own kernel (rows_gemm.h): LoRA
// factors, the DFlash drafter's layers, attention's score blocks. A Transformer's own products run
// over its weights packed once (packed_gemm.h). OpenBLAS remains for attention's GEMM path and as
// the reference benchmarks compare with (BlasLinear).
#pragma once

namespace tandem::kernels::cpu {

// y[m, n] = x[m, k] · w[n, k]^T (+ bias[n])  — the layout of a Hugging Face Linear weight
// ([out_features, in_features]). In slabs of up to kRowsMaxM input rows, each reading the weights
// once; batch invariant: row j of any product equals the one-row product of x's row j bit for
// bit. (Measured against OpenBLAS 0.3.21 called per column block from the same pool, 2 threads,
// the products of a 400 MB and a 1.5 GB model: 0.58-0.78x its time from 32 to 512 rows.)
// `bias` may be null.
void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k);

// y[m, n] += alpha * x[m, k] · w[n, k]^T
void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha);

// y[m, n] = x[m, k] · w[n, k]^T through OpenBLAS sgemm, the output columns split across the ops'
// pool in blocks of 64 (single-threaded OpenBLAS in each thread): the reference a benchmark sets
// Linear against.
void BlasLinear(const float* x, const float* w, float* y, int m, int n, int k);

// Threads the CPU ops may use (<= 0: all cores), in every thread of the process. Every op runs
// on one OpenMP pool (its loops name the count, since omp_set_num_threads would reach only the
// calling thread and the engine's forwards run on a thread of their own); OpenBLAS runs
// single-threaded inside it.
void SetBlasThreads(int threads);
int BlasThreads();  // = CpuThreads()
// The thread count the ops' OpenMP loops use: SetBlasThreads' value, all cores until it is called.
int CpuThreads();

}  // namespace tandem::kernels::cpu
