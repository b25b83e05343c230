#include "services/cli/locate.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace tandem::cli {

namespace fs = std::filesystem;

std::string ExecutableDir() {
  std::error_code error;
  const fs::path exe = fs::read_symlink("/proc/self/exe", error);
  return error ? fs::current_path().string() : exe.parent_path().string();
}

absl::StatusOr<std::string> FindServiceBinary(const std::string& name, const std::string& folder) {
  const fs::path exe_dir = ExecutableDir();
  const fs::path candidates[] = {exe_dir / name, exe_dir.parent_path() / folder / name};
  for (const fs::path& path : candidates) {
    if (access(path.c_str(), X_OK) == 0) return path.string();
  }
  return absl::NotFoundError(absl::StrCat("cannot find '", name, "': looked for ",
                                          candidates[0].string(), " and ", candidates[1].string(),
                                          " (is it built?)"));
}

absl::StatusOr<std::string> FindModelDir(const std::string& flag) {
  if (!flag.empty()) return flag;
  if (const char* env = std::getenv("TANDEM_MODEL_DIR"); env != nullptr && *env != '\0') {
    return std::string(env);
  }
  for (fs::path dir = ExecutableDir(); !dir.empty(); dir = dir.parent_path()) {
    const fs::path model = dir / "models" / "tandem-target";
    if (fs::exists(model / "config.json")) return model.string();
    if (dir == dir.parent_path()) break;
  }
  return absl::NotFoundError(
      "cannot find the bundled models/tandem-target above the tandem executable; pass --model "
      "or set TANDEM_MODEL_DIR");
}

std::string DefaultDrafterDir(const std::string& target_model_dir) {
  const fs::path target(target_model_dir);
  fs::path folder = target.lexically_normal();
  if (folder.filename().empty()) folder = folder.parent_path();  // a trailing '/'
  const fs::path drafter = folder.parent_path() / "tandem-drafter";
  std::error_code error;
  if (!fs::exists(drafter / "config.json", error) || fs::equivalent(drafter, target, error)) {
    return target_model_dir;
  }
  auto read = [](const fs::path& path) -> std::optional<std::string> {
    std::ifstream in(path, std::ios::binary);
    if (!in) return std::nullopt;
    std::ostringstream text;
    text << in.rdbuf();
    return text.str();
  };
  const std::optional<std::string> a = read(target / "tokenizer.json");
  const std::optional<std::string> b = read(drafter / "tokenizer.json");
  if (!a.has_value() || !b.has_value() || *a != *b) return target_model_dir;
  return drafter.string();
}

absl::StatusOr<std::string> FindRepoFile(const std::string& relative) {
  for (fs::path dir = ExecutableDir(); !dir.empty(); dir = dir.parent_path()) {
    const fs::path file = dir / relative;
    if (fs::exists(file)) return file.string();
    if (dir == dir.parent_path()) break;
  }
  return absl::NotFoundError(
      absl::StrCat("cannot find ", relative, " above the tandem executable (not a source tree?)"));
}

}  // namespace tandem::cli
