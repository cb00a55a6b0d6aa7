// PNG through libpng's own API, with the transforms OpenCV's PNG decoder applies before reading
// (imgcodecs' grfmt_png.cpp): 16-bit colour samples cut to their high byte, alpha dropped,
// palettes and 1/2/4-bit grey expanded, grey widened to RGB or RGB taken to grey with the
// weights 0.299, 0.587. One exception, for PIL's pixels (what a torchvision user trains on): a
// 16-bit grey PNG is PIL's mode "I", which convert("RGB") and convert("L") clip to 255, so each
// sample here is min(value, 255), not its high byte. A build without OpenCV's imgcodecs (the
// wheel's) decodes PNG the same way.
//
// libpng reports errors by longjmp: everything this function changes after setjmp lives on the
// heap behind pointers set before it, and nothing with a destructor is made between the two.

#include "decode_png.h"

#include <png.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

namespace troupe::images {

namespace {

struct Source {
  const uint8_t* data;
  size_t size;
  size_t at = 0;
  char error[200] = "";
};

void readBytes(png_structp png, png_bytep out, size_t n) {
  auto* source = static_cast<Source*>(png_get_io_ptr(png));
  if (n > source->size - source->at) png_error(png, "the file ends inside the image");
  memcpy(out, source->data + source->at, n);
  source->at += n;
}

void onError(png_structp png, png_const_charp message) {
  auto* source = static_cast<Source*>(png_get_error_ptr(png));
  snprintf(source->error, sizeof source->error, "%s", message);
  png_longjmp(png, 1);
}

void onWarning(png_structp, png_const_charp) {}  // as OpenCV: a warning is not a failure

struct Decoding {
  Image image;
  std::vector<png_bytep> rows;
  std::vector<uint8_t> wide;  // a 16-bit grey image's rows, before they are clipped
};

}  // namespace

bool isPng(std::span<const uint8_t> b) {
  return b.size() >= 8 && png_sig_cmp(const_cast<uint8_t*>(b.data()), 0, 8) == 0;
}

Image decodePng(std::span<const uint8_t> bytes, const std::string& name, int channels) {
  auto source = std::make_unique<Source>(Source{bytes.data(), bytes.size()});
  auto decoding = std::make_unique<Decoding>();
  png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, source.get(), onError, onWarning);
  if (png == nullptr) throw std::bad_alloc();
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_read_struct(&png, nullptr, nullptr);
    throw std::bad_alloc();
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_read_struct(&png, &info, nullptr);
    throw data::SampleError(name, std::string("a damaged or truncated PNG: ") + source->error);
  }
  png_set_read_fn(png, source.get(), readBytes);
  png_read_info(png, info);
  png_uint_32 width = 0, height = 0;
  int depth = 0, type = 0;
  png_get_IHDR(png, info, &width, &height, &depth, &type, nullptr, nullptr, nullptr);
  bool grey16 = type == PNG_COLOR_TYPE_GRAY && depth == 16;  // PIL's mode "I": clipped below
  if (depth == 16 && !grey16) png_set_strip_16(png);
  png_set_strip_alpha(png);
  if (type == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
  if ((type & PNG_COLOR_MASK_COLOR) == 0 && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
  if (grey16) {
    png_set_tRNS_to_alpha(png);  // a grey tRNS: dropped, as PIL's convert("RGB") drops it
    png_set_strip_alpha(png);
  } else if (channels == 3) {
    png_set_gray_to_rgb(png);
  } else {
    png_set_rgb_to_gray(png, 1, 0.299, 0.587);
  }
  png_set_interlace_handling(png);
  png_read_update_info(png, info);
  size_t row = size_t(width) * channels, read = grey16 ? size_t(width) * 2 : row;
  if (png_get_rowbytes(png, info) != read)
    png_error(png, "an unexpected row size after conversion");
  Image& image = decoding->image;
  image.width = int(width);
  image.height = int(height);
  image.channels = channels;
  image.pixels.resize(row * height);
  uint8_t* into = image.pixels.data();
  if (grey16) {
    decoding->wide.resize(read * height);
    into = decoding->wide.data();
  }
  decoding->rows.resize(height);
  for (png_uint_32 r = 0; r < height; ++r) decoding->rows[r] = into + r * read;
  png_read_image(png, decoding->rows.data());
  png_read_end(png, nullptr);
  png_destroy_read_struct(&png, &info, nullptr);
  if (grey16) {
    const uint8_t* in = decoding->wide.data();  // big-endian samples
    uint8_t* out = image.pixels.data();
    for (size_t i = 0, n = size_t(width) * height; i < n; ++i) {
      unsigned v = unsigned(in[2 * i]) << 8 | in[2 * i + 1];
      auto clipped = uint8_t(v > 255 ? 255 : v);
      for (int c = 0; c < channels; ++c) *out++ = clipped;
    }
  }
  return std::move(decoding->image);
}

}  // namespace troupe::images
