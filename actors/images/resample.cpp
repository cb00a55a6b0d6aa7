// PIL's bilinear resize (resample.h): Resample.c's precompute_coeffs, normalize_coeffs_8bpc and
// its two passes, written again.

#include "resample.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace troupe::images {

namespace {

struct Taps {
  std::vector<int> first, count;  // per output pixel: the first input pixel it reads, how many
  std::vector<int32_t> weights;   // `width` per output pixel
  int width = 0;
};

Taps pilTaps(double in0, double in1, int inSize, int outSize) {
  constexpr int kPrecision = 22;
  double scale = (in1 - in0) / outSize, filterScale = std::max(1.0, scale);
  double support = filterScale;  // the bilinear filter's support (1) times the scale
  Taps t;
  t.width = int(std::ceil(support)) * 2 + 1;
  t.first.resize(size_t(outSize));
  t.count.resize(size_t(outSize));
  t.weights.assign(size_t(outSize) * t.width, 0);
  std::vector<double> k(size_t(t.width));
  for (int x = 0; x < outSize; ++x) {
    double center = in0 + (x + 0.5) * scale;
    int lo = std::max(0, int(center - support + 0.5));
    int hi = std::min(inSize, int(center + support + 0.5));
    int n = std::max(0, std::min(hi - lo, t.width));
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      double d = std::abs((i + lo - center + 0.5) / filterScale);
      k[size_t(i)] = d < 1 ? 1 - d : 0;
      sum += k[size_t(i)];
    }
    for (int i = 0; i < n; ++i) {
      double w = sum != 0 ? k[size_t(i)] / sum : 0;
      t.weights[size_t(x) * t.width + i] =
          int32_t(w < 0 ? -0.5 + w * (1 << kPrecision) : 0.5 + w * (1 << kPrecision));
    }
    t.first[size_t(x)] = lo;
    t.count[size_t(x)] = n;
  }
  return t;
}

inline uint8_t pilClip(int64_t v) {
  v >>= 22;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

cv::Mat pilResize(const cv::Mat& m, double x0, double y0, double x1, double y1, int width,
                  int height) {
  int channels = m.channels();
  auto down = pilTaps(y0, y1, m.rows, height);
  int rowFirst = down.first.front(), rowLast = rowFirst;
  for (int y = 0; y < height; ++y) {
    rowLast = std::max(rowLast, down.first[size_t(y)] + down.count[size_t(y)]);
  }
  // Across, on the rows the second pass reads; skipped, as PIL skips it, where nothing changes.
  cv::Mat src;
  if (width != m.cols || x0 != 0 || x1 != m.cols) {
    auto across = pilTaps(x0, x1, m.cols, width);
    src.create(rowLast - rowFirst, width, CV_8UC(channels));
    for (int r = rowFirst; r < rowLast; ++r) {
      const uint8_t* in = m.ptr<uint8_t>(r);
      uint8_t* out = src.ptr<uint8_t>(r - rowFirst);
      for (int x = 0; x < width; ++x) {
        const int32_t* k = &across.weights[size_t(x) * across.width];
        const uint8_t* p = in + across.first[size_t(x)] * channels;
        int n = across.count[size_t(x)];
        for (int c = 0; c < channels; ++c) {
          int64_t v = 1 << 21;
          for (int i = 0; i < n; ++i) v += int64_t(p[i * channels + c]) * k[i];
          out[x * channels + c] = pilClip(v);
        }
      }
    }
  } else {
    src = m.rowRange(rowFirst, rowLast);
  }
  if (height == m.rows && y0 == 0 && y1 == m.rows) return src.clone();
  cv::Mat out(height, width, CV_8UC(channels));
  int row = width * channels;
  for (int y = 0; y < height; ++y) {
    const int32_t* k = &down.weights[size_t(y) * down.width];
    int first = down.first[size_t(y)] - rowFirst, n = down.count[size_t(y)];
    uint8_t* o = out.ptr<uint8_t>(y);
    for (int i = 0; i < row; ++i) {
      int64_t v = 1 << 21;
      for (int j = 0; j < n; ++j) v += int64_t(src.ptr<uint8_t>(first + j)[i]) * k[j];
      o[i] = pilClip(v);
    }
  }
  return out;
}

}  // namespace troupe::images
