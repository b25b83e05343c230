// tokenizer.json (as written by Hugging Face `tokenizers`) -> BpeTokenizer. Only the pipeline
// pieces byte-level BPE models use are accepted; anything else is InvalidArgument naming the
// field, so an unsupported file fails at load rather than tokenizing differently.
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"
#include "worker/tokenizer/internal/bpe_tokenizer.h"
#include "worker/tokenizer/tokenizer.h"

namespace tandem {
namespace {

using json = nlohmann::json;
using tokenizer_internal::AddedToken;
using tokenizer_internal::BpeSpec;
using tokenizer_internal::BpeTokenizer;
using tokenizer_internal::PipelineOptions;
using tokenizer_internal::Regex;

constexpr int kMaxNormalizerDepth = 8;

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", field, ": ", problem));
}

// Member `key` of object `parent`, or nullptr when absent or null.
const json* Find(const json& parent, absl::string_view key) {
  auto it = parent.find(key);
  if (it == parent.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::StatusOr<bool> GetBool(const json& parent, absl::string_view key, bool default_value,
                             absl::string_view path) {
  const json* value = Find(parent, key);
  if (value == nullptr) return default_value;
  if (!value->is_boolean()) return Invalid(absl::StrCat(path, ".", key), "must be a boolean");
  return value->get<bool>();
}

absl::StatusOr<std::string> GetString(const json& parent, absl::string_view key,
                                      absl::string_view path) {
  const json* value = Find(parent, key);
  if (value == nullptr) return Invalid(absl::StrCat(path, ".", key), "is missing");
  if (!value->is_string()) return Invalid(absl::StrCat(path, ".", key), "must be a string");
  return value->get<std::string>();
}

absl::StatusOr<int32_t> ToId(const json& value, absl::string_view field) {
  if (value.is_number_unsigned()) {
    if (value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
      return static_cast<int32_t>(value.get<uint64_t>());
    }
  } else if (value.is_number_integer()) {
    return Invalid(field, "must be a non-negative token id");
  }
  return Invalid(field, "must be an integer token id below 2^31");
}

absl::Status ParseNormalizer(const json& node, absl::string_view path, int depth,
                             PipelineOptions* pipeline) {
  if (!node.is_object()) return Invalid(path, "must be an object or null");
  TANDEM_ASSIGN_OR_RETURN(const std::string type, GetString(node, "type", path));
  if (type == "NFC") {
    pipeline->nfc = true;
    return absl::OkStatus();
  }
  if (type == "Sequence") {
    if (depth >= kMaxNormalizerDepth) return Invalid(path, "Sequence nested too deeply");
    const json* items = Find(node, "normalizers");
    if (items == nullptr || !items->is_array()) {
      return Invalid(absl::StrCat(path, ".normalizers"), "must be an array");
    }
    for (size_t i = 0; i < items->size(); ++i) {
      TANDEM_RETURN_IF_ERROR(ParseNormalizer(
          (*items)[i], absl::StrCat(path, ".normalizers[", i, "]"), depth + 1, pipeline));
    }
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat(path, ".type"),
                 absl::StrCat("unsupported normalizer '", type, "' (supported: NFC, Sequence)"));
}

absl::Status ParseByteLevel(const json& node, absl::string_view path, PipelineOptions* pipeline) {
  // Defaults are HF tokenizers' ByteLevel defaults.
  TANDEM_ASSIGN_OR_RETURN(pipeline->add_prefix_space,
                          GetBool(node, "add_prefix_space", true, path));
  TANDEM_ASSIGN_OR_RETURN(const bool use_regex, GetBool(node, "use_regex", true, path));
  if (use_regex) {
    TANDEM_ASSIGN_OR_RETURN(pipeline->byte_level_regex,
                            Regex::Compile(tokenizer_internal::kGpt2Pattern, /*literal=*/false));
  }
  return absl::OkStatus();
}

absl::Status ParseSplit(const json& node, absl::string_view path, PipelineOptions* pipeline) {
  TANDEM_ASSIGN_OR_RETURN(const std::string behavior, GetString(node, "behavior", path));
  if (behavior != "Isolated") {
    return Invalid(
        absl::StrCat(path, ".behavior"),
        absl::StrCat("unsupported split behavior '", behavior, "' (supported: Isolated)"));
  }
  TANDEM_ASSIGN_OR_RETURN(const bool invert, GetBool(node, "invert", false, path));
  if (invert) return Invalid(absl::StrCat(path, ".invert"), "only false is supported");
  const json* pattern = Find(node, "pattern");
  if (pattern == nullptr || !pattern->is_object()) {
    return Invalid(absl::StrCat(path, ".pattern"), "must be {\"Regex\": ...} or {\"String\": ...}");
  }
  const std::string pattern_path = absl::StrCat(path, ".pattern");
  const bool literal = Find(*pattern, "String") != nullptr;
  if (!literal && Find(*pattern, "Regex") == nullptr) {
    return Invalid(pattern_path, "must be {\"Regex\": ...} or {\"String\": ...}");
  }
  TANDEM_ASSIGN_OR_RETURN(const std::string text,
                          GetString(*pattern, literal ? "String" : "Regex", pattern_path));
  auto regex = Regex::Compile(text, literal);
  if (!regex.ok()) return Invalid(pattern_path, regex.status().message());
  pipeline->splits.push_back(*std::move(regex));
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const json* node, PipelineOptions* pipeline) {
  constexpr absl::string_view kPath = "pre_tokenizer";
  if (node == nullptr) return Invalid(kPath, "is missing (a ByteLevel pre-tokenizer is required)");
  if (!node->is_object()) return Invalid(kPath, "must be an object");
  TANDEM_ASSIGN_OR_RETURN(const std::string type, GetString(*node, "type", kPath));
  if (type == "ByteLevel") return ParseByteLevel(*node, kPath, pipeline);
  if (type != "Sequence") {
    return Invalid("pre_tokenizer.type",
                   absl::StrCat("unsupported pre-tokenizer '", type,
                                "' (supported: ByteLevel, Sequence of Split then ByteLevel)"));
  }
  const json* items = Find(*node, "pretokenizers");
  if (items == nullptr || !items->is_array() || items->empty()) {
    return Invalid("pre_tokenizer.pretokenizers", "must be a non-empty array");
  }
  for (size_t i = 0; i < items->size(); ++i) {
    const std::string path = absl::StrCat("pre_tokenizer.pretokenizers[", i, "]");
    const json& item = (*items)[i];
    if (!item.is_object()) return Invalid(path, "must be an object");
    TANDEM_ASSIGN_OR_RETURN(const std::string item_type, GetString(item, "type", path));
    const bool last = i + 1 == items->size();
    if (item_type == "Split" && !last) {
      TANDEM_RETURN_IF_ERROR(ParseSplit(item, path, pipeline));
    } else if (item_type == "ByteLevel" && last) {
      TANDEM_RETURN_IF_ERROR(ParseByteLevel(item, path, pipeline));
    } else {
      return Invalid(absl::StrCat(path, ".type"),
                     absl::StrCat("unsupported '", item_type,
                                  "' here (supported: Split entries followed by one ByteLevel)"));
    }
  }
  return absl::OkStatus();
}

absl::Status ParseModel(const json* node, BpeSpec* spec) {
  if (node == nullptr) return Invalid("model", "is missing");
  if (!node->is_object()) return Invalid("model", "must be an object");
  TANDEM_ASSIGN_OR_RETURN(const std::string type, GetString(*node, "type", "model"));
  if (type != "BPE") {
    return Invalid("model.type", absl::StrCat("unsupported model '", type, "' (supported: BPE)"));
  }
  TANDEM_ASSIGN_OR_RETURN(const bool byte_fallback,
                          GetBool(*node, "byte_fallback", false, "model"));
  if (byte_fallback) return Invalid("model.byte_fallback", "only false is supported");
  if (const json* dropout = Find(*node, "dropout");
      dropout != nullptr && !(dropout->is_number() && dropout->get<double>() == 0.0)) {
    return Invalid("model.dropout", "only null is supported (dropout is for training)");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json* affix = Find(*node, key);
    if (affix != nullptr && !(affix->is_string() && affix->get<std::string>().empty())) {
      return Invalid(absl::StrCat("model.", key), "only null or \"\" is supported");
    }
  }
  TANDEM_ASSIGN_OR_RETURN(spec->ignore_merges, GetBool(*node, "ignore_merges", false, "model"));
  TANDEM_ASSIGN_OR_RETURN(spec->fuse_unk, GetBool(*node, "fuse_unk", false, "model"));
  if (const json* unk = Find(*node, "unk_token")) {
    if (!unk->is_string()) return Invalid("model.unk_token", "must be a string or null");
    spec->unk_token = unk->get<std::string>();
  }

  const json* vocab = Find(*node, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return Invalid("model.vocab", "must be an object");
  spec->vocab.reserve(vocab->size());
  for (const auto& [spelling, id_value] : vocab->items()) {
    TANDEM_ASSIGN_OR_RETURN(const int32_t id,
                            ToId(id_value, absl::StrCat("model.vocab['", spelling, "']")));
    spec->vocab.emplace_back(spelling, id);
  }

  const json* merges = Find(*node, "merges");
  if (merges == nullptr) return absl::OkStatus();
  if (!merges->is_array()) return Invalid("model.merges", "must be an array");
  spec->merges.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const json& merge = (*merges)[i];
    const std::string path = absl::StrCat("model.merges[", i, "]");
    if (merge.is_string()) {
      // Older files: "left right"; neither side can contain a space (they are byte-level).
      const std::string& line = merge.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return Invalid(path, absl::StrCat("'", line, "' is not two tokens separated by a space"));
      }
      spec->merges.emplace_back(line.substr(0, space), line.substr(space + 1));
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      spec->merges.emplace_back(merge[0].get<std::string>(), merge[1].get<std::string>());
    } else {
      return Invalid(path, "must be \"left right\" or [left, right]");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseAddedTokens(const json* node, std::vector<AddedToken>* added) {
  if (node == nullptr) return absl::OkStatus();
  if (!node->is_array()) return Invalid("added_tokens", "must be an array");
  for (size_t i = 0; i < node->size(); ++i) {
    const json& item = (*node)[i];
    const std::string path = absl::StrCat("added_tokens[", i, "]");
    if (!item.is_object()) return Invalid(path, "must be an object");
    AddedToken token;
    // The format requires an id, but the effective one is assigned the way HF tokenizers
    // assigns it on load (see AssignAddedTokenIds).
    const json* id = Find(item, "id");
    if (id == nullptr) return Invalid(absl::StrCat(path, ".id"), "is missing");
    TANDEM_ASSIGN_OR_RETURN(token.id, ToId(*id, absl::StrCat(path, ".id")));
    TANDEM_ASSIGN_OR_RETURN(token.content, GetString(item, "content", path));
    TANDEM_ASSIGN_OR_RETURN(token.special, GetBool(item, "special", false, path));
    TANDEM_ASSIGN_OR_RETURN(token.single_word, GetBool(item, "single_word", false, path));
    TANDEM_ASSIGN_OR_RETURN(token.lstrip, GetBool(item, "lstrip", false, path));
    TANDEM_ASSIGN_OR_RETURN(token.rstrip, GetBool(item, "rstrip", false, path));
    TANDEM_ASSIGN_OR_RETURN(token.normalized, GetBool(item, "normalized", !token.special, path));
    added->push_back(std::move(token));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Build(const json& root) {
  if (!root.is_object()) return Invalid("(root)", "must be a JSON object");
  PipelineOptions pipeline;
  if (const json* normalizer = Find(root, "normalizer")) {
    TANDEM_RETURN_IF_ERROR(ParseNormalizer(*normalizer, "normalizer", 0, &pipeline));
  }
  TANDEM_RETURN_IF_ERROR(ParsePreTokenizer(Find(root, "pre_tokenizer"), &pipeline));
  const json* decoder = Find(root, "decoder");
  if (decoder == nullptr) return Invalid("decoder", "is missing (ByteLevel is required)");
  if (!decoder->is_object()) return Invalid("decoder", "must be an object");
  TANDEM_ASSIGN_OR_RETURN(const std::string decoder_type, GetString(*decoder, "type", "decoder"));
  if (decoder_type != "ByteLevel") {
    return Invalid("decoder.type",
                   absl::StrCat("unsupported decoder '", decoder_type, "' (supported: ByteLevel)"));
  }
  BpeSpec spec;
  TANDEM_RETURN_IF_ERROR(ParseModel(Find(root, "model"), &spec));
  std::vector<AddedToken> added;
  TANDEM_RETURN_IF_ERROR(ParseAddedTokens(Find(root, "added_tokens"), &added));
  TANDEM_ASSIGN_OR_RETURN(
      std::unique_ptr<BpeTokenizer> tokenizer,
      BpeTokenizer::Create(std::move(pipeline), std::move(spec), std::move(added)));
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json_text) {
  // nlohmann::json reports errors by throwing; nothing escapes this function.
  try {
    const json root = json::parse(json_text);
    return Build(root);
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", e.what()));
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("tokenizer.json: out of memory while loading");
  }
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open tokenizer file '", path, "'"));
  std::ostringstream contents;
  contents << file.rdbuf();
  if (file.bad()) return absl::DataLossError(absl::StrCat("cannot read '", path, "'"));
  auto tokenizer = FromJson(contents.str());
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat(path, ": ", tokenizer.status().message()));
  }
  return tokenizer;
}

}  // namespace tandem
