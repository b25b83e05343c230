#include "worker/model/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using Json = nlohmann::json;

// The reference implementation refuses headers above 100 MB; so do we, before allocating.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

absl::Status Invalid(const std::string& origin, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": ", what));
}

absl::Status InvalidTensor(const std::string& origin, const std::string& name,
                           absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(origin, ": tensor '", name, "': ", what));
}

// A JSON value as a non-negative integer; floats and negatives are rejected.
bool AsUnsigned(const Json& value, uint64_t* out) {
  if (!value.is_number_unsigned()) return false;
  *out = value.get<uint64_t>();
  return true;
}

struct ByteRange {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

absl::Status ParseTensorEntry(const std::string& origin, const std::string& name, const Json& entry,
                              std::span<const std::byte> data, TensorView* view, ByteRange* range) {
  if (!entry.is_object()) return InvalidTensor(origin, name, "header entry is not a JSON object");
  const auto dtype_it = entry.find("dtype");
  const auto shape_it = entry.find("shape");
  const auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return InvalidTensor(origin, name, "missing string field \"dtype\"");
  }
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return InvalidTensor(origin, name, "missing array field \"shape\"");
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2) {
    return InvalidTensor(origin, name, "\"data_offsets\" must be an array [begin, end]");
  }

  absl::StatusOr<DType> dtype = ParseDType(dtype_it->get_ref<const std::string&>());
  if (!dtype.ok()) return InvalidTensor(origin, name, dtype.status().message());

  // numel * element size must fit in uint64 (and in the file, checked below).
  const uint64_t element_size = DTypeSize(*dtype);
  const uint64_t max_numel = std::numeric_limits<uint64_t>::max() / element_size;
  std::vector<int64_t> shape;
  uint64_t numel = 1;
  for (const Json& dim_json : *shape_it) {
    uint64_t dim = 0;
    if (!AsUnsigned(dim_json, &dim) ||
        dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return InvalidTensor(origin, name, "shape entries must be non-negative integers");
    }
    if (dim != 0 && numel > max_numel / dim) {
      return InvalidTensor(origin, name, "element count overflows");
    }
    numel *= dim;
    shape.push_back(static_cast<int64_t>(dim));
  }

  uint64_t begin = 0;
  uint64_t end = 0;
  if (!AsUnsigned((*offsets_it)[0], &begin) || !AsUnsigned((*offsets_it)[1], &end)) {
    return InvalidTensor(origin, name, "\"data_offsets\" must be non-negative integers");
  }
  if (begin > end) {
    return InvalidTensor(origin, name,
                         absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
  }
  if (end > data.size()) {
    return InvalidTensor(
        origin, name,
        absl::StrCat("data_offsets [", begin, ", ", end, "] lie outside the data section of ",
                     data.size(), " bytes (file truncated?)"));
  }
  const uint64_t expected_bytes = numel * element_size;
  if (end - begin != expected_bytes) {
    return InvalidTensor(
        origin, name,
        absl::StrCat("byte size ", end - begin, " does not match dtype ",
                     std::string(DTypeName(*dtype)), " and shape [", absl::StrJoin(shape, ", "),
                     "] (", expected_bytes, " bytes)"));
  }

  view->name = name;
  view->dtype = *dtype;
  view->shape = std::move(shape);
  view->data = data.subspan(begin, end - begin);
  *range = ByteRange{begin, end, &view->name};
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& origin, const Json& value,
                           std::map<std::string, std::string>* metadata) {
  if (!value.is_object()) return Invalid(origin, "\"__metadata__\" must be an object of strings");
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) {
      return Invalid(origin,
                     absl::StrCat("\"__metadata__\" value for \"", key, "\" is not a string"));
    }
    (*metadata)[key] = item.get<std::string>();
  }
  return absl::OkStatus();
}

// Rejects two tensors sharing bytes. Empty ranges share nothing.
absl::Status CheckNoOverlap(const std::string& origin, std::vector<ByteRange> ranges) {
  std::erase_if(ranges, [](const ByteRange& r) { return r.begin == r.end; });
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return Invalid(
          origin, absl::StrCat("tensors '", *ranges[i - 1].name, "' [", ranges[i - 1].begin, ", ",
                               ranges[i - 1].end, ") and '", *ranges[i].name, "' [",
                               ranges[i].begin, ", ", ranges[i].end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

int64_t TensorView::NumElements() const {
  int64_t numel = 1;
  for (int64_t dim : shape) numel *= dim;  // cannot overflow: checked when the header was parsed
  return numel;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    std::span<const std::byte> bytes, const std::string& origin) {
  if (bytes.size() < 8) {
    return Invalid(origin, absl::StrCat("file has ", bytes.size(),
                                        " bytes, too short for the 8-byte header length"));
  }
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
  }
  if (header_size > kMaxHeaderBytes) {
    return Invalid(origin, absl::StrCat("header length ", header_size, " exceeds the limit of ",
                                        kMaxHeaderBytes, " bytes"));
  }
  if (header_size > bytes.size() - 8) {
    return Invalid(origin, absl::StrCat("header length ", header_size, " runs past the end of the ",
                                        bytes.size(), "-byte file (file truncated?)"));
  }
  const char* header_begin = reinterpret_cast<const char*>(bytes.data() + 8);
  const std::span<const std::byte> data = bytes.subspan(8 + header_size);

  auto file = std::unique_ptr<SafetensorsFile>(new SafetensorsFile());
  file->origin_ = origin;
  std::vector<ByteRange> ranges;
  try {
    const Json header = Json::parse(header_begin, header_begin + header_size, /*cb=*/nullptr,
                                    /*allow_exceptions=*/false);
    if (header.is_discarded()) return Invalid(origin, "header is not valid JSON");
    if (!header.is_object()) return Invalid(origin, "header is not a JSON object");
    ranges.reserve(header.size());
    for (const auto& [name, entry] : header.items()) {
      if (name == kMetadataKey) {
        TANDEM_RETURN_IF_ERROR(ParseMetadata(origin, entry, &file->metadata_));
        continue;
      }
      TensorView view;
      ByteRange range;
      TANDEM_RETURN_IF_ERROR(ParseTensorEntry(origin, name, entry, data, &view, &range));
      auto [it, inserted] = file->tensors_.emplace(name, std::move(view));
      if (!inserted) return InvalidTensor(origin, name, "appears twice in the header");
      range.name = &it->first;
      ranges.push_back(range);
    }
  } catch (const std::exception& e) {
    // nlohmann::json may still throw (e.g. allocation failure); never let it escape.
    return Invalid(origin, absl::StrCat("cannot parse header: ", e.what()));
  }
  TANDEM_RETURN_IF_ERROR(CheckNoOverlap(origin, std::move(ranges)));
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    std::string message = absl::StrCat(path, ": cannot open: ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(message) : absl::UnavailableError(message);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const size_t size = static_cast<size_t>(st.st_size);
  if (size < 8) {
    ::close(fd);
    return Invalid(
        path, absl::StrCat("file has ", size, " bytes, too short for the 8-byte header length"));
  }
  // MAP_PRIVATE + PROT_READ: weights are paged in on first touch and shared with the page cache.
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat(path, ": mmap failed: ", std::strerror(map_errno)));
  }
  auto file = Parse(std::span<const std::byte>(static_cast<const std::byte*>(mapping), size), path);
  if (!file.ok()) {
    ::munmap(mapping, size);
    return file.status();
  }
  (*file)->mapping_ = mapping;
  (*file)->mapping_size_ = size;
  return file;
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
}

const TensorView* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors(", path, "): dtype ",
                                                   std::string(DTypeName(dtype)),
                                                   " is not F32, F16 or BF16"));
  }
  const size_t element_size = DTypeSize(dtype);

  // Tensors are laid out in name order, the order the header lists them in.
  std::vector<const TensorToWrite*> order;
  std::set<std::string_view> names;
  for (const TensorToWrite& tensor : tensors) {
    if (tensor.name == kMetadataKey || !names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors(", path, "): duplicate or reserved name '", tensor.name, "'"));
    }
    int64_t numel = 1;
    for (int64_t dim : tensor.shape) {
      if (dim < 0) {
        return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors(", path, "): tensor '",
                                                       tensor.name, "' has a negative dimension"));
      }
      numel *= dim;
    }
    if (static_cast<size_t>(numel) != tensor.values.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "WriteSafetensors(", path, "): tensor '", tensor.name, "' has ", tensor.values.size(),
          " values for shape [", absl::StrJoin(tensor.shape, ", "), "]"));
    }
    order.push_back(&tensor);
  }
  std::sort(order.begin(), order.end(),
            [](const TensorToWrite* a, const TensorToWrite* b) { return a->name < b->name; });

  Json header = Json::object();
  std::string data;
  for (const TensorToWrite* tensor : order) {
    const size_t begin = data.size();
    for (float value : tensor->values) {
      char bytes[4];
      if (dtype == DType::kF32) {
        std::memcpy(bytes, &value, 4);
      } else {
        const uint16_t bits = dtype == DType::kF16 ? F32ToF16Bits(value) : F32ToBF16Bits(value);
        std::memcpy(bytes, &bits, 2);
      }
      data.append(bytes, element_size);
    }
    header[tensor->name] = {{"dtype", std::string(DTypeName(dtype))},
                            {"shape", tensor->shape},
                            {"data_offsets", {begin, data.size()}}};
  }
  // Pad the header with spaces to a multiple of 8 so the data section stays 8-byte aligned,
  // as the reference writer does.
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_size = header_text.size();
  char length_bytes[8];
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<char>((header_size >> (8 * i)) & 0xff);

  std::FILE* out = std::fopen(path.c_str(), "wb");
  if (out == nullptr) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot create: ", std::strerror(errno)));
  }
  bool ok = std::fwrite(length_bytes, 1, 8, out) == 8;
  ok = ok && std::fwrite(header_text.data(), 1, header_text.size(), out) == header_text.size();
  ok = ok && std::fwrite(data.data(), 1, data.size(), out) == data.size();
  ok = (std::fclose(out) == 0) && ok;
  if (!ok) return absl::UnavailableError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace tandem
