#include "services/cli/bench_prompts.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "services/cli/locate.h"

namespace tandem::cli {

absl::StatusOr<std::vector<Prompt>> LoadPrompts(const std::string& path, int per_category) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read prompt file ", path,
                     " (write it with tools/bench/make_bench_prompts.py, or pass --prompts-file)"));
  }
  std::vector<Prompt> prompts;
  try {
    const nlohmann::json j = nlohmann::json::parse(in);
    for (const auto& [category, items] : j.at("categories").items()) {
      int taken = 0;
      for (const auto& item : items) {
        if (per_category > 0 && taken == per_category) break;
        prompts.push_back(
            {category, item.at("source").get<std::string>(), item.at("text").get<std::string>()});
        ++taken;
      }
    }
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": expected {\"categories\": {name: [{\"source\", \"text\"}]}}: ", e.what()));
  }
  if (prompts.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " has no prompts"));
  return prompts;
}

absl::StatusOr<std::vector<Prompt>> LoadBenchPrompts(const std::string& model_dir_flag,
                                                     const std::string& prompts_file,
                                                     int per_category) {
  if (!prompts_file.empty()) return LoadPrompts(prompts_file, per_category);
  absl::StatusOr<std::string> model_dir = FindModelDir(model_dir_flag);
  if (!model_dir.ok()) return model_dir.status();
  return LoadPrompts(*model_dir + "/fixtures/bench_prompts.json", per_category);
}

}  // namespace tandem::cli
