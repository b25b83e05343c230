#include "services/common/proto_decode.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/unknown_field_set.h"

namespace tandem {

namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

// Walks the wire form of a `type` message without its schema's string checks and returns the
// path of the first string field whose bytes are not UTF-8; nullopt when all are valid. Sets
// `*malformed` when the bytes of the message, or of a message field in it, are not wire format
// at all: the typed parse would fail on them too, after logging an error for any invalid string
// it met first.
std::optional<std::string> FindInvalidUtf8(const std::string& bytes, const Descriptor& type,
                                           const std::string& prefix, int depth, bool* malformed) {
  // Deeper than any GenerateRequest nests: leave the rest to the typed parse.
  if (depth > 8) return std::nullopt;
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    *malformed = true;
    return std::nullopt;
  }
  std::map<int, int> seen;  // field number -> occurrences so far (index in a repeated field)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& wire = fields.field(i);
    if (wire.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const FieldDescriptor* field = type.FindFieldByNumber(wire.number());
    if (field == nullptr) continue;
    const int index = seen[wire.number()]++;
    std::string path = absl::StrCat(prefix, field->name());
    if (field->is_repeated()) absl::StrAppend(&path, "[", index, "]");
    const std::string& value = wire.length_delimited();
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      if (!google::protobuf::internal::IsStructurallyValidUTF8(value.data(),
                                                               static_cast<int>(value.size()))) {
        return path;
      }
    } else if (field->type() == FieldDescriptor::TYPE_MESSAGE) {
      auto inner = FindInvalidUtf8(value, *field->message_type(), path + ".", depth + 1, malformed);
      if (inner || *malformed) return inner;
    }
  }
  return std::nullopt;
}

}  // namespace

absl::Status DecodeProto(const grpc::ByteBuffer& buffer, size_t max_bytes, std::string_view who,
                         google::protobuf::Message* out) {
  const size_t size = buffer.Length();
  if (size > max_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("the request is ", size, " bytes; the ",
                                                   std::string(who), " accepts at most ", max_bytes,
                                                   " bytes (", max_bytes >> 20, " MiB)"));
  }
  std::vector<grpc::Slice> slices;
  if (grpc::Status dumped = buffer.Dump(&slices); !dumped.ok()) {
    return absl::InternalError(absl::StrCat("cannot read the request: ", dumped.error_message()));
  }
  std::string bytes;
  bytes.reserve(size);
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  // Checked before the typed parse, which would fail on the same bytes without saying where
  // (and log an error for every such request).
  bool malformed = false;
  if (auto field = FindInvalidUtf8(bytes, *out->GetDescriptor(), "", 0, &malformed)) {
    return absl::InvalidArgumentError(absl::StrCat(
        *field,
        " is not valid UTF-8; string fields must be UTF-8 (send token_ids for raw tokens)"));
  }
  if (malformed || !out->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request is not a valid ", out->GetDescriptor()->full_name(), " (malformed protobuf)"));
  }
  return absl::OkStatus();
}

}  // namespace tandem
