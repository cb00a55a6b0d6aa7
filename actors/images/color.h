// ColorJitter's four adjustments as torchvision 0.14 makes them on a PIL image (color.cpp), in
// place on an 8-bit image of 1 or 3 channels with packed rows, for transforms.cpp.
#pragma once

#include <opencv2/core.hpp>

namespace troupe::images {

// PIL's ImageEnhance: Image.blend(degenerate, image, factor), each value
// degenerate + factor * (value - degenerate) in float, cut to [0, 255] and truncated.
void adjustBrightness(cv::Mat& m, float factor);  // degenerate: black
void adjustContrast(cv::Mat& m, float factor);    // the mean of its "L" image, rounded
void adjustSaturation(cv::Mat& m, float factor);  // each pixel's "L" value (3 channels only)
// torchvision's adjust_hue: PIL's HSV (Convert.c's rgb2hsv and hsv2rgb), the hue byte shifted by
// np.uint8(hue * 255) modulo 256 (3 channels only).
void adjustHue(cv::Mat& m, double hue);

// ToTensor/Normalize of RGB pixels into three float planes: value * scale[c] + shift[c]. Does
// whole groups of 16 pixels where the CPU has AVX2 and returns how many it did (the caller does
// the rest).
size_t normalizeToPlanes(const uint8_t* rgb, size_t pixels, const float scale[3],
                         const float shift[3], float* planes[3]);

// ColorJitter's brightness, contrast and saturation blends (no hue), in `order` (0 brightness,
// 1 contrast, 2 saturation; `n` of them) with `factors` by the same index, then ToTensor/Normalize
// into three float planes, as adjust*() and normalizeToPlanes() one after another would give, to
// the bit, in at most two passes over the pixels: the blends before a contrast and the luma sum
// its mean needs, then every blend and the normalisation, each value kept as the integer PIL's
// uint8 would hold. False, with nothing done, without AVX2.
bool jitterNormalize(const cv::Mat& rgb, const int* order, int n, const float* factors,
                     const float scale[3], const float shift[3], float* planes[3]);
bool jitterFusable();  // whether jitterNormalize() runs here (the CPU has AVX2)

// A ColorJitter drawn but left to the output's writing (jitterNormalize): its blends' order and
// factors.
struct DeferredJitter {
  bool set = false;
  int order[3] = {0, 0, 0};
  int n = 0;
  float factors[3] = {1, 1, 1};
};

// PIL's "L" of an RGB pixel (ITU-R 601-2 in 16-bit fixed point, Convert.c's L24).
inline uint8_t pilLuma(const uint8_t* rgb) {
  return uint8_t((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

}  // namespace troupe::images
