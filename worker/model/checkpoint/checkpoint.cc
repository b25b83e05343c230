#include "worker/model/checkpoint/checkpoint.h"

#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/model/checkpoint/internal/json_file.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

// A shard name from the index must stay inside the checkpoint directory.
bool IsSafeShardName(const std::string& name) {
  if (name.empty()) return false;
  const fs::path path(name);
  if (path.is_absolute()) return false;
  for (const fs::path& part : path) {
    if (part == "..") return false;
  }
  return true;
}

// weight_map of model.safetensors.index.json: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ParseIndex(const std::string& index_path) {
  TANDEM_ASSIGN_OR_RETURN(const Json index, checkpoint_internal::ReadJsonObject(index_path));
  const auto weight_map = index.find("weight_map");
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": missing object \"weight_map\""));
  }
  std::map<std::string, std::string> result;
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string() || !IsSafeShardName(shard.get<std::string>())) {
      return absl::InvalidArgumentError(absl::StrCat(index_path, ": weight_map entry for '", tensor,
                                                     "' is not a relative file name"));
    }
    result.emplace(tensor, shard.get<std::string>());
  }
  if (result.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": \"weight_map\" is empty"));
  }
  return result;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::Status Checkpoint::AddFile(std::unique_ptr<SafetensorsFile> file) {
  for (const auto& [name, view] : file->tensors()) {
    auto [it, inserted] = tensors_.emplace(name, Entry{&view, file.get()});
    if (!inserted) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", name, "' appears in both ", it->second.file->path(), " and ", file->path()));
    }
  }
  files_.push_back(std::move(file));
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  const fs::path root(dir);
  const fs::path index_path = root / kIndexFile;
  const fs::path single_path = root / kSingleFile;
  std::error_code ec;
  if (fs::exists(index_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(auto weight_map, ParseIndex(index_path.string()));
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) shards.insert(shard);
    std::vector<std::string> files;
    for (const std::string& shard : shards) files.push_back((root / shard).string());
    TANDEM_ASSIGN_OR_RETURN(auto checkpoint, OpenFiles(files));
    checkpoint->origin_ = dir;
    // Every tensor the index promises must be in the shard it names.
    for (const auto& [tensor, shard] : weight_map) {
      const std::string shard_path = (root / shard).string();
      auto it = checkpoint->tensors_.find(tensor);
      if (it == checkpoint->tensors_.end() || it->second.file->path() != shard_path) {
        return absl::InvalidArgumentError(absl::StrCat(index_path.string(), ": tensor '", tensor,
                                                       "' is listed for ", shard_path,
                                                       " but that file does not contain it"));
      }
    }
    return checkpoint;
  }
  if (fs::exists(single_path, ec)) {
    TANDEM_ASSIGN_OR_RETURN(auto checkpoint, OpenFiles({single_path.string()}));
    checkpoint->origin_ = dir;
    return checkpoint;
  }
  return absl::NotFoundError(absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile,
                                          " (is this a Hugging Face checkpoint directory?)"));
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::OpenFiles(
    const std::vector<std::string>& files) {
  auto checkpoint = std::make_unique<Checkpoint>();
  checkpoint->origin_ = absl::StrJoin(files, ", ");
  for (const std::string& path : files) {
    TANDEM_ASSIGN_OR_RETURN(auto file, SafetensorsFile::Open(path));
    TANDEM_RETURN_IF_ERROR(checkpoint->AddFile(std::move(file)));
  }
  return checkpoint;
}

const TensorView* Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second.view;
}

std::vector<std::string> Checkpoint::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, entry] : tensors_) names.push_back(name);
  return names;
}

absl::StatusOr<std::vector<float>> Checkpoint::LoadF32(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", name, "' not found in checkpoint ", origin_));
  }
  const TensorView& view = *it->second.view;
  if (view.shape != expected_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' in ", it->second.file->path(), " has shape ",
                     ShapeString(view.shape), ", expected ", ShapeString(expected_shape)));
  }
  std::vector<float> values(static_cast<size_t>(view.NumElements()));
  absl::Status status = ConvertToF32(view.dtype, view.data.data(), values.size(), values.data());
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' in ", it->second.file->path(), ": ", status.message()));
  }
  return values;
}

}  // namespace tandem
