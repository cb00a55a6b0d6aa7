// A Pipeline's path for one sample (troupe/images/transforms.h): what run() decodes of it (its
// DCT scale, the part of a JPEG a first RandomResizedCrop needs: decode.cpp) into buffers kept
// per thread, the transforms (transforms.cpp), and the output written as ToTensor/Normalize,
// the dtype and the layout say; each stage timed where asked (StageTimes).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <opencv2/core.hpp>

#include "color.h"
#include "cv_image.h"
#include "ops.h"

namespace troupe::images {

const char* dtypeName(Dtype d) {
  switch (d) {
    case Dtype::kUint8:
      return "uint8";
    case Dtype::kFloat16:
      return "float16";
    case Dtype::kFloat32:
      return "float32";
  }
  return "?";
}

size_t dtypeBytes(Dtype d) {
  return d == Dtype::kUint8 ? 1 : d == Dtype::kFloat16 ? 2 : 4;
}

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
      cv::Mat(1, int(n), CV_8UC1, data)
          .convertTo(dst, CV_32F, 1.0 / (255.0 * stddev), -mean / stddev);
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
  } else if (first.kind == Kind::kCenterCrop && first.height <= height && first.width <= width) {
    // The centre box as transforms.cpp's centerCrop() takes it (no padding: inside the image);
    // its pixels exactly, so never DCT-scaled.
    return {1, pyRound((height - first.height) / 2.0), pyRound((width - first.width) / 2.0),
            first.height, first.width};
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

bool Pipeline::decodeRegion(const data::Encoded& sample, const DecodePlan& plan, int width,
                            int height, std::string* warning, Image& image,
                            std::pair<int, int>& origin) const {
  if (!decodeRegions_ || ops_.empty()) return false;
  auto kind = ops_.front()->kind;
  if (kind == Kind::kCenterCrop && (plan.height < height || plan.width < width)) {
    // A first CenterCrop: the box itself, which centerCrop() then takes whole.
    if (!decodeJpegRegion(sample.bytes, sample.name, 3, 1, plan.left, plan.top, plan.width,
                          plan.height, warning, image)) {
      return false;
    }
    origin = {plan.top, plan.left};
    return true;
  }
  if (kind != Kind::kRandomResizedCrop) return false;
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
  std::string out = tensor_ ? (mean_.empty() ? "ToTensor" : "Normalize") : "copy out";
  // A last ColorJitter's blends are made as the output is written (apply() defers them).
  if (!ops_.empty() && ops_.back()->kind == Kind::kColorJitter && tensor_ &&
      dtype_ == Dtype::kFloat32 && !channelsLast_ && jitterFusable()) {
    names.back() += " (its draws)";
    out = "ColorJitter's blends + " + out;
  }
  names.push_back(out);
  return names;
}

void Pipeline::finish(const cv::Mat& input, std::span<uint8_t> out,
                      const DeferredJitter* deferred) const {
  cv::Mat image = input;
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
  bool aligned = reinterpret_cast<uintptr_t>(out.data()) % alignof(float) == 0;
  if (deferred != nullptr && deferred->set) {
    // A last ColorJitter apply() left here: its blends and the normalisation in one go.
    auto* f = reinterpret_cast<float*>(out.data());
    float* planes[3] = {f, f + plane, f + 2 * plane};
    if (dtype_ == Dtype::kFloat32 && aligned && !channelsLast_ &&
        jitterNormalize(image, deferred->order, deferred->n, deferred->factors, scale.data(),
                        shift.data(), planes)) {
      return;
    }
    image = input.clone();  // (not fused here: the blends first, on a copy)
    for (int k = 0; k < deferred->n; ++k) {
      float factor = deferred->factors[deferred->order[k]];
      if (deferred->order[k] == 0) adjustBrightness(image, factor);
      if (deferred->order[k] == 1) adjustContrast(image, factor);
      if (deferred->order[k] == 2) adjustSaturation(image, factor);
    }
  }
  if (dtype_ == Dtype::kFloat32 && aligned) {
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
  // The decode's buffer, kept per thread: its pixels are the transforms' to change. After a huge
  // image (whether it was transformed or refused), it and the scratch buffers are released.
  thread_local Image image;
  struct Release {
    ~Release() {
      if (image.pixels.capacity() > kKeptBufferBytes) image = Image();
      releaseLargeScratch();
    }
  } release;
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
  DeferredJitter deferred;  // a last ColorJitter, fused with the output's writing
  try {
    done = apply(view(image), seed, scale, full, times, origin, &deferred);
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
  finish(done, out, &deferred);
  if (times != nullptr) {
    times->seconds.back() +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  }
}

}  // namespace troupe::images
