// Resizing as PIL resizes (resample.cpp), for transforms.cpp.
#pragma once

#include <opencv2/core.hpp>

namespace troupe::images {

/// PIL's bilinear resize, which torchvision's Resize and RandomResizedCrop call on a PIL image:
/// separable, a triangle filter whose support grows with the shrink (antialiased), the box's
/// edges anywhere (a box drawn on a JPEG's full size and read from its decode at 1/8 falls
/// inside pixels), coefficients in 22-bit fixed point, each pass rounded to 8 bits: PIL's pixels.
/// The box [x0, x1) x [y0, y1) of `m` (8-bit, 1 to 4 channels) resized to width x height.
cv::Mat pilResize(const cv::Mat& m, double x0, double y0, double x1, double y1, int width,
                  int height);
/// The same into `out` (its buffer reused where it has the size already; not `m`'s).
void pilResize(const cv::Mat& m, double x0, double y0, double x1, double y1, int width, int height,
               cv::Mat& out);

}  // namespace troupe::images
