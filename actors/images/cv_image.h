// Between OpenCV's cv::Mat and troupe::images::Image (decode.cpp, transforms.cpp).
#pragma once

#include <cstring>
#include <opencv2/core.hpp>

#include "troupe/images/transforms.h"

namespace troupe::images {

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

}  // namespace troupe::images
