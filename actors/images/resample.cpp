// PIL's bilinear resize (resample.h): Resample.c's precompute_coeffs, normalize_coeffs_8bpc and
// its two passes, written again with PIL's arithmetic (22-bit coefficients, 32-bit sums) and
// arranged for the compiler's vectoriser: every output pixel of a pass reads the same number of
// input pixels (PIL's own taps, padded with zero weights where they would run past the edge), and
// the vertical pass sums whole rows at a time.

#include "resample.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace troupe::images {

namespace {

constexpr int kPrecision = 22;

struct Taps {
  std::vector<int> first;        // per output pixel: the first input pixel it reads
  std::vector<int32_t> weights;  // `width` per output pixel, zero past PIL's own taps
  int width = 0;
};

// PIL's taps for [in0, in1) of an axis of `inSize` pixels resampled to `outSize`, each output
// pixel's moved to start at most inSize - width (its weights moved with it), where width is the
// most taps PIL gives any output pixel: a fixed count read.
void pilTaps(double in0, double in1, int inSize, int outSize, Taps& t) {
  double scale = (in1 - in0) / outSize, filterScale = std::max(1.0, scale);
  double support = filterScale;  // the bilinear filter's support (1) times the scale
  int ksize = int(std::ceil(support)) * 2 + 1;
  thread_local std::vector<int> lows, counts;
  lows.resize(size_t(outSize));
  counts.resize(size_t(outSize));
  t.width = 1;
  for (int x = 0; x < outSize; ++x) {
    double center = in0 + (x + 0.5) * scale;
    int lo = std::max(0, int(center - support + 0.5));
    int hi = std::min(inSize, int(center + support + 0.5));
    lows[size_t(x)] = lo;
    counts[size_t(x)] = std::max(0, std::min(hi - lo, ksize));
    t.width = std::max(t.width, counts[size_t(x)]);
  }
  t.first.resize(size_t(outSize));
  t.weights.assign(size_t(outSize) * t.width, 0);
  thread_local std::vector<double> k;
  k.resize(size_t(t.width));
  for (int x = 0; x < outSize; ++x) {
    double center = in0 + (x + 0.5) * scale;
    int lo = lows[size_t(x)], n = counts[size_t(x)];
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      double d = std::abs((i + lo - center + 0.5) / filterScale);
      k[size_t(i)] = d < 1 ? 1 - d : 0;
      sum += k[size_t(i)];
    }
    int start = std::max(0, std::min(lo, inSize - t.width));
    int32_t* w = &t.weights[size_t(x) * t.width];
    for (int i = 0; i < n; ++i) {
      double v = sum != 0 ? k[size_t(i)] / sum : 0;
      w[lo - start + i] =
          int32_t(v < 0 ? -0.5 + v * (1 << kPrecision) : 0.5 + v * (1 << kPrecision));
    }
    t.first[size_t(x)] = start;
  }
}

inline uint8_t pilClip(int32_t v) {
  v >>= kPrecision;
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// The horizontal pass of one row, `C` channels, `W` taps each (0: t.width, read at run time).
template <int C, int W>
void across(const uint8_t* in, uint8_t* out, int width, const Taps& t, int from = 0) {
  const int n = W > 0 ? W : t.width;
  for (int x = from; x < width; ++x) {
    const int32_t* k = &t.weights[size_t(x) * n];
    const uint8_t* p = in + t.first[size_t(x)] * C;
    int32_t s[C];
    for (int c = 0; c < C; ++c) s[c] = 1 << (kPrecision - 1);
    for (int i = 0; i < n; ++i) {
      for (int c = 0; c < C; ++c) s[c] += int32_t(p[i * C + c]) * k[i];
    }
    for (int c = 0; c < C; ++c) out[x * C + c] = pilClip(s[c]);
  }
}

template <int C>
void acrossFrom(const uint8_t* in, uint8_t* out, int from, int width, const Taps& t) {
  across<C, 0>(in, out, width, t, from);
}

// The horizontal pass of 3-channel rows with AVX2: two output pixels at a time, each tap's pixel
// read as 4 bytes (the next pixel's first one rides along, weighted but never stored) and summed
// in a 32-bit lane per channel, PIL's sums exactly. `pairs` holds each pair's weights as the
// lanes take them (pairWeights). Returns the first output pixel left to the scalar pass: those
// whose last tap's 4 bytes would run past the row.
__attribute__((target("avx2"))) int across3Avx2(const uint8_t* in, int inCols, uint8_t* out,
                                                int width, const Taps& t, const int32_t* pairs) {
  const int n = t.width;
  // The two pixels' bytes R G B of each, together at the bottom of the vector.
  const __m128i rgbRgb = _mm_setr_epi8(0, 1, 2, 4, 5, 6, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1);
  int x = 0;
  for (; x + 1 < width; x += 2, pairs += 8 * n) {
    int f0 = t.first[size_t(x)], f1 = t.first[size_t(x) + 1];
    if (f1 + n >= inCols) break;  // (first is ascending: so are the ones after)
    const uint8_t* p0 = in + f0 * 3;
    const uint8_t* p1 = in + f1 * 3;
    __m256i s = _mm256_set1_epi32(1 << (kPrecision - 1));
    for (int i = 0; i < n; ++i) {
      uint32_t a, b;
      std::memcpy(&a, p0 + 3 * i, 4);
      std::memcpy(&b, p1 + 3 * i, 4);
      __m256i px =
          _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(int64_t(uint64_t(a) | uint64_t(b) << 32)));
      __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(pairs + 8 * i));
      s = _mm256_add_epi32(s, _mm256_mullo_epi32(px, w));
    }
    s = _mm256_srai_epi32(s, kPrecision);
    __m128i words = _mm_packs_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    __m128i bytes = _mm_shuffle_epi8(_mm_packus_epi16(words, words), rgbRgb);
    uint8_t* o = out + x * 3;
    if (x + 3 < width) {
      _mm_storel_epi64(reinterpret_cast<__m128i*>(o), bytes);  // 2 bytes over: the next pair's
    } else {
      uint64_t six = uint64_t(_mm_cvtsi128_si64(bytes));
      std::memcpy(o, &six, 6);
    }
  }
  return x;
}

// Each pair of output pixels' weights as across3Avx2's lanes take them: for each tap, the first
// pixel's weight 4 times, then the second's.
void pairWeights(const Taps& t, int width, std::vector<int32_t>& out) {
  const int n = t.width;
  out.resize(size_t(width / 2) * 8 * n);
  for (int x = 0; x + 1 < width; x += 2) {
    int32_t* w = &out[size_t(x / 2) * 8 * n];
    for (int i = 0; i < n; ++i) {
      for (int lane = 0; lane < 4; ++lane) {
        w[8 * i + lane] = t.weights[size_t(x) * n + i];
        w[8 * i + 4 + lane] = t.weights[size_t(x + 1) * n + i];
      }
    }
  }
}

bool hasAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

template <int C>
void acrossRows(const cv::Mat& m, int rowFirst, int rowLast, cv::Mat& dst, const Taps& t) {
  thread_local std::vector<int32_t> pairs;
  bool simd = C == 3 && hasAvx2();
  if (simd) pairWeights(t, dst.cols, pairs);
  for (int r = rowFirst; r < rowLast; ++r) {
    const uint8_t* in = m.ptr<uint8_t>(r);
    uint8_t* out = dst.ptr<uint8_t>(r - rowFirst);
    int done = 0;
    if (simd) done = across3Avx2(in, m.cols, out, dst.cols, t, pairs.data());
    if (done > 0) {
      // The rest from pixel `done`: the scalar pass on shifted taps.
      acrossFrom<C>(in, out, done, dst.cols, t);
      continue;
    }
    switch (t.width) {
      case 2:
        across<C, 2>(in, out, dst.cols, t);
        break;
      case 3:
        across<C, 3>(in, out, dst.cols, t);
        break;
      case 4:
        across<C, 4>(in, out, dst.cols, t);
        break;
      default:
        across<C, 0>(in, out, dst.cols, t);
        break;
    }
  }
}

// The vertical pass of one output row: `n` input rows of `row` bytes, summed a whole row at a
// time into `sum` (32-bit, as PIL's), then clipped.
__attribute__((target_clones("avx2", "default"))) void down(const uint8_t* const* rows,
                                                            const int32_t* k, int n, int row,
                                                            int32_t* sum, uint8_t* out) {
  for (int i = 0; i < row; ++i) sum[i] = 1 << (kPrecision - 1);
  for (int j = 0; j < n; ++j) {
    const uint8_t* in = rows[j];
    const int32_t w = k[j];
    if (w == 0) continue;
    for (int i = 0; i < row; ++i) sum[i] += int32_t(in[i]) * w;
  }
  for (int i = 0; i < row; ++i) {
    int32_t v = sum[i] >> kPrecision;
    out[i] = uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
  }
}

}  // namespace

void pilResize(const cv::Mat& m, double x0, double y0, double x1, double y1, int width, int height,
               cv::Mat& out) {
  thread_local Taps vertical, horizontal;
  thread_local cv::Mat middle;
  thread_local std::vector<int32_t> sums;
  thread_local std::vector<const uint8_t*> rows;
  int channels = m.channels();
  pilTaps(y0, y1, m.rows, height, vertical);
  int rowFirst = vertical.first.front(), rowLast = rowFirst;
  for (int y = 0; y < height; ++y) {
    rowLast = std::max(rowLast, vertical.first[size_t(y)] + vertical.width);
  }
  // Across, on the rows the second pass reads; skipped, as PIL skips it, where nothing changes.
  cv::Mat src;
  if (width != m.cols || x0 != 0 || x1 != m.cols) {
    pilTaps(x0, x1, m.cols, width, horizontal);
    middle.create(rowLast - rowFirst, width, CV_8UC(channels));
    switch (channels) {
      case 1:
        acrossRows<1>(m, rowFirst, rowLast, middle, horizontal);
        break;
      case 2:
        acrossRows<2>(m, rowFirst, rowLast, middle, horizontal);
        break;
      case 3:
        acrossRows<3>(m, rowFirst, rowLast, middle, horizontal);
        break;
      default:
        acrossRows<4>(m, rowFirst, rowLast, middle, horizontal);
        break;
    }
    src = middle;
  } else {
    src = m.rowRange(rowFirst, rowLast);
  }
  if (height == m.rows && y0 == 0 && y1 == m.rows) {
    src.copyTo(out);
    return;
  }
  out.create(height, width, CV_8UC(channels));
  int row = width * channels;
  sums.resize(size_t(row));
  rows.resize(size_t(vertical.width));
  for (int y = 0; y < height; ++y) {
    int first = vertical.first[size_t(y)] - rowFirst;
    for (int j = 0; j < vertical.width; ++j) rows[size_t(j)] = src.ptr<uint8_t>(first + j);
    down(rows.data(), &vertical.weights[size_t(y) * vertical.width], vertical.width, row,
         sums.data(), out.ptr<uint8_t>(y));
  }
}

cv::Mat pilResize(const cv::Mat& m, double x0, double y0, double x1, double y1, int width,
                  int height) {
  cv::Mat out;
  pilResize(m, x0, y0, x1, y1, width, height, out);
  return out;
}

}  // namespace troupe::images
