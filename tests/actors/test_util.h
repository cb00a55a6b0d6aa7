// Helpers shared by the actors tests: scratch directories and small IDX files.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace troupe::test {

using TempDir = troupe::testing::TempDir;

/// IDX bytes: magic 0x0000 0x08 rank, big-endian dims, then `data`.
inline std::vector<uint8_t> idxBytes(const std::vector<uint32_t>& dims,
                                     const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out = {0, 0, 0x08, uint8_t(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(d >> shift));
  }
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

inline void writeFile(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

inline void writeGzFile(const std::filesystem::path& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
}

/// Writes a valid split (`prefix` "train" or "t10k") of `count` images of rows x cols, gzipped.
inline void writeSplit(const std::filesystem::path& dir, const std::string& prefix, uint32_t count,
                       uint32_t rows = 28, uint32_t cols = 28, bool gz = true) {
  std::vector<uint8_t> pixels(size_t(count) * rows * cols);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 7);
  std::vector<uint8_t> labels(count);
  for (uint32_t i = 0; i < count; ++i) labels[i] = uint8_t(i % 10);
  auto write = gz ? writeGzFile : writeFile;
  const std::string ext = gz ? ".gz" : "";
  write(dir / (prefix + "-images-idx3-ubyte" + ext), idxBytes({count, rows, cols}, pixels));
  write(dir / (prefix + "-labels-idx1-ubyte" + ext), idxBytes({count}, labels));
}

}  // namespace troupe::test
