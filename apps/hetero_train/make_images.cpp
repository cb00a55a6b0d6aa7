// make_images: an image dataset no one tuned for, made from Fashion-MNIST, for `make run-images`
// and the tests (docs/data.md). Each 28x28 grey image is scaled to its own random size, coloured
// (a tint per class on a tinted background, jittered) and written as a JPEG into an ImageFolder:
//
//     OUT/train/<class>/<id>.jpg    OUT/test/<class>/<id>.jpg    OUT/train.csv (a manifest)
//
// Class folders are named "0_tshirt_top" ... "9_ankle_boot", so torchvision's sorted order is
// Fashion-MNIST's label order. Every --png-every-th file is a PNG, every --grey-every-th a
// one-channel JPEG; --corrupt N cuts N training JPEGs short (a bad file, named on stdout).
// --hostile adds what a real collection holds: a README.txt and a Thumbs.db in class folders
// (not images: torchvision leaves them out), a JPEG with 8 stray bytes before its end marker
// (libjpeg warns, PIL decodes it) and a 3 KB progressive JPEG whose header claims 65000 x 65000
// pixels (a decompression bomb), each named on stdout. Deterministic from --seed. Writes nothing
// over an existing OUT/train.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "troupe/dataset/fashion_mnist.h"

namespace fs = std::filesystem;
namespace data = troupe::data;

namespace {

const char* kClasses[] = {"0_tshirt_top", "1_trouser", "2_pullover", "3_dress", "4_coat",
                          "5_sandal",     "6_shirt",   "7_sneaker",  "8_bag",   "9_ankle_boot"};

struct Options {
  std::string out;
  std::string dataDir = data::kDefaultFashionMnistDir;
  unsigned samples = 6000, testSamples = 1000;
  unsigned minSize = 40, maxSize = 160;
  unsigned pngEvery = 37, greyEvery = 29, corrupt = 0;
  bool hostile = false;
  uint64_t seed = 7;
};

// The 16-bit big-endian height and width of a JPEG's start-of-frame marker (SOF0..SOF2), set.
bool claimSize(std::vector<uint8_t>& jpeg, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] >= 0xC0 && jpeg[i + 1] <= 0xC2) {
      jpeg[i + 5] = uint8_t(h >> 8), jpeg[i + 6] = uint8_t(h);
      jpeg[i + 7] = uint8_t(w >> 8), jpeg[i + 8] = uint8_t(w);
      return true;
    }
  }
  return false;
}

void writeBytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

// --hostile: into the training set at `root` (train.partial), `shown` the folder's final name.
void addHostile(const std::vector<std::pair<fs::path, int>>& files, const fs::path& root,
                const fs::path& shown) {
  std::ofstream(root / kClasses[0] / "README.txt") << "T-shirts, scraped in 2019.\n";
  std::ofstream(root / kClasses[1] / "Thumbs.db") << "a Windows thumbnail cache";
  printf("hostile: %s, %s: not images\n", (shown / kClasses[0] / "README.txt").c_str(),
         (shown / kClasses[1] / "Thumbs.db").c_str());
  std::vector<fs::path> jpegs;
  for (auto& [path, label] : files) {
    if (path.extension() == ".jpg") jpegs.push_back(path);
  }
  if (jpegs.size() < 20) throw std::runtime_error("--hostile needs 20 JPEGs: more --samples");
  // Stray bytes before the end marker: "Corrupt JPEG data: N extraneous bytes before marker
  // 0xd9". Eight, as the entropy decoder reads up to four bytes ahead of what it needs: fewer may
  // all be read as the scan's padding, and then libjpeg says nothing.
  auto& stray = jpegs[jpegs.size() / 3];
  std::ifstream in(stray, std::ios::binary);
  std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
  bytes.insert(bytes.end() - 2, 8, 0x00);
  writeBytes(stray, bytes);
  printf("hostile: %s: 8 stray bytes before its end marker\n",
         (shown / fs::relative(stray, root)).c_str());
  // The bomb: a small progressive JPEG, its header made to claim 65000 x 65000.
  auto& bomb = jpegs[jpegs.size() * 2 / 3];
  cv::Mat small = cv::imread(bomb.string());
  std::vector<uint8_t> jpeg;
  if (small.empty() || !cv::imencode(".jpg", small, jpeg, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}) ||
      !claimSize(jpeg, 65000, 65000)) {
    throw std::runtime_error("cannot make the bomb from " + bomb.string());
  }
  writeBytes(bomb, jpeg);
  printf("hostile: %s: a %zu-byte progressive JPEG whose header claims 65000 x 65000 pixels\n",
         (shown / fs::relative(bomb, root)).c_str(), jpeg.size());
}

// One sample: scaled to w x h, the garment in its class's colour on a background of another.
cv::Mat render(std::span<const uint8_t> grey, int label, std::mt19937_64& rng, int w, int h) {
  cv::Mat src(28, 28, CV_8UC1, const_cast<uint8_t*>(grey.data()));
  cv::Mat big;
  cv::resize(src, big, cv::Size(w, h), 0, 0, cv::INTER_CUBIC);
  std::uniform_real_distribution<float> jitter(-30, 30);
  cv::Vec3f fg(60 + 18 * label + jitter(rng), 200 - 15 * label + jitter(rng),
               90 + 9 * ((label * 7) % 10) + jitter(rng));
  cv::Vec3f bg(20 + jitter(rng) / 2 + 20, 40 + jitter(rng) / 2 + 20, 30 + jitter(rng) / 2 + 20);
  cv::Mat out(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      float a = big.at<uint8_t>(y, x) / 255.0f;
      cv::Vec3f v = a * fg + (1 - a) * bg;
      out.at<cv::Vec3b>(y, x) =
          cv::Vec3b(cv::saturate_cast<uint8_t>(v[0]), cv::saturate_cast<uint8_t>(v[1]),
                    cv::saturate_cast<uint8_t>(v[2]));
    }
  }
  return out;
}

// Writes `count` samples of `set` into root/<class>/; returns the files written, in order.
std::vector<std::pair<fs::path, int>> writeSplit(const data::LabeledImages& set, unsigned count,
                                                 const fs::path& root, const Options& o,
                                                 std::mt19937_64& rng) {
  std::vector<std::pair<fs::path, int>> files;
  std::uniform_int_distribution<int> size(int(o.minSize), int(o.maxSize));
  for (auto* c : kClasses) fs::create_directories(root / c);
  for (unsigned i = 0; i < count; ++i) {
    int label = set.labels[i];
    int w = size(rng), h = size(rng);
    auto image = render(set.image(i), label, rng, w, h);
    bool png = o.pngEvery && i % o.pngEvery == o.pngEvery - 1;
    bool grey = !png && o.greyEvery && i % o.greyEvery == o.greyEvery - 1;
    if (grey) cv::cvtColor(image, image, cv::COLOR_BGR2GRAY);
    char name[32];
    snprintf(name, sizeof(name), "%06u.%s", i, png ? "png" : "jpg");
    auto path = root / kClasses[label] / name;
    if (!cv::imwrite(path.string(), image, {cv::IMWRITE_JPEG_QUALITY, 90})) {
      throw std::runtime_error("cannot write " + path.string());
    }
    files.push_back({path, label});
  }
  return files;
}

}  // namespace

int main(int argc, char* argv[]) {
  Options o;
  CLI::App cli("make_images: a JPEG ImageFolder from Fashion-MNIST, of many sizes and colours");
  cli.add_option("out", o.out, "the folder to write (train/, test/, train.csv)")->required();
  cli.add_option("--data-dir", o.dataDir, "Fashion-MNIST IDX files");
  cli.add_option("--samples", o.samples, "training images")->check(CLI::Range(10u, 60000u));
  cli.add_option("--test-samples", o.testSamples, "test images")->check(CLI::Range(0u, 10000u));
  cli.add_option("--min-size", o.minSize, "smallest side")->check(CLI::Range(8u, 4096u));
  cli.add_option("--max-size", o.maxSize, "largest side")->check(CLI::Range(8u, 4096u));
  cli.add_option("--png-every", o.pngEvery, "every Nth file a PNG (0: none)");
  cli.add_option("--grey-every", o.greyEvery, "every Nth file one-channel (0: none)");
  cli.add_option("--corrupt", o.corrupt, "cut this many training JPEGs short");
  cli.add_flag("--hostile", o.hostile,
               "add a README.txt, a Thumbs.db, a JPEG with stray bytes and a decompression bomb");
  cli.add_option("--seed", o.seed);
  CLI11_PARSE(cli, argc, argv);
  if (o.minSize > o.maxSize) {
    fprintf(stderr, "make_images: --min-size %u is larger than --max-size %u\n", o.minSize,
            o.maxSize);
    return 2;
  }
  fs::path out(o.out);
  if (fs::exists(out / "train")) {
    fprintf(stderr, "make_images: %s already exists; remove it to make the dataset again\n",
            (out / "train").c_str());
    return 2;
  }
  try {
    std::mt19937_64 rng(o.seed);
    auto train = data::loadFashionMnist(o.dataDir, data::Split::kTrain);
    auto files = writeSplit(train, o.samples, out / "train.partial", o, rng);
    if (o.testSamples) {
      auto test = data::loadFashionMnist(o.dataDir, data::Split::kTest);
      fs::remove_all(out / "test");
      writeSplit(test, o.testSamples, out / "test", o, rng);
    }
    std::ofstream csv(out / "train.csv");
    csv << "path,label\n";
    for (auto& [path, label] : files) {
      csv << fs::relative(path, out / "train.partial").string().insert(0, "train/") << "," << label
          << "\n";
    }
    unsigned cut = 0;
    for (size_t i = 0; i < files.size() && cut < o.corrupt; i += 97) {
      auto& path = files[(i * 7919) % files.size()].first;
      if (path.extension() != ".jpg") continue;
      auto size = fs::file_size(path);
      fs::resize_file(path, size / 2);
      printf("corrupt: %s cut from %ju to %ju bytes\n",
             (out / "train" / fs::relative(path, out / "train.partial")).c_str(), uintmax_t(size),
             uintmax_t(size / 2));
      ++cut;
    }
    if (o.hostile) addHostile(files, out / "train.partial", out / "train");
    // Complete, or not there: a make_images stopped halfway leaves only train.partial.
    fs::rename(out / "train.partial", out / "train");
    printf(
        "make_images: %s: %u training and %u test images (%u..%u px, PNG every %u, grey every "
        "%u), 10 classes\n",
        out.c_str(), o.samples, o.testSamples, o.minSize, o.maxSize, o.pngEvery, o.greyEvery);
  } catch (const std::exception& e) {
    fprintf(stderr, "make_images: %s\n", e.what());
    return 1;
  }
  return 0;
}
