// bench_images: the data group's image pipeline per CPU core against torchvision's, on the same
// JPEGs in the same run.
//
// The JPEGs: N pictures of ImageNet's median size (500 x 375 by default) with the detail of a
// photograph (shapes, gradients and sensor-like noise, quality 90), made here and removed after.
// Each mode runs on one thread (OpenCV's own pool off) over every file, from bytes in memory (the files are read once
// first: this measures the CPU, not the disk):
//
//   decode                     libjpeg-turbo to RGB at full size: the floor of any pipeline
//   decode 1/2, 1/4            the same with DCT scaling
//   troupe                     decode + the spec (ImageNet's training recipe by default), DCT
//                              scaling where the crop allows, into float32 CHW
//   troupe, full-size decode   the same with DCT scaling off
//   torchvision + PIL          Image.open().convert("RGB") and the same transforms composed in
//                              torchvision 0.14, torch on one thread (/usr/bin/python3)
//
// Usage: bench_images [--json] [--images N] [--size WxH] [--spec SPEC] [--python PATH]
//                     [--no-torchvision]

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "troupe/images/transforms.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kDefaultSpec =
    "RandomResizedCrop(224),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),Normalize(imagenet)";

// The same recipe in torchvision; the bench passes it the files and prints its JSON.
const char* kTorchvision = R"PY(
import json, sys, time
try:
    import torch, torchvision, PIL
    from PIL import Image
    import torchvision.transforms as T
except Exception as e:
    print(json.dumps({"skipped": "cannot import torch, torchvision and PIL: %s" % e})); sys.exit(0)
torch.set_num_threads(1)
files = sys.argv[1:]
t = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ColorJitter(0.4, 0.4, 0.4),
               T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
torch.manual_seed(0)
for f in files[:20]:
    t(Image.open(f).convert("RGB"))
start = time.perf_counter()
for f in files:
    t(Image.open(f).convert("RGB"))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "images": len(files), "torchvision": torchvision.__version__,
                  "pil": PIL.__version__, "torch": torch.__version__}))
)PY";

// A picture with a photograph's detail: gradients, shapes, and noise that JPEG must code.
cv::Mat photo(int w, int h, std::mt19937& rng) {
  cv::Mat m(h, w, CV_8UC3);
  std::uniform_int_distribution<int> byte(0, 255), x(0, w - 1), y(0, h - 1), r(5, std::min(w, h) / 3);
  for (int row = 0; row < h; ++row) {
    for (int col = 0; col < w; ++col) {
      m.at<cv::Vec3b>(row, col) = cv::Vec3b(uint8_t(col * 200 / w), uint8_t(row * 200 / h), 90);
    }
  }
  for (int i = 0; i < 12; ++i) {
    cv::circle(m, {x(rng), y(rng)}, r(rng), cv::Scalar(byte(rng), byte(rng), byte(rng)), -1);
    cv::rectangle(m, {x(rng), y(rng)}, {x(rng), y(rng)}, cv::Scalar(byte(rng), byte(rng), byte(rng)), 3);
  }
  cv::Mat noise(h, w, CV_8UC3);
  cv::randn(noise, cv::Scalar::all(0), cv::Scalar::all(14));
  cv::Mat signedNoise;
  noise.convertTo(signedNoise, CV_16SC3);
  cv::Mat sum;
  m.convertTo(sum, CV_16SC3);
  sum += signedNoise - cv::Scalar::all(0);
  sum.convertTo(m, CV_8UC3);
  cv::GaussianBlur(m, m, {3, 3}, 0.8);
  return m;
}

struct Row {
  std::string name;
  double seconds = 0;
  size_t images = 0;
  double perSecond() const { return seconds > 0 ? images / seconds : 0; }
};

template <typename F>
Row measure(const std::string& name, size_t count, F&& one) {
  for (size_t i = 0; i < std::min<size_t>(20, count); ++i) one(i);  // warm-up
  auto start = Clock::now();
  for (size_t i = 0; i < count; ++i) one(i);
  return Row{name, std::chrono::duration<double>(Clock::now() - start).count(), count};
}

}  // namespace

int main(int argc, char* argv[]) {
  // One core means one thread: OpenCV would otherwise run its resizes and colour conversions on a
  // pool of its own (every CPU), which no per-core figure may count.
  cv::setNumThreads(1);
  bool json = false, torchvision = true;
  size_t count = 2000;
  int width = 500, height = 375;
  std::string spec = kDefaultSpec, python = "/usr/bin/python3";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool more = i + 1 < argc;
    if (a == "--json") {
      json = true;
    } else if (a == "--no-torchvision") {
      torchvision = false;
    } else if (a == "--images" && more) {
      count = std::stoul(argv[++i]);
    } else if (a == "--size" && more && sscanf(argv[i + 1], "%dx%d", &width, &height) == 2) {
      ++i;
    } else if (a == "--spec" && more) {
      spec = argv[++i];
    } else if (a == "--python" && more) {
      python = argv[++i];
    } else {
      fprintf(stderr,
              "usage: %s [--json] [--images N] [--size WxH] [--spec SPEC] [--python PATH] "
              "[--no-torchvision]\n",
              argv[0]);
      return 2;
    }
  }
  troupe::images::Pipeline pipeline = [&] {
    try {
      return troupe::images::Pipeline::parse(spec);
    } catch (const troupe::images::SpecError& e) {
      fprintf(stderr, "bench_images: --spec: %s\n", e.what());
      exit(2);
    }
  }();
  auto shape = pipeline.outputShape(3);

  // The JPEGs, on disk for torchvision and in memory for troupe.
  auto dir = fs::temp_directory_path() / ("troupe-bench-images-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::vector<std::vector<uint8_t>> jpegs;
  std::vector<std::string> files;
  std::mt19937 rng(1);
  const size_t distinct = std::min<size_t>(count, 200);  // encoding is slow; 200 pictures, reused
  for (size_t i = 0; i < count; ++i) {
    if (i < distinct) {
      std::vector<uint8_t> bytes;
      cv::imencode(".jpg", photo(width, height, rng), bytes, {cv::IMWRITE_JPEG_QUALITY, 90});
      jpegs.push_back(std::move(bytes));
    } else {
      jpegs.push_back(jpegs[i % distinct]);
    }
    files.push_back((dir / ("img-" + std::to_string(i) + ".jpg")).string());
    std::ofstream(files.back(), std::ios::binary)
        .write(reinterpret_cast<const char*>(jpegs.back().data()), jpegs.back().size());
  }
  size_t bytes = 0;
  for (auto& j : jpegs) bytes += j.size();

  std::vector<Row> rows;
  rows.push_back(measure("decode (libjpeg-turbo, RGB)", count, [&](size_t i) {
    troupe::images::decode(jpegs[i], files[i], 3, 1);
  }));
  for (int d : {2, 4}) {
    rows.push_back(measure("decode at 1/" + std::to_string(d) + " (DCT scaling)", count,
                           [&](size_t i) { troupe::images::decode(jpegs[i], files[i], 3, d); }));
  }
  std::vector<uint8_t> out(shape.elements() * troupe::images::dtypeBytes(pipeline.dtype()));
  size_t scaled = 0;
  rows.push_back(measure("troupe: decode + spec", count, [&](size_t i) {
    troupe::data::Encoded sample{jpegs[i], 0, files[i]};
    scaled += pipeline.decodeScale(width, height, i) > 1;
    pipeline.run(sample, troupe::data::Encoding::kFile, {}, i, out);
  }));
  pipeline.setDecodeScaling(false);
  rows.push_back(measure("troupe: full-size decode + spec", count, [&](size_t i) {
    troupe::data::Encoded sample{jpegs[i], 0, files[i]};
    pipeline.run(sample, troupe::data::Encoding::kFile, {}, i, out);
  }));

  nlohmann::json tv = nullptr;
  std::string tvSkip = torchvision ? "" : "--no-torchvision";
  if (torchvision) {
    auto script = dir / "torchvision_bench.py";
    std::ofstream(script) << kTorchvision;
    std::string cmd = python + " " + script.string();
    for (auto& f : files) cmd += " " + f;
    FILE* p = popen(cmd.c_str(), "r");
    std::string text;
    char buf[4096];
    while (p && fgets(buf, sizeof(buf), p)) text += buf;
    int status = p ? pclose(p) : -1;
    try {
      tv = nlohmann::json::parse(text);
      if (tv.contains("skipped")) {
        tvSkip = tv["skipped"];
        tv = nullptr;
      } else {
        rows.push_back(Row{"torchvision " + tv["torchvision"].get<std::string>() + " + PIL " +
                               tv["pil"].get<std::string>(),
                           tv["seconds"].get<double>(), tv["images"].get<size_t>()});
      }
    } catch (const std::exception&) {
      tvSkip = "the torchvision script failed (status " + std::to_string(status) + "): " + text;
    }
  }
  std::error_code ec;
  fs::remove_all(dir, ec);

  double baseline = tv.is_null() ? 0 : rows.back().perSecond();
  double troupeRate = rows[3].perSecond();
  if (json) {
    nlohmann::json j = {{"bench", "images"},
                        {"images", count},
                        {"size", std::to_string(width) + "x" + std::to_string(height)},
                        {"mean_jpeg_bytes", bytes / count},
                        {"spec", pipeline.describe()},
                        {"decode_scaled_fraction", double(scaled) / count},
                        {"torchvision_skipped", tvSkip.empty() ? nlohmann::json(nullptr) : nlohmann::json(tvSkip)},
                        {"troupe_vs_torchvision", baseline > 0 ? troupeRate / baseline : 0}};
    for (auto& r : rows) {
      j["modes"].push_back({{"mode", r.name}, {"images_per_s", r.perSecond()},
                            {"us_per_image", 1e6 * r.seconds / r.images}});
    }
    printf("%s\n", j.dump().c_str());
    return 0;
  }
  printf("%zu JPEGs of %dx%d (%zu bytes on average, quality 90), one thread each mode\n", count,
         width, height, bytes / count);
  printf("spec: %s\n", pipeline.describe().c_str());
  printf("DCT-scaled decodes in the troupe row: %.0f%%\n\n", 100.0 * scaled / count);
  printf("%-40s %12s %12s %14s\n", "mode", "images/s", "us/image", "x torchvision");
  for (auto& r : rows) {
    printf("%-40s %12.0f %12.0f %14s\n", r.name.c_str(), r.perSecond(), 1e6 * r.seconds / r.images,
           baseline > 0 ? (std::to_string(r.perSecond() / baseline).substr(0, 4)).c_str() : "-");
  }
  if (!tvSkip.empty()) printf("\ntorchvision: skipped: %s\n", tvSkip.c_str());
  return 0;
}
