// One transform of a Pipeline with its arguments (transforms.h): what spec.cpp parses and
// transforms.cpp applies.
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

// spec.cpp
std::vector<Op> parseSpec(const std::string& spec);

}  // namespace troupe::images
