// Products against weights packed once for the CPU: y[m, r] = alpha * x[m, k] · w[r, k] (+ bias or
// beta * y), where w is stored as panels of kPanelRows weight rows, each panel k steps of its 16
// rows' values side by side (a panel is one contiguous stream). The kernel is an outer product:
// each step of k loads a panel's 16 values once and multiplies them into register tiles of
// (panels x input rows) with the input row's value broadcast. Against the checkpoint's row layout
// (rows_gemm.h's dot products) it needs no lane sums, keeps more multiply-adds in flight per
// load, and streams each panel from memory as one long run the hardware prefetcher follows. Many
// input rows (past 8 on AVX-512) are first packed step-major, k steps of 16 values side by side,
// so a tile broadcasts them from one running pointer.
//
// Batch invariant: every output is one chain of multiply-adds over k in order (fused where the
// instruction set has FMA), whatever m, the tile shape or the thread split, so row j of a many-row
// product equals the one-row product of input row j bit for bit. The instruction set is picked
// once per process (PackedKernelName()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "common/huge_pages.h"

namespace tandem::kernels::cpu {

inline constexpr int kPanelRows = 16;

// How a packed matrix holds its values: fp32, or bf16 (the upper half of the fp32 bits, rounded
// to nearest even when packed) that the kernel widens to fp32 as it loads them, half the bytes
// a product streams. Products accumulate in fp32 either way.
enum class WeightType { kF32, kBf16 };
// "f32" / "bf16"; anything else is InvalidArgument naming the accepted values.
absl::StatusOr<WeightType> ParseWeightType(std::string_view name);
std::string_view WeightTypeName(WeightType type);
// Input rows of one pass over the weights (a product of more runs in slabs of this many).
inline constexpr int kPackedMaxM = 64;

// A [rows, cols] weight matrix (the layout of a Hugging Face Linear weight, [out, in]) in panels.
// The last panel is padded with zero rows.
class PackedMatrix {
 public:
  PackedMatrix() = default;
  // From row-major values (rows apart by `cols`).
  static PackedMatrix Pack(const float* row_major, int rows, int cols,
                           WeightType type = WeightType::kF32);

  int rows() const { return rows_; }
  int cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  WeightType type() const { return type_; }
  // Panel p's values (cols() steps of kPanelRows values): fp32 or bf16 bits, as type() says.
  const float* panel(int p) const { return data_.data() + static_cast<size_t>(p) * PanelValues(); }
  const uint16_t* bf16_panel(int p) const {
    return bf16_.data() + static_cast<size_t>(p) * PanelValues();
  }
  size_t PanelValues() const { return static_cast<size_t>(cols_) * kPanelRows; }
  // Bytes a product reads (the padding included).
  size_t bytes() const { return data_.size() * sizeof(float) + bf16_.size() * sizeof(uint16_t); }

  // Row r into out[0, cols) (an embedding lookup from a tied head), in fp32.
  void CopyRow(int r, float* out) const;
  // The matrix back in row-major order in fp32 (for a device upload or a reference); bf16
  // values come back as the fp32 values the products use.
  std::vector<float> RowMajor() const;

 private:
  // Huge pages where the system grants them: a product streams the whole matrix.
  std::vector<float, HugePageAllocator<float>> data_;        // kF32
  std::vector<uint16_t, HugePageAllocator<uint16_t>> bf16_;  // kBf16
  int rows_ = 0, cols_ = 0;
  WeightType type_ = WeightType::kF32;
};

struct PackedProduct {
  const float* x = nullptr;  // [m, w->cols()], rows ldx apart (0: cols)
  int ldx = 0;
  int m = 0;
  const PackedMatrix* w = nullptr;
  // Weight rows [row_begin, row_end) (row_end 0: every row); output column c is weight row
  // row_begin + c.
  int row_begin = 0, row_end = 0;
  float* y = nullptr;  // [m, ldy]; read only when beta != 0
  int ldy = 0;         // 0: the number of outputs
  float alpha = 1.0f;
  float beta = 0.0f;
};

// The panels split across the ops' OpenMP pool (gemm.h) past a little work; more than
// kPackedMaxM input rows run in slabs.
void InvokePacked(const PackedProduct& product);

// y[m, n] = x[m, k] · w^T (+ bias[n]): Linear (gemm.h) over packed weights. `bias` may be null.
void PackedLinear(const float* x, const PackedMatrix& w, const float* bias, float* y, int m);

// "avx512", "avx2" or "portable": the version this process runs.
const char* PackedKernelName();

// For tests: every version this CPU can run (the process's own among them), and a product
// through one of them by name (InvokePacked's split and slabs; a name not listed runs the
// portable one).
std::vector<const char*> PackedKernelVersions();
void InvokePackedWith(const char* version, const PackedProduct& product);

}  // namespace tandem::kernels::cpu
