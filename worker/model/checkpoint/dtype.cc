#include "worker/model/checkpoint/dtype.h"

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4},   {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kF64, "F64", 8},   {DType::kI64, "I64", 8}, {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},   {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable: every enumerator is in the table
}

// Reads a little-endian value of type T from a possibly unaligned address.
template <typename T>
T LoadUnaligned(const std::byte* src) {
  static_assert(std::endian::native == std::endian::little, "checkpoints are little-endian");
  T value;
  std::memcpy(&value, src, sizeof(T));
  return value;
}

// Smallest |double| that rounds to infinity as a float: FLT_MAX plus half an ulp (2^103).
constexpr double kF32OverflowThreshold = 3.4028235677973366e38;

float F64ToF32(double value) {
  // Converting an out-of-range finite double is undefined in C++; IEEE would give infinity.
  if (std::isfinite(value) && std::fabs(value) >= kF32OverflowThreshold) {
    return std::signbit(value) ? -std::numeric_limits<float>::infinity()
                               : std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(value);
}

}  // namespace

absl::StatusOr<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported dtype \"", std::string(name),
                   "\" (supported: F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL)"));
}

std::string_view DTypeName(DType dtype) { return Info(dtype).name; }

size_t DTypeSize(DType dtype) { return Info(dtype).size; }

float F16BitsToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in fp32.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) {
    // Infinity or NaN; the payload (and so the quiet bit) is kept.
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t F32ToF16Bits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) {
    // NaN: keep the top payload bits and force the quiet bit so it cannot become infinity.
    return static_cast<uint16_t>(sign | 0x7e00u | ((magnitude >> 13) & 0x3ffu));
  }
  if (magnitude >= 0x477ff000u) {
    // >= 65520 (halfway between the largest half, 65504, and 2^16) rounds to infinity.
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (magnitude < 0x38800000u) {
    // Below 2^-14: a half subnormal. Scaling by 2^24 is exact; nearbyint rounds half to even
    // under the default rounding mode. A result of 1024 is the smallest normal's encoding.
    const float scaled = std::bit_cast<float>(magnitude) * 0x1p24f;
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(scaled)));
  }
  // Normal: rebias the exponent (127 -> 15) and round the 13 dropped mantissa bits. A carry
  // out of the mantissa correctly increments the exponent.
  uint32_t half = (magnitude - 0x38000000u) >> 13;
  const uint32_t dropped = magnitude & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

absl::Status ConvertToF32(DType dtype, const std::byte* src, size_t count, float* dst) {
  switch (dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(dst, src, count * sizeof(float));
      return absl::OkStatus();
    case DType::kF16:
      for (size_t i = 0; i < count; ++i)
        dst[i] = F16BitsToF32(LoadUnaligned<uint16_t>(src + 2 * i));
      return absl::OkStatus();
    case DType::kBF16:
      for (size_t i = 0; i < count; ++i)
        dst[i] = BF16BitsToF32(LoadUnaligned<uint16_t>(src + 2 * i));
      return absl::OkStatus();
    case DType::kF64:
      for (size_t i = 0; i < count; ++i) dst[i] = F64ToF32(LoadUnaligned<double>(src + 8 * i));
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(absl::StrCat("cannot convert dtype ",
                                                     std::string(DTypeName(dtype)),
                                                     " to F32 (only F32, F16, BF16, F64)"));
  }
}

}  // namespace tandem
