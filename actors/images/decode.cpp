// Decoding image files (troupe/images/transforms.h): JPEG through libjpeg-turbo's TurboJPEG API,
// with its DCT scaling; PNG through libpng (decode_png.cpp); the rest OpenCV reads (BMP, PPM/PGM,
// TIFF, WebP) through cv::imdecode, in a build with OpenCV's imgcodecs (TROUPE_IMGCODECS, ON but
// for the wheel's build: scripts/wheel.sh).

#include <turbojpeg.h>

#include <cstring>
#if TROUPE_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "cv_image.h"
#endif
#include "decode_png.h"
#include "troupe/images/transforms.h"

namespace troupe::images {

namespace {

bool isJpeg(std::span<const uint8_t> b) { return b.size() >= 3 && b[0] == 0xFF && b[1] == 0xD8 && b[2] == 0xFF; }

// One TurboJPEG decompressor per thread (a handle is not safe to share).
tjhandle decompressor() {
  struct Handle {
    tjhandle h = tjInitDecompress();
    ~Handle() {
      if (h) tjDestroy(h);
    }
  };
  thread_local Handle handle;
  return handle.h;
}

// The one libjpeg warning PIL does not decode through: the file ends early (PIL: "image file is
// truncated"), where the decoder fills the rest with grey. The others (stray bytes before a
// marker, a bad Huffman code) PIL decodes, and so does this.
bool cutShort(const char* message) {
  return strstr(message, "Premature end") != nullptr;
}

// A PNG's IHDR width and height, big-endian at bytes 16..23 (IHDR is always the first chunk).
std::pair<uint32_t, uint32_t> pngSize(std::span<const uint8_t> b) {
  auto be = [&](size_t at) {
    return uint32_t(b[at]) << 24 | uint32_t(b[at + 1]) << 16 | uint32_t(b[at + 2]) << 8 | b[at + 3];
  };
  return {be(16), be(20)};
}

// A header that claims more than `maxPixels` (0: no limit): a bad sample, before any allocation.
void checkPixels(uint64_t w, uint64_t h, uint64_t maxPixels, const std::string& name) {
  if (maxPixels == 0 || w * h <= maxPixels) return;
  throw data::SampleError(name, "its header claims " + std::to_string(w) + " x " +
                                    std::to_string(h) + " = " + std::to_string(w * h) +
                                    " pixels, more than the limit of " + std::to_string(maxPixels) +
                                    " (a decompression bomb, or an image larger than PIL opens; "
                                    "--max-image-pixels, or max_image_pixels= in Python, raises "
                                    "the limit, 0 removes it)");
}

}  // namespace

std::pair<int, int> imageSize(std::span<const uint8_t> bytes, const std::string& name,
                              uint64_t maxPixels) {
  if (isJpeg(bytes)) {
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(decompressor(), bytes.data(), (unsigned long)bytes.size(), &w, &h,
                            &subsamp, &colorspace) != 0) {
      throw data::SampleError(name, std::string("not a JPEG this can read: ") +
                                        tjGetErrorStr2(decompressor()));
    }
    checkPixels(uint64_t(w), uint64_t(h), maxPixels, name);
    return {w, h};
  }
  if (bytes.size() >= 24 && isPng(bytes)) {
    auto [w, h] = pngSize(bytes);
    checkPixels(w, h, maxPixels, name);
    if (w == 0 || h == 0 || w > 0x7fffffff || h > 0x7fffffff) {
      throw data::SampleError(name, "a damaged PNG header: its size is " + std::to_string(w) +
                                        " x " + std::to_string(h));
    }
    return {int(w), int(h)};
  }
  auto image = decode(bytes, name, 1, 1, maxPixels);  // the other formats: decode to learn it
  return {image.width, image.height};
}

Image decode(std::span<const uint8_t> bytes, const std::string& name, int channels,
             int scaleDenominator, uint64_t maxPixels, std::string* warning) {
  if (channels != 1 && channels != 3) {
    throw std::invalid_argument("decode: channels must be 1 or 3, not " + std::to_string(channels));
  }
  if (bytes.empty()) throw data::SampleError(name, "the file is empty (0 bytes)");
  if (isJpeg(bytes)) {
    auto tj = decompressor();
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(tj, bytes.data(), (unsigned long)bytes.size(), &w, &h, &subsamp,
                            &colorspace) != 0) {
      throw data::SampleError(name, std::string("a damaged JPEG header: ") + tjGetErrorStr2(tj));
    }
    checkPixels(uint64_t(w), uint64_t(h), maxPixels, name);
    tjscalingfactor factor{1, std::max(1, scaleDenominator)};
    int sw = TJSCALED(w, factor), sh = TJSCALED(h, factor);
    // CMYK JPEGs: TurboJPEG cannot convert them to RGB; OpenCV can.
    if (colorspace != TJCS_CMYK && colorspace != TJCS_YCCK) {
      Image out;
      out.width = sw;
      out.height = sh;
      out.channels = channels;
      out.pixels.resize(size_t(sw) * sh * channels);
      int rc = tjDecompress2(tj, bytes.data(), (unsigned long)bytes.size(), out.pixels.data(), sw,
                             0, sh, channels == 3 ? TJPF_RGB : TJPF_GRAY, 0);
      if (rc != 0) {
        const char* why = tjGetErrorStr2(tj);
        if (tjGetErrorCode(tj) != TJERR_WARNING || cutShort(why)) {
          throw data::SampleError(name, std::string("a corrupt or truncated JPEG: ") + why);
        }
        if (warning != nullptr) *warning = why;
      }
      return out;
    }
  }
  if (isPng(bytes)) {
    if (bytes.size() >= 24)
      checkPixels(pngSize(bytes).first, pngSize(bytes).second, maxPixels, name);
    return decodePng(bytes, name, channels);
  }
#if TROUPE_IMGCODECS
  cv::Mat m;
  try {
    m = cv::imdecode(cv::Mat(1, int(bytes.size()), CV_8U, const_cast<uint8_t*>(bytes.data())),
                     channels == 3 ? cv::IMREAD_COLOR : cv::IMREAD_GRAYSCALE);
  } catch (const cv::Exception& e) {
    throw data::SampleError(name, std::string("cannot decode: ") + e.what());
  }
  if (m.empty()) {
    throw data::SampleError(name, "not an image this can decode (a corrupt or truncated file, or "
                                  "not JPEG, PNG, BMP, PPM/PGM, TIFF or WebP)");
  }
  if (channels == 3) cv::cvtColor(m, m, cv::COLOR_BGR2RGB);
  return imageOf(m);
#else
  throw data::SampleError(name, "not JPEG or PNG, the formats this build of troupe reads (the "
                                "wheel's: its build has no OpenCV imgcodecs); BMP, PPM/PGM, TIFF "
                                "and WebP need troupe built from source or its image");
#endif
}

}  // namespace troupe::images
