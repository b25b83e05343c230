// Memory-mapped safetensors files (https://github.com/huggingface/safetensors format):
// 8-byte little-endian header length, JSON header, then raw tensor bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint/dtype.h"

namespace tandem {

struct TensorView {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::span<const std::byte> data;  // points into the mapping; size == numel * DTypeSize(dtype)

  int64_t NumElements() const;
};

class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the header: every tensor's byte range lies inside the
  // file, matches its dtype and shape, and ranges do not overlap. Errors name the file and tensor.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  // Parses an in-memory image (no copy: `bytes` must outlive the result). `origin` names the
  // source in error messages. Used by Open and by the fuzz target.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(std::span<const std::byte> bytes,
                                                                const std::string& origin);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return origin_; }
  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* Find(const std::string& name) const;

 private:
  SafetensorsFile() = default;

  std::string origin_;
  void* mapping_ = nullptr;  // munmap'ed in the destructor when set by Open
  size_t mapping_size_ = 0;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (fp32 data converted to `dtype`, which must be F32, F16 or BF16) as one
// safetensors file. For tests, tools and fixtures.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> values;
};
absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              DType dtype);

}  // namespace tandem
