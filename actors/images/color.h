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

// PIL's "L" of an RGB pixel (ITU-R 601-2 in 16-bit fixed point, Convert.c's L24).
inline uint8_t pilLuma(const uint8_t* rgb) {
  return uint8_t((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
}

}  // namespace troupe::images
