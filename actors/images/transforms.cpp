// Applying a Pipeline (troupe/images/transforms.h) with OpenCV, following torchvision's
// semantics for PIL images: the same random parameters drawn the same way (RandomResizedCrop's
// ten tries and its fallback, ColorJitter's random order), the same arithmetic where it is
// defined on 8-bit pixels (PIL's blend for brightness, contrast and saturation; ITU-R 601-2 luma
// for Grayscale), bilinear resizing (area averaging when shrinking, as PIL's antialiased filter
// does), nearest-neighbour affine warps with zero fill.

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "cv_image.h"
#include "ops.h"
#include "resample.h"

namespace troupe::images {

const char* dtypeName(Dtype d) {
  switch (d) {
    case Dtype::kUint8: return "uint8";
    case Dtype::kFloat16: return "float16";
    case Dtype::kFloat32: return "float32";
  }
  return "?";
}

size_t dtypeBytes(Dtype d) { return d == Dtype::kUint8 ? 1 : d == Dtype::kFloat16 ? 2 : 4; }

void toFloat(std::span<const uint8_t> bytes, Dtype dtype, std::span<float> out, float mean,
             float stddev) {
  size_t n = bytes.size() / dtypeBytes(dtype);
  if (n * dtypeBytes(dtype) != bytes.size() || out.size() != n) {
    throw std::invalid_argument("toFloat: " + std::to_string(bytes.size()) + " bytes of " +
                                dtypeName(dtype) + " into " + std::to_string(out.size()) +
                                " floats");
  }
  if (n == 0) return;
  cv::Mat dst(1, int(n), CV_32F, out.data());
  auto* data = const_cast<uint8_t*>(bytes.data());
  switch (dtype) {
    case Dtype::kUint8:
      cv::Mat(1, int(n), CV_8UC1, data).convertTo(dst, CV_32F, 1.0 / (255.0 * stddev),
                                                  -mean / stddev);
      break;
    case Dtype::kFloat16:
      cv::Mat(1, int(n), CV_16F, data).convertTo(dst, CV_32F);
      break;
    case Dtype::kFloat32:
      std::memcpy(out.data(), data, bytes.size());
      break;
  }
}

namespace {

cv::Mat view(Image& im) {
  return cv::Mat(im.height, im.width, CV_8UC(im.channels), im.pixels.data());
}

cv::Mat resize(const cv::Mat& m, int height, int width) {
  if (m.rows == height && m.cols == width) return m;
  return pilResize(m, 0, 0, m.cols, m.rows, width, height);
}

// torchvision's _compute_resized_output_size for an int size: the shorter side becomes `size`.
std::pair<int, int> shorterSideTo(int height, int width, int size) {
  if (height <= width) return {size, int(double(size) * width / height)};
  return {int(double(size) * height / width), size};
}

// Python's round(): halves to the even neighbour (round(36.5) == 36), as torchvision computes its
// boxes; std::lround would take 37.
int pyRound(double x) { return int(std::nearbyint(x)); }

struct Box {
  int top = 0, left = 0, height = 0, width = 0;
};

// torchvision's RandomResizedCrop.get_params.
Box resizedCropBox(const Op& op, int height, int width, Rng& rng) {
  double area = double(height) * width;
  double logMin = std::log(op.ratio.min), logMax = std::log(op.ratio.max);
  for (int attempt = 0; attempt < 10; ++attempt) {
    double target = area * rng.uniform(op.scale.min, op.scale.max);
    double aspect = std::exp(rng.uniform(logMin, logMax));
    int w = int(pyRound(std::sqrt(target * aspect)));
    int h = int(pyRound(std::sqrt(target / aspect)));
    if (0 < w && w <= width && 0 < h && h <= height) {
      int top = rng.randint(0, height - h + 1), left = rng.randint(0, width - w + 1);
      return {top, left, h, w};
    }
  }
  double inRatio = double(width) / height;
  int w = width, h = height;
  if (inRatio < op.ratio.min) {
    h = int(pyRound(w / op.ratio.min));
  } else if (inRatio > op.ratio.max) {
    w = int(pyRound(h * op.ratio.max));
  }
  return {(height - h) / 2, (width - w) / 2, h, w};
}

cv::Mat centerCrop(const cv::Mat& m, int height, int width) {
  cv::Mat src = m;
  if (height > m.rows || width > m.cols) {
    // torchvision pads with zeros, (crop - size) // 2 before and the rest after.
    int padH = std::max(0, height - m.rows), padW = std::max(0, width - m.cols);
    cv::copyMakeBorder(m, src, padH / 2, padH - padH / 2, padW / 2, padW - padW / 2,
                       cv::BORDER_CONSTANT, cv::Scalar::all(0));
  }
  int top = int(pyRound((src.rows - height) / 2.0));
  int left = int(pyRound((src.cols - width) / 2.0));
  return src(cv::Rect(left, top, width, height)).clone();
}

// PIL's ImageEnhance: blend(degenerate, image, factor) = degenerate + factor * (image - degenerate).
cv::Mat blend(const cv::Mat& image, const cv::Mat& degenerate, double factor) {
  cv::Mat out;
  cv::addWeighted(image, factor, degenerate, 1.0 - factor, 0.0, out);
  return out;
}

cv::Mat luma(const cv::Mat& m) {
  if (m.channels() == 1) return m;
  cv::Mat grey;
  cv::cvtColor(m, grey, cv::COLOR_RGB2GRAY);  // 0.299 R + 0.587 G + 0.114 B, as PIL's "L"
  return grey;
}

cv::Mat asChannels(const cv::Mat& grey, int channels) {
  if (channels == 1) return grey;
  cv::Mat out;
  cv::cvtColor(grey, out, cv::COLOR_GRAY2RGB);
  return out;
}

cv::Mat colorJitter(const cv::Mat& in, const Op& op, Rng& rng) {
  // torchvision: the order of the four is random (torch.randperm(4)), then each factor drawn.
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i + 1)]);
  double b = op.brightness.set ? rng.uniform(op.brightness.min, op.brightness.max) : 1;
  double c = op.contrast.set ? rng.uniform(op.contrast.min, op.contrast.max) : 1;
  double s = op.saturation.set ? rng.uniform(op.saturation.min, op.saturation.max) : 1;
  double h = op.hue.set ? rng.uniform(op.hue.min, op.hue.max) : 0;
  cv::Mat m = in;
  for (int which : order) {
    if (which == 0 && op.brightness.set) {
      m = blend(m, cv::Mat::zeros(m.size(), m.type()), b);
    } else if (which == 1 && op.contrast.set) {
      double mean = std::floor(cv::mean(luma(m))[0] + 0.5);
      m = blend(m, cv::Mat(m.size(), m.type(), cv::Scalar::all(mean)), c);
    } else if (which == 2 && op.saturation.set && m.channels() == 3) {
      m = blend(m, asChannels(luma(m), 3), s);
    } else if (which == 3 && op.hue.set && m.channels() == 3 && h != 0) {
      cv::Mat hsv;
      cv::cvtColor(m, hsv, cv::COLOR_RGB2HSV_FULL);  // hue on 0..255, as PIL's HSV
      int shift = int(std::lround(h * 255));
      for (int r = 0; r < hsv.rows; ++r) {
        auto* p = hsv.ptr<uint8_t>(r);
        for (int x = 0; x < hsv.cols; ++x) p[3 * x] = uint8_t(p[3 * x] + shift);
      }
      cv::cvtColor(hsv, m, cv::COLOR_HSV2RGB_FULL);
    }
  }
  return m;
}

// torchvision 0.14's RandomAffine on a PIL image: its draws (angle, translation, scale, shear x
// and y), the inverse matrix of functional._get_inverse_affine_matrix about the image's centre
// (w / 2, h / 2), and PIL's nearest-neighbour sampling: output pixel (x, y) reads input pixel
// floor(M (x + 0.5, y + 0.5)), zero outside. A positive angle turns the picture clockwise, as
// torchvision's affine does.
cv::Mat affine(const cv::Mat& m, const Op& op, Rng& rng) {
  double angle = rng.uniform(op.degrees.min, op.degrees.max);
  double tx = 0, ty = 0;
  if (op.translate.set) {
    double maxX = op.translate.min * m.cols, maxY = op.translate.max * m.rows;
    tx = pyRound(rng.uniform(-maxX, maxX));
    ty = pyRound(rng.uniform(-maxY, maxY));
  }
  double scale = op.affineScale.set ? rng.uniform(op.affineScale.min, op.affineScale.max) : 1;
  double shearX = op.shear.set ? rng.uniform(op.shear.min, op.shear.max) : 0;
  double shearY = op.shearY.set ? rng.uniform(op.shearY.min, op.shearY.max) : 0;
  double rot = angle * M_PI / 180, sx = shearX * M_PI / 180, sy = shearY * M_PI / 180;
  double cx = m.cols * 0.5, cy = m.rows * 0.5;
  double a = std::cos(rot - sy) / std::cos(sy);
  double b = -std::cos(rot - sy) * std::tan(sx) / std::cos(sy) - std::sin(rot);
  double c = std::sin(rot - sy) / std::cos(sy);
  double d = -std::sin(rot - sy) * std::tan(sx) / std::cos(sy) + std::cos(rot);
  // The inverse: RSS^-1 (det 1), scaled, then the centre and the translation undone.
  double inv[6] = {d / scale, -b / scale, 0, -c / scale, a / scale, 0};
  inv[2] = inv[0] * (-cx - tx) + inv[1] * (-cy - ty) + cx;
  inv[5] = inv[3] * (-cx - tx) + inv[4] * (-cy - ty) + cy;
  // OpenCV's nearest reads round(M' (x, y)) = floor(M' (x, y) + 0.5): M' = M with the half pixel
  // PIL adds on both sides folded into the offsets.
  inv[2] += (inv[0] + inv[1]) * 0.5 - 0.5;
  inv[5] += (inv[3] + inv[4]) * 0.5 - 0.5;
  cv::Mat matrix(2, 3, CV_64F, inv);
  cv::Mat out;
  cv::warpAffine(m, out, matrix, m.size(), cv::INTER_NEAREST | cv::WARP_INVERSE_MAP,
                 cv::BORDER_CONSTANT, cv::Scalar::all(0));
  return out;
}

// IEEE half from float (round to nearest even), for ToDtype(float16).
uint16_t toHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, exp = (x >> 23) & 0xff, man = x & 0x7fffff;
  if (exp == 0xff) return uint16_t(sign | 0x7c00 | (man ? 0x200 : 0));
  int e = int(exp) - 127 + 15;
  if (e >= 31) return uint16_t(sign | 0x7c00);
  if (e <= 0) {
    if (e < -10) return uint16_t(sign);
    man |= 0x800000;
    uint32_t shift = uint32_t(14 - e);
    uint32_t half = man >> shift, rest = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rest > mid || (rest == mid && (half & 1))) ++half;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | uint32_t(e) << 10 | man >> 13, rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;
  return uint16_t(half);
}

}  // namespace

Pipeline::Pipeline() = default;
Pipeline::Pipeline(Pipeline&&) noexcept = default;
Pipeline& Pipeline::operator=(Pipeline&&) noexcept = default;
Pipeline::~Pipeline() = default;

Pipeline Pipeline::parse(const std::string& spec) {
  Pipeline p;
  bool floats = false;
  for (auto& op : parseSpec(spec)) {
    if (op.kind == Kind::kToTensor || op.kind == Kind::kNormalize) {
      if (op.kind == Kind::kNormalize) {
        if (!p.mean_.empty()) throw SpecError("Normalize is given twice");
        p.mean_ = op.mean;
        p.std_ = op.stddev;
      }
      floats = true;
      continue;
    }
    if (op.kind == Kind::kToDtype || op.kind == Kind::kChannelsLast) {
      if (!floats) {
        throw SpecError(op.text + " needs ToTensor() or Normalize(...) before it: without them "
                                  "the output is uint8, height x width x channels");
      }
      if (op.kind == Kind::kToDtype) p.dtype_ = op.dtype;
      if (op.kind == Kind::kChannelsLast) p.channelsLast_ = true;
      continue;
    }
    if (floats) {
      throw SpecError(op.text + " after ToTensor/Normalize: image transforms come first, as "
                                "torchvision's on PIL images");
    }
    p.ops_.push_back(std::make_unique<Op>(std::move(op)));
  }
  p.tensor_ = floats;
  if (floats && p.dtype_ == Dtype::kUint8) p.dtype_ = Dtype::kFloat32;
  return p;
}

std::string Pipeline::describe() const {
  std::string out;
  for (auto& op : ops_) out += (out.empty() ? "" : ",") + op->text;
  return out + tail(!out.empty());
}

std::string Pipeline::evaluationSpec(int inputChannels) const {
  // torchvision's ImageNet evaluation: the shorter side to 8/7 of the crop (256 for 224), then
  // the centre crop; the training output's channels, layout and dtype.
  auto shape = outputShape(inputChannels);
  std::string size = shape.height == shape.width
                         ? std::to_string(shape.height)
                         : "(" + std::to_string(shape.height) + ", " +
                               std::to_string(shape.width) + ")";
  int shorter = std::min(shape.height, shape.width) * 8 / 7;
  std::string out = "Resize(" + std::to_string(shorter) + "),CenterCrop(" + size + ")";
  for (auto& op : ops_) {
    if (op->text.rfind("Grayscale", 0) == 0) out += "," + op->text;
  }
  return out + tail(true);
}

std::string Pipeline::tail(bool after) const {
  std::string out;
  if (tensor_) {
    std::string n = "ToTensor()";
    if (!mean_.empty()) {
      n = "Normalize(mean=(";
      char buf[32];
      for (size_t i = 0; i < mean_.size(); ++i) {
        snprintf(buf, sizeof(buf), "%s%g", i ? ", " : "", mean_[i]);
        n += buf;
      }
      n += "), std=(";
      for (size_t i = 0; i < std_.size(); ++i) {
        snprintf(buf, sizeof(buf), "%s%g", i ? ", " : "", std_[i]);
        n += buf;
      }
      n += "))";
    }
    out += (after ? "," : "") + n;
    if (dtype_ != Dtype::kFloat32) out += std::string(",ToDtype(dtype=") + dtypeName(dtype_) + ")";
    if (channelsLast_) out += ",ChannelsLast()";
  }
  return out;
}

Dtype Pipeline::dtype() const { return dtype_; }

Shape Pipeline::outputShape(int inputChannels) const {
  int channels = inputChannels, height = 0, width = 0;
  bool fixed = false;
  for (auto& op : ops_) {
    switch (op->kind) {
      case Kind::kResize:
        fixed = !op->shorterSide;
        height = op->height;
        width = op->width;
        break;
      case Kind::kCenterCrop:
      case Kind::kRandomResizedCrop:
        fixed = true;
        height = op->height;
        width = op->width;
        break;
      case Kind::kGrayscale:
        channels = op->grayChannels;
        break;
      default:
        break;
    }
  }
  if (!fixed) {
    throw SpecError("the transforms '" + describe() +
                    "' do not fix the output's size, and a batch needs one: end with "
                    "Resize((h, w)), CenterCrop(size) or RandomResizedCrop(size)");
  }
  if (!mean_.empty() && mean_.size() != size_t(channels)) {
    throw SpecError("Normalize has " + std::to_string(mean_.size()) + " mean(s) for images of " +
                    std::to_string(channels) + " channel(s): give one per channel");
  }
  return Shape{channels, height, width, tensor_ && !channelsLast_};
}

int Pipeline::decodeScale(int width, int height, uint64_t seed) const {
  if (ops_.empty() || !decodeScaling_) return 1;
  auto& first = *ops_.front();
  int needH = 0, needW = 0, boxH = height, boxW = width;
  if (first.kind == Kind::kRandomResizedCrop) {
    Rng rng(seed);
    auto box = resizedCropBox(first, height, width, rng);
    boxH = box.height;
    boxW = box.width;
    needH = first.height;
    needW = first.width;
  } else if (first.kind == Kind::kResize) {
    auto [h, w] = first.shorterSide ? shorterSideTo(height, width, first.height)
                                    : std::pair<int, int>{first.height, first.width};
    needH = h;
    needW = w;
  } else {
    return 1;
  }
  for (int d : {8, 4, 2}) {
    // The part used, decoded 1/d the size, still has at least the output's pixels each way.
    if (boxH / d >= needH && boxW / d >= needW) return d;
  }
  return 1;
}

Image Pipeline::transform(Image image, uint64_t seed) const {
  std::pair<int, int> full{image.height, image.width};
  return transformScaled(std::move(image), seed, 1, full);
}

Image Pipeline::transformScaled(Image image, uint64_t seed, int scale,
                                std::pair<int, int> full) const {
  Rng rng(seed);
  cv::Mat m = view(image);
  for (size_t i = 0; i < ops_.size(); ++i) {
    auto& op = *ops_[i];
    switch (op.kind) {
      case Kind::kResize: {
        auto [h, w] = op.shorterSide ? shorterSideTo(m.rows, m.cols, op.height)
                                     : std::pair<int, int>{op.height, op.width};
        m = resize(m, h, w);
        break;
      }
      case Kind::kCenterCrop:
        m = centerCrop(m, op.height, op.width);
        break;
      case Kind::kRandomResizedCrop: {
        // Drawn on the full image's size (what a decode at 1/scale came from), read at scale.
        Box box = i == 0 ? resizedCropBox(op, full.first, full.second, rng)
                         : resizedCropBox(op, m.rows, m.cols, rng);
        if (i == 0 && scale > 1) {
          // The same box in the smaller decode's pixels, where its edges fall inside pixels.
          // decodeScale() chose a scale that leaves the box at least the output's size.
          m = pilResize(m, double(box.left) / scale, double(box.top) / scale,
                        double(box.left + box.width) / scale, double(box.top + box.height) / scale,
                        op.width, op.height);
          break;
        }
        m = resize(m(cv::Rect(box.left, box.top, box.width, box.height)), op.height, op.width);
        break;
      }
      case Kind::kRandomHorizontalFlip:
      case Kind::kRandomVerticalFlip:
        if (rng.uniform(0, 1) < op.p) {
          cv::Mat out;
          cv::flip(m, out, op.kind == Kind::kRandomHorizontalFlip ? 1 : 0);
          m = out;
        }
        break;
      case Kind::kColorJitter:
        m = colorJitter(m, op, rng);
        break;
      case Kind::kRandomAffine:
        m = affine(m, op, rng);
        break;
      case Kind::kGaussianBlur: {
        double sigma = rng.uniform(op.sigma.min, op.sigma.max);
        cv::Mat out;
        cv::GaussianBlur(m, out, cv::Size(op.kernelX, op.kernelY), sigma, sigma,
                         cv::BORDER_REFLECT_101);
        m = out;
        break;
      }
      case Kind::kGrayscale:
        m = asChannels(luma(m), op.grayChannels);
        break;
      default:
        break;
    }
  }
  return imageOf(m);
}

void Pipeline::finish(const Image& image, std::span<uint8_t> out) const {
  size_t n = size_t(image.height) * image.width * image.channels;
  if (out.size() != n * dtypeBytes(dtype_)) {
    throw std::invalid_argument("Pipeline::run: the output holds " + std::to_string(out.size()) +
                                " bytes, not " + std::to_string(n * dtypeBytes(dtype_)));
  }
  if (!tensor_) {
    memcpy(out.data(), image.pixels.data(), n);
    return;
  }
  int c = image.channels;
  size_t plane = size_t(image.height) * image.width;
  std::vector<float> scale(c), shift(c);
  for (int k = 0; k < c; ++k) {
    float mean = mean_.empty() ? 0.f : mean_[k], sd = mean_.empty() ? 1.f : std_[k];
    scale[k] = 1.f / (255.f * sd);
    shift[k] = -mean / sd;
  }
  const uint8_t* px = image.pixels.data();
  if (dtype_ == Dtype::kFloat32 && reinterpret_cast<uintptr_t>(out.data()) % alignof(float) == 0) {
    // The common case, one plane (or the interleaved row) at a time: loops the compiler vectorises.
    auto* f = reinterpret_cast<float*>(out.data());
    if (channelsLast_) {
      for (size_t p = 0; p < plane; ++p) {
        for (int k = 0; k < c; ++k) f[p * c + k] = float(px[p * c + k]) * scale[k] + shift[k];
      }
    } else {
      for (int k = 0; k < c; ++k) {
        float* dst = f + size_t(k) * plane;
        const float a = scale[k], b = shift[k];
        for (size_t p = 0; p < plane; ++p) dst[p] = float(px[p * c + k]) * a + b;
      }
    }
    return;
  }
  for (size_t p = 0; p < plane; ++p) {
    for (int k = 0; k < c; ++k) {
      float v = float(px[p * c + k]) * scale[k] + shift[k];
      size_t at = channelsLast_ ? p * c + k : size_t(k) * plane + p;
      if (dtype_ == Dtype::kFloat16) {
        uint16_t h = toHalf(v);
        memcpy(out.data() + 2 * at, &h, 2);
      } else {
        memcpy(out.data() + 4 * at, &v, 4);
      }
    }
  }
}

void Pipeline::run(const data::Encoded& sample, data::Encoding encoding,
                   std::pair<int, int> rawShape, uint64_t seed, std::span<uint8_t> out,
                   std::string* warning) const {
  Image image;
  int scale = 1;
  std::pair<int, int> full;
  if (encoding == data::Encoding::kRawGrey8) {
    image.height = rawShape.first;
    image.width = rawShape.second;
    image.channels = 1;
    if (sample.bytes.size() != size_t(image.height) * image.width) {
      throw data::SampleError(sample.name, "holds " + std::to_string(sample.bytes.size()) +
                                               " bytes, not " + std::to_string(image.height) +
                                               " x " + std::to_string(image.width));
    }
    image.pixels = sample.bytes;
  } else {
    auto [w, h] = imageSize(sample.bytes, sample.name, maxPixels_);
    full = {h, w};
    scale = decodeScale(w, h, seed);
    try {
      image = decode(sample.bytes, sample.name, 3, scale, maxPixels_, warning);
    } catch (const std::bad_alloc&) {
      throw data::SampleError(sample.name, "out of memory decoding its " + std::to_string(w) +
                                               " x " + std::to_string(h) + " pixels");
    }
    if (image.width == w && image.height == h) scale = 1;  // not a JPEG: decoded at full size
  }
  auto shape = outputShape(image.channels);
  if (encoding == data::Encoding::kRawGrey8) full = {image.height, image.width};
  Image done;
  try {
    done = transformScaled(std::move(image), seed, scale, full);
  } catch (const std::bad_alloc&) {
    throw data::SampleError(sample.name, "out of memory transforming it");
  }
  if (done.height != shape.height || done.width != shape.width) {
    throw data::SampleError(sample.name, "transformed to " + std::to_string(done.height) + " x " +
                                             std::to_string(done.width) + ", not " +
                                             std::to_string(shape.height) + " x " +
                                             std::to_string(shape.width));
  }
  finish(done, out);
}

}  // namespace troupe::images
