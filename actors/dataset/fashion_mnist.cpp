#include "troupe/dataset/fashion_mnist.h"

#include <zlib.h>

#include <algorithm>
#include <cstdio>
#include <memory>

namespace troupe::data {
namespace {

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

// Reads the whole file, decompressing when it is gzip. gzread passes plain files through
// unchanged, which is what lets us accept both `.gz` and uncompressed channel contents.
std::vector<uint8_t> readMaybeGzipped(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    throw DatasetError(path.string() + ": no such file");
  }
  std::unique_ptr<gzFile_s, GzCloser> file(gzopen(path.c_str(), "rb"));
  if (!file) throw DatasetError(path.string() + ": cannot open");
  std::vector<uint8_t> out;
  std::vector<uint8_t> chunk(1 << 20);
  for (;;) {
    int n = gzread(file.get(), chunk.data(), unsigned(chunk.size()));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(file.get(), &code);
      throw DatasetError(path.string() + ": corrupt or truncated gzip data (" + msg + ")");
    }
    if (n == 0) break;
    out.insert(out.end(), chunk.begin(), chunk.begin() + n);
  }
  // A gzip stream cut short ends without error from gzread on some zlib versions; gzerror then
  // reports Z_BUF_ERROR ("unexpected end of file").
  int code = Z_OK;
  const char* msg = gzerror(file.get(), &code);
  if (code != Z_OK && code != Z_STREAM_END) {
    throw DatasetError(path.string() + ": corrupt or truncated gzip data (" + msg + ")");
  }
  return out;
}

uint32_t readBigEndian32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

std::string dimsToString(const std::vector<uint32_t>& dims) {
  std::string s;
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
  return s;
}

}  // namespace

IdxArray readIdxFile(const std::filesystem::path& path, uint32_t expectedRank) {
  std::vector<uint8_t> bytes = readMaybeGzipped(path);
  const std::string name = path.string();
  if (bytes.size() < 4) {
    throw DatasetError(name + ": truncated: " + std::to_string(bytes.size()) +
                       " bytes, too short for an IDX header");
  }
  const uint32_t magic = readBigEndian32(bytes.data());
  const uint32_t expectedMagic = 0x0800u | expectedRank;
  if (magic != expectedMagic) {
    char buf[128];
    snprintf(buf, sizeof buf,
             ": bad magic number 0x%08x, expected 0x%08x (unsigned bytes, rank %u)", magic,
             expectedMagic, expectedRank);
    throw DatasetError(name + buf);
  }
  const size_t headerSize = 4 + 4 * size_t(expectedRank);
  if (bytes.size() < headerSize) {
    throw DatasetError(name + ": truncated: " + std::to_string(bytes.size()) +
                       " bytes, header alone needs " + std::to_string(headerSize));
  }
  IdxArray out;
  size_t payload = 1;
  for (uint32_t i = 0; i < expectedRank; ++i) {
    out.dims.push_back(readBigEndian32(bytes.data() + 4 + 4 * i));
    payload *= out.dims.back();
  }
  const size_t have = bytes.size() - headerSize;
  if (have < payload) {
    throw DatasetError(name + ": truncated: header says " + dimsToString(out.dims) + " = " +
                       std::to_string(payload) + " bytes of data but the file has " +
                       std::to_string(have));
  }
  if (have > payload) {
    throw DatasetError(name + ": " + std::to_string(have - payload) +
                       " unexpected bytes after the " + dimsToString(out.dims) + " data");
  }
  out.data.assign(bytes.begin() + headerSize, bytes.end());
  return out;
}

std::filesystem::path findIdxFile(const std::filesystem::path& dir, const std::string& baseName) {
  std::error_code ec;
  const std::filesystem::path gz = dir / (baseName + ".gz");
  if (std::filesystem::is_regular_file(gz, ec)) return gz;
  const std::filesystem::path plain = dir / baseName;
  if (std::filesystem::is_regular_file(plain, ec)) return plain;
  std::string hint =
      std::filesystem::is_directory(dir, ec) ? "" : " (" + dir.string() + " is not a directory)";
  throw DatasetError("neither " + gz.string() + " nor " + plain.string() + " exists" + hint +
                     "; pass the directory holding the Fashion-MNIST IDX files (Debian: " +
                     kDefaultFashionMnistDir + ", SageMaker: the channel directory)");
}

LabeledImages loadFashionMnist(const std::filesystem::path& dir, Split split) {
  const std::string prefix = split == Split::kTrain ? "train" : "t10k";
  const std::filesystem::path imagePath = findIdxFile(dir, prefix + "-images-idx3-ubyte");
  const std::filesystem::path labelPath = findIdxFile(dir, prefix + "-labels-idx1-ubyte");
  IdxArray images = readIdxFile(imagePath, 3);
  IdxArray labels = readIdxFile(labelPath, 1);

  if (images.dims[1] == 0 || images.dims[2] == 0) {
    throw DatasetError(imagePath.filename().string() + " has empty images (" +
                       std::to_string(images.dims[1]) + "x" + std::to_string(images.dims[2]) + ")");
  }
  if (labels.dims[0] != images.dims[0]) {
    throw DatasetError(labelPath.filename().string() + " has " + std::to_string(labels.dims[0]) +
                       " labels but " + imagePath.filename().string() + " has " +
                       std::to_string(images.dims[0]) + " images (in " + dir.string() + ")");
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kFashionMnistClasses) {
      throw DatasetError(labelPath.string() + ": label " + std::to_string(i) + " is " +
                         std::to_string(labels.data[i]) + ", classes are 0.." +
                         std::to_string(kFashionMnistClasses - 1));
    }
  }
  LabeledImages out;
  out.rows = images.dims[1];
  out.cols = images.dims[2];
  out.pixels = std::move(images.data);
  out.labels = std::move(labels.data);
  return out;
}

LabeledImages gatherSamples(const LabeledImages& from, std::span<const uint32_t> samples) {
  LabeledImages out;
  out.rows = from.rows;
  out.cols = from.cols;
  out.pixels.resize(samples.size() * from.imageSize());
  out.labels.resize(samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    if (samples[i] >= from.size()) {
      throw DatasetError("sample id " + std::to_string(samples[i]) + " is out of range for " +
                         std::to_string(from.size()) + " images");
    }
    std::span<const uint8_t> image = from.image(samples[i]);
    std::copy(image.begin(), image.end(), out.pixels.begin() + i * from.imageSize());
    out.labels[i] = from.labels[samples[i]];
  }
  return out;
}

}  // namespace troupe::data
