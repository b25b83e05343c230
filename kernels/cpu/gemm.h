// Matrix products on the CPU through OpenBLAS.
#pragma once

namespace tandem::kernels::cpu {

// y[m, n] = x[m, k] · w[n, k]^T (+ bias[n])  — the layout of a Hugging Face Linear weight
// ([out_features, in_features]). m == 1 takes the matrix-vector path. `bias` may be null.
void Linear(const float* x, const float* w, const float* bias, float* y, int m, int n, int k);

// y[m, n] += alpha * x[m, k] · w[n, k]^T
void LinearAccumulate(const float* x, const float* w, float* y, int m, int n, int k, float alpha);

// Threads OpenBLAS may use (<= 0: all cores).
void SetBlasThreads(int threads);
int BlasThreads();

}  // namespace tandem::kernels::cpu
