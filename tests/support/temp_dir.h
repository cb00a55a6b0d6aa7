// File: temp_dir.h
//
// A fresh folder under $TMPDIR (else /tmp) for one test, removed with everything in it when the
// test ends: every test that writes files uses this one (tests/support, linked into each test
// binary through troupe_catch_main).
//
//   troupe::testing::TempDir dir("troupe-secret");
//   write(dir / "secret", text);               // "<dir>/secret"
//   load(dir.path());                          // the folder itself

#pragma once

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

namespace troupe::testing {

class TempDir {
 public:
  explicit TempDir(std::string_view prefix = "troupe-test") {
    auto pattern =
        (std::filesystem::temp_directory_path() / (std::string(prefix) + "-XXXXXX")).string();
    if (mkdtemp(pattern.data()) == nullptr) {
      throw std::runtime_error("cannot make a temporary folder " + pattern + ": " +
                               strerror(errno));
    }
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string operator/(std::string_view relative) const {
    return path_ + "/" + std::string(relative);
  }

 private:
  std::string path_;
};

}  // namespace troupe::testing
