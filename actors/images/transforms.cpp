// The transforms of a Pipeline (troupe/images/transforms.h), following torchvision's semantics
// for PIL images: the spec parsed into ops, and the ops applied to a decoded image (apply()) with
// the same random parameters drawn the same way (RandomResizedCrop's ten tries and its fallback,
// ColorJitter's random order) and PIL's arithmetic (its resampler, blends, luma and HSV:
// resample.cpp, color.cpp; nearest-neighbour affine warps with zero fill). sample.cpp decodes a
// sample for them and writes their output.

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

namespace {

cv::Mat& otherBuffer(const cv::Mat& in);

// `m` resized into a scratch buffer (`m` itself where it has the size).
cv::Mat resize(const cv::Mat& m, int height, int width) {
  if (m.rows == height && m.cols == width) return m;
  cv::Mat& dst = otherBuffer(m);
  pilResize(m, 0, 0, m.cols, m.rows, width, height, dst);
  return dst;
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

size_t bytesOf(const cv::Mat& m) {
  return m.empty() ? 0 : size_t(m.dataend - m.datastart);
}

// `m` as a packed buffer the transforms may change in place: itself where its rows are packed
// (it is a scratch buffer or the pipeline's own decode), else copied into scratch.
void ownPacked(cv::Mat& m) {
  if (m.isContinuous()) return;
  cv::Mat& dst = otherBuffer(m);
  m.copyTo(dst);
  m = dst;
}

// `defer`: where the blends may be left to the output's writing (jitterNormalize: fused with
// Normalize), their order and factors go there and `m` is left as it is; not with a hue turn.
void colorJitter(cv::Mat& m, const Op& op, Rng& rng, DeferredJitter* defer) {
  // torchvision: the order of the four is random (torch.randperm(4)), then each factor drawn.
  int order[4] = {0, 1, 2, 3};
  for (int i = 3; i > 0; --i) std::swap(order[i], order[rng.randint(0, i + 1)]);
  double b = op.brightness.set ? rng.uniform(op.brightness.min, op.brightness.max) : 1;
  double c = op.contrast.set ? rng.uniform(op.contrast.min, op.contrast.max) : 1;
  double s = op.saturation.set ? rng.uniform(op.saturation.min, op.saturation.max) : 1;
  double h = op.hue.set ? rng.uniform(op.hue.min, op.hue.max) : 0;
  if (defer != nullptr && (!op.hue.set || h == 0)) {
    bool set[3] = {op.brightness.set, op.contrast.set, op.saturation.set};
    defer->set = true;
    defer->n = 0;
    defer->factors[0] = float(b);
    defer->factors[1] = float(c);
    defer->factors[2] = float(s);
    for (int which : order) {
      if (which < 3 && set[which]) defer->order[defer->n++] = which;
    }
    return;
  }
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

Image Pipeline::transform(Image image, uint64_t seed) const {
  std::pair<int, int> full{image.height, image.width};
  return transformScaled(std::move(image), seed, 1, full);
}

Image Pipeline::transformScaled(Image image, uint64_t seed, int scale,
                                std::pair<int, int> full) const {
  return imageOf(apply(view(image), seed, scale, full, nullptr));
}

cv::Mat Pipeline::apply(cv::Mat m, uint64_t seed, int scale, std::pair<int, int> full,
                        StageTimes* times, std::pair<int, int> origin,
                        DeferredJitter* deferred) const {
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
      case Kind::kColorJitter: {
        // The last transform, before a float32 CHW output of RGB: fused with its writing.
        bool fuse = deferred != nullptr && i + 1 == ops_.size() && tensor_ &&
                    dtype_ == Dtype::kFloat32 && !channelsLast_ && m.channels() == 3 &&
                    jitterFusable();
        ownPacked(m);
        colorJitter(m, op, rng, fuse ? deferred : nullptr);
        break;
      }
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

void releaseLargeScratch() {
  auto& s = scratch();
  if (bytesOf(s.a) + bytesOf(s.b) > kKeptBufferBytes) {
    s.a.release();
    s.b.release();
  }
}

}  // namespace troupe::images
