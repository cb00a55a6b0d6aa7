// Applying a Pipeline (troupe/images/transforms.h) with OpenCV, following torchvision's
// semantics for PIL images: the same random parameters drawn the same way (RandomResizedCrop's
// ten tries and its fallback, ColorJitter's random order), the same arithmetic where it is
// defined on 8-bit pixels (PIL's blend for brightness, contrast and saturation; ITU-R 601-2 luma
// for Grayscale), bilinear resizing (area averaging when shrinking, as PIL's antialiased filter
// does), nearest-neighbour affine warps with zero fill.

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "color.h"
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

cv::Mat& otherBuffer(const cv::Mat& in);

// `m` resized into a scratch buffer (`m` itself where it has the size).
cv::Mat resize(const cv::Mat& m, int height, int width) {
  if (m.rows == height && m.cols == width) return m;
  cv::Mat& dst = otherBuffer(m);
  pilResize(m, 0, 0, m.cols, m.rows, width, height, dst);
  return dst;
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

// A view of `m`'s centre (padded into a scratch buffer first where it is smaller).
cv::Mat centerCrop(const cv::Mat& m, int height, int width) {
  cv::Mat src = m;
  if (height > m.rows || width > m.cols) {
    // torchvision pads with zeros, (crop - size) // 2 before and the rest after.
    int padH = std::max(0, height - m.rows), padW = std::max(0, width - m.cols);
    cv::Mat& dst = otherBuffer(m);
    cv::copyMakeBorder(m, dst, padH / 2, padH - padH / 2, padW / 2, padW - padW / 2,
                       cv::BORDER_CONSTANT, cv::Scalar::all(0));
    src = dst;
  }
  int top = int(pyRound((src.rows - height) / 2.0));
  int left = int(pyRound((src.cols - width) / 2.0));
  return src(cv::Rect(left, top, width, height));
}

cv::Mat luma(const cv::Mat& m) {
  if (m.channels() == 1) return m;
  cv::Mat grey(m.size(), CV_8UC1);
  for (int r = 0; r < m.rows; ++r) {
    const uint8_t* in = m.ptr<uint8_t>(r);
    uint8_t* out = grey.ptr<uint8_t>(r);
    for (int x = 0; x < m.cols; ++x) out[x] = pilLuma(in + 3 * x);  // PIL's "L"
  }
  return grey;
}

cv::Mat asChannels(const cv::Mat& grey, int channels) {
  if (channels == 1) return grey;
  cv::Mat out;
  cv::cvtColor(grey, out, cv::COLOR_GRAY2RGB);
  return out;
}

// Two buffers per thread that the transforms write into in turn, so that a sample allocates
// nothing once the first of its size is done (glibc would hand buffers this size back to the
// kernel and fault them in again every image).
struct Scratch {
  cv::Mat a, b;
  // The buffer `in` is not in.
  cv::Mat& other(const cv::Mat& in) { return in.datastart == a.datastart ? b : a; }
};

Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

cv::Mat& otherBuffer(const cv::Mat& in) {
  return scratch().other(in);
}

// `m` as a packed buffer the transforms may change in place: itself where its rows are packed
// (it is a scratch buffer or the pipeline's own decode), else copied into scratch.
void ownPacked(cv::Mat& m) {
  if (m.isContinuous()) return;
  cv::Mat& dst = otherBuffer(m);
  m.copyTo(dst);
  m = dst;
}

void colorJitter(cv::Mat& m, const Op& op, Rng& rng) {
  // torchvision: the order of the four is random (torch.randperm(4)), then each factor drawn.
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i + 1)]);
  double b = op.brightness.set ? rng.uniform(op.brightness.min, op.brightness.max) : 1;
  double c = op.contrast.set ? rng.uniform(op.contrast.min, op.contrast.max) : 1;
  double s = op.saturation.set ? rng.uniform(op.saturation.min, op.saturation.max) : 1;
  double h = op.hue.set ? rng.uniform(op.hue.min, op.hue.max) : 0;
  for (int which : order) {
    if (which == 0 && op.brightness.set) {
      adjustBrightness(m, float(b));
    } else if (which == 1 && op.contrast.set) {
      adjustContrast(m, float(c));
    } else if (which == 2 && op.saturation.set) {
      adjustSaturation(m, float(s));
    } else if (which == 3 && op.hue.set && h != 0) {
      adjustHue(m, h);
    }
  }
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
  cv::Mat& out = otherBuffer(m);
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
  return decodePlan(width, height, seed).scale;
}

Pipeline::DecodePlan Pipeline::decodePlan(int width, int height, uint64_t seed) const {
  DecodePlan plan{1, 0, 0, height, width};
  if (ops_.empty()) return plan;
  auto& first = *ops_.front();
  int needH = 0, needW = 0;
  if (first.kind == Kind::kRandomResizedCrop) {
    Rng rng(seed);
    auto box = resizedCropBox(first, height, width, rng);
    plan = {1, box.top, box.left, box.height, box.width};
    needH = first.height;
    needW = first.width;
  } else if (first.kind == Kind::kResize) {
    auto [h, w] = first.shorterSide ? shorterSideTo(height, width, first.height)
                                    : std::pair<int, int>{first.height, first.width};
    needH = h;
    needW = w;
  } else {
    return plan;
  }
  if (!decodeScaling_) return plan;
  for (int d : {8, 4, 2}) {
    // The part used, decoded 1/d the size, still has at least the output's pixels each way.
    if (plan.height / d >= needH && plan.width / d >= needW) {
      plan.scale = d;
      return plan;
    }
  }
  return plan;
}

Image Pipeline::transform(Image image, uint64_t seed) const {
  std::pair<int, int> full{image.height, image.width};
  return transformScaled(std::move(image), seed, 1, full);
}

Image Pipeline::transformScaled(Image image, uint64_t seed, int scale,
                                std::pair<int, int> full) const {
  return imageOf(apply(view(image), seed, scale, full, nullptr));
}

cv::Mat Pipeline::apply(cv::Mat m, uint64_t seed, int scale, std::pair<int, int> full,
                        StageTimes* times, std::pair<int, int> origin) const {
  Rng rng(seed);
  auto since = std::chrono::steady_clock::now();
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
        cv::Mat& dst = otherBuffer(m);
        // A first crop's image may be a part of the decode, at `origin` (run()).
        int dx = i == 0 ? origin.second : 0, dy = i == 0 ? origin.first : 0;
        if (i == 0 && scale > 1) {
          // The same box in the smaller decode's pixels, where its edges fall inside pixels.
          // decodeScale() chose a scale that leaves the box at least the output's size.
          pilResize(m, double(box.left) / scale - dx, double(box.top) / scale - dy,
                    double(box.left + box.width) / scale - dx,
                    double(box.top + box.height) / scale - dy, op.width, op.height, dst);
        } else {
          pilResize(m(cv::Rect(box.left - dx, box.top - dy, box.width, box.height)), 0, 0,
                    box.width, box.height, op.width, op.height, dst);
        }
        m = dst;
        break;
      }
      case Kind::kRandomHorizontalFlip:
      case Kind::kRandomVerticalFlip:
        if (rng.uniform(0, 1) < op.p) {
          cv::Mat& out = otherBuffer(m);
          cv::flip(m, out, op.kind == Kind::kRandomHorizontalFlip ? 1 : 0);
          m = out;
        }
        break;
      case Kind::kColorJitter:
        ownPacked(m);
        colorJitter(m, op, rng);
        break;
      case Kind::kRandomAffine:
        m = affine(m, op, rng);
        break;
      case Kind::kGaussianBlur: {
        double sigma = rng.uniform(op.sigma.min, op.sigma.max);
        cv::Mat& out = otherBuffer(m);
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
    if (times != nullptr) {
      auto now = std::chrono::steady_clock::now();
      times->seconds[i + 1] += std::chrono::duration<double>(now - since).count();
      since = now;
    }
  }
  return m;
}

bool Pipeline::decodeRegion(const data::Encoded& sample, const DecodePlan& plan, int width,
                            int height, std::string* warning, Image& image,
                            std::pair<int, int>& origin) const {
  if (!decodeRegions_ || ops_.empty() || ops_.front()->kind != Kind::kRandomResizedCrop) {
    return false;
  }
  auto& op = *ops_.front();
  int x0 = plan.left, y0 = plan.top, x1 = plan.left + plan.width, y1 = plan.top + plan.height;
  int s = plan.scale;
  if (s > 1) {
    // The box in the scaled decode's pixels, its edges inside pixels, with room for the taps
    // the resampler reads around it (its support is the shrink, at least 1 pixel).
    int sw = (width + s - 1) / s, sh = (height + s - 1) / s;
    int mx = int(std::ceil(std::max(1.0, double(plan.width) / s / op.width))) + 2;
    int my = int(std::ceil(std::max(1.0, double(plan.height) / s / op.height))) + 2;
    x0 = std::max(0, plan.left / s - mx);
    y0 = std::max(0, plan.top / s - my);
    x1 = std::min(sw, (plan.left + plan.width + s - 1) / s + mx);
    y1 = std::min(sh, (plan.top + plan.height + s - 1) / s + my);
  }
  if (!decodeJpegRegion(sample.bytes, sample.name, 3, s, x0, y0, x1 - x0, y1 - y0, warning,
                        image)) {
    return false;
  }
  origin = {y0, x0};
  return true;
}

std::vector<std::string> Pipeline::stageNames() const {
  std::vector<std::string> names{"decode"};
  for (auto& op : ops_) names.push_back(op->text.substr(0, op->text.find('(')));
  names.push_back(tensor_ ? (mean_.empty() ? "ToTensor" : "Normalize") : "copy out");
  return names;
}

void Pipeline::finish(const cv::Mat& image, std::span<uint8_t> out) const {
  int c = image.channels();
  size_t width = size_t(image.cols), plane = size_t(image.rows) * width, row = width * c;
  size_t n = plane * c;
  if (out.size() != n * dtypeBytes(dtype_)) {
    throw std::invalid_argument("Pipeline::run: the output holds " + std::to_string(out.size()) +
                                " bytes, not " + std::to_string(n * dtypeBytes(dtype_)));
  }
  if (!tensor_) {
    for (int r = 0; r < image.rows; ++r) memcpy(out.data() + r * row, image.ptr(r), row);
    return;
  }
  std::vector<float> scale(c), shift(c);
  for (int k = 0; k < c; ++k) {
    float mean = mean_.empty() ? 0.f : mean_[k], sd = mean_.empty() ? 1.f : std_[k];
    scale[k] = 1.f / (255.f * sd);
    shift[k] = -mean / sd;
  }
  if (dtype_ == Dtype::kFloat32 && reinterpret_cast<uintptr_t>(out.data()) % alignof(float) == 0) {
    // The common case, a row of one plane (or the interleaved row) at a time: loops the compiler
    // vectorises.
    auto* f = reinterpret_cast<float*>(out.data());
    for (int r = 0; r < image.rows; ++r) {
      const uint8_t* px = image.ptr<uint8_t>(r);
      if (channelsLast_) {
        float* dst = f + r * row;
        for (size_t x = 0; x < width; ++x) {
          for (int k = 0; k < c; ++k) dst[x * c + k] = float(px[x * c + k]) * scale[k] + shift[k];
        }
        continue;
      }
      size_t done = 0;
      if (c == 3) {
        float* planes[3] = {f + r * width, f + plane + r * width, f + 2 * plane + r * width};
        done = normalizeToPlanes(px, width, scale.data(), shift.data(), planes);
      }
      for (int k = 0; k < c; ++k) {
        float* dst = f + size_t(k) * plane + r * width;
        const float a = scale[k], b = shift[k];
        for (size_t x = done; x < width; ++x) dst[x] = float(px[x * c + k]) * a + b;
      }
    }
    return;
  }
  for (int r = 0; r < image.rows; ++r) {
    const uint8_t* px = image.ptr<uint8_t>(r);
    for (size_t x = 0; x < width; ++x) {
      size_t p = r * width + x;
      for (int k = 0; k < c; ++k) {
        float v = float(px[x * c + k]) * scale[k] + shift[k];
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
}

std::pair<int, int> Pipeline::decodeFile(const data::Encoded& sample, uint64_t seed,
                                         std::string* warning, StageTimes* times, Image& image,
                                         int& scale, std::pair<int, int>& origin) const {
  auto [w, h] = imageSize(sample.bytes, sample.name, maxPixels_);
  auto plan = decodePlan(w, h, seed);
  scale = plan.scale;
  origin = {0, 0};
  try {
    if (decodeRegion(sample, plan, w, h, warning, image, origin)) {
      if (times != nullptr) ++times->partDecodes;
    } else {
      decodeInto(sample.bytes, sample.name, 3, scale, maxPixels_, warning, image);
    }
  } catch (const std::bad_alloc&) {
    image = Image();
    throw data::SampleError(sample.name, "out of memory decoding its " + std::to_string(w) + " x " +
                                             std::to_string(h) + " pixels");
  }
  if (image.width == w && image.height == h && origin == std::pair<int, int>{0, 0}) {
    scale = 1;  // not a JPEG: decoded at full size
  }
  return {h, w};
}

void Pipeline::decodeOnly(const data::Encoded& sample, uint64_t seed) const {
  thread_local Image image;
  int scale = 1;
  std::pair<int, int> origin;
  decodeFile(sample, seed, nullptr, nullptr, image, scale, origin);
}

void Pipeline::run(const data::Encoded& sample, data::Encoding encoding,
                   std::pair<int, int> rawShape, uint64_t seed, std::span<uint8_t> out,
                   std::string* warning, StageTimes* times) const {
  auto began = std::chrono::steady_clock::now();
  if (times != nullptr) {
    times->seconds.resize(ops_.size() + 2, 0.0);
    ++times->images;
  }
  // The decode's buffer, kept per thread: its pixels are the transforms' to change.
  thread_local Image image;
  int scale = 1;
  std::pair<int, int> full, origin{0, 0};  // origin: of a part decoded (row, column)
  if (encoding == data::Encoding::kRawGrey8) {
    image.height = rawShape.first;
    image.width = rawShape.second;
    image.channels = 1;
    if (sample.bytes.size() != size_t(image.height) * image.width) {
      throw data::SampleError(sample.name, "holds " + std::to_string(sample.bytes.size()) +
                                               " bytes, not " + std::to_string(image.height) +
                                               " x " + std::to_string(image.width));
    }
    image.pixels.assign(sample.bytes.begin(), sample.bytes.end());
    full = {image.height, image.width};
  } else {
    full = decodeFile(sample, seed, warning, times, image, scale, origin);
  }
  auto shape = outputShape(image.channels);
  if (times != nullptr) {
    times->seconds[0] +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  }
  cv::Mat done;
  try {
    done = apply(view(image), seed, scale, full, times, origin);
  } catch (const std::bad_alloc&) {
    throw data::SampleError(sample.name, "out of memory transforming it");
  }
  if (done.rows != shape.height || done.cols != shape.width) {
    throw data::SampleError(sample.name, "transformed to " + std::to_string(done.rows) + " x " +
                                             std::to_string(done.cols) + ", not " +
                                             std::to_string(shape.height) + " x " +
                                             std::to_string(shape.width));
  }
  auto before = std::chrono::steady_clock::now();
  finish(done, out);
  if (times != nullptr) {
    times->seconds.back() +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  }
}

}  // namespace troupe::images
