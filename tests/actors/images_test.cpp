// The data plane for any dataset (troupe/dataset/source.h, troupe/images/transforms.h) on data
// made here: an ImageFolder of JPEGs and PNGs of many sizes, the same as a manifest and as
// WebDataset shards written by GNU tar, a corrupt and a truncated JPEG; specs with typos.

#include <unistd.h>

#include <turbojpeg.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>

#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace fs = std::filesystem;
using troupe::data::SampleError;
using troupe::data::SourceError;
using troupe::images::Pipeline;
using troupe::images::SpecError;

namespace {

struct Dir {
  fs::path path;
  explicit Dir(const std::string& name)
      : path(fs::temp_directory_path() / ("troupe-images-test-" + std::to_string(getpid()) + "-" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Dir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// A picture that is not flat: a gradient with a disc, `w` x `h`, RGB.
cv::Mat picture(int w, int h, int seed) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      m.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t((x * 255) / w), uint8_t((y * 255) / h),
                                        uint8_t((x + y + seed * 40) % 256));
    }
  }
  cv::circle(m, {w / 2, h / 2}, std::min(w, h) / 4, cv::Scalar(30, 200, 90), -1);
  return m;
}

std::vector<uint8_t> encode(const cv::Mat& m, const std::string& ext) {
  std::vector<uint8_t> out;
  REQUIRE(cv::imencode(ext, m, out));
  return out;
}

void write(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::vector<uint8_t> readFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// An ImageFolder: ant (2), cat (3, one in a sub-folder), dog (1 PNG); sizes from 40x30 to 640x480.
void makeFolder(const fs::path& root) {
  write(root / "cat" / "b.jpg", encode(picture(500, 375, 1), ".jpg"));
  write(root / "cat" / "a.jpg", encode(picture(320, 240, 2), ".jpg"));
  write(root / "cat" / "more" / "c.JPG", encode(picture(64, 96, 3), ".jpg"));
  write(root / "ant" / "x.png", encode(picture(40, 30, 4), ".png"));
  write(root / "ant" / "y.jpeg", encode(picture(640, 480, 5), ".jpeg"));
  write(root / "dog" / "d.png", encode(picture(100, 100, 6), ".png"));
  std::ofstream(root / "dog" / ".DS_Store") << "hidden";
}

}  // namespace

TEST_CASE("ImageFolder: classes and files in torchvision's order, targets by class",
          "[images][source]") {
  Dir d("folder");
  makeFolder(d.path);
  auto s = troupe::data::openSource(d.path);
  CHECK(s->kind() == "ImageFolder");
  CHECK(s->classes() == std::vector<std::string>{"ant", "cat", "dog"});
  REQUIRE(s->size() == 6);
  std::vector<std::string> names;
  for (size_t i = 0; i < s->size(); ++i) names.push_back(fs::path(s->nameOf(i)).filename());
  // sorted(os.walk(class)): the class folder's files, then its sub-folders'.
  CHECK(names == std::vector<std::string>{"x.png", "y.jpeg", "a.jpg", "b.jpg", "c.JPG", "d.png"});
  CHECK(s->read(0).target == 0);
  CHECK(s->read(4).target == 1);
  CHECK(s->read(5).target == 2);
  CHECK(s->read(3).bytes == readFile(d.path / "cat" / "b.jpg"));
}

TEST_CASE(
    "ImageFolder: an empty class folder fails at open, a file that is not an image is left "
    "out and counted",
    "[images][source]") {
  Dir d("bad-folder");
  makeFolder(d.path);
  fs::create_directories(d.path / "emu");
  try {
    troupe::data::openSource(d.path);
    FAIL("an empty class folder was accepted");
  } catch (const SourceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("no image in the class folder(s) emu") != std::string::npos);
    CHECK(std::string(e.what()).find(".jpg .jpeg .png") != std::string::npos);
  }
  fs::remove(d.path / "emu");
  // torchvision's ImageFolder leaves out what has no image extension; this says how many.
  std::ofstream(d.path / "cat" / "notes.txt") << "not an image";
  std::ofstream(d.path / "dog" / "Thumbs.db") << "a Windows thumbnail cache";
  auto s = troupe::data::openSource(d.path);
  CHECK(s->size() == 6);
  REQUIRE(s->notes().size() == 1);
  INFO(s->notes()[0]);
  CHECK(s->notes()[0].find("left out 2 file(s) that are not images") != std::string::npos);
  CHECK(s->notes()[0].find("cat/notes.txt") != std::string::npos);
  CHECK(s->notes()[0].find("dog/Thumbs.db") != std::string::npos);
}

TEST_CASE("a manifest, CSV or JSON lines: paths beside it, labels checked at open",
          "[images][source]") {
  Dir d("manifest");
  makeFolder(d.path);
  std::ofstream(d.path / "train.csv") << "path,label\ncat/a.jpg,3\nant/x.png,0\n";
  auto csv = troupe::data::openManifest(d.path / "train.csv");
  CHECK(csv->kind() == "manifest");
  REQUIRE(csv->size() == 2);
  CHECK(csv->read(0).target == 3);
  CHECK(csv->classes().size() == 4);
  CHECK(csv->read(1).bytes == readFile(d.path / "ant" / "x.png"));

  std::ofstream(d.path / "train.jsonl") << R"({"path": "dog/d.png", "label": 1})" << "\n"
                                        << R"({"path": "cat/b.jpg", "label": -2})" << "\n";
  try {
    troupe::data::openManifest(d.path / "train.jsonl");
    FAIL("a label of -2 was accepted");
  } catch (const SourceError& e) {
    INFO(e.what());
    CHECK(std::string(e.what()).find("line 2") != std::string::npos);
    CHECK(std::string(e.what()).find("out of range") != std::string::npos);
  }
  // A missing file is found when its sample is read, and named.
  std::ofstream(d.path / "gone.csv") << "cat/none.jpg,0\n";
  auto gone = troupe::data::openManifest(d.path / "gone.csv");
  CHECK_THROWS_WITH(gone->read(0), Catch::Contains("cat/none.jpg") && Catch::Contains("cannot open"));
}

TEST_CASE("WebDataset shards made by tar: samples by key, labels from .cls and .json, read in "
          "place, and a truncated shard names the member",
          "[images][source]") {
  Dir d("shards");
  auto files = d.path / "files";
  fs::create_directories(files / "deep" / std::string(120, 'n'));  // a name past ustar's 100
  write(files / "s000.jpg", encode(picture(200, 150, 1), ".jpg"));
  std::ofstream(files / "s000.cls") << "4\n";
  write(files / "s001.png", encode(picture(50, 80, 2), ".png"));
  std::ofstream(files / "s001.json") << R"({"label": 2})";
  auto deep = "deep/" + std::string(120, 'n') + "/s002";
  write(files / (deep + ".jpeg"), encode(picture(300, 300, 3), ".jpg"));
  std::ofstream(files / (deep + ".cls")) << "0";
  auto tar = [&](const std::string& format, const std::string& shard) {
    auto cmd = "tar --format=" + format + " -cf " + (d.path / shard).string() + " -C " +
               files.string() + " s000.jpg s000.cls s001.png s001.json " + deep + ".jpeg " + deep + ".cls";
    REQUIRE(std::system(cmd.c_str()) == 0);
  };
  fs::create_directories(d.path / "shards");
  tar("gnu", "shards/a-000.tar");
  tar("posix", "shards/a-001.tar");
  auto s = troupe::data::openSource(d.path / "shards");
  CHECK(s->kind() == "WebDataset");
  REQUIRE(s->size() == 6);
  CHECK(s->read(0).target == 4);
  CHECK(s->read(1).target == 2);
  CHECK(s->read(5).target == 0);
  CHECK(s->read(0).bytes == readFile(files / "s000.jpg"));
  CHECK(s->read(5).bytes == readFile(files / (deep + ".jpeg")));
  CHECK(s->nameOf(3).find("a-001.tar:s000.jpg") != std::string::npos);

  // Cut the second shard inside its last image: the other samples still read; that one names
  // itself.
  auto shard = d.path / "shards" / "a-001.tar";
  auto bytes = readFile(shard);
  auto image = readFile(files / (deep + ".jpeg"));
  auto at = std::search(bytes.begin(), bytes.end(), image.begin(), image.end()) - bytes.begin();
  fs::resize_file(shard, size_t(at) + 100);
  auto cut = troupe::data::openSource(d.path / "shards");
  REQUIRE(cut->size() == 6);
  CHECK(cut->read(3).target == 4);
  CHECK_THROWS_WITH(cut->read(5), Catch::Contains("a-001.tar:" + deep + ".jpeg") &&
                                      Catch::Contains("cut short"));
}

TEST_CASE("decoding: JPEG at 1/2, 1/4 and 1/8 scale, PNG to RGB, a corrupt and a truncated "
          "JPEG named",
          "[images][decode]") {
  auto jpeg = encode(picture(500, 375, 1), ".jpg");
  CHECK(troupe::images::imageSize(jpeg, "x.jpg") == std::pair<int, int>{500, 375});
  for (int d : {1, 2, 4, 8}) {
    auto im = troupe::images::decode(jpeg, "x.jpg", 3, d);
    CHECK(im.width == (500 + d - 1) / d);
    CHECK(im.height == (375 + d - 1) / d);
    CHECK(im.channels == 3);
  }
  auto grey = troupe::images::decode(jpeg, "x.jpg", 1);
  CHECK(grey.channels == 1);
  cv::Mat rgba(30, 20, CV_8UC4, cv::Scalar(10, 20, 30, 255));
  auto png = troupe::images::decode(encode(rgba, ".png"), "x.png", 3);
  CHECK(png.width == 20);
  REQUIRE(png.pixels.size() == 20 * 30 * 3);
  CHECK(int(png.pixels[0]) == 30);  // stored BGRA: red is the third
  CHECK(int(png.pixels[2]) == 10);

  auto truncated = jpeg;
  truncated.resize(jpeg.size() / 2);
  CHECK_THROWS_WITH(troupe::images::decode(truncated, "cut.jpg", 3),
                    Catch::Contains("cut.jpg") && Catch::Contains("truncated"));
  auto corrupt = jpeg;
  for (size_t i = 0; i < 64; ++i) corrupt[corrupt.size() / 2 + i] = 0;
  std::fill(corrupt.begin() + 2, corrupt.begin() + 200, 0x11);
  CHECK_THROWS_AS(troupe::images::decode(corrupt, "bad.jpg", 3), SampleError);
  std::vector<uint8_t> text = {'h', 'e', 'l', 'l', 'o'};
  CHECK_THROWS_WITH(troupe::images::decode(text, "t.png", 3), Catch::Contains("t.png"));
}

// decode_png.cpp reads PNG through libpng with OpenCV's transforms: its pixels are cv::imdecode's
// for every kind cv::imencode writes (8 and 16 bits, grey, RGB, RGBA, 1-bit), to grey and to RGB,
// but 16-bit grey, which is PIL's (each sample clipped to 255, as convert("RGB") of mode "I").
TEST_CASE("decoding: a PNG through libpng gives OpenCV's pixels for every kind, a cut one named",
          "[images][decode]") {
  cv::Mat rgb = picture(37, 23, 3), grey, rgba, rgb16, grey16, bilevel;
  cv::cvtColor(rgb, grey, cv::COLOR_BGR2GRAY);
  cv::cvtColor(rgb, rgba, cv::COLOR_BGR2BGRA);
  for (int y = 0; y < rgba.rows; ++y) rgba.at<cv::Vec4b>(y, y % rgba.cols)[3] = uint8_t(y * 9);
  rgb.convertTo(rgb16, CV_16UC3, 257.0, 3);
  grey.convertTo(grey16, CV_16UC1, 2.0);  // 0..510: half above 255, where PIL clips
  cv::threshold(grey, bilevel, 128, 255, cv::THRESH_BINARY);
  struct Kind {
    const char* name;
    cv::Mat image;
    std::vector<int> params;
  };
  for (const auto& kind : {Kind{"8-bit RGB", rgb, {}}, Kind{"8-bit grey", grey, {}},
                           Kind{"RGBA", rgba, {}}, Kind{"16-bit RGB", rgb16, {}},
                           Kind{"16-bit grey", grey16, {}},
                           Kind{"1-bit", bilevel, {cv::IMWRITE_PNG_BILEVEL, 1}}}) {
    std::vector<uint8_t> bytes;
    REQUIRE(cv::imencode(".png", kind.image, bytes, kind.params));
    for (int channels : {1, 3}) {
      INFO(kind.name << ", decoded to " << channels << " channels");
      cv::Mat want = cv::imdecode(bytes, channels == 3 ? cv::IMREAD_COLOR : cv::IMREAD_GRAYSCALE);
      if (channels == 3) cv::cvtColor(want, want, cv::COLOR_BGR2RGB);
      if (std::string(kind.name) == "16-bit grey") {
        cv::Mat clipped = cv::min(grey16, 255);
        clipped.convertTo(want, CV_8U);
        CHECK(cv::countNonZero(want != 255) > 0);  // not all clipped: a test that can fail
        if (channels == 3) cv::cvtColor(want, want, cv::COLOR_GRAY2RGB);
      }
      auto got = troupe::images::decode(bytes, "k.png", channels);
      REQUIRE(got.width == want.cols);
      REQUIRE(got.height == want.rows);
      REQUIRE(got.channels == channels);
      REQUIRE(want.isContinuous());
      CHECK(std::equal(got.pixels.begin(), got.pixels.end(), want.data));
    }
    auto cut = bytes;
    cut.resize(bytes.size() * 2 / 3);
    CHECK_THROWS_WITH(troupe::images::decode(cut, "cut.png", 3),
                      Catch::Contains("cut.png") && Catch::Contains("PNG"));
  }
}

TEST_CASE("transform specs: torchvision's names and arguments, and a typo names what is allowed",
          "[images][spec]") {
  auto p = Pipeline::parse("RandomResizedCrop(224),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),"
                           "Normalize(imagenet)");
  auto shape = p.outputShape(3);
  CHECK(shape.channels == 3);
  CHECK(shape.height == 224);
  CHECK(shape.width == 224);
  CHECK(shape.channelsFirst);
  CHECK(p.dtype() == troupe::images::Dtype::kFloat32);
  CHECK(p.describe().find("RandomResizedCrop(size=(224, 224), scale=(0.08, 1), ratio=(0.75,") == 0);

  auto bytes = Pipeline::parse("Resize(256), CenterCrop(size=(200, 100))");
  CHECK(bytes.dtype() == troupe::images::Dtype::kUint8);
  CHECK_FALSE(bytes.outputShape(3).channelsFirst);
  CHECK(Pipeline::parse("CenterCrop(32),ToTensor(),ToDtype(float16),ChannelsLast()").dtype() ==
        troupe::images::Dtype::kFloat16);

  CHECK_THROWS_WITH(Pipeline::parse("RandomResizeCrop(224)"),
                    Catch::Contains("unknown transform 'RandomResizeCrop'") &&
                        Catch::Contains("did you mean RandomResizedCrop?"));
  CHECK_THROWS_WITH(Pipeline::parse("RandomHorizontalFlip(p=1.5)"),
                    Catch::Contains("p=1.5") && Catch::Contains("from 0 to 1"));
  CHECK_THROWS_WITH(Pipeline::parse("CenterCrop(sz=3)"),
                    Catch::Contains("no argument 'sz'") && Catch::Contains("size"));
  CHECK_THROWS_WITH(Pipeline::parse("GaussianBlur(4)"), Catch::Contains("odd"));
  CHECK_THROWS_WITH(Pipeline::parse("Normalize(imagenet),Resize(3)"),
                    Catch::Contains("after ToTensor/Normalize"));
  CHECK_THROWS_WITH(Pipeline::parse("Resize(256)").outputShape(3),
                    Catch::Contains("do not fix the output's size"));
  CHECK_THROWS_WITH(Pipeline::parse("CenterCrop(28),Normalize(imagenet)").outputShape(1),
                    Catch::Contains("3 mean(s) for images of 1 channel"));
  CHECK_THROWS_AS(Pipeline::parse("Resize(256"), SpecError);
  CHECK_THROWS_AS(Pipeline::parse(""), SpecError);
}

TEST_CASE("transforms as torchvision's where they are deterministic: Resize's shorter side, "
          "CenterCrop, a flip, Normalize",
          "[images][transforms]") {
  troupe::images::Image im;
  im.height = 375;
  im.width = 500;
  im.channels = 3;
  cv::Mat pic = picture(500, 375, 7);
  im.pixels.assign(pic.data, pic.data + pic.total() * 3);
  // torchvision: Resize(256) on 500x375 gives 341x256 (int(256 * 500 / 375)).
  auto r = Pipeline::parse("Resize(256)").transform(im, 1);
  CHECK(r.width == 341);
  CHECK(r.height == 256);
  // CenterCrop: top = round((375 - 100) / 2) = 138 (137.5 rounds to even), left = 200.
  auto c = Pipeline::parse("CenterCrop((100, 100))").transform(im, 1);
  REQUIRE(c.height == 100);
  CHECK(std::equal(c.pixels.begin(), c.pixels.begin() + 300, pic.ptr<uint8_t>(138) + 200 * 3));
  auto f = Pipeline::parse("CenterCrop((100, 100)),RandomHorizontalFlip(p=1)").transform(im, 1);
  CHECK(std::equal(f.pixels.begin(), f.pixels.begin() + 3, pic.ptr<uint8_t>(138) + 299 * 3));
  // Normalize: (x / 255 - mean) / std, channels first.
  auto n = Pipeline::parse("CenterCrop((100, 100)),Normalize((0.5, 0.5, 0.5), (0.25, 0.25, 0.25))");
  std::vector<uint8_t> out(3 * 100 * 100 * 4);
  cv::Mat rgb;
  cv::cvtColor(pic, rgb, cv::COLOR_BGR2RGB);  // encode() wrote BGR; as decoded, RGB
  troupe::data::Encoded sample{encode(pic, ".png"), 0, "p.png"};
  n.run(sample, troupe::data::Encoding::kFile, {}, 1, out);
  float v[2];
  memcpy(&v[0], out.data(), 4);                      // channel 0 (R), pixel (0, 0)
  memcpy(&v[1], out.data() + 4 * 100 * 100, 4);      // channel 1 (G)
  CHECK(v[0] == Approx((rgb.at<cv::Vec3b>(138, 200)[0] / 255.0 - 0.5) / 0.25).margin(1e-5));
  CHECK(v[1] == Approx((rgb.at<cv::Vec3b>(138, 200)[1] / 255.0 - 0.5) / 0.25).margin(1e-5));
}

TEST_CASE("the same seed gives the same pixels, and a large JPEG is decoded at a DCT scale",
          "[images][transforms]") {
  auto p = Pipeline::parse("RandomResizedCrop(64),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4,"
                           "0.1),RandomAffine(10, translate=(0.1, 0.1), scale=(0.9, 1.1)),"
                           "GaussianBlur(5),Normalize(imagenet)");
  troupe::data::Encoded sample{encode(picture(640, 480, 3), ".jpg"), 1, "big.jpg"};
  auto shape = p.outputShape(3);
  std::vector<uint8_t> a(shape.elements() * 4), b(a.size()), c(a.size());
  p.run(sample, troupe::data::Encoding::kFile, {}, 42, a);
  p.run(sample, troupe::data::Encoding::kFile, {}, 42, b);
  p.run(sample, troupe::data::Encoding::kFile, {}, 43, c);
  CHECK(a == b);
  CHECK(a != c);
  // 64x64 from a crop of at least 8% of 640x480: a scale above 1 for most seeds.
  int scaled = 0;
  for (uint64_t seed = 0; seed < 20; ++seed) scaled += p.decodeScale(640, 480, seed) > 1;
  CHECK(scaled >= 10);
  // Raw grey pixels (Fashion-MNIST's IDX) through the same pipeline shape rules.
  auto grey = Pipeline::parse("RandomResizedCrop(28, scale=(0.6, 1.0)),Normalize((0.286,), (0.353,))");
  std::vector<uint8_t> px(28 * 28, 100), out(28 * 28 * 4);
  grey.run({px, 0, "idx[0]"}, troupe::data::Encoding::kRawGrey8, {28, 28}, 5, out);
  float first;
  memcpy(&first, out.data(), 4);
  CHECK(first == Approx((100 / 255.0 - 0.286) / 0.353).margin(1e-4));
}

// The DCT-scaled decode is the default path for every large JPEG: it must give the pixels a full
// decode would, within 2 levels of 255 on average (libjpeg-turbo's scaled IDCT against a full
// decode and the area resize the crop then does).
TEST_CASE("a JPEG decoded at a DCT scale gives a full decode's pixels, within 2 levels on average",
          "[images][transforms]") {
  auto p = Pipeline::parse("RandomResizedCrop(64)");
  auto full = Pipeline::parse("RandomResizedCrop(64)");
  full.setDecodeScaling(false);
  troupe::data::Encoded sample{encode(picture(1200, 900, 5), ".jpg"), 0, "large.jpg"};
  std::vector<uint8_t> a(p.outputShape(3).elements()), b(a.size());
  int scaled = 0;
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    if (p.decodeScale(1200, 900, seed) == 1) continue;
    ++scaled;
    p.run(sample, troupe::data::Encoding::kFile, {}, seed, a);
    full.run(sample, troupe::data::Encoding::kFile, {}, seed, b);
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += std::abs(int(a[i]) - int(b[i]));
    INFO("seed " << seed << ": decoded at 1/" << p.decodeScale(1200, 900, seed));
    CHECK(sum / a.size() <= 2.0);
    CHECK(a != b);  // another path indeed: the comparison is not of one decode with itself
  }
  CHECK(scaled >= 10);
}

// A first RandomResizedCrop or CenterCrop decodes only its box's part of a JPEG (libjpeg's crop
// and skip, the resampler's margin around a DCT-scaled box): the same bytes out as a whole decode,
// for every kind of JPEG (chroma subsampling, grey, progressive, sizes off the 8- and 16-pixel
// blocks).
TEST_CASE("a JPEG decoded only in its crop's part gives the whole decode's pixels exactly",
          "[images][transforms]") {
  struct Kind {
    std::string name;
    cv::Mat image;
    int subsampling;   // TurboJPEG's TJSAMP_*
    bool progressive;  // (OpenCV's encoder, 4:2:0)
  };
  cv::Mat grey;
  cv::cvtColor(picture(517, 389, 2), grey, cv::COLOR_RGB2GRAY);
  std::vector<Kind> kinds = {
      {"4:2:0", picture(517, 389, 1), TJSAMP_420, false},
      {"4:4:4", picture(517, 389, 1), TJSAMP_444, false},
      {"4:2:2", picture(517, 389, 1), TJSAMP_422, false},
      {"4:4:0", picture(517, 389, 1), TJSAMP_440, false},
      {"grey", grey, TJSAMP_GRAY, false},
      {"progressive", picture(517, 389, 3), TJSAMP_420, true},
      {"1600x1200 (DCT-scaled)", picture(1600, 1200, 4), TJSAMP_420, false},
  };
  for (auto& kind : kinds) {
    std::vector<uint8_t> bytes;
    if (kind.progressive) {
      REQUIRE(cv::imencode(".jpg", kind.image, bytes, {cv::IMWRITE_JPEG_PROGRESSIVE, 1}));
    } else {
      tjhandle tj = tjInitCompress();
      unsigned char* jpeg = nullptr;
      unsigned long size = 0;
      auto& m = kind.image;
      REQUIRE(tjCompress2(tj, m.data, m.cols, 0, m.rows, m.channels() == 3 ? TJPF_RGB : TJPF_GRAY,
                          &jpeg, &size, kind.subsampling, 90, 0) == 0);
      bytes.assign(jpeg, jpeg + size);
      tjFree(jpeg);
      tjDestroy(tj);
    }
    troupe::data::Encoded sample{bytes, 0, kind.name + ".jpg"};
    for (auto spec :
         {"RandomResizedCrop(64)", "RandomResizedCrop(224),Normalize(imagenet)",
          "CenterCrop((101, 77)),Resize((32, 24))", "CenterCrop(224),Normalize(imagenet)"}) {
      auto part = Pipeline::parse(spec), whole = Pipeline::parse(spec);
      whole.setDecodeRegions(false);
      std::vector<uint8_t> a(part.outputShape(3).elements() *
                             troupe::images::dtypeBytes(part.dtype())),
          b(a.size());
      troupe::images::StageTimes times;
      for (uint64_t seed = 0; seed < 25; ++seed) {
        INFO(kind.name << ", " << spec << ", seed " << seed);
        part.run(sample, troupe::data::Encoding::kFile, {}, seed, a, nullptr, &times);
        whole.run(sample, troupe::data::Encoding::kFile, {}, seed, b);
        size_t differ = 0;
        for (size_t i = 0; i < a.size(); ++i) differ += a[i] != b[i];
        CHECK(differ == 0);  // bytes that differ
      }
      CHECK(times.partDecodes == 25);  // the part's path indeed
    }
  }
  // Without its end marker a JPEG may be cut: decoded whole, so that a cut is still a bad sample.
  auto bytes = encode(picture(517, 389, 1), ".jpg");
  bytes.push_back(0);
  auto p = Pipeline::parse("RandomResizedCrop(64)");
  std::vector<uint8_t> out(p.outputShape(3).elements());
  troupe::images::StageTimes times;
  p.run({bytes, 0, "trailing.jpg"}, troupe::data::Encoding::kFile, {}, 1, out, nullptr, &times);
  CHECK(times.partDecodes == 0);
}

// A last ColorJitter before a float32 CHW output is fused with the output's writing (color.cpp's
// jitterNormalize: at most two passes): the same floats as the blends on uint8 then Normalize,
// for every order of the three blends, odd widths (a row's last pixels one by one) too.
TEST_CASE("a last ColorJitter fused with Normalize gives the same floats as the two apart",
          "[images][transforms]") {
  troupe::data::Encoded sample{encode(picture(517, 389, 3), ".jpg"), 0, "jitter.jpg"};
  for (auto size : {"(64, 64)", "(37, 61)"}) {
    for (auto jitter :
         {"ColorJitter(0.4, 0.4, 0.4)", "ColorJitter(brightness=0.5)",
          "ColorJitter(contrast=0.6, saturation=0.9)", "ColorJitter(0.4, 0.4, 0.4, 0.1)"}) {
      std::string crop = std::string("RandomResizedCrop(") + size + "),RandomHorizontalFlip(),";
      auto fused = Pipeline::parse(crop + jitter + ",Normalize(imagenet)");
      auto apart = Pipeline::parse(crop + jitter);  // uint8, its blends done in place
      auto shape = fused.outputShape(3);
      std::vector<uint8_t> a(shape.elements() * 4), pixels(shape.elements());
      const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
      for (uint64_t seed = 0; seed < 30; ++seed) {
        INFO(size << " " << jitter << ", seed " << seed);
        fused.run(sample, troupe::data::Encoding::kFile, {}, seed, a);
        apart.run(sample, troupe::data::Encoding::kFile, {}, seed, pixels);
        size_t plane = size_t(shape.height) * shape.width, differ = 0;
        for (size_t p = 0; p < plane; ++p) {
          for (int c = 0; c < 3; ++c) {
            float want = float(pixels[p * 3 + c]) * (1.f / (255.f * sd[c])) + (-mean[c] / sd[c]);
            float got;
            memcpy(&got, a.data() + 4 * (c * plane + p), 4);
            differ += got != want;
          }
        }
        CHECK(differ == 0);
      }
    }
  }
}
