// A Hugging Face checkpoint directory: one model.safetensors, or shards listed by
// model.safetensors.index.json ("weight_map": tensor name -> shard file).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/checkpoint/safetensors.h"

namespace tandem {

class Checkpoint {
 public:
  // Opens every shard of the checkpoint in `dir`. A missing or truncated shard is an error
  // naming the file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // Opens the safetensors files given explicitly (e.g. a PEFT adapter_model.safetensors).
  static absl::StatusOr<std::unique_ptr<Checkpoint>> OpenFiles(
      const std::vector<std::string>& files);

  const TensorView* Find(const std::string& name) const;
  bool Has(const std::string& name) const { return Find(name) != nullptr; }
  std::vector<std::string> TensorNames() const;

  // The tensor converted to fp32. NotFound / InvalidArgument errors name the tensor, the file,
  // the expected and the actual shape.
  absl::StatusOr<std::vector<float>> LoadF32(const std::string& name,
                                             const std::vector<int64_t>& expected_shape) const;

 private:
  struct Entry {
    const TensorView* view;       // owned by `file`
    const SafetensorsFile* file;  // one of files_
  };

  // Adds every tensor of `file`; a name already present in another file is an error.
  absl::Status AddFile(std::unique_ptr<SafetensorsFile> file);

  std::string origin_;  // the directory or file list, for error messages
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, Entry> tensors_;
};

}  // namespace tandem
