#include "kernels/cpu/packed_gemm.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/bf16.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec.h"

// The helpers below take and return wide vectors; they are internal and inlined into callers
// compiled for the matching instruction set, so no call ever crosses the ABI GCC warns about.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace tandem::kernels::cpu {

absl::StatusOr<WeightType> ParseWeightType(std::string_view name) {
  if (name == "f32") return WeightType::kF32;
  if (name == "bf16") return WeightType::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown CPU weight type '", std::string(name), "' (accepted: f32, bf16)"));
}

std::string_view WeightTypeName(WeightType type) {
  return type == WeightType::kBf16 ? "bf16" : "f32";
}

PackedMatrix PackedMatrix::Pack(const float* row_major, int rows, int cols, WeightType type) {
  PackedMatrix m;
  if (rows <= 0 || cols <= 0) return m;
  m.rows_ = rows;
  m.cols_ = cols;
  m.type_ = type;
  const int panels = (rows + kPanelRows - 1) / kPanelRows;
  const size_t total = static_cast<size_t>(panels) * m.PanelValues();
  if (type == WeightType::kBf16) {
    m.bf16_.assign(total, 0);
  } else {
    m.data_.assign(total, 0.0f);
  }
  const long work = static_cast<long>(rows) * cols;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (work > (1 << 20))
  for (int p = 0; p < panels; ++p) {
    const size_t base = static_cast<size_t>(p) * m.PanelValues();
    for (int lane = 0; lane < kPanelRows && p * kPanelRows + lane < rows; ++lane) {
      const float* row = row_major + static_cast<size_t>(p * kPanelRows + lane) * cols;
      for (int i = 0; i < cols; ++i) {
        const size_t at = base + static_cast<size_t>(i) * kPanelRows + lane;
        if (type == WeightType::kBf16) {
          m.bf16_[at] = F32ToBF16Bits(row[i]);
        } else {
          m.data_[at] = row[i];
        }
      }
    }
  }
  return m;
}

void PackedMatrix::CopyRow(int r, float* out) const {
  const size_t base = static_cast<size_t>(r / kPanelRows) * PanelValues() + r % kPanelRows;
  for (int i = 0; i < cols_; ++i) {
    const size_t at = base + static_cast<size_t>(i) * kPanelRows;
    out[i] = type_ == WeightType::kBf16 ? BF16BitsToF32(bf16_[at]) : data_[at];
  }
}

std::vector<float> PackedMatrix::RowMajor() const {
  std::vector<float> out(static_cast<size_t>(rows_) * cols_);
  for (int r = 0; r < rows_; ++r) CopyRow(r, out.data() + static_cast<size_t>(r) * cols_);
  return out;
}

namespace {

using vec::Load;
using vec::VecOf;

// Steps of k per chunk when a tile's input rows pass over its panels in several groups: the
// chunk of the tile's panels stays in the L1 cache for the later groups (16 KB a panel).
constexpr int kChunk = 256;
// How far ahead (steps of k, a cache line of a panel each) the first group asks for its panels
// when there are several input rows, and into the L2 cache only (prefetcht2): a panel's stream
// then arrives ahead of the multiply-adds that wait on it, without holding the L1 cache's few
// miss buffers for a whole memory round trip. (Measured, 400 MB of weights in the 125M model's
// shapes, 2 threads, AMD EPYC with AVX-512, 15 alternated rounds: against 32 steps into L1, 4
// rows 1.12 -> 1.08 one-row products, 16 rows 1.72 -> 1.49; the AVX2 kernel on the same machine
// 16 rows 2.42 -> 1.96. One row is faster without a prefetch, and so is the AVX-512 2-row tile
// of 4 panels.)
constexpr int kPrefetchSteps = 64;
inline __attribute__((always_inline)) void PrefetchToL2(const void* at) {
  __builtin_prefetch(at, 0, 1);
}
// Whether the first group of a product of m input rows prefetches (the measurements above).
template <int W>
constexpr bool Prefetches(int m) {
  return m > (W == 16 ? 2 : 1);
}

// The steps of k in [i0, i1) of NP panels (ps floats apart, from pw) against G input rows: x's
// rows ldx apart, or with PX packed (step i of row j at x[i * ldx + j]). acc_mem[j * NP * V + v]
// holds row j's partial sums for the panels' V-vector columns (started from zero when `first`).
// Every sum is one multiply-add chain over k in order.
template <int W, int NP, int G, bool PX, typename T>
inline __attribute__((always_inline)) void Steps(const T* __restrict pw, size_t ps,
                                                 const float* __restrict x, size_t ldx, int i0,
                                                 int i1, bool first, bool prefetch,
                                                 typename VecOf<W>::type* __restrict acc_mem) {
  using Vec = typename VecOf<W>::type;
  constexpr int kPerPanel = kPanelRows / W, V = NP * kPerPanel;
  Vec acc[G][V];
#pragma GCC unroll 16
  for (int j = 0; j < G; ++j) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) acc[j][v] = first ? Vec{} : acc_mem[j * V + v];
  }
#pragma GCC unroll 2
  for (int i = i0; i < i1; ++i) {
    if (prefetch) {
#pragma GCC unroll 8
      for (int q = 0; q < NP; ++q) {
        PrefetchToL2(pw + q * ps + static_cast<size_t>(i + kPrefetchSteps) * kPanelRows);
      }
    }
    Vec wv[V];
#pragma GCC unroll 16
    for (int q = 0; q < NP; ++q) {
#pragma GCC unroll 4
      for (int c = 0; c < kPerPanel; ++c) {
        wv[q * kPerPanel + c] = Load<W>(pw + q * ps + static_cast<size_t>(i) * kPanelRows + c * W);
      }
    }
#pragma GCC unroll 16
    for (int j = 0; j < G; ++j) {
      const float xs = PX ? x[i * ldx + j] : x[j * ldx + i];
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[j][v] += wv[v] * xs;
    }
  }
#pragma GCC unroll 16
  for (int j = 0; j < G; ++j) {
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) acc_mem[j * V + v] = acc[j][v];
  }
}

// Steps for a group of g input rows (1 <= g <= G).
template <int W, int NP, int G, bool PX, typename T>
inline __attribute__((always_inline)) void GroupSteps(int g, const T* pw, size_t ps, const float* x,
                                                      size_t ldx, int i0, int i1, bool first,
                                                      bool prefetch,
                                                      typename VecOf<W>::type* acc_mem) {
  if constexpr (G > 1) {
    if (g < G) {
      return GroupSteps<W, NP, G - 1, PX, T>(g, pw, ps, x, ldx, i0, i1, first, prefetch, acc_mem);
    }
  }
  Steps<W, NP, G, PX, T>(pw, ps, x, ldx, i0, i1, first, prefetch, acc_mem);
}

// Panels p0 .. p0 + NP - 1 against every input row, then their outputs written (the rows of the
// product's range only). With PX the rows are read packed from xp (PackRows, groups of G).
template <int W, int NP, int G, bool PX, typename T>
inline __attribute__((always_inline)) void Tile(const PackedProduct& p, const float* xp,
                                                int row_end, int p0) {
  using Vec = typename VecOf<W>::type;
  constexpr int V = NP * kPanelRows / W;
  Vec acc[kPackedMaxM * V];
  const PackedMatrix& w = *p.w;
  const int k = w.cols();
  const size_t ps = w.PanelValues(), ldx = p.ldx > 0 ? p.ldx : k;
  const T* pw;
  if constexpr (std::is_same_v<T, uint16_t>) {
    pw = w.bf16_panel(p0);
  } else {
    pw = w.panel(p0);
  }
  // Where step i0 of input rows j0.. is, and how far apart the steps of a row (PX) or the rows
  // (not PX) are.
  auto rows_at = [&](int j0, int i0) {
    return PX ? xp + static_cast<size_t>(j0) * k + static_cast<size_t>(i0) * G
              : p.x + j0 * ldx + i0;
  };
  const size_t x_stride = PX ? G : ldx;
  const bool groups = p.m > G;
  const int chunk = groups ? kChunk : k;
  for (int i0 = 0; i0 < k; i0 += chunk) {
    const int i1 = std::min(k, i0 + chunk);
    if constexpr (std::is_same_v<T, uint16_t>) {
      if (groups) {
        // Several groups pass over this chunk: widen it to fp32 once, into L1, instead of once
        // per group (the widening is exact, so the sums are the same).
        float wide[NP * kChunk * kPanelRows];
        const int len = i1 - i0;
        for (int q = 0; q < NP; ++q) {
          const uint16_t* src = pw + q * ps + static_cast<size_t>(i0) * kPanelRows;
          float* dst = wide + static_cast<size_t>(q) * len * kPanelRows;
          for (int i = 0; i < len * kPanelRows; i += W) {
            PrefetchToL2(src + i + kPrefetchSteps * kPanelRows);
            const Vec v = Load<W>(src + i);
            std::memcpy(dst + i, &v, sizeof(v));
          }
        }
        for (int j0 = 0; j0 < p.m; j0 += G) {
          GroupSteps<W, NP, G, PX, float>(std::min(G, p.m - j0), wide,
                                          static_cast<size_t>(len) * kPanelRows, rows_at(j0, i0),
                                          x_stride, 0, len, i0 == 0, false, acc + j0 * V);
        }
        continue;
      }
    }
    for (int j0 = 0; j0 < p.m; j0 += G) {
      GroupSteps<W, NP, G, PX, T>(std::min(G, p.m - j0), pw, ps, rows_at(j0, 0), x_stride, i0, i1,
                                  i0 == 0, Prefetches<W>(p.m) && j0 == 0, acc + j0 * V);
    }
  }
  const int ldy = p.ldy > 0 ? p.ldy : row_end - p.row_begin;
  const int first_row = p0 * kPanelRows;
  if (first_row >= p.row_begin && first_row + V * W <= row_end) {
    // The whole tile is in the range: its outputs a vector at a time.
    for (int j = 0; j < p.m; ++j) {
      float* out = p.y + static_cast<size_t>(j) * ldy - p.row_begin + first_row;
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) {
        const Vec value = acc[j * V + v] * p.alpha;
        // beta == 0 must not read y: it may hold garbage (0 * NaN is NaN).
        vec::Store<W>(out + v * W, p.beta == 0.0f ? value : p.beta * Load<W>(out + v * W) + value);
      }
    }
    return;
  }
  float sums[V * W];
  for (int j = 0; j < p.m; ++j) {
    std::memcpy(sums, &acc[j * V], sizeof(sums));
    const int lo = std::max(first_row, p.row_begin), hi = std::min(first_row + V * W, row_end);
    float* out = p.y + static_cast<size_t>(j) * ldy - p.row_begin;
    for (int r = lo; r < hi; ++r) {
      const float value = p.alpha * sums[r - first_row];
      // beta == 0 must not read y: it may hold garbage (0 * NaN is NaN).
      out[r] = p.beta == 0.0f ? value : p.beta * out[r] + value;
    }
  }
}

// Panels [p0, p1) in tiles of NP (the last ones one at a time).
template <int W, int NP, int G, bool PX, typename T>
inline __attribute__((always_inline)) void PanelsOf(const PackedProduct& p, const float* xp,
                                                    int row_end, int p0, int p1) {
  int q = p0;
  for (; q + NP <= p1; q += NP) Tile<W, NP, G, PX, T>(p, xp, row_end, q);
  if constexpr (NP > 1) {
    for (; q < p1; ++q) Tile<W, 1, G, PX, T>(p, xp, row_end, q);
  }
}

// Panels [p0, p1) in tiles of NP (the last ones one at a time), over the matrix's weight type.
template <int W, int NP, int G, bool PX = false>
inline __attribute__((always_inline)) void Panels(const PackedProduct& p, const float* xp,
                                                  int row_end, int p0, int p1) {
  if (p.w->type() == WeightType::kBf16) {
    return PanelsOf<W, NP, G, PX, uint16_t>(p, xp, row_end, p0, p1);
  }
  PanelsOf<W, NP, G, PX, float>(p, xp, row_end, p0, p1);
}

// Past 8 input rows, the AVX-512 kernel reads them packed (PackRows): each step of k's 16 values
// side by side, so a tile's broadcasts come from one pointer instead of a register per row (GCC
// kept 12 row pointers of the 2 x 12 tile by spilling them to the stack and reloading them every
// step). Returns the rows per packed group (0: the rows are read where they are); Product takes
// the packed tile exactly when it is not 0.
constexpr int kPackedRows = 16;
template <int W>
constexpr int PackedGroup(int m) {
  if constexpr (W == 16) return m > 8 ? kPackedRows : 0;
  return 0;
}

// The tile shapes per instruction set and input rows: enough independent chains to cover the
// multiply-add latency, and as many accumulators as the registers hold next to the panel's
// vectors. W = 16 (AVX-512, 32 registers): 4 panels for 1-4 rows, 2 panels x 8 rows for 5-8,
// then 1 panel x 16 packed rows (3-4 rows: 1.08 -> 1.02-1.04 one-row products against 2 panels,
// the model's 49 matrices, two runs of 15 alternated rounds; 16 rows: docs/PERF.md).
// W = 8 (AVX2, 16 registers): 4 panels x 1 row, 2 x 2, 2 x 3, then 1 x 6 (12 accumulators).
// W = 4 (16 registers): 2 panels x 1 row, then 1 x 3.
template <int W>
inline __attribute__((always_inline)) void Product(const PackedProduct& p, const float* xp,
                                                   int row_end, int p0, int p1) {
  if constexpr (W == 16) {
    if (p.m <= 2) {
      return p.m == 1 ? Panels<W, 4, 1>(p, xp, row_end, p0, p1)
                      : Panels<W, 4, 2>(p, xp, row_end, p0, p1);
    }
    if (p.m <= 4) return Panels<W, 4, 4>(p, xp, row_end, p0, p1);
    if (PackedGroup<W>(p.m) == 0) return Panels<W, 2, 8>(p, xp, row_end, p0, p1);
    return Panels<W, 1, kPackedRows, true>(p, xp, row_end, p0, p1);
  } else if constexpr (W == 8) {
    if (p.m == 1) return Panels<W, 4, 1>(p, xp, row_end, p0, p1);
    if (p.m == 2) return Panels<W, 2, 2>(p, xp, row_end, p0, p1);
    if (p.m == 3) return Panels<W, 2, 3>(p, xp, row_end, p0, p1);
    return Panels<W, 1, 6>(p, xp, row_end, p0, p1);
  } else {
    if (p.m == 1) return Panels<W, 2, 1>(p, xp, row_end, p0, p1);
    return Panels<W, 1, 3>(p, xp, row_end, p0, p1);
  }
}

using ProductFn = void (*)(const PackedProduct&, const float*, int, int, int);

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TANDEM_PACKED_X86 1
__attribute__((target("avx512f"), optimize("fp-contract=fast"))) void ProductAvx512(
    const PackedProduct& p, const float* xp, int row_end, int p0, int p1) {
  Product<16>(p, xp, row_end, p0, p1);
}
__attribute__((target("avx2,fma"), optimize("fp-contract=fast"))) void ProductAvx2(
    const PackedProduct& p, const float* xp, int row_end, int p0, int p1) {
  Product<8>(p, xp, row_end, p0, p1);
}
#endif
void ProductPortable(const PackedProduct& p, const float* xp, int row_end, int p0, int p1) {
  Product<4>(p, xp, row_end, p0, p1);
}

ProductFn PickProduct() {
#ifdef TANDEM_PACKED_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return ProductAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ProductAvx2;
#endif
  return ProductPortable;
}

const ProductFn kProduct = PickProduct();

// Panels a thread takes at a time: 64 weight rows, whole tiles of every shape above.
constexpr int kBlockPanels = 4;

}  // namespace

namespace {

// The input-row group the kernel `fn` packs a product of m rows into (0: it reads the rows as
// they are).
int GroupFor(ProductFn fn, int m) {
#ifdef TANDEM_PACKED_X86
  if (fn == ProductAvx512) return PackedGroup<16>(m);
  if (fn == ProductAvx2) return PackedGroup<8>(m);
#endif
  return PackedGroup<4>(m);
}

// x's m rows (ldx apart, k values each) in groups of g rows, each group k steps of g values side
// by side (a short last group padded), into `out`.
void PackRows(const float* x, size_t ldx, int m, int k, int g, std::vector<float>& out) {
  out.resize(static_cast<size_t>((m + g - 1) / g) * g * k);
  constexpr int kStrip = 16;  // steps per pass over the rows: the writes stay within a few lines
  for (int i0 = 0; i0 < k; i0 += kStrip) {
    const int i1 = std::min(k, i0 + kStrip);
    for (int j = 0; j < m; ++j) {
      const float* row = x + j * ldx;
      float* dst = out.data() + static_cast<size_t>(j / g) * g * k + j % g;
      for (int i = i0; i < i1; ++i) dst[static_cast<size_t>(i) * g] = row[i];
    }
  }
}

void Invoke(ProductFn fn, const PackedProduct& product) {
  const PackedMatrix& w = *product.w;
  const int row_end = product.row_end > 0 ? product.row_end : w.rows();
  if (product.m <= 0 || row_end <= product.row_begin) return;
  const int p_begin = product.row_begin / kPanelRows;
  const int p_end = (row_end + kPanelRows - 1) / kPanelRows;
  const int blocks = (p_end - p_begin + kBlockPanels - 1) / kBlockPanels;
  const size_t ldx = product.ldx > 0 ? product.ldx : w.cols();
  const int ldy = product.ldy > 0 ? product.ldy : row_end - product.row_begin;
  for (int j0 = 0; j0 < product.m; j0 += kPackedMaxM) {
    PackedProduct slab = product;
    slab.x = product.x + j0 * ldx;
    slab.ldx = static_cast<int>(ldx);
    slab.y = product.y + static_cast<size_t>(j0) * ldy;
    slab.ldy = ldy;
    slab.m = std::min(kPackedMaxM, product.m - j0);
    const long work = static_cast<long>(p_end - p_begin) * kPanelRows * w.cols() * slab.m;
    // Kernels with many input rows read them packed (GroupFor), packed here before the threads
    // start: a share per thread inside the parallel region would need a barrier more per
    // product, and a barrier is where a team waits out a preempted thread on busy cores.
    const int g = GroupFor(fn, slab.m);
    thread_local std::vector<float> packed;
    if (g > 0) PackRows(slab.x, ldx, slab.m, w.cols(), g, packed);
    const float* xp = g > 0 ? packed.data() : nullptr;
#pragma omp parallel for schedule(static) num_threads(CpuThreads()) if (work > (1 << 16))
    for (int b = 0; b < blocks; ++b) {
      const int p0 = p_begin + b * kBlockPanels;
      fn(slab, xp, row_end, p0, std::min(p_end, p0 + kBlockPanels));
    }
  }
}

}  // namespace

void InvokePacked(const PackedProduct& product) { Invoke(kProduct, product); }

void PackedLinear(const float* x, const PackedMatrix& w, const float* bias, float* y, int m) {
  const int n = w.rows();
  if (bias != nullptr) {
    for (int r = 0; r < m; ++r)
      std::memcpy(y + static_cast<size_t>(r) * n, bias, sizeof(float) * n);
  }
  InvokePacked({.x = x, .m = m, .w = &w, .y = y, .beta = bias != nullptr ? 1.0f : 0.0f});
}

const char* PackedKernelName() {
#ifdef TANDEM_PACKED_X86
  if (kProduct == ProductAvx512) return "avx512";
  if (kProduct == ProductAvx2) return "avx2";
#endif
  return "portable";
}

std::vector<const char*> PackedKernelVersions() {
  std::vector<const char*> versions;
#ifdef TANDEM_PACKED_X86
  if (__builtin_cpu_supports("avx512f")) versions.push_back("avx512");
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) versions.push_back("avx2");
#endif
  versions.push_back("portable");
  return versions;
}

void InvokePackedWith(const char* version, const PackedProduct& product) {
  const std::string_view name = version;
  ProductFn fn = ProductPortable;
#ifdef TANDEM_PACKED_X86
  if (name == "avx512") fn = ProductAvx512;
  if (name == "avx2") fn = ProductAvx2;
#endif
  Invoke(fn, product);
}

}  // namespace tandem::kernels::cpu
