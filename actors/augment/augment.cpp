#include "troupe/augment/augment.h"

#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::augment {
namespace {

void require(bool ok, const char* field, double value, const char* allowed) {
  if (ok) return;
  throw std::invalid_argument(std::string("AugmentConfig.") + field + " is " +
                              std::to_string(value) + "; it must be " + allowed);
}

// splitmix64 finaliser: spreads (batchSeed, index) so neighbouring images get unrelated streams.
uint64_t imageSeed(uint64_t batchSeed, uint64_t index) {
  uint64_t z = batchSeed + 0x9e3779b97f4a7c15ull * (index + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return z ? z : 1;  // cv::RNG treats state 0 as "use the default seed".
}

}  // namespace

void AugmentConfig::validate() const {
  require(padding >= 0 && padding <= 14, "padding", padding, "in [0, 14]");
  require(upscale >= 1 && upscale <= 4, "upscale", upscale, "1, 2, 3 or 4");
  require(cropAreaMin > 0 && cropAreaMin <= 1, "cropAreaMin", cropAreaMin, "in (0, 1]");
  require(flipProbability >= 0 && flipProbability <= 1, "flipProbability", flipProbability,
          "in [0, 1]");
  require(maxRotationDegrees >= 0 && maxRotationDegrees <= 180, "maxRotationDegrees",
          maxRotationDegrees, "in [0, 180]");
  require(minScale > 0 && minScale <= 4, "minScale", minScale, "in (0, 4]");
  require(maxScale >= minScale && maxScale <= 4, "maxScale", maxScale, "in [minScale, 4]");
  require(brightness >= 0 && brightness <= 1, "brightness", brightness, "in [0, 1]");
  require(contrast >= 0 && contrast <= 1, "contrast", contrast, "in [0, 1]");
  require(blurKernel == 0 || (blurKernel >= 3 && blurKernel <= 99 && blurKernel % 2 == 1),
          "blurKernel", blurKernel, "0 (no blur) or an odd number in [3, 99]");
  require(blurSigmaMin > 0, "blurSigmaMin", blurSigmaMin, "positive");
  require(blurSigmaMax >= blurSigmaMin, "blurSigmaMax", blurSigmaMax, ">= blurSigmaMin");
  require(noiseStddev >= 0 && noiseStddev <= 1, "noiseStddev", noiseStddev, "in [0, 1]");
  require(mean >= 0 && mean <= 1, "mean", mean, "in [0, 1]");
  require(stddev > 0, "stddev", stddev, "positive");
}

AugmentConfig AugmentConfig::none() {
  AugmentConfig c;
  c.padding = 0;
  c.flipProbability = 0;
  c.maxRotationDegrees = 0;
  c.minScale = c.maxScale = 1;
  c.brightness = 0;
  c.contrast = 0;
  c.blurKernel = 0;
  c.noiseStddev = 0;
  return c;
}

AugmentConfig AugmentConfig::light() { return AugmentConfig(); }

AugmentConfig AugmentConfig::heavy() {
  AugmentConfig c;
  c.upscale = 2;
  c.cropAreaMin = 0.6f;
  return c;
}

Augmenter::Augmenter(const AugmentConfig& config) : config_(config) {
  config_.validate();
}

void Augmenter::checkSizes(size_t pixels, size_t out, int rows, int cols) const {
  if (rows <= 0 || cols <= 0) {
    throw std::invalid_argument("Augmenter::augment: image size " + std::to_string(rows) + "x" +
                                std::to_string(cols) + " is not positive");
  }
  const size_t imageSize = size_t(rows) * cols;
  if (pixels % imageSize != 0 || out != pixels) {
    throw std::invalid_argument("Augmenter::augment: " + std::to_string(pixels) +
                                " input bytes and " + std::to_string(out) +
                                " output values do not fit images of " + std::to_string(rows) +
                                "x" + std::to_string(cols));
  }
}

void Augmenter::augment(std::span<const uint8_t> pixels, int rows, int cols, uint64_t batchSeed,
                        std::span<float> out) const {
  checkSizes(pixels.size(), out.size(), rows, cols);
  const size_t imageSize = size_t(rows) * cols;
  for (size_t i = 0; i < pixels.size() / imageSize; ++i) {
    augmentOne(pixels.data() + i * imageSize, rows, cols, imageSeed(batchSeed, i),
               out.data() + i * imageSize, nullptr);
  }
}

void Augmenter::augmentPixels(std::span<const uint8_t> pixels, int rows, int cols,
                              uint64_t batchSeed, std::span<uint8_t> out) const {
  checkSizes(pixels.size(), out.size(), rows, cols);
  const size_t imageSize = size_t(rows) * cols;
  for (size_t i = 0; i < pixels.size() / imageSize; ++i) {
    augmentOne(pixels.data() + i * imageSize, rows, cols, imageSeed(batchSeed, i), nullptr,
               out.data() + i * imageSize);
  }
}

std::vector<float> Augmenter::augment(std::span<const uint8_t> pixels, int rows, int cols,
                                      uint64_t batchSeed) const {
  std::vector<float> out(pixels.size());
  augment(pixels, rows, cols, batchSeed, out);
  return out;
}

void Augmenter::augmentOne(const uint8_t* pixels, int rows, int cols, uint64_t seed,
                           float* floats, uint8_t* bytes) const {
  const AugmentConfig& c = config_;
  cv::RNG rng(seed);
  // Every parameter is drawn, used or not, so one image's stream does not depend on the config
  // of an unrelated step; cheap next to the image work.
  const int dx = rng.uniform(0, 2 * c.padding + 1);
  const int dy = rng.uniform(0, 2 * c.padding + 1);
  const bool flip = rng.uniform(0.0f, 1.0f) < c.flipProbability;
  const double angle = rng.uniform(-c.maxRotationDegrees, c.maxRotationDegrees + 1e-6f);
  const double scale = rng.uniform(c.minScale, c.maxScale + 1e-6f);
  const double brightness = 1.0 + rng.uniform(-c.brightness, c.brightness + 1e-6f);
  const double contrast = 1.0 + rng.uniform(-c.contrast, c.contrast + 1e-6f);
  const double sigma = rng.uniform(c.blurSigmaMin, c.blurSigmaMax + 1e-6f);
  // From a stream of their own, so a config without a resized crop gives the images it always gave.
  cv::RNG cropRng(imageSeed(seed, 0x5eed));
  const double cropArea = cropRng.uniform(double(c.cropAreaMin), 1.0 + 1e-9);
  const double cropAspect = std::exp(cropRng.uniform(std::log(0.75), std::log(4.0 / 3.0)));
  const double cropX = cropRng.uniform(0.0, 1.0);
  const double cropY = cropRng.uniform(0.0, 1.0);

  cv::Mat src(rows, cols, CV_8UC1, const_cast<uint8_t*>(pixels));
  cv::Mat img;
  if (c.padding > 0) {
    cv::Mat padded;
    cv::copyMakeBorder(src, padded, c.padding, c.padding, c.padding, c.padding, cv::BORDER_CONSTANT,
                       cv::Scalar(0));
    img = padded(cv::Rect(dx, dy, cols, rows)).clone();
  } else {
    img = src.clone();
  }
  // The working size: the image's, or `upscale` times it.
  const int wr = rows * c.upscale, wc = cols * c.upscale;
  if (c.cropAreaMin < 1 || c.upscale > 1) {
    int w = cols, h = rows;
    if (c.cropAreaMin < 1) {
      w = std::clamp(int(std::lround(std::sqrt(cropArea * rows * cols * cropAspect))), 1, cols);
      h = std::clamp(int(std::lround(std::sqrt(cropArea * rows * cols / cropAspect))), 1, rows);
    }
    cv::Rect box(int(cropX * (cols - w)), int(cropY * (rows - h)), w, h);
    cv::resize(img(box), img, cv::Size(wc, wr), 0, 0, cv::INTER_CUBIC);
  }
  if (flip) cv::flip(img, img, 1);
  if (angle != 0.0 || scale != 1.0) {
    cv::Mat m =
        cv::getRotationMatrix2D(cv::Point2f(wc / 2.0f - 0.5f, wr / 2.0f - 0.5f), angle, scale);
    cv::warpAffine(img, img, m, img.size(), cv::INTER_LINEAR, cv::BORDER_CONSTANT, cv::Scalar(0));
  }
  cv::Mat f;
  img.convertTo(f, CV_32F, 1.0 / 255.0);
  if (c.brightness > 0 || c.contrast > 0) {
    // torchvision ColorJitter semantics: brightness scales (black background stays black, as in
    // the unaugmented test set), contrast blends with the mean grey.
    const double meanGrey = cv::mean(f)[0] * brightness;
    f.convertTo(f, CV_32F, contrast * brightness, (1.0 - contrast) * meanGrey);
  }
  if (c.blurKernel > 0) cv::GaussianBlur(f, f, cv::Size(c.blurKernel, c.blurKernel), sigma);
  if (c.noiseStddev > 0) {
    cv::Mat noise(wr, wc, CV_32F);
    rng.fill(noise, cv::RNG::NORMAL, 0.0, c.noiseStddev);
    f += noise;
  }
  cv::min(cv::max(f, 0.0), 1.0, f);
  if (c.upscale > 1) cv::resize(f, f, cv::Size(cols, rows), 0, 0, cv::INTER_AREA);
  // Writes straight into the caller's row: `dst` has the right size and type, so no realloc.
  if (bytes != nullptr) {
    cv::Mat dst(rows, cols, CV_8U, bytes);
    f.convertTo(dst, CV_8U, 255.0);  // rounds and saturates
    return;
  }
  cv::Mat dst(rows, cols, CV_32F, floats);
  f.convertTo(dst, CV_32F, 1.0 / c.stddev, -c.mean / c.stddev);
}

void normalizeImages(std::span<const uint8_t> pixels, std::span<float> out, float mean,
                     float stddev) {
  if (!(stddev > 0)) {
    throw std::invalid_argument("normalizeImages: stddev is " + std::to_string(stddev) +
                                "; it must be positive");
  }
  if (out.size() != pixels.size()) {
    throw std::invalid_argument("normalizeImages: " + std::to_string(pixels.size()) +
                                " pixels into " + std::to_string(out.size()) + " floats");
  }
  if (pixels.empty()) return;
  cv::Mat src(1, int(pixels.size()), CV_8UC1, const_cast<uint8_t*>(pixels.data()));
  cv::Mat dst(1, int(out.size()), CV_32F, out.data());
  src.convertTo(dst, CV_32F, 1.0 / (255.0 * stddev), -mean / stddev);
}

std::vector<float> normalizeImages(std::span<const uint8_t> pixels, float mean, float stddev) {
  std::vector<float> out(pixels.size());
  normalizeImages(pixels, out, mean, stddev);
  return out;
}

}  // namespace troupe::augment
