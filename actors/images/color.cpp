// ColorJitter's adjustments (color.h) with PIL's arithmetic: ImagingBlend's float blend, cut and
// truncated (not rounded: OpenCV's addWeighted rounds, one level off), Convert.c's L24 luma, and
// its HSV conversions in the float and double precision its C code computes them in.

#include "color.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace troupe::images {

namespace {

inline uint8_t cut(float t) {
  return t <= 0.f ? 0 : t >= 255.f ? 255 : uint8_t(int(t));
}

bool hasAvx2() {
  static const bool yes = __builtin_cpu_supports("avx2");
  return yes;
}

// PIL's blend of 8 values against their degenerates, cut to [0, 255] and truncated, as 32-bit
// lanes.
__attribute__((target("avx2"))) inline __m256i blend8(__m256 values, __m256 degenerate,
                                                      __m256 factor) {
  __m256 t = _mm256_add_ps(degenerate, _mm256_mul_ps(factor, _mm256_sub_ps(values, degenerate)));
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(255.f));
  return _mm256_cvttps_epi32(t);
}

// 16 bytes to two vectors of 8 floats, and back (16 values of [0, 255] in 32-bit lanes).
__attribute__((target("avx2"))) inline void widen(__m128i bytes, __m256& lo, __m256& hi) {
  lo = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(bytes));
  hi = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8)));
}
__attribute__((target("avx2"))) inline __m128i narrow(__m256i lo, __m256i hi) {
  __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(lo, hi), 0xD8);
  return _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
}

__attribute__((target("avx2"))) size_t blendConstantAvx2(uint8_t* p, size_t n, float d, float f) {
  const __m256 vd = _mm256_set1_ps(d), vf = _mm256_set1_ps(f);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 lo, hi;
    widen(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)), lo, hi);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p + i),
                     narrow(blend8(lo, vd, vf), blend8(hi, vd, vf)));
  }
  return i;
}

void blendConstant(uint8_t* p, size_t n, float degenerate, float f) {
  size_t i = hasAvx2() ? blendConstantAvx2(p, n, degenerate, f) : 0;
  for (; i < n; ++i) p[i] = cut(degenerate + f * (float(p[i]) - degenerate));
}

// Masks that split 16 RGB pixels (48 bytes in three vectors) into R, G and B vectors of 16, and
// join them again: for each output byte, which input vector and which byte of it (pshufb).
struct Shuffles {
  alignas(16) int8_t split[3][3][16];  // [channel][input vector][byte]
  alignas(16) int8_t join[3][3][16];   // [output vector][channel][byte]
  Shuffles() {
    for (int c = 0; c < 3; ++c) {
      for (int v = 0; v < 3; ++v) {
        for (int j = 0; j < 16; ++j) {
          int at = 3 * j + c;  // channel c of pixel j, in the 48 bytes
          split[c][v][j] = int8_t(at / 16 == v ? at % 16 : -1);
          int byte = 16 * v + j;  // output byte: pixel byte / 3, channel byte % 3
          join[v][c][j] = int8_t(byte % 3 == c ? byte / 3 : -1);
        }
      }
    }
  }
};
const Shuffles kShuffles;

__attribute__((target("avx2"))) inline __m128i gather3(const __m128i in[3], const int8_t (*m)[16]) {
  auto mask = [&](int k) { return _mm_load_si128(reinterpret_cast<const __m128i*>(m[k])); };
  return _mm_or_si128(
      _mm_or_si128(_mm_shuffle_epi8(in[0], mask(0)), _mm_shuffle_epi8(in[1], mask(1))),
      _mm_shuffle_epi8(in[2], mask(2)));
}

// PIL's L of 8 pixels (their R, G, B in 32-bit lanes).
__attribute__((target("avx2"))) inline __m256i luma8(__m256i r, __m256i g, __m256i b) {
  __m256i sum = _mm256_add_epi32(_mm256_mullo_epi32(r, _mm256_set1_epi32(19595)),
                                 _mm256_mullo_epi32(g, _mm256_set1_epi32(38470)));
  sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(b, _mm256_set1_epi32(7471)));
  return _mm256_srli_epi32(_mm256_add_epi32(sum, _mm256_set1_epi32(0x8000)), 16);
}

// Adds 32-bit lanes to `sum`, and zeroes them.
__attribute__((target("avx2"))) inline void flush(__m256i& lanes, uint64_t* sum) {
  alignas(32) uint32_t values[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(values), lanes);
  for (auto v : values) *sum += v;
  lanes = _mm256_setzero_si256();
}

// Saturation (each pixel against its L) or the L sum (contrast's mean) of whole groups of 16
// pixels; returns how many pixels it did.
__attribute__((target("avx2"))) size_t lumaAvx2(uint8_t* p, size_t pixels, float f, bool blend,
                                                uint64_t* sum) {
  const __m256 vf = _mm256_set1_ps(f);
  __m256i total = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 16 <= pixels; i += 16, p += 48) {
    __m128i in[3];
    for (int v = 0; v < 3; ++v)
      in[v] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * v));
    __m128i ch[3];
    for (int c = 0; c < 3; ++c) ch[c] = gather3(in, kShuffles.split[c]);
    __m256i lo[3], hi[3];
    for (int c = 0; c < 3; ++c) {
      lo[c] = _mm256_cvtepu8_epi32(ch[c]);
      hi[c] = _mm256_cvtepu8_epi32(_mm_srli_si128(ch[c], 8));
    }
    __m256i lumaLo = luma8(lo[0], lo[1], lo[2]), lumaHi = luma8(hi[0], hi[1], hi[2]);
    if (!blend) {
      total = _mm256_add_epi32(total, _mm256_add_epi32(lumaLo, lumaHi));
      if ((i / 16) % 65536 == 65535) flush(total, sum);  // a lane holds 510 a group
      continue;
    }
    __m256 dLo = _mm256_cvtepi32_ps(lumaLo), dHi = _mm256_cvtepi32_ps(lumaHi);
    for (int c = 0; c < 3; ++c) {
      ch[c] = narrow(blend8(_mm256_cvtepi32_ps(lo[c]), dLo, vf),
                     blend8(_mm256_cvtepi32_ps(hi[c]), dHi, vf));
    }
    for (int v = 0; v < 3; ++v) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16 * v), gather3(ch, kShuffles.join[v]));
    }
  }
  if (!blend) flush(total, sum);
  return i;
}

void blendLuma(uint8_t* p, size_t pixels, float f) {
  size_t i = hasAvx2() ? lumaAvx2(p, pixels, f, true, nullptr) : 0;
  for (p += 3 * i; i < pixels; ++i, p += 3) {
    float d = float(pilLuma(p));
    p[0] = cut(d + f * (float(p[0]) - d));
    p[1] = cut(d + f * (float(p[1]) - d));
    p[2] = cut(d + f * (float(p[2]) - d));
  }
}

uint64_t lumaSum(const uint8_t* p, size_t pixels) {
  uint64_t sum = 0;
  size_t i = hasAvx2() ? lumaAvx2(const_cast<uint8_t*>(p), pixels, 0, false, &sum) : 0;
  for (p += 3 * i; i < pixels; ++i, p += 3) sum += pilLuma(p);
  return sum;
}

inline uint8_t clip8(int v) {
  return uint8_t(v < 0 ? 0 : v > 255 ? 255 : v);
}

// Convert.c's rgb2hsv_row (Pillow 9): h and s in float, the arithmetic with double literals in
// double.
inline void rgbToHsv(const uint8_t* in, uint8_t* out) {
  uint8_t r = in[0], g = in[1], b = in[2];
  uint8_t maxc = std::max(r, std::max(g, b)), minc = std::min(r, std::min(g, b));
  uint8_t uh = 0, us = 0;
  if (minc != maxc) {
    float cr = float(maxc - minc);
    float s = cr / float(maxc);
    float rc = float(maxc - r) / cr, gc = float(maxc - g) / cr, bc = float(maxc - b) / cr;
    float h;
    if (r == maxc) {
      h = bc - gc;
    } else if (g == maxc) {
      h = float(2.0 + rc - bc);
    } else {
      h = float(4.0 + gc - rc);
    }
    h = float(std::fmod(h / 6.0 + 1.0, 1.0));
    uh = clip8(int(h * 255.0));
    us = clip8(int(s * 255.0));
  }
  out[0] = uh;
  out[1] = us;
  out[2] = maxc;
}

// Convert.c's hsv2rgb.
inline void hsvToRgb(const uint8_t* in, uint8_t* out) {
  uint8_t h = in[0], s = in[1], v = in[2];
  if (s == 0) {
    out[0] = out[1] = out[2] = v;
    return;
  }
  int i = int(std::floor(float(h) * 6.0 / 255.0));
  float f = float(float(h) * 6.0 / 255.0 - float(i));
  float fs = float(float(s) / 255.0);
  uint8_t up = clip8(int(std::round(float(v) * (1.0 - fs))));
  uint8_t uq = clip8(int(std::round(float(v) * (1.0 - fs * f))));
  uint8_t ut = clip8(int(std::round(float(v) * (1.0 - fs * (1.0 - f)))));
  switch (i % 6) {
    case 0:
      out[0] = v, out[1] = ut, out[2] = up;
      break;
    case 1:
      out[0] = uq, out[1] = v, out[2] = up;
      break;
    case 2:
      out[0] = up, out[1] = v, out[2] = ut;
      break;
    case 3:
      out[0] = up, out[1] = uq, out[2] = v;
      break;
    case 4:
      out[0] = ut, out[1] = up, out[2] = v;
      break;
    default:
      out[0] = v, out[1] = up, out[2] = uq;
      break;
  }
}

size_t values(const cv::Mat& m) {
  return m.total() * size_t(m.channels());
}

__attribute__((target("avx2"))) size_t normalizeAvx2(const uint8_t* p, size_t pixels,
                                                     const float scale[3], const float shift[3],
                                                     float* planes[3]) {
  size_t i = 0;
  for (; i + 16 <= pixels; i += 16, p += 48) {
    __m128i in[3];
    for (int v = 0; v < 3; ++v)
      in[v] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * v));
    for (int c = 0; c < 3; ++c) {
      __m128i ch = gather3(in, kShuffles.split[c]);
      __m256 lo, hi;
      widen(ch, lo, hi);
      const __m256 a = _mm256_set1_ps(scale[c]), b = _mm256_set1_ps(shift[c]);
      // (a separate multiply and add, as the scalar loop's: the same floats)
      _mm256_storeu_ps(planes[c] + i, _mm256_add_ps(_mm256_mul_ps(lo, a), b));
      _mm256_storeu_ps(planes[c] + i + 8, _mm256_add_ps(_mm256_mul_ps(hi, a), b));
    }
  }
  return i;
}

// One blend of 8 integer-valued floats against their degenerates, cut and truncated as PIL's
// uint8 would hold it: still integer-valued floats.
__attribute__((target("avx2"))) inline __m256 blendKept(__m256 v, __m256 d, __m256 f) {
  __m256 t = _mm256_add_ps(d, _mm256_mul_ps(f, _mm256_sub_ps(v, d)));
  t = _mm256_min_ps(_mm256_max_ps(t, _mm256_setzero_ps()), _mm256_set1_ps(255.f));
  return _mm256_round_ps(t, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
}

// PIL's L24 luma of 8 pixels held as integer-valued floats: exact in float (the sum is below
// 2^24), then floored as the shift floors.
__attribute__((target("avx2"))) inline __m256 lumaKept(const __m256 c[3]) {
  __m256 sum = _mm256_add_ps(_mm256_mul_ps(c[0], _mm256_set1_ps(19595.f)),
                             _mm256_mul_ps(c[1], _mm256_set1_ps(38470.f)));
  sum = _mm256_add_ps(sum, _mm256_mul_ps(c[2], _mm256_set1_ps(7471.f)));
  sum = _mm256_add_ps(sum, _mm256_set1_ps(32768.f));
  return _mm256_floor_ps(_mm256_mul_ps(sum, _mm256_set1_ps(1.f / 65536.f)));
}

// The blends order[from, to) on 8 pixels' channels.
__attribute__((target("avx2"))) inline void blendsKept(__m256 c[3], const int* order, int from,
                                                       int to, const float* factors, float mean) {
  for (int k = from; k < to; ++k) {
    __m256 f = _mm256_set1_ps(factors[order[k]]);
    __m256 d = order[k] == 0   ? _mm256_setzero_ps()
               : order[k] == 1 ? _mm256_set1_ps(mean)
                               : lumaKept(c);
    for (int ch = 0; ch < 3; ++ch) c[ch] = blendKept(c[ch], d, f);
  }
}

// The same on one pixel, for a row's last pixels.
inline void blendsPixel(float c[3], const int* order, int from, int to, const float* factors,
                        float mean) {
  for (int k = from; k < to; ++k) {
    float f = factors[order[k]], d = 0;
    if (order[k] == 1) d = mean;
    if (order[k] == 2) {
      uint8_t p[3] = {uint8_t(c[0]), uint8_t(c[1]), uint8_t(c[2])};
      d = float(pilLuma(p));
    }
    for (int ch = 0; ch < 3; ++ch) c[ch] = float(cut(d + f * (c[ch] - d)));
  }
}

// A group of 16 RGB pixels as floats: lo[c] the first 8 of channel c, hi[c] the next.
__attribute__((target("avx2"))) inline void load16(const uint8_t* p, __m256 lo[3], __m256 hi[3]) {
  __m128i in[3];
  for (int v = 0; v < 3; ++v) in[v] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * v));
  for (int c = 0; c < 3; ++c) widen(gather3(in, kShuffles.split[c]), lo[c], hi[c]);
}

__attribute__((target("avx2"))) void jitterNormalizeAvx2(const cv::Mat& rgb, const int* order,
                                                         int n, const float* factors,
                                                         const float scale[3], const float shift[3],
                                                         float* planes[3]) {
  int contrast = -1;
  for (int k = 0; k < n; ++k) {
    if (order[k] == 1) contrast = k;
  }
  float mean = 0;
  size_t width = size_t(rgb.cols);
  if (contrast >= 0) {
    // Pass 1: the blends before the contrast, and the luma sum of what they make.
    uint64_t sum = 0;
    for (int r = 0; r < rgb.rows; ++r) {
      const uint8_t* p = rgb.ptr<uint8_t>(r);
      __m256i lanes = _mm256_setzero_si256();
      size_t x = 0;
      for (; x + 16 <= width; x += 16, p += 48) {
        __m256 lo[3], hi[3];
        load16(p, lo, hi);
        blendsKept(lo, order, 0, contrast, factors, 0);
        blendsKept(hi, order, 0, contrast, factors, 0);
        lanes = _mm256_add_epi32(lanes, _mm256_add_epi32(_mm256_cvtps_epi32(lumaKept(lo)),
                                                         _mm256_cvtps_epi32(lumaKept(hi))));
      }
      flush(lanes, &sum);  // (a row's lanes: at most 2 x 255 x width / 16 each)
      for (; x < width; ++x, p += 3) {
        float c[3] = {float(p[0]), float(p[1]), float(p[2])};
        blendsPixel(c, order, 0, contrast, factors, 0);
        uint8_t q[3] = {uint8_t(c[0]), uint8_t(c[1]), uint8_t(c[2])};
        sum += pilLuma(q);
      }
    }
    size_t pixels = rgb.total();
    double m = pixels ? double(sum) / double(pixels) : 0;
    mean = float(int(m + 0.5));
  }
  // Pass 2: every blend, then the normalisation into the planes.
  for (int r = 0; r < rgb.rows; ++r) {
    const uint8_t* p = rgb.ptr<uint8_t>(r);
    size_t x = 0, at = size_t(r) * width;
    for (; x + 16 <= width; x += 16, p += 48) {
      __m256 lo[3], hi[3];
      load16(p, lo, hi);
      blendsKept(lo, order, 0, n, factors, mean);
      blendsKept(hi, order, 0, n, factors, mean);
      for (int c = 0; c < 3; ++c) {
        const __m256 a = _mm256_set1_ps(scale[c]), b = _mm256_set1_ps(shift[c]);
        _mm256_storeu_ps(planes[c] + at + x, _mm256_add_ps(_mm256_mul_ps(lo[c], a), b));
        _mm256_storeu_ps(planes[c] + at + x + 8, _mm256_add_ps(_mm256_mul_ps(hi[c], a), b));
      }
    }
    for (; x < width; ++x, p += 3) {
      float c[3] = {float(p[0]), float(p[1]), float(p[2])};
      blendsPixel(c, order, 0, n, factors, mean);
      for (int ch = 0; ch < 3; ++ch) planes[ch][at + x] = c[ch] * scale[ch] + shift[ch];
    }
  }
}

}  // namespace

bool jitterFusable() {
  return hasAvx2();
}

bool jitterNormalize(const cv::Mat& rgb, const int* order, int n, const float* factors,
                     const float scale[3], const float shift[3], float* planes[3]) {
  if (!hasAvx2() || rgb.channels() != 3) return false;
  jitterNormalizeAvx2(rgb, order, n, factors, scale, shift, planes);
  return true;
}

size_t normalizeToPlanes(const uint8_t* rgb, size_t pixels, const float scale[3],
                         const float shift[3], float* planes[3]) {
  return hasAvx2() ? normalizeAvx2(rgb, pixels, scale, shift, planes) : 0;
}

void adjustBrightness(cv::Mat& m, float factor) {
  CV_Assert(m.isContinuous());
  blendConstant(m.data, values(m), 0.f, factor);
}

void adjustContrast(cv::Mat& m, float factor) {
  CV_Assert(m.isContinuous());
  // ImageEnhance.Contrast: int(ImageStat.Stat(image.convert("L")).mean[0] + 0.5).
  uint64_t sum = 0;
  size_t pixels = m.total();
  const uint8_t* p = m.data;
  if (m.channels() == 3) {
    sum = lumaSum(p, pixels);
  } else {
    for (size_t i = 0; i < pixels; ++i) sum += p[i];
  }
  double mean = pixels ? double(sum) / double(pixels) : 0;
  blendConstant(m.data, values(m), float(int(mean + 0.5)), factor);
}

void adjustSaturation(cv::Mat& m, float factor) {
  CV_Assert(m.isContinuous());
  if (m.channels() == 3) blendLuma(m.data, m.total(), factor);
}

void adjustHue(cv::Mat& m, double hue) {
  CV_Assert(m.isContinuous());
  if (m.channels() != 3) return;
  // np.uint8(hue * 255): truncated toward zero, then taken modulo 256.
  auto shift = uint8_t(int(hue * 255));
  uint8_t* p = m.data;
  for (size_t i = 0, n = m.total(); i < n; ++i, p += 3) {
    uint8_t hsv[3];
    rgbToHsv(p, hsv);
    hsv[0] = uint8_t(hsv[0] + shift);
    hsvToRgb(hsv, p);
  }
}

}  // namespace troupe::images
