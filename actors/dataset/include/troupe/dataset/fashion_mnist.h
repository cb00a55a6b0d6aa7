// File: troupe/dataset/fashion_mnist.h
//
// Reads Fashion-MNIST (and MNIST: same format) from IDX files, gzip-compressed or not. The data
// set is small (60k + 10k images of 28x28 bytes, ~55 MB unpacked), so a split is loaded whole
// into memory; shards and epochs are index lists over it (see epoch.h).
//
// Errors: every problem with the files throws DatasetError whose message names the file and the
// offending values, because the usual cause is a wrong channel directory or a truncated upload
// and the person reading the log has to know which file to fix.

#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::data {

/// Thrown for missing, unreadable, truncated or inconsistent data files and for bad shard
/// arguments. The message is meant for a user: it names the file or argument and the values.
class DatasetError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Where the Debian package `dataset-fashion-mnist` installs the files.
inline constexpr const char* kDefaultFashionMnistDir = "/usr/share/datasets/fashion-mnist";

/// Number of classes in Fashion-MNIST; labels are 0..9.
inline constexpr uint32_t kFashionMnistClasses = 10;

/// One decoded IDX file of unsigned bytes (type code 0x08): its dimensions and payload.
struct IdxArray {
  std::vector<uint32_t> dims;  ///< As in the header, outermost first; e.g. {60000, 28, 28}.
  std::vector<uint8_t> data;   ///< Product of dims bytes, row-major.
};

/// Reads one IDX file of unsigned bytes. gzip input is detected by content, so `path` may name a
/// `.gz` or a plain file. Checks that the magic number is 0x0000 0x08 `expectedRank` and that the
/// payload has exactly the size the header promises (a shorter file is reported as truncated).
IdxArray readIdxFile(const std::filesystem::path& path, uint32_t expectedRank);

/// Which half of the data set.
enum class Split { kTrain, kTest };

/// Images and their labels, as stored in the files: `rows * cols` bytes per image, 0 = background.
struct LabeledImages {
  uint32_t rows = 0;
  uint32_t cols = 0;
  std::vector<uint8_t> pixels;  ///< size() * rows * cols bytes.
  std::vector<uint8_t> labels;  ///< One class id in [0, kFashionMnistClasses) per image.

  /// Number of images.
  size_t size() const { return labels.size(); }
  /// Bytes per image.
  size_t imageSize() const { return size_t(rows) * cols; }
  /// Pixels of image `i`.
  std::span<const uint8_t> image(size_t i) const {
    return {pixels.data() + i * imageSize(), imageSize()};
  }
};

/// Loads one split from `dir`, which is either the Debian package directory or a SageMaker
/// channel directory (`/opt/ml/input/data/<channel>`). Looks for the standard names
/// (`train-images-idx3-ubyte`, `train-labels-idx1-ubyte`, `t10k-...`), first with `.gz`, then
/// without. Throws DatasetError when a file is missing, malformed, when the label count differs
/// from the image count, or when a label is out of range.
LabeledImages loadFashionMnist(const std::filesystem::path& dir, Split split);

/// The file `loadFashionMnist` would read for `baseName` in `dir` (the `.gz` one if both exist).
/// Throws DatasetError naming both candidates when neither exists.
std::filesystem::path findIdxFile(const std::filesystem::path& dir, const std::string& baseName);

/// Copies the images and labels of `samples` (ids into `from`), in that order, into a new set;
/// this is how a producer turns a CursorBatch into contiguous pixels for the augmenter. Throws
/// DatasetError for an id >= from.size().
LabeledImages gatherSamples(const LabeledImages& from, std::span<const uint32_t> samples);

}  // namespace troupe::data
