// File: troupe/augment/augment.h
//
// The data group's work: turn a batch of 8-bit grey images into augmented, normalised float32
// rows (batch x rows*cols) the trainer can multiply directly. Each image goes through, in order:
// random crop with zero padding, a random resized crop (torchvision's RandomResizedCrop) to
// `upscale` times the image's size (bicubic), horizontal flip, a small affine (rotation and scale
// about the centre), brightness/contrast jitter, Gaussian blur, Gaussian noise, clamping to [0, 1],
// area downsampling back to the image's size and normalisation ((x - mean) / stddev). All image
// operations are OpenCV imgproc calls.
//
// Reproducibility: image `i` of a batch draws its random parameters from a generator seeded by
// (batchSeed, i) only, so a batch re-sent after a producer restart is bit-identical, and images
// may be processed in any order or on any thread.
//
// Cost: the work after the resized crop is done at `upscale` times the image's resolution (4x the
// pixels at 2), as a vision pipeline that decodes and crops a larger source does; the blur kernel
// is the other knob, as GaussianBlur(11) was in the PyTorch example this project reproduces.
// AugmentConfig::heavy() is hetero_train's default; docs/hetero_train.md gives each setting's cost
// per image.

#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::augment {

/// What the augmenter does. Defaults are mild Fashion-MNIST settings. Invalid values are
/// reported by validate(), which the Augmenter constructor calls.
struct AugmentConfig {
  int padding = 1;                  ///< Crop offset range in pixels (zero padding); 0 disables.
  /// Work at this many times the image's size (1..4): bicubic up after the crop, area down at the
  /// end. 1 = the image's own resolution.
  int upscale = 1;
  /// Random resized crop: area fraction drawn from [cropAreaMin, 1] (aspect ratio from [3/4, 4/3])
  /// of the padded image, resized to the working size. 1 = off.
  float cropAreaMin = 1.0f;
  float flipProbability = 0.5f;     ///< Chance of a horizontal flip, in [0, 1].
  float maxRotationDegrees = 5.0f;  ///< Rotation drawn from [-max, max], max in [0, 180].
  float minScale = 0.95f;           ///< Scale drawn from [minScale, maxScale], within (0, 4].
  float maxScale = 1.05f;
  float brightness = 0.1f;    ///< Brightness factor from [1 - b, 1 + b], b in [0, 1]; black stays.
  float contrast = 0.1f;      ///< Contrast factor drawn from [1 - c, 1 + c], c in [0, 1].
  int blurKernel = 0;         ///< Gaussian blur kernel side: 0 = off, else odd in [3, 99].
  float blurSigmaMin = 0.1f;  ///< Blur sigma drawn from [min, max] (torchvision's default).
  float blurSigmaMax = 2.0f;
  float noiseStddev = 0.02f;  ///< Std-dev of additive Gaussian noise on [0, 1] pixels, in [0, 1].
  float mean = 0.2860f;       ///< Normalisation: Fashion-MNIST training-set pixel mean ...
  float stddev = 0.3530f;     ///< ... and standard deviation (on [0, 1] pixels).

  /// Throws std::invalid_argument naming the first bad field, its value and the allowed range.
  void validate() const;

  /// Every augmentation off: output is only scaled and normalised. For evaluation data.
  static AugmentConfig none();

  /// The defaults (mild Fashion-MNIST settings, about 11 us per 28x28 image on one core).
  static AugmentConfig light();

  /// A vision pipeline's cost, as the seeds' PyTorch example was made "heavy on data
  /// preprocessing": random resized crop (area 0.6..1) to 2x the size (56x56, bicubic), flip,
  /// affine, color jitter and noise at that size, area-downsampled back to 28x28 (about 34 us per
  /// image on one core of the dev VM; a blur, blurKernel, adds to it).
  static AugmentConfig heavy();
};

/// Applies an AugmentConfig. Immutable after construction, so one Augmenter may be shared by all
/// threads of a pool.
class Augmenter {
 public:
  /// Validates `config` (std::invalid_argument on bad values).
  explicit Augmenter(const AugmentConfig& config);

  /// Augments `pixels.size() / (rows * cols)` images of `rows` x `cols` bytes, stored
  /// contiguously, into `out` (one row of rows*cols floats per image). `batchSeed` fixes every
  /// random choice; derive it from (run seed, epoch, batch position) so retries reproduce.
  /// Throws std::invalid_argument when the sizes do not fit together.
  void augment(std::span<const uint8_t> pixels, int rows, int cols, uint64_t batchSeed,
               std::span<float> out) const;

  /// As above, allocating the output.
  std::vector<float> augment(std::span<const uint8_t> pixels, int rows, int cols,
                             uint64_t batchSeed) const;

  /// The same images, not normalised: each augmented pixel in [0, 1] as a byte (x 255, rounded),
  /// a quarter of the floats' bytes to send. normalizeImages() of the result equals augment()'s
  /// to within half a grey level (2e-3 / stddev).
  void augmentPixels(std::span<const uint8_t> pixels, int rows, int cols, uint64_t batchSeed,
                     std::span<uint8_t> out) const;

  const AugmentConfig& config() const { return config_; }

 private:
  // Writes floats (normalised) to `floats`, or bytes (x 255) to `bytes`: the other is null.
  void augmentOne(const uint8_t* pixels, int rows, int cols, uint64_t seed, float* floats,
                  uint8_t* bytes) const;
  void checkSizes(size_t pixels, size_t out, int rows, int cols) const;

  AugmentConfig config_;
};

/// Scales bytes to [0, 1] and normalises with (mean, stddev), no augmentation; for test data.
std::vector<float> normalizeImages(std::span<const uint8_t> pixels, float mean = 0.2860f,
                                   float stddev = 0.3530f);

/// The same into `out` (as many floats as `pixels`; std::invalid_argument otherwise): a caller
/// that normalises every batch keeps one buffer.
void normalizeImages(std::span<const uint8_t> pixels, std::span<float> out, float mean = 0.2860f,
                     float stddev = 0.3530f);

}  // namespace troupe::augment
