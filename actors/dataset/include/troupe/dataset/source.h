// File: troupe/dataset/source.h
//
// A dataset the data group reads: its length, and for sample i the encoded bytes (a JPEG, a PNG,
// or raw pixels) and a target. Four kinds, found from what is at the path (openSource):
//
//   - an ImageFolder, as torchvision's: one sub-folder per class, classes in sorted order, the
//     files of each class in sorted order, image files by extension (.jpg .jpeg .png ...), other
//     files left out (and counted in notes()), symlinked folders followed;
//   - a manifest: a CSV (`path,label` per line, an optional header) or JSON lines
//     (`{"path": ..., "label": ...}`), paths relative to the manifest's folder;
//   - WebDataset shards: `.tar` files whose members are grouped by basename (the name up to its
//     first dot), an image (`.jpg` `.jpeg` `.png`) with its label (`.cls`: the class as text, or
//     `.json`: an integer or {"label": n}); read in place, at the offsets an index of the headers
//     gives, never unpacked;
//   - Fashion-MNIST's IDX files (train-images-idx3-ubyte[.gz], ...): raw 28x28 grey pixels.
//
// Sized for ImageNet: the file list is built once per process and holds paths and offsets only;
// no sample's bytes are kept. read() is safe from any number of threads at once.
//
// Errors: a dataset that cannot be used at all (nothing there, an empty class folder, a label out
// of range, a damaged tar header, a symlink loop, class folders beside a manifest) throws
// SourceError at open, naming the path and what is allowed: a configuration error, exit 2
// before anything starts. One sample that cannot be read later (gone, unreadable, cut short, too
// large to hold) throws SampleError naming that file, which the caller fails the job with, or
// skips (--skip-bad-samples).

#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::data {

/// The dataset cannot be used: names the path, the problem and what is allowed.
class SourceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// One sample cannot be read or decoded: `file()` names it (a path, or "shard.tar:member").
class SampleError : public std::runtime_error {
 public:
  SampleError(std::string file, const std::string& why)
      : std::runtime_error(file + ": " + why), file_(std::move(file)) {}
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

/// How a sample's bytes are encoded.
enum class Encoding : uint8_t {
  kFile,      ///< An image file's bytes (JPEG, PNG, ...): the decoder finds the format.
  kRawGrey8,  ///< rows x cols bytes of grey (Fashion-MNIST's IDX); see Source::rawShape().
};

/// The largest file read whole as one sample (1 GiB: PIL's pixel limit of RGB pixels stored
/// raw, with room); a larger one is a SampleError naming its size, never read.
inline constexpr uint64_t kMaxSampleFileBytes = 1ull << 30;

/// One sample as stored.
struct Encoded {
  std::vector<uint8_t> bytes;
  int64_t target = 0;
  std::string name;  ///< The file it came from, for errors and the report's skipped list.
};

class Source {
 public:
  virtual ~Source() = default;

  /// Samples in the dataset.
  virtual size_t size() const = 0;

  /// Sample `index` (< size()). Throws SampleError naming the file when it cannot be read.
  virtual Encoded read(size_t index) const = 0;

  /// The name of sample `index`'s file without reading it.
  virtual std::string nameOf(size_t index) const = 0;

  /// Class names in target order (an ImageFolder's folders; "0".."N-1" where only numbers are
  /// known). Targets are in [0, classes().size()).
  virtual const std::vector<std::string>& classes() const = 0;

  /// "ImageFolder", "manifest", "WebDataset" or "IDX".
  virtual std::string kind() const = 0;

  /// Where it was opened from.
  virtual std::string where() const = 0;

  virtual Encoding encoding() const { return Encoding::kFile; }

  /// kRawGrey8: the image's rows and cols.
  virtual std::pair<int, int> rawShape() const { return {0, 0}; }

  /// What opening it left out or found odd, one line each, for the log: files in class folders
  /// that are not images (left out, as torchvision's ImageFolder leaves them), a shard cut short.
  virtual std::vector<std::string> notes() const { return {}; }
};

/// The file extensions of images an ImageFolder or a shard holds, as torchvision's
/// IMG_EXTENSIONS (compared without case).
const std::vector<std::string>& imageExtensions();

/// Opens whatever is at `path`: a folder of class folders, a folder of `.tar` shards or one
/// shard, a manifest file (.csv, .jsonl, .json lines), a folder holding one manifest, or a
/// folder of IDX files. Throws SourceError naming the path and the kinds it looked for.
std::unique_ptr<Source> openSource(const std::filesystem::path& path);

std::unique_ptr<Source> openImageFolder(const std::filesystem::path& root);
std::unique_ptr<Source> openManifest(const std::filesystem::path& file);
std::unique_ptr<Source> openWebDataset(std::vector<std::filesystem::path> shards);
std::unique_ptr<Source> openIdx(const std::filesystem::path& dir);

}  // namespace troupe::data
