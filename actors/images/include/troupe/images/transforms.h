// File: troupe/images/transforms.h
//
// The data group's image pipeline: decode a sample (JPEG through libjpeg-turbo, PNG through
// libpng, the rest through OpenCV, or raw grey pixels) and apply transforms with torchvision's
// names and semantics, written as a spec:
//
//     auto p = Pipeline::parse("RandomResizedCrop(224),RandomHorizontalFlip(),"
//                              "ColorJitter(0.4,0.4,0.4),Normalize(imagenet)");
//     p.run(sample, seed, out);   // 3 x 224 x 224 float32, CHW
//
// Transforms (arguments as torchvision's, positional or by name):
//   Resize(size)                  int: the shorter side becomes size; (h, w): exactly that
//   CenterCrop(size)              int or (h, w); zero padding where the image is smaller
//   RandomResizedCrop(size, scale=(0.08, 1.0), ratio=(0.75, 1.3333))
//   RandomHorizontalFlip(p=0.5), RandomVerticalFlip(p=0.5)
//   ColorJitter(brightness=0, contrast=0, saturation=0, hue=0)   each a number or (min, max)
//   RandomAffine(degrees, translate=None, scale=None, shear=None)
//   GaussianBlur(kernel_size, sigma=(0.1, 2.0))
//   Grayscale(num_output_channels=1)
//   ToTensor()                    float32 in [0, 1], channels first
//   Normalize(mean, std), or Normalize(imagenet)   implies ToTensor()
//   ToDtype(float16 | float32)    after ToTensor/Normalize
//   ChannelsLast()                float output as H x W x C
// Without ToTensor or Normalize the output is uint8, H x W x C: a quarter of float32's bytes on
// the wire, normalised on the trainer (as DALI and FFCV send it).
//
// Images are decoded as RGB (torchvision's ImageFolder loader converts every file to RGB); raw
// grey sources stay one channel. Where the first transform is RandomResizedCrop or Resize and its
// output is at most half, a quarter or an eighth of the part of a JPEG it uses, the JPEG is
// decoded at that scale (libjpeg-turbo's DCT scaling, as FFCV and DALI do): the crop is drawn on
// the full image's size, then read from the smaller decode.
//
// Reproducible: every random choice comes from `seed` (derive it from the run's seed, the epoch
// and the sample): same seed, same sample, same pixels, on any thread or instance.

#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "troupe/dataset/source.h"

namespace cv {
class Mat;
}

namespace troupe::images {

/// A transform spec that cannot be used: names the transform, the argument, the value and what
/// is allowed (a configuration error: exit 2 at start).
class SpecError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// An 8-bit image, rows of width x channels bytes.
struct Image {
  int height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};

enum class Dtype : uint8_t { kUint8, kFloat16, kFloat32 };
const char* dtypeName(Dtype d);  // "uint8"
size_t dtypeBytes(Dtype d);

/// A model's input from a pipeline's output: float32 as they are, float16 widened, uint8 scaled
/// as (x / 255 - mean) / std (hetero_train's MLP takes uint8 pixels this way). `out` holds
/// bytes.size() / dtypeBytes(dtype) floats.
void toFloat(std::span<const uint8_t> bytes, Dtype dtype, std::span<float> out,
             float mean = 0.5f, float stddev = 0.25f);

/// One sample's output: its shape in `layout` order.
struct Shape {
  int channels = 0, height = 0, width = 0;
  bool channelsFirst = false;  ///< C x H x W; else H x W x C.
  size_t elements() const { return size_t(channels) * height * width; }
};

/// The most pixels an image may claim before it is decoded: PIL's limit, twice its
/// Image.MAX_IMAGE_PIXELS, where it raises DecompressionBombError. A JPEG or PNG whose header
/// claims more is a bad sample (SampleError naming it), refused before anything is allocated
/// for its pixels; 0 is no limit. Formats OpenCV decodes (BMP, TIFF, WebP) have OpenCV's own
/// (CV_IO_MAX_IMAGE_PIXELS, 2^30).
constexpr uint64_t kMaxImagePixels = 178956970;

/// The JPEG's or PNG's size without decoding it: (width, height). SampleError naming `name`
/// when it is not an image this can read, or claims more than `maxPixels` pixels.
std::pair<int, int> imageSize(std::span<const uint8_t> bytes, const std::string& name,
                              uint64_t maxPixels = kMaxImagePixels);

/// Decodes an image file to `channels` (1 or 3) channels. `scaleDenominator` (1, 2, 4 or 8):
/// a JPEG is decoded at that fraction of its size; other formats at full size. SampleError
/// naming `name` for a corrupt, truncated or unknown file, or one whose header claims more than
/// `maxPixels` pixels. As PIL: a JPEG libjpeg warns about (stray bytes, a bad Huffman code) is
/// decoded, one that ends early is not; a 16-bit PNG is read as PIL reads it (grey clipped to
/// 255, colour cut to its high byte). `warning`, where given, gets libjpeg's warning about a JPEG
/// decoded despite one (empty: none).
Image decode(std::span<const uint8_t> bytes, const std::string& name, int channels,
             int scaleDenominator = 1, uint64_t maxPixels = kMaxImagePixels,
             std::string* warning = nullptr);

struct Op;              // one transform with its arguments (transforms.cpp)
struct DeferredJitter;  // a last ColorJitter left to the output's writing (color.h)

/// Where run()'s time goes, summed over its calls (apps/bench/images' stage table): seconds per
/// stage, in Pipeline::stageNames()' order.
struct StageTimes {
  std::vector<double> seconds;
  size_t images = 0, partDecodes = 0;  // run()'s calls; JPEGs of them decoded in part only
};

class Pipeline {
 public:
  /// Parses `spec`. Throws SpecError naming the transform or argument, the value and what is
  /// allowed (with the closest name for a misspelt transform).
  static Pipeline parse(const std::string& spec);

  Pipeline(Pipeline&&) noexcept;
  Pipeline& operator=(Pipeline&&) noexcept;
  ~Pipeline();

  /// The spec in canonical form, every argument named.
  std::string describe() const;

  /// The spec of an evaluation pipeline for this one, as torchvision's ImageNet recipe: Resize
  /// the shorter side to 8/7 of the output, CenterCrop the output's size, then this pipeline's
  /// Grayscale, ToTensor/Normalize, dtype and layout. Same output shape and dtype, no random op.
  std::string evaluationSpec(int inputChannels) const;

  /// What run() writes for a source whose images have `inputChannels` channels (3 for image
  /// files, 1 for raw grey). Throws SpecError when the pipeline does not fix the output's height
  /// and width (a final Resize, CenterCrop or RandomResizedCrop does), or when Normalize's means
  /// do not match the channels.
  Shape outputShape(int inputChannels) const;
  Dtype dtype() const;

  /// Decodes and transforms one sample into `out` (outputShape().elements() x dtypeBytes()).
  /// Raw grey samples need `rawShape` (rows, cols). SampleError naming the file when it cannot
  /// be decoded. `warning`, where given, gets libjpeg's warning about a JPEG decoded despite one
  /// (as PIL decodes it), else is left empty.
  /// With `times`, each stage's time is added to it. Not safe to call on one thread from two
  /// places at once: a thread's buffers are reused from one call to the next.
  void run(const data::Encoded& sample, data::Encoding encoding, std::pair<int, int> rawShape,
           uint64_t seed, std::span<uint8_t> out, std::string* warning = nullptr,
           StageTimes* times = nullptr) const;

  /// run()'s decode of an image file alone, for `seed` (its part, at its scale): what the
  /// transforms cost beside it (apps/bench/images).
  void decodeOnly(const data::Encoded& sample, uint64_t seed) const;

  /// The stages run() times: "decode", each transform's name, then what makes the output
  /// ("Normalize", "ToTensor" or "copy out").
  std::vector<std::string> stageNames() const;

  /// The transforms only, on an image already decoded (tests, and a caller that decodes itself).
  Image transform(Image image, uint64_t seed) const;

  /// The JPEG scale run() decodes an image of `width` x `height` at, for `seed` (1, 2, 4 or 8).
  int decodeScale(int width, int height, uint64_t seed) const;

  /// Off: run() decodes every JPEG at full size (what DCT scaling saves, measured by
  /// apps/bench/images). On by default.
  void setDecodeScaling(bool on) { decodeScaling_ = on; }
  bool decodeScaling() const { return decodeScaling_; }

  /// Off: run() decodes a JPEG whole where its first transform is a RandomResizedCrop or a
  /// CenterCrop inside the image (what decoding only the crop's part saves, measured by
  /// apps/bench/images). On by default: the same pixels.
  void setDecodeRegions(bool on) { decodeRegions_ = on; }

  /// The most pixels run() decodes an image of (kMaxImagePixels; 0: no limit).
  void setMaxPixels(uint64_t n) { maxPixels_ = n; }
  uint64_t maxPixels() const { return maxPixels_; }

 private:
  Pipeline();
  std::vector<std::unique_ptr<Op>> ops_;
  Dtype dtype_ = Dtype::kUint8;
  bool tensor_ = false;         // ToTensor or Normalize: float, channels first
  bool channelsLast_ = false;   // ChannelsLast
  bool decodeScaling_ = true;
  bool decodeRegions_ = true;
  uint64_t maxPixels_ = kMaxImagePixels;
  std::vector<float> mean_, std_;  // Normalize; empty: [0, 1] only

  // `deferred`: a last ColorJitter apply() left to it (fused with Normalize).
  void finish(const cv::Mat& image, std::span<uint8_t> out,
              const DeferredJitter* deferred = nullptr) const;
  std::string tail(bool after) const;  // describe()'s ToTensor/Normalize/dtype/layout part
  // transform() on an image decoded at 1/scale of its full size, `full` (height, width): the
  // first RandomResizedCrop draws its box on the full size and reads it from the smaller image.
  Image transformScaled(Image image, uint64_t seed, int scale, std::pair<int, int> full) const;
  // The transforms on `m` (packed rows the pipeline may change), into buffers of this thread
  // reused from call to call: the result is valid until the thread's next call.
  // `origin`: where m's top-left pixel is in the (scaled) decode a first RandomResizedCrop's box
  // refers to (run() decodes only the box's part of a JPEG).
  cv::Mat apply(cv::Mat m, uint64_t seed, int scale, std::pair<int, int> full, StageTimes* times,
                std::pair<int, int> origin = {0, 0}, DeferredJitter* deferred = nullptr) const;
  // What run() decodes of an image of width x height: its scale, and the box a first
  // RandomResizedCrop draws (the whole image otherwise), on the full size.
  struct DecodePlan {
    int scale, top, left, height, width;
  };
  DecodePlan decodePlan(int width, int height, uint64_t seed) const;
  // run()'s decode of a file into `image`: its full size (height, width), the scale and the
  // origin of the part decoded.
  std::pair<int, int> decodeFile(const data::Encoded& sample, uint64_t seed, std::string* warning,
                                 StageTimes* times, Image& image, int& scale,
                                 std::pair<int, int>& origin) const;
  // The part of a JPEG the plan's box needs (with the resampler's margin at a scale), into
  // `image`, and its origin; false where run() must decode it whole.
  bool decodeRegion(const data::Encoded& sample, const DecodePlan& plan, int width, int height,
                    std::string* warning, Image& image, std::pair<int, int>& origin) const;
};

}  // namespace troupe::images
