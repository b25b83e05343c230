// Element types found in checkpoints and their conversion to fp32.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "absl/status/statusor.h"
#include "common/bf16.h"  // BF16BitsToF32, F32ToBF16Bits

namespace tandem {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kI16, kI8, kU8, kBool };

// Safetensors spelling ("F32", "BF16", ...) to DType; unknown names are InvalidArgument.
absl::StatusOr<DType> ParseDType(std::string_view name);
std::string_view DTypeName(DType dtype);
size_t DTypeSize(DType dtype);

// Converts `count` elements of a floating dtype (F32, F16, BF16, F64) at `src` to fp32 `dst`.
// `src` need not be aligned. Other dtypes are InvalidArgument.
absl::Status ConvertToF32(DType dtype, const std::byte* src, size_t count, float* dst);

// Scalar conversions between fp32 and f16 (bf16's are in common/bf16.h). Narrowing rounds to
// nearest, ties to even; overflow gives infinity, NaN stays NaN (quiet), subnormals are exact.
float F16BitsToF32(uint16_t bits);
uint16_t F32ToF16Bits(float value);

}  // namespace tandem
