// Decoding image files (troupe/images/transforms.h): JPEG through libjpeg-turbo's TurboJPEG API,
// with its DCT scaling (CMYK and YCCK JPEGs too, made RGB as PIL makes them); PNG through libpng (decode_png.cpp); the rest OpenCV reads (BMP, PPM/PGM,
// TIFF, WebP) through cv::imdecode, in a build with OpenCV's imgcodecs (TROUPE_IMGCODECS, ON but
// for the wheel's build: scripts/wheel.sh).

#include <turbojpeg.h>
// (jpeglib.h needs FILE and size_t declared before it.)
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>

#include <jpeglib.h>
#if TROUPE_IMGCODECS
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#endif
#include "cv_image.h"
#include "decode_png.h"
#include "ops.h"
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

// The size the header of a BMP, PNM (P1-P6), WebP or TIFF file claims, read as their decoders
// read it (the BMP's BITMAPINFOHEADER or OS/2 core header, the PNM's text header, the WebP's
// VP8/VP8L/VP8X chunk, the TIFF's first IFD: the page OpenCV decodes); nothing: not one of these,
// or a header too short or damaged to say (the decoder then refuses the file itself).
std::optional<std::pair<uint64_t, uint64_t>> headerSize(std::span<const uint8_t> b) {
  auto le16 = [&](size_t at) { return uint32_t(b[at]) | uint32_t(b[at + 1]) << 8; };
  auto le32 = [&](size_t at) { return le16(at) | le16(at + 2) << 16; };
  auto le24 = [&](size_t at) { return le16(at) | uint32_t(b[at + 2]) << 16; };
  if (b.size() >= 26 && b[0] == 'B' && b[1] == 'M') {
    uint32_t header = le32(14);
    if (header == 12) return std::pair<uint64_t, uint64_t>{le16(18), le16(20)};  // OS/2 1.x
    if (header < 40) return std::nullopt;
    // Signed: a negative height is a top-down bitmap.
    auto w = int32_t(le32(18)), h = int32_t(le32(22));
    return std::pair<uint64_t, uint64_t>{uint64_t(std::abs(int64_t(w))),
                                         uint64_t(std::abs(int64_t(h)))};
  }
  if (b.size() >= 3 && b[0] == 'P' && b[1] >= '1' && b[1] <= '6') {
    // "P6 <width> <height> <maxval>", whitespace and # comments between the fields.
    size_t at = 2;
    uint64_t fields[2] = {0, 0};
    for (auto& field : fields) {
      while (at < b.size() && (std::isspace(b[at]) || b[at] == '#')) {
        if (b[at] == '#') {
          while (at < b.size() && b[at] != '\n') ++at;
        } else {
          ++at;
        }
      }
      size_t digits = 0;
      while (at < b.size() && std::isdigit(b[at]) && digits < 12) {
        field = field * 10 + (b[at++] - '0');
        ++digits;
      }
      if (digits == 0 || digits == 12) return std::nullopt;
    }
    return std::pair<uint64_t, uint64_t>{fields[0], fields[1]};
  }
  if (b.size() >= 30 && std::memcmp(b.data(), "RIFF", 4) == 0 &&
      std::memcmp(b.data() + 8, "WEBP", 4) == 0) {
    if (std::memcmp(b.data() + 12, "VP8X", 4) == 0) {  // the canvas, 24-bit minus one
      return std::pair<uint64_t, uint64_t>{le24(24) + 1ull, le24(27) + 1ull};
    }
    if (std::memcmp(b.data() + 12, "VP8L", 4) == 0 && b[20] == 0x2f) {  // 14 bits minus one each
      uint32_t bits = le32(21);
      return std::pair<uint64_t, uint64_t>{(bits & 0x3fff) + 1ull, ((bits >> 14) & 0x3fff) + 1ull};
    }
    if (std::memcmp(b.data() + 12, "VP8 ", 4) == 0 && b[23] == 0x9d && b[24] == 0x01 &&
        b[25] == 0x2a) {  // after the key frame's start code, 14 bits each
      return std::pair<uint64_t, uint64_t>{le16(26) & 0x3fff, le16(28) & 0x3fff};
    }
    return std::nullopt;
  }
  if (b.size() >= 8 && ((b[0] == 'I' && b[1] == 'I' && b[2] == 42 && b[3] == 0) ||
                        (b[0] == 'M' && b[1] == 'M' && b[2] == 0 && b[3] == 42))) {
    bool big = b[0] == 'M';
    auto u16 = [&](size_t at) {
      return big ? uint32_t(b[at]) << 8 | b[at + 1] : le16(at);
    };
    auto u32 = [&](size_t at) {
      return big ? u16(at) << 16 | u16(at + 2) : le32(at);
    };
    size_t ifd = u32(4);
    if (ifd + 2 > b.size()) return std::nullopt;
    size_t entries = u16(ifd);
    uint64_t w = 0, h = 0;
    for (size_t k = 0; k < entries && ifd + 2 + 12 * (k + 1) <= b.size(); ++k) {
      size_t e = ifd + 2 + 12 * k;
      uint32_t tag = u16(e), type = u16(e + 2);
      // A SHORT value sits in the entry's first two bytes, a LONG in its four.
      uint64_t value = type == 3 ? u16(e + 8) : type == 4 ? u32(e + 8) : 0;
      if (tag == 256) w = value;
      if (tag == 257) h = value;
    }
    if (w == 0 || h == 0) return std::nullopt;
    return std::pair<uint64_t, uint64_t>{w, h};
  }
  return std::nullopt;
}

// CMYK to RGB (or grey) as PIL's convert("RGB") does (Pillow's cmyk2rgb: each channel
// (255 - K) - C x (255 - K) / 255, rounded by its MULDIV255; grey from that RGB with its
// L = R x 299/1000 + G x 587/1000 + B x 114/1000 in fixed point). The stored values are read
// inverted first, as Photoshop writes them and PIL always reads them ("CMYK;I", "assume adobe
// conventions"), with Adobe's marker or without.
void cmykToRgb(const uint8_t* cmyk, size_t pixels, int channels, uint8_t* out) {
  auto muldiv255 = [](int a, int b) {
    int t = a * b + 128;
    return ((t >> 8) + t) >> 8;
  };
  for (size_t i = 0; i < pixels; ++i) {
    int v[4];
    for (int k = 0; k < 4; ++k) v[k] = 255 - cmyk[4 * i + k];
    int nk = 255 - v[3];
    int rgb[3];
    for (int k = 0; k < 3; ++k) rgb[k] = std::clamp(nk - muldiv255(v[k], nk), 0, 255);
    if (channels == 3) {
      for (int k = 0; k < 3; ++k) out[3 * i + k] = uint8_t(rgb[k]);
    } else {
      out[i] = uint8_t((rgb[0] * 19595 + rgb[1] * 38470 + rgb[2] * 7471 + 0x8000) >> 16);
    }
  }
}

// A header that claims more than `maxPixels` (0: no limit): a bad sample, before any allocation.
void checkPixels(uint64_t w, uint64_t h, uint64_t maxPixels, const std::string& name) {
  if (maxPixels == 0 || w * h <= maxPixels) return;
  throw data::SampleError(name, "its header claims " + std::to_string(w) + " x " +
                                    std::to_string(h) + " = " + std::to_string(w * h) +
                                    " pixels, more than the limit of " + std::to_string(maxPixels) +
                                    " (a decompression bomb, or an image larger than PIL opens; "
                                    "a torchvision ImageFolder's limit is PIL's "
                                    "Image.MAX_IMAGE_PIXELS (None removes it), a troupe.data "
                                    "ImageDataset's or AugmentedBatches' max_image_pixels=, "
                                    "hetero_train's --max-image-pixels (0 removes it))");
}

// A JPEG header's size, as TurboJPEG read it: a header too damaged to say one (a file that is a
// JPEG's first bytes and then garbage) gives 0 here, never an image.
void checkJpegSize(int w, int h, const std::string& name) {
  if (w <= 0 || h <= 0) {
    throw data::SampleError(name, "a damaged JPEG header: its size is " + std::to_string(w) +
                                      " x " + std::to_string(h));
  }
}

// libjpeg's errors and warnings for a decode through its own API (decodeJpegRegion): an error
// jumps back with its message; the first warning is kept, and whether the data ended early.
struct JpegErrors {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char error[JMSG_LENGTH_MAX] = "";
  char warning[JMSG_LENGTH_MAX] = "";
  bool cut = false;
};

void onJpegError(j_common_ptr c) {
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  c->err->format_message(c, e->error);
  std::longjmp(e->jump, 1);
}

void onJpegMessage(j_common_ptr c, int level) {
  if (level >= 0) return;  // trace messages
  auto* e = reinterpret_cast<JpegErrors*>(c->err);
  char text[JMSG_LENGTH_MAX];
  c->err->format_message(c, text);
  if (e->warning[0] == 0) std::strcpy(e->warning, text);
  if (cutShort(text)) e->cut = true;
}

// Whether the JPEG ends with its end-of-image marker: then its data cannot end early, and
// decoding only a part of it loses no "truncated" verdict (PIL's one refusal) to the rows left
// unread.
bool endsWhole(std::span<const uint8_t> b) {
  return b.size() >= 4 && b[b.size() - 2] == 0xFF && b[b.size() - 1] == 0xD9;
}

}  // namespace

bool decodeJpegRegion(std::span<const uint8_t> bytes, const std::string& name, int channels,
                      int scaleDenominator, int x, int y, int width, int height,
                      std::string* warning, Image& out) {
  if (!isJpeg(bytes) || !endsWhole(bytes) || width <= 0 || height <= 0) return false;
  thread_local std::vector<uint8_t> row;
  jpeg_decompress_struct cinfo;
  JpegErrors errors;
  cinfo.err = jpeg_std_error(&errors.mgr);
  errors.mgr.error_exit = onJpegError;
  errors.mgr.emit_message = onJpegMessage;
  jpeg_create_decompress(&cinfo);
  if (setjmp(errors.jump) != 0) {
    jpeg_destroy_decompress(&cinfo);
    throw data::SampleError(name, std::string("a corrupt or truncated JPEG: ") + errors.error);
  }
  jpeg_mem_src(&cinfo, bytes.data(), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&cinfo, TRUE);
  if (cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&cinfo);
    return false;  // decode() hands these to OpenCV
  }
  // TurboJPEG's settings (tjDecompress2 without flags): the accurate integer DCT, fancy
  // upsampling.
  cinfo.out_color_space = channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
  cinfo.scale_num = 1;
  cinfo.scale_denom = static_cast<unsigned>(std::max(1, scaleDenominator));
  cinfo.dct_method = JDCT_ISLOW;
  cinfo.do_fancy_upsampling = TRUE;
  jpeg_start_decompress(&cinfo);
  if (x + width > int(cinfo.output_width) || y + height > int(cinfo.output_height)) {
    jpeg_destroy_decompress(&cinfo);
    return false;
  }
  // The columns from the iMCU boundary at or before x, 16 more each side: a crop's edge is an
  // edge to the fancy upsampling of horizontally subsampled chroma (4:2:0, 4:2:2), which gives its
  // first and last columns other pixels than a whole decode has there. The rows before y are
  // skipped (no IDCT or colour conversion where the chroma is not vertically subsampled).
  int from = std::max(0, x - 16), to = std::min(int(cinfo.output_width), x + width + 16);
  JDIMENSION left = JDIMENSION(from), across = JDIMENSION(to - from);
  jpeg_crop_scanline(&cinfo, &left, &across);
  if (y > 0) jpeg_skip_scanlines(&cinfo, JDIMENSION(y));
  out.width = width;
  out.height = height;
  out.channels = channels;
  out.pixels.resize(size_t(width) * height * channels);
  row.resize(size_t(across) * channels);
  size_t skip = size_t(JDIMENSION(x) - left) * channels, bytesOut = size_t(width) * channels;
  for (int r = 0; r < height; ++r) {
    JSAMPROW rows[1] = {row.data()};
    jpeg_read_scanlines(&cinfo, rows, 1);
    std::memcpy(out.pixels.data() + r * bytesOut, row.data() + skip, bytesOut);
  }
  // The rows after, skipped to the end and the end marker read: what libjpeg warns about there
  // (a bad Huffman code, stray bytes before the marker) is counted as a whole decode counts it.
  // (Their Huffman data is most of a decode's cost, so stopping here instead saves little: at
  // 1600x1200, DCT-scaled, 228 against 234 images/s, within the noise.)
  if (cinfo.output_scanline < cinfo.output_height) {
    jpeg_skip_scanlines(&cinfo, cinfo.output_height - cinfo.output_scanline);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  if (errors.cut) {
    throw data::SampleError(name, std::string("a corrupt or truncated JPEG: ") + errors.warning);
  }
  if (warning != nullptr && errors.warning[0] != 0) *warning = errors.warning;
  return true;
}

std::pair<int, int> imageSize(std::span<const uint8_t> bytes, const std::string& name,
                              uint64_t maxPixels) {
  if (isJpeg(bytes)) {
    int w = 0, h = 0, subsamp = 0, colorspace = 0;
    if (tjDecompressHeader3(decompressor(), bytes.data(), (unsigned long)bytes.size(), &w, &h,
                            &subsamp, &colorspace) != 0) {
      throw data::SampleError(name, std::string("not a JPEG this can read: ") +
                                        tjGetErrorStr2(decompressor()));
    }
    checkJpegSize(w, h, name);
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
  if (auto size = headerSize(bytes)) {  // BMP, PNM, WebP, TIFF: their headers say it
    auto [w, h] = *size;
    checkPixels(w, h, maxPixels, name);
    if (w > 0 && h > 0 && w <= 0x7fffffff && h <= 0x7fffffff) return {int(w), int(h)};
  }
  auto image = decode(bytes, name, 1, 1, maxPixels);  // a header it could not read: decode it
  return {image.width, image.height};
}

Image decode(std::span<const uint8_t> bytes, const std::string& name, int channels,
             int scaleDenominator, uint64_t maxPixels, std::string* warning) {
  Image out;
  decodeInto(bytes, name, channels, scaleDenominator, maxPixels, warning, out);
  return out;
}

void decodeInto(std::span<const uint8_t> bytes, const std::string& name, int channels,
                int scaleDenominator, uint64_t maxPixels, std::string* warning, Image& out) {
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
    checkJpegSize(w, h, name);
    checkPixels(uint64_t(w), uint64_t(h), maxPixels, name);
    tjscalingfactor factor{1, std::max(1, scaleDenominator)};
    int sw = TJSCALED(w, factor), sh = TJSCALED(h, factor);
    bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
    {
      // CMYK and YCCK JPEGs (ImageNet has some): TurboJPEG decodes them to CMYK (YCCK
      // converted), which is then made RGB as PIL makes it; in every build, the wheel's too.
      thread_local std::vector<uint8_t> cmykPixels;
      uint8_t* into = nullptr;
      out.width = sw;
      out.height = sh;
      out.channels = channels;
      out.pixels.resize(size_t(sw) * sh * channels);
      if (cmyk) {
        cmykPixels.resize(size_t(sw) * sh * 4);
        into = cmykPixels.data();
      } else {
        into = out.pixels.data();
      }
      int rc = tjDecompress2(tj, bytes.data(), (unsigned long)bytes.size(), into, sw, 0, sh,
                             cmyk ? TJPF_CMYK : channels == 3 ? TJPF_RGB : TJPF_GRAY, 0);
      if (rc != 0) {
        const char* why = tjGetErrorStr2(tj);
        // (TurboJPEG 2.1 keeps a warning's flag from the handle's last decode when it refuses its
        // arguments: "Invalid argument" is never a warning, whatever tjGetErrorCode says.)
        if (tjGetErrorCode(tj) != TJERR_WARNING || cutShort(why) ||
            std::strstr(why, "Invalid argument") != nullptr) {
          throw data::SampleError(name, std::string("a corrupt or truncated JPEG: ") + why);
        }
        if (warning != nullptr) *warning = why;
      }
      if (cmyk) {
        cmykToRgb(cmykPixels.data(), size_t(sw) * sh, channels, out.pixels.data());
        if (cmykPixels.capacity() > kKeptBufferBytes) std::vector<uint8_t>().swap(cmykPixels);
      }
      return;
    }
  }
  if (isPng(bytes)) {
    if (bytes.size() >= 24)
      checkPixels(pngSize(bytes).first, pngSize(bytes).second, maxPixels, name);
    out = decodePng(bytes, name, channels);
    return;
  }
  // The other formats' limit, from their headers, before their decoder allocates anything.
  if (auto size = headerSize(bytes)) checkPixels(size->first, size->second, maxPixels, name);
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
  out = imageOf(m);
#else
  throw data::SampleError(name, "not JPEG or PNG, the formats this build of troupe reads (the "
                                "wheel's: its build has no OpenCV imgcodecs); BMP, PPM/PGM, TIFF "
                                "and WebP need troupe built from source or its image");
#endif
}

}  // namespace troupe::images
