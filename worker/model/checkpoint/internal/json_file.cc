#include "worker/model/checkpoint/internal/json_file.h"

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace tandem::checkpoint_internal {

absl::StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::UnavailableError(absl::StrCat(path, ": read failed"));
  return text.str();
}

absl::StatusOr<nlohmann::json> ReadJsonObject(const std::string& path) {
  TANDEM_ASSIGN_OR_RETURN(std::string text, ReadTextFile(path));
  nlohmann::json json = nlohmann::json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": invalid JSON"));
  if (!json.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  return json;
}

}  // namespace tandem::checkpoint_internal
