// A fresh directory under the system temp dir, removed with its contents on destruction.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace tandem::test {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tandem_ckpt_XXXXXX").string();
    const char* made = ::mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::string File(const std::string& name) const { return (path_ / name).string(); }

  // Writes `contents` to `name` inside the directory and returns the full path.
  std::string Write(const std::string& name, const std::string& contents) const {
    const std::string full = File(name);
    std::ofstream out(full, std::ios::binary);
    out << contents;
    EXPECT_TRUE(out.good()) << full;
    return full;
  }

 private:
  std::filesystem::path path_;
};

}  // namespace tandem::test
