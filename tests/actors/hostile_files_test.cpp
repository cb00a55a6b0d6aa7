// What a real collection holds, against the data plane (issue 49): decompression bombs, JPEGs
// libjpeg warns about, symlink loops, a manifest beside class folders, tar shards with crafted
// sizes or cut short. Each is a named sample error or a clear error at open; none is the
// process's end. The files are made here: a bomb is a small JPEG or PNG whose header is made to
// claim 65000 x 65000 pixels.

#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include "temp_dir.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"

namespace fs = std::filesystem;
using troupe::data::SampleError;
using troupe::data::SourceError;
using troupe::images::Pipeline;

namespace {

// A scratch folder (tests/support/temp_dir.h), `path` its own.
struct Dir {
  troupe::testing::TempDir dir;
  fs::path path{dir.path()};
  explicit Dir(const std::string& name) : dir("troupe-hostile-" + name) {}
};

cv::Mat picture(int w, int h) {
  cv::Mat m(h, w, CV_8UC3);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x)
      m.at<cv::Vec3b>(y, x) = cv::Vec3b(uint8_t(x * 7), uint8_t(y * 5), 90);
  }
  return m;
}

std::vector<uint8_t> encode(const cv::Mat& m, const std::string& ext,
                            std::vector<int> params = {}) {
  std::vector<uint8_t> out;
  REQUIRE(cv::imencode(ext, m, out, params));
  return out;
}

void write(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

// A JPEG's start-of-frame (SOF0..SOF2) made to claim w x h.
std::vector<uint8_t> claimJpeg(std::vector<uint8_t> jpeg, uint16_t w, uint16_t h) {
  for (size_t i = 2; i + 9 < jpeg.size(); ++i) {
    if (jpeg[i] == 0xFF && jpeg[i + 1] >= 0xC0 && jpeg[i + 1] <= 0xC2) {
      jpeg[i + 5] = uint8_t(h >> 8), jpeg[i + 6] = uint8_t(h);
      jpeg[i + 7] = uint8_t(w >> 8), jpeg[i + 8] = uint8_t(w);
      return jpeg;
    }
  }
  FAIL("no start-of-frame marker");
  return jpeg;
}

// A PNG's IHDR made to claim w x h, its CRC made right (libpng checks it).
std::vector<uint8_t> claimPng(std::vector<uint8_t> png, uint32_t w, uint32_t h) {
  for (int k = 0; k < 4; ++k) {
    png[16 + k] = uint8_t(w >> (24 - 8 * k));
    png[20 + k] = uint8_t(h >> (24 - 8 * k));
  }
  uint32_t crc = uint32_t(crc32(0, png.data() + 12, 17));  // "IHDR" and its 13 bytes
  for (int k = 0; k < 4; ++k) png[29 + k] = uint8_t(crc >> (24 - 8 * k));
  return png;
}

// A ustar header for a member `name` of `size` bytes (raw: the 12-byte size field as given).
std::string tarHeader(const std::string& name, char type, const std::string& rawSize) {
  std::string h(512, '\0');
  memcpy(&h[0], name.data(), std::min<size_t>(name.size(), 99));
  memcpy(&h[100], "0000644", 7);
  memcpy(&h[124], rawSize.data(), std::min<size_t>(rawSize.size(), 12));
  h[156] = type;
  memcpy(&h[257], "ustar", 6);
  memcpy(&h[263], "00", 2);
  return h;
}
std::string octal(uint64_t n) {
  char b[13];
  snprintf(b, sizeof b, "%011llo", (unsigned long long)n);
  return b;
}
std::string base256(uint64_t n) {  // tar's size field for 8 GiB and more
  std::string f(12, '\0');
  f[0] = '\x80';
  for (int k = 0; k < 8; ++k) f[4 + k] = char(uint8_t(n >> (56 - 8 * k)));
  return f;
}
std::string padded(std::string s) {
  return s + std::string((512 - s.size() % 512) % 512, '\0');
}

}  // namespace

TEST_CASE(
    "a header claiming more pixels than the limit is refused before decoding, naming the "
    "file",
    "[images][decode][hostile]") {
  auto jpeg = encode(picture(64, 48), ".jpg");
  auto progressive = encode(picture(64, 48), ".jpg", {cv::IMWRITE_JPEG_PROGRESSIVE, 1});
  auto png = encode(picture(64, 48), ".png");
  struct Bomb {
    const char* name;
    std::vector<uint8_t> bytes;
  };
  for (auto& bomb : {Bomb{"bomb.jpg", claimJpeg(jpeg, 65000, 65000)},
                     Bomb{"progressive-bomb.jpg", claimJpeg(progressive, 65000, 65000)},
                     Bomb{"bomb.png", claimPng(png, 65000, 65000)}}) {
    INFO(bomb.name << ", " << bomb.bytes.size() << " bytes");
    CHECK(bomb.bytes.size() < 8192);
    // (Matchers combined with && hold their parts by reference: each written out in full.)
    CHECK_THROWS_WITH(troupe::images::imageSize(bomb.bytes, bomb.name),
                      Catch::Contains(bomb.name) && Catch::Contains("65000 x 65000") &&
                          Catch::Contains("limit of 178956970") &&
                          Catch::Contains("--max-image-pixels"));
    CHECK_THROWS_WITH(troupe::images::decode(bomb.bytes, bomb.name, 3),
                      Catch::Contains(bomb.name) && Catch::Contains("65000 x 65000"));
    // Through a pipeline, with the DCT-scaled decode (RandomResizedCrop first) and without.
    for (auto spec : {"RandomResizedCrop(32)", "CenterCrop(32),Resize((16, 16))"}) {
      auto p = Pipeline::parse(spec);
      std::vector<uint8_t> out(p.outputShape(3).elements());
      troupe::data::Encoded sample{bomb.bytes, 0, bomb.name};
      CHECK_THROWS_AS(p.run(sample, troupe::data::Encoding::kFile, {}, 1, out), SampleError);
    }
  }
  // The limit is the caller's: below an image's pixels it refuses it; 0 is none.
  auto p = Pipeline::parse("Resize(16),CenterCrop(16)");
  std::vector<uint8_t> out(p.outputShape(3).elements());
  troupe::data::Encoded sample{jpeg, 0, "small.jpg"};
  p.setMaxPixels(64 * 48 - 1);
  CHECK_THROWS_WITH(p.run(sample, troupe::data::Encoding::kFile, {}, 1, out),
                    Catch::Contains("64 x 48 = 3072 pixels"));
  p.setMaxPixels(64 * 48);
  CHECK_NOTHROW(p.run(sample, troupe::data::Encoding::kFile, {}, 1, out));
  p.setMaxPixels(0);
  CHECK_NOTHROW(p.run(sample, troupe::data::Encoding::kFile, {}, 1, out));
}

namespace {

// A TIFF's first IFD made to claim w x h (ImageWidth 256, ImageLength 257, SHORT or LONG).
std::vector<uint8_t> claimTiff(std::vector<uint8_t> tiff, uint32_t w, uint32_t h) {
  bool big = tiff[0] == 'M';
  auto get = [&](size_t at, int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) v |= uint32_t(tiff[at + k]) << (8 * (big ? n - 1 - k : k));
    return v;
  };
  auto put = [&](size_t at, int n, uint32_t v) {
    for (int k = 0; k < n; ++k) tiff[at + k] = uint8_t(v >> (8 * (big ? n - 1 - k : k)));
  };
  size_t ifd = get(4, 4);
  int found = 0;
  for (uint32_t k = 0; k < get(ifd, 2); ++k) {
    size_t e = ifd + 2 + 12 * k;
    uint32_t tag = get(e, 2), type = get(e + 2, 2);
    if (tag != 256 && tag != 257) continue;
    REQUIRE((type == 3 || type == 4));
    put(e + 8, type == 3 ? 2 : 4, tag == 256 ? w : h);
    ++found;
  }
  REQUIRE(found == 2);
  return tiff;
}

// A WebP's size fields (VP8X's canvas, VP8L's or VP8's frame) made to claim w x h (< 16384).
std::vector<uint8_t> claimWebp(std::vector<uint8_t> webp, uint32_t w, uint32_t h) {
  std::string chunk(webp.begin() + 12, webp.begin() + 16);
  if (chunk == "VP8X") {
    for (int k = 0; k < 3; ++k) {
      webp[24 + k] = uint8_t((w - 1) >> (8 * k));
      webp[27 + k] = uint8_t((h - 1) >> (8 * k));
    }
  } else if (chunk == "VP8L") {
    uint32_t bits = uint32_t(webp[21]) | uint32_t(webp[22]) << 8 | uint32_t(webp[23]) << 16 |
                    uint32_t(webp[24]) << 24;
    bits = (bits & ~0xfffffffu) | (w - 1) | (h - 1) << 14;
    for (int k = 0; k < 4; ++k) webp[21 + k] = uint8_t(bits >> (8 * k));
  } else {
    REQUIRE(chunk == "VP8 ");
    webp[26] = uint8_t(w), webp[27] = uint8_t(webp[27] & 0xc0) | uint8_t(w >> 8);
    webp[28] = uint8_t(h), webp[29] = uint8_t(webp[29] & 0xc0) | uint8_t(h >> 8);
  }
  return webp;
}

}  // namespace

TEST_CASE("every format's header is read for its size: the pixel limit holds for BMP, PNM, TIFF "
          "and WebP before their decoders allocate, and a real file is sized without decoding",
          "[images][decode][hostile]") {
  auto m = picture(64, 48);
  cv::Mat grey;
  cv::cvtColor(m, grey, cv::COLOR_BGR2GRAY);
  struct File {
    std::string name;
    std::vector<uint8_t> bytes, bomb;
  };
  std::vector<File> files;
  auto bmp = encode(m, ".bmp");
  auto bmpBomb = bmp;
  for (int k = 0; k < 4; ++k) {
    bmpBomb[18 + k] = uint8_t(20000u >> (8 * k));
    bmpBomb[22 + k] = uint8_t(20000u >> (8 * k));
  }
  files.push_back({"a.bmp", bmp, bmpBomb});
  for (auto [ext, img] : {std::pair{".ppm", m}, std::pair{".pgm", grey}}) {
    auto pnm = encode(img, ext);
    // The header's numbers rewritten: "P6\n# a comment\n20000 20000\n255\n", the pixels after.
    std::string header = std::string(ext == std::string(".ppm") ? "P6" : "P5") +
                         "\n# made by a test\n20000  20000\n255\n";
    size_t body = pnm.size() - size_t(img.total() * img.channels());
    std::vector<uint8_t> bomb(header.begin(), header.end());
    bomb.insert(bomb.end(), pnm.begin() + body, pnm.end());
    files.push_back({std::string("a") + ext, pnm, bomb});
  }
  auto tiff = encode(m, ".tiff");
  files.push_back({"a.tiff", tiff, claimTiff(tiff, 20000, 20000)});
  auto lossy = encode(m, ".webp", {cv::IMWRITE_WEBP_QUALITY, 80});
  auto lossless = encode(m, ".webp", {cv::IMWRITE_WEBP_QUALITY, 101});
  files.push_back({"lossy.webp", lossy, claimWebp(lossy, 16383, 16383)});
  files.push_back({"lossless.webp", lossless, claimWebp(lossless, 16383, 16383)});
  for (auto& f : files) {
    INFO(f.name << ", " << f.bytes.size() << " bytes");
    CHECK(troupe::images::imageSize(f.bytes, f.name) == std::pair<int, int>{64, 48});
    auto claim = f.name.find("webp") != std::string::npos ? "16383 x 16383" : "20000 x 20000";
    CHECK_THROWS_WITH(troupe::images::imageSize(f.bomb, f.name),
                      Catch::Contains(f.name) && Catch::Contains(claim) &&
                          Catch::Contains("limit of 178956970"));
    CHECK_THROWS_WITH(troupe::images::decode(f.bomb, f.name, 3),
                      Catch::Contains(f.name) && Catch::Contains(claim));
    auto p = Pipeline::parse("Resize(16),CenterCrop(16)");
    std::vector<uint8_t> out(p.outputShape(3).elements());
    troupe::data::Encoded sample{f.bomb, 0, f.name};
    CHECK_THROWS_WITH(p.run(sample, troupe::data::Encoding::kFile, {}, 1, out),
                      Catch::Contains(claim));
    troupe::data::Encoded real{f.bytes, 0, f.name};
    CHECK_NOTHROW(p.run(real, troupe::data::Encoding::kFile, {}, 1, out));
  }
}

TEST_CASE("a file larger than one sample's limit is refused before it is read, naming its size",
          "[images][decode][hostile]") {
  Dir d("huge-file");
  auto path = d.path / "c" / "huge.jpg";
  write(path, encode(picture(16, 16), ".jpg"));
  fs::resize_file(path, troupe::data::kMaxSampleFileBytes + 1);  // sparse: nothing written
  auto source = troupe::data::openSource(d.path);
  CHECK_THROWS_WITH(source->read(0), Catch::Contains("huge.jpg") &&
                                         Catch::Contains(std::to_string(
                                             troupe::data::kMaxSampleFileBytes + 1)) &&
                                         Catch::Contains("more than troupe reads"));
}

TEST_CASE("a JPEG's first bytes and then garbage are a named sample error, also after a JPEG "
          "libjpeg warned about on the same thread",
          "[images][decode][hostile]") {
  // The conformance suite's corrupt file (tests/conformance/script.py): SOI, APP0, then text.
  // TurboJPEG read its size as 0 x 0 and, its handle still holding the warning of the decode
  // before, called refusing it a warning: the pipeline resized an empty image and the process
  // died of SIGSEGV (every data instance of a job, one after the other).
  std::string text = "\xff\xd8\xff\xe0 not a JPEG";
  std::vector<uint8_t> garbage(text.begin(), text.end());
  auto jpeg = encode(picture(40, 30), ".jpg");
  auto stray = jpeg;
  stray.insert(stray.end() - 2, 8, 0x00);  // a warning: extraneous bytes before marker 0xd9
  for (auto spec : {"RandomResizedCrop(16)", "Resize((16, 16))"}) {
    INFO(spec);
    auto p = Pipeline::parse(spec);
    std::vector<uint8_t> out(p.outputShape(3).elements());
    for (auto& before : {jpeg, stray}) {
      troupe::data::Encoded good{before, 0, "good.jpg"};
      p.run(good, troupe::data::Encoding::kFile, {}, 1, out);
      troupe::data::Encoded bad{garbage, 0, "garbage.jpg"};
      CHECK_THROWS_WITH(p.run(bad, troupe::data::Encoding::kFile, {}, 7, out),
                        Catch::Contains("garbage.jpg") && Catch::Contains("damaged JPEG header"));
    }
  }
  CHECK_THROWS_WITH(troupe::images::imageSize(garbage, "garbage.jpg"),
                    Catch::Contains("garbage.jpg"));
}

TEST_CASE("a JPEG libjpeg warns about is decoded as PIL decodes it, one that ends early is not",
          "[images][decode][hostile]") {
  auto jpeg = encode(picture(64, 48), ".jpg");
  auto stray = jpeg;
  stray.insert(stray.end() - 2, 8, 0x00);  // "N extraneous bytes before marker 0xd9"
  std::string none, warning;
  auto clean =
      troupe::images::decode(jpeg, "clean.jpg", 3, 1, troupe::images::kMaxImagePixels, &none);
  auto warned =
      troupe::images::decode(stray, "stray.jpg", 3, 1, troupe::images::kMaxImagePixels, &warning);
  CHECK(warned.pixels == clean.pixels);
  CHECK(none.empty());
  CHECK(warning.find("extraneous bytes before marker 0xd9") != std::string::npos);
  auto cut = jpeg;
  cut.resize(jpeg.size() * 2 / 3);
  CHECK_THROWS_WITH(troupe::images::decode(cut, "cut.jpg", 3),
                    Catch::Contains("cut.jpg") && Catch::Contains("Premature end"));
}

TEST_CASE(
    "ImageFolder: a symlink loop is an error at open naming it, a folder linked twice is "
    "read twice",
    "[images][source][hostile]") {
  Dir d("loops");
  write(d.path / "cat" / "a.jpg", encode(picture(20, 20), ".jpg"));
  write(d.path / "dog" / "b.jpg", encode(picture(20, 20), ".jpg"));
  write(d.path / "shared" / "c.jpg", encode(picture(20, 20), ".jpg"));
  // Not a loop: the same folder in two classes (os.walk(followlinks=True) reads it twice).
  // Classes cat (a, more/c), dog (b, more/c) and shared (c).
  fs::create_directory_symlink(d.path / "shared", d.path / "cat" / "more");
  fs::create_directory_symlink(d.path / "shared", d.path / "dog" / "more");
  CHECK(troupe::data::openSource(d.path)->size() == 5);
  struct Loop {
    const char* what;
    fs::path link, to;
  };
  for (auto& loop : {Loop{"to its own class folder", d.path / "cat" / "up", d.path / "cat"},
                     Loop{"to the dataset's root", d.path / "dog" / "root", d.path},
                     Loop{"to itself", d.path / "cat" / "self", d.path / "cat" / "self"},
                     Loop{"through another link", d.path / "shared" / "back", d.path / "cat"}}) {
    INFO("a symlink loop " << loop.what << ": " << loop.link);
    fs::create_directory_symlink(loop.to, loop.link);
    try {
      auto s = troupe::data::openSource(d.path);
      FAIL("opened with " << s->size() << " samples");
    } catch (const SourceError& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find("symlink loop") != std::string::npos);
    }
    fs::remove(loop.link);
  }
}

TEST_CASE("a manifest beside class folders is an error naming both, not silently ignored",
          "[images][source][hostile]") {
  Dir d("ambiguous");
  write(d.path / "cat" / "a.jpg", encode(picture(20, 20), ".jpg"));
  std::ofstream(d.path / "train.csv") << "path,label\ncat/a.jpg,0\n";
  CHECK_THROWS_WITH(troupe::data::openSource(d.path),
                    Catch::Contains("class folders") && Catch::Contains("train.csv") &&
                        Catch::Contains("give the manifest's own path"));
  CHECK(troupe::data::openSource(d.path / "train.csv")->kind() == "manifest");
}

TEST_CASE(
    "WebDataset: crafted tar sizes are refused or end the index, never allocated or looped "
    "on, and a cut shard says what it lost",
    "[images][source][hostile]") {
  Dir d("tar");
  auto jpeg = encode(picture(30, 30), ".jpg");
  std::string image(jpeg.begin(), jpeg.end());
  auto member = [&](const std::string& name, const std::string& bytes) {
    return tarHeader(name, '0', octal(bytes.size())) + padded(bytes);
  };
  std::string good = member("s0.jpg", image) + member("s0.cls", "1") + member("s1.jpg", image) +
                     member("s1.cls", "0");
  std::string end(1024, '\0');
  auto shard = [&](const std::string& name, const std::string& bytes) {
    auto p = d.path / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  };
  SECTION("a long-name header claiming 1 TiB: refused at open, nothing allocated") {
    auto p =
        shard("longname.tar", tarHeader("././@LongLink", 'L', base256(1ull << 40)) + good + end);
    CHECK_THROWS_WITH(troupe::data::openSource(p),
                      Catch::Contains("long-name header of 1099511627776 bytes") &&
                          Catch::Contains("past the shard's end"));
  }
  SECTION("a pax header of 2 MiB inside the file: refused") {
    auto p = shard("pax.tar",
                   tarHeader("pax", 'x', octal(2 << 20)) + std::string(2 << 20, 'x') + good + end);
    CHECK_THROWS_WITH(troupe::data::openSource(p), Catch::Contains("more than 1 MiB"));
  }
  SECTION("a member whose base-256 size wraps the offset: the index ends there") {
    std::string huge(12, '\xff');
    huge[0] = '\x80';
    auto p = shard("wrap.tar", good + tarHeader("s2.jpg", '0', huge) + image + end);
    auto s = troupe::data::openSource(p);  // before: the offset wrapped round, looping forever
    CHECK(s->size() == 3);
    CHECK(s->read(0).target == 1);
    CHECK_THROWS_WITH(s->read(2), Catch::Contains("s2.jpg") && Catch::Contains("cut short"));
    REQUIRE(s->notes().size() == 1);
    CHECK(s->notes()[0].find("wrap.tar is cut short") != std::string::npos);
  }
  SECTION("a shard cut in half: the cut member is a bad sample, the loss is named") {
    std::string many;
    for (int i = 0; i < 20; ++i) {
      many += member("k" + std::to_string(100 + i) + ".jpg", image) +
              member("k" + std::to_string(100 + i) + ".cls", std::to_string(i % 3));
    }
    auto whole = many + end;
    // Cut 100 bytes into the image of the first .jpg header past the middle.
    size_t at = whole.size() / 2 / 512 * 512;
    while (whole.compare(at, 1, "k") != 0 || whole.find(".jpg", at) > at + 10) at += 512;
    size_t cutAt = at + 512 + 100;
    auto p = shard("cut.tar", whole.substr(0, cutAt));
    auto s = troupe::data::openSource(p);
    INFO(s->size() << " samples");
    CHECK(s->size() > 5);
    CHECK(s->size() < 20);
    CHECK_THROWS_WITH(s->read(s->size() - 1), Catch::Contains("cut short"));
    CHECK_NOTHROW(s->read(0));
    REQUIRE(s->notes().size() == 1);
    INFO(s->notes()[0]);
    CHECK(s->notes()[0].find("cut.tar is cut short: it ends at byte " + std::to_string(cutAt)) !=
          std::string::npos);
    CHECK(s->notes()[0].find("every member after the cut is lost") != std::string::npos);
  }
  SECTION("a shard cut between members, its end blocks gone: said") {
    auto s = troupe::data::openSource(shard("noend.tar", good));
    CHECK(s->size() == 2);
    REQUIRE(s->notes().size() == 1);
    CHECK(s->notes()[0].find("no end-of-archive blocks") != std::string::npos);
    CHECK(troupe::data::openSource(shard("whole.tar", good + end))->notes().empty());
  }
}
