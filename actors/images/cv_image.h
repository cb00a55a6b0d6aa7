// Between OpenCV's cv::Mat and troupe::images::Image (decode.cpp, transforms.cpp), and the
// decode into a buffer kept.
#pragma once

#include <cstring>
#include <opencv2/core.hpp>

#include "troupe/images/transforms.h"

namespace troupe::images {

// An 8-bit image's pixels as a cv::Mat (no copy).
inline cv::Mat view(Image& im) {
  return cv::Mat(im.height, im.width, CV_8UC(im.channels), im.pixels.data());
}

// A copy of an 8-bit image, rows packed (a cv::Mat view into a larger one has gaps between them).
inline Image imageOf(const cv::Mat& m) {
  Image out;
  out.height = m.rows;
  out.width = m.cols;
  out.channels = m.channels();
  size_t row = size_t(m.cols) * m.channels();
  out.pixels.resize(row * m.rows);
  for (int r = 0; r < m.rows; ++r) memcpy(out.pixels.data() + r * row, m.ptr(r), row);
  return out;
}

// decode() into `out`, whose buffer is reused where it is large enough (decode.cpp).
void decodeInto(std::span<const uint8_t> bytes, const std::string& name, int channels,
                int scaleDenominator, uint64_t maxPixels, std::string* warning, Image& out);

// A part of a JPEG decoded at 1/scaleDenominator: the x, y, width, height box of the scaled
// image (the same pixels as decode() then cropped), into `out`. False, with nothing done, where it
// cannot be done so (not a JPEG, no end marker at its end, CMYK, a box outside the image): decode
// it whole. SampleError as decode().
bool decodeJpegRegion(std::span<const uint8_t> bytes, const std::string& name, int channels,
                      int scaleDenominator, int x, int y, int width, int height,
                      std::string* warning, Image& out);

}  // namespace troupe::images
