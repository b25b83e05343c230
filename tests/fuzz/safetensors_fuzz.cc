// libFuzzer target for the safetensors header parser. Any input must either be rejected with a
// status or give tensor views that lie inside the input and are consistent with their dtype and
// shape; every view is read in full so AddressSanitizer sees any out-of-bounds range.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <span>
#include <vector>

#include "worker/model/checkpoint/safetensors.h"

namespace {

void Check(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "safetensors_fuzz: check failed: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  auto file = tandem::SafetensorsFile::Parse(bytes, "fuzz-input");
  if (!file.ok()) {
    Check(!file.status().message().empty(), "errors carry a message");
    return 0;
  }
  const std::byte* begin = bytes.data();
  const std::byte* end = begin + size;
  for (const auto& [name, view] : (*file)->tensors()) {
    Check(view.name == name, "view is keyed by its name");
    Check(
        view.data.size() == static_cast<size_t>(view.NumElements()) * tandem::DTypeSize(view.dtype),
        "byte size matches shape and dtype");
    if (!view.data.empty()) {
      Check(view.data.data() >= begin && view.data.data() + view.data.size() <= end,
            "view lies inside the input");
    }
    Check((*file)->Find(name) == &view, "Find returns the view");
    const auto numel = static_cast<size_t>(view.NumElements());
    if (view.dtype == tandem::DType::kF32 || view.dtype == tandem::DType::kF16 ||
        view.dtype == tandem::DType::kBF16 || view.dtype == tandem::DType::kF64) {
      std::vector<float> values(numel);
      Check(tandem::ConvertToF32(view.dtype, view.data.data(), numel, values.data()).ok(),
            "float dtypes convert");
    } else {
      unsigned sum = 0;
      for (std::byte b : view.data) sum += static_cast<unsigned>(b);
      volatile unsigned sink = sum;
      (void)sink;
    }
  }
  return 0;
}
