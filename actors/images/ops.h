// One transform of a Pipeline with its arguments (transforms.h): what spec.cpp parses and
// transforms.cpp applies, and the draws of its random boxes that sample.cpp plans a decode by.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "troupe/images/transforms.h"

namespace troupe::images {

enum class Kind : uint8_t {
  kResize,
  kCenterCrop,
  kRandomResizedCrop,
  kRandomHorizontalFlip,
  kRandomVerticalFlip,
  kColorJitter,
  kRandomAffine,
  kGaussianBlur,
  kGrayscale,
  kToTensor,
  kNormalize,
  kToDtype,
  kChannelsLast,
};

struct Range {
  double min = 0, max = 0;
  bool set = false;  // given (a factor range of ColorJitter, a RandomAffine option)
};

struct Op {
  Kind kind{};
  int height = 0, width = 0;  // Resize, CenterCrop, RandomResizedCrop
  bool shorterSide = false;   // Resize(int): the shorter side becomes `height`
  Range scale{0.08, 1.0, true}, ratio{3.0 / 4.0, 4.0 / 3.0, true};  // RandomResizedCrop
  double p = 0.5;                                                   // flips
  Range brightness, contrast, saturation, hue;                      // ColorJitter
  Range degrees, translate, affineScale, shear, shearY;             // RandomAffine
  int kernelX = 0, kernelY = 0;                                     // GaussianBlur
  Range sigma{0.1, 2.0, true};
  int grayChannels = 1;            // Grayscale
  std::vector<float> mean, stddev; // Normalize
  Dtype dtype = Dtype::kFloat32;   // ToDtype
  std::string text;                // the canonical spec of this transform
};

// The random choices of one sample: splitmix64, so the same seed draws the same numbers with
// any compiler and standard library.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform(double a, double b) { return a + (b - a) * double(next() >> 11) * 0x1.0p-53; }
  // An integer in [lo, hi): torch.randint(lo, hi).
  int randint(int lo, int hi) { return hi <= lo ? lo : lo + int(next() % uint64_t(hi - lo)); }

 private:
  uint64_t state_;
};

// torchvision's _compute_resized_output_size for an int size: the shorter side becomes `size`.
inline std::pair<int, int> shorterSideTo(int height, int width, int size) {
  if (height <= width) return {size, int(double(size) * width / height)};
  return {int(double(size) * height / width), size};
}

// Python's round(): halves to the even neighbour (round(36.5) == 36), as torchvision computes its
// boxes; std::lround would take 37.
inline int pyRound(double x) {
  return int(std::nearbyint(x));
}

struct Box {
  int top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params.
inline Box resizedCropBox(const Op& op, int height, int width, Rng& rng) {
  double area = double(height) * width;
  double logMin = std::log(op.ratio.min), logMax = std::log(op.ratio.max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.uniform(op.scale.min, op.scale.max);
    double aspect = std::exp(rng.uniform(logMin, logMax));
    int w = int(pyRound(std::sqrt(target * aspect)));
    int h = int(pyRound(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      int top = rng.randint(0, height - h + 1), left = rng.randint(0, width - w + 1);
      return {top, left, h, w};
    }
  }
  double inRatio = double(width) / height;
  int w = width, h = height;
  if (inRatio < op.ratio.min) {
    h = int(pyRound(w / op.ratio.min));
  } else if (inRatio > op.ratio.max) {
    w = int(pyRound(h * op.ratio.max));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

// spec.cpp
std::vector<Op> parseSpec(const std::string& spec);

// The most bytes a thread keeps in its decode and scratch buffers between two images: an image
// larger than this (a 4000 x 3000 photo is 36 MB) leaves them released, not held for the job's
// life (transforms.cpp, sample.cpp).
inline constexpr size_t kKeptBufferBytes = 48u << 20;
// Releases this thread's scratch buffers where they hold more than kKeptBufferBytes.
void releaseLargeScratch();

}  // namespace troupe::images
