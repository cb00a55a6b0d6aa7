#include "troupe/augment/augment.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>

using Catch::Matchers::Contains;
using troupe::augment::AugmentConfig;
using troupe::augment::Augmenter;

namespace {

// A recognisable 28x28 image: a bright off-centre block on black.
std::vector<uint8_t> blockImages(size_t count) {
  std::vector<uint8_t> pixels(count * 784, 0);
  for (size_t i = 0; i < count; ++i) {
    for (int r = 6; r < 20; ++r) {
      for (int c = 4; c < 14 + int(i % 5); ++c) pixels[i * 784 + r * 28 + c] = 200;
    }
  }
  return pixels;
}

}  // namespace

TEST_CASE("augmented batches have the right shape, range and are reproducible", "[augment]") {
  AugmentConfig config;
  config.blurKernel = 11;
  Augmenter augmenter(config);
  const auto pixels = blockImages(16);
  const auto a = augmenter.augment(pixels, 28, 28, 1234);
  REQUIRE(a.size() == 16 * 784);
  const float lo = (0 - config.mean) / config.stddev, hi = (1 - config.mean) / config.stddev;
  for (float x : a) {
    REQUIRE(x >= lo - 1e-5f);
    REQUIRE(x <= hi + 1e-5f);
  }
  CHECK(a == augmenter.augment(pixels, 28, 28, 1234));
  CHECK(a != augmenter.augment(pixels, 28, 28, 1235));
  // Per-image streams: image 3 of a batch does not depend on the other images.
  std::vector<float> out(784 * 16);
  augmenter.augment(pixels, 28, 28, 1234, out);
  CHECK(std::equal(out.begin() + 3 * 784, out.begin() + 4 * 784, a.begin() + 3 * 784));
}

TEST_CASE("with augmentation off the output is just normalised pixels", "[augment]") {
  Augmenter plain(AugmentConfig::none());
  const auto pixels = blockImages(3);
  const auto a = plain.augment(pixels, 28, 28, 99);
  const auto b = troupe::augment::normalizeImages(pixels);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == Approx(b[i]).margin(1e-5));
  CHECK(b[0] == Approx(-0.2860f / 0.3530f));
}

TEST_CASE("geometric augmentation moves the object but keeps its mass roughly", "[augment]") {
  // Photometric steps off: crop, flip and a small affine move ink around, they do not add it.
  AugmentConfig config;
  config.brightness = config.contrast = config.noiseStddev = 0;
  Augmenter augmenter(config);
  const auto pixels = blockImages(8);
  const auto plain = troupe::augment::normalizeImages(pixels);
  const auto aug = augmenter.augment(pixels, 28, 28, 5);
  CHECK(aug != plain);
  auto ink = [&](const std::vector<float>& v) {
    double sum = 0;
    for (float x : v) sum += x * config.stddev + config.mean;  // Back to [0, 1] pixels.
    return sum;
  };
  CHECK(ink(aug) == Approx(ink(plain)).epsilon(0.15));
}

TEST_CASE("bad augment config and sizes are explained", "[augment]") {
  AugmentConfig c;
  c.blurKernel = 4;
  CHECK_THROWS_WITH(Augmenter(c), Contains("AugmentConfig.blurKernel is 4") && Contains("odd"));
  c = {};
  c.flipProbability = 1.5f;
  CHECK_THROWS_WITH(c.validate(), Contains("flipProbability") && Contains("[0, 1]"));
  c = {};
  c.minScale = 1.2f;
  c.maxScale = 1.1f;
  CHECK_THROWS_WITH(c.validate(), Contains("maxScale"));
  c = {};
  c.stddev = 0;
  CHECK_THROWS_AS(c.validate(), std::invalid_argument);
  c = {};
  c.padding = -1;
  CHECK_THROWS_WITH(c.validate(), Contains("padding is -1"));

  Augmenter ok{AugmentConfig{}};
  std::vector<uint8_t> pixels(784 * 2 + 1);
  std::vector<float> out(pixels.size());
  CHECK_THROWS_WITH(ok.augment(pixels, 28, 28, 1, out), Contains("do not fit"));
}

TEST_CASE("pixels as bytes are the normalised floats to within half a grey level", "[augment]") {
  for (auto config : {AugmentConfig::light(), AugmentConfig::heavy()}) {
    Augmenter augmenter(config);
    const auto pixels = blockImages(8);
    const auto floats = augmenter.augment(pixels, 28, 28, 77);
    std::vector<uint8_t> bytes(pixels.size());
    augmenter.augmentPixels(pixels, 28, 28, 77, bytes);
    const auto back = troupe::augment::normalizeImages(bytes, config.mean, config.stddev);
    REQUIRE(back.size() == floats.size());
    double worst = 0;
    for (size_t i = 0; i < back.size(); ++i) worst = std::max(worst, double(std::fabs(back[i] - floats[i])));
    CHECK(worst <= 0.5 / 255 / config.stddev + 1e-5);
    std::vector<float> into(bytes.size());
    troupe::augment::normalizeImages(bytes, into, config.mean, config.stddev);
    CHECK(into == back);
    std::vector<float> short_(bytes.size() - 1);
    CHECK_THROWS_WITH(troupe::augment::normalizeImages(bytes, short_), Contains("pixels into"));
    std::vector<uint8_t> wrong(pixels.size() - 1);
    CHECK_THROWS_WITH(augmenter.augmentPixels(pixels, 28, 28, 77, wrong),
                      Contains("do not fit images of 28x28"));
  }
}

TEST_CASE("the heavy preset works at twice the size and keeps the light one's images", "[augment]") {
  // heavy: a random resized crop to 56x56 and back; the light preset's images are as they were
  // before the crop's own random stream existed (the noise draws are unchanged).
  const auto heavy = AugmentConfig::heavy();
  CHECK(heavy.upscale == 2);
  CHECK(heavy.cropAreaMin < 1);
  const auto pixels = blockImages(4);
  const auto h = Augmenter(heavy).augment(pixels, 28, 28, 5);
  const auto l = Augmenter(AugmentConfig::light()).augment(pixels, 28, 28, 5);
  CHECK(h.size() == l.size());
  CHECK(h != l);
  AugmentConfig bad;
  bad.upscale = 5;
  CHECK_THROWS_WITH(Augmenter(bad), Contains("AugmentConfig.upscale is 5"));
  bad = AugmentConfig();
  bad.cropAreaMin = 0;
  CHECK_THROWS_WITH(Augmenter(bad), Contains("cropAreaMin"));
}
