// bench_images: the data group's image pipeline per CPU core against torchvision's and, with
// --peers, the CPU pipelines users compare it with, on the same JPEGs in the same run.
//
// The JPEGs: N pictures of ImageNet's median size (500 x 375 by default) with the detail of a
// photograph (shapes, gradients and sensor-like noise, quality 90), made here and removed after.
// Every mode runs on one thread over every file, in R rounds that take the modes in turn
// (interleaved: a slow minute of the machine's touches each alike); its figure is the median of
// its rounds' images per CPU-second (the thread's CPU time in process, the process's in Python),
// with the rounds' spread. troupe's modes read the files' bytes from memory (the CPU, not the
// disk):
//
//   decode                     libjpeg-turbo to RGB, the whole image at full size
//   decode, the spec's part    what troupe's run() decodes: only a first RandomResizedCrop's box,
//                              DCT-scaled where the crop allows (the floor of its pipeline)
//   troupe                     decode + the spec (ImageNet's training recipe by default) into
//                              float32 CHW, as the data group's augmenters run it
//   troupe, DCT-scaled whole   the same decoding every JPEG whole, DCT-scaled where the crop
//                              allows (what decoding the part saves)
//   troupe, whole decode       the same decoding every JPEG whole at full size
//   torchvision + PIL          the same recipe composed in torchvision 0.14 (/usr/bin/python3,
//                              torch on one thread): peers.py --mode torchvision
//   peers (--peers)            OpenCV's PyPI wheel, simplejpeg, PyTurboJPEG, DALI's CPU pipeline
//                              and SPDL, each the same recipe (peers.py), from a venv that
//                              peers_venv.sh makes; one skipped says why
//
// A stage table follows: where the troupe row's time goes (Pipeline::run's StageTimes).
//
// Usage: bench_images [--json] [--images N] [--rounds R] [--size WxH] [--spec SPEC]
//                     [--python PATH] [--no-torchvision] [--peers [VENV]]

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>
#include <random>
#include <string>
#include <vector>

#include "troupe/images/transforms.h"

namespace {

namespace fs = std::filesystem;

const char* kDefaultSpec =
    "RandomResizedCrop(224),RandomHorizontalFlip(),ColorJitter(0.4,0.4,0.4),Normalize(imagenet)";

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

long threadFaults() {
  rusage u;
  getrusage(RUSAGE_THREAD, &u);
  return u.ru_minflt + u.ru_majflt;
}

double threadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + t.tv_nsec * 1e-9;
}

// One mode's rounds: images per CPU-second each, or why it was skipped.
struct Mode {
  std::string name;
  std::vector<double> rates;
  double faults = -1;  // page faults an image (troupe's modes: this thread's, all rounds)
  std::string skipped, version;
  double median() const {
    if (rates.empty()) return 0;
    auto r = rates;
    std::sort(r.begin(), r.end());
    return r.size() % 2 ? r[r.size() / 2] : (r[r.size() / 2 - 1] + r[r.size() / 2]) / 2;
  }
  // The rounds' range around the median, as a fraction of it.
  double spread() const {
    if (rates.size() < 2 || median() <= 0) return 0;
    auto [lo, hi] = std::minmax_element(rates.begin(), rates.end());
    return (*hi - *lo) / median();
  }
};

// A Python mode's round: peers.py over the files, its one JSON line.
nlohmann::json runPython(const std::string& python, const std::string& script,
                         const std::string& mode, const std::string& list) {
  std::string cmd = python + " " + script + " --mode " + mode + " --files " + list + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string text, last;
  char buf[4096];
  while (p && fgets(buf, sizeof(buf), p)) {
    text += buf;
    if (buf[0] == '{') last = buf;
  }
  int status = p ? pclose(p) : -1;
  try {
    return nlohmann::json::parse(last);
  } catch (const std::exception&) {
    auto tail = text.size() > 300 ? text.substr(text.size() - 300) : text;
    std::replace(tail.begin(), tail.end(), '\n', ' ');
    return {{"skipped", "peers.py --mode " + mode + " failed (status " + std::to_string(status) +
                            "): " + tail}};
  }
}

}  // namespace

int main(int argc, char* argv[]) {
  // One core means one thread: OpenCV would otherwise run its resizes and colour conversions on a
  // pool of its own (every CPU), which no per-core figure may count.
  cv::setNumThreads(1);
  bool json = false, torchvision = true;
  size_t count = 500, rounds = 5;
  int width = 500, height = 375;
  std::string spec = kDefaultSpec, python = "/usr/bin/python3", venv;
  bool peers = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    bool more = i + 1 < argc;
    if (a == "--json") {
      json = true;
    } else if (a == "--no-torchvision") {
      torchvision = false;
    } else if (a == "--images" && more) {
      count = std::stoul(argv[++i]);
    } else if (a == "--rounds" && more) {
      rounds = std::max<size_t>(1, std::stoul(argv[++i]));
    } else if (a == "--size" && more && sscanf(argv[i + 1], "%dx%d", &width, &height) == 2) {
      ++i;
    } else if (a == "--spec" && more) {
      spec = argv[++i];
    } else if (a == "--python" && more) {
      python = argv[++i];
    } else if (a == "--peers") {
      peers = true;
      if (more && argv[i + 1][0] != '-') venv = argv[++i];
    } else {
      fprintf(stderr,
              "usage: %s [--json] [--images N] [--rounds R] [--size WxH] [--spec SPEC] "
              "[--python PATH] [--no-torchvision] [--peers [VENV]]\n",
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
  auto whole = troupe::images::Pipeline::parse(spec);
  whole.setDecodeRegions(false);
  whole.setDecodeScaling(false);
  auto shape = pipeline.outputShape(3);
  auto scaledWhole = troupe::images::Pipeline::parse(spec);
  scaledWhole.setDecodeRegions(false);

  // The JPEGs, on disk for the Python modes and in memory for troupe's.
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
  auto list = (dir / "files.txt").string();
  {
    std::ofstream out(list);
    for (auto& f : files) out << f << "\n";
  }
  size_t bytes = 0;
  for (auto& j : jpegs) bytes += j.size();

  // The Python modes: torchvision with Debian's torch, the peers from their venv.
  std::string script = BENCH_IMAGES_PEERS_PY;
  std::vector<std::pair<std::string, std::string>> pythonModes;  // (mode, python)
  if (torchvision) pythonModes.push_back({"torchvision", python});
  std::string peersSkip;
  if (peers) {
    if (venv.empty()) venv = (fs::temp_directory_path() / "troupe-bench-peers").string();
    std::string make = std::string(BENCH_IMAGES_PEERS_VENV) + " " + venv + " >&2";
    if (system(make.c_str()) != 0) {
      peersSkip = "peers_venv.sh " + venv + " failed (its lines above say why)";
    } else {
      for (auto m : {"opencv", "simplejpeg", "pyturbojpeg", "dali", "spdl"}) {
        pythonModes.push_back({m, venv + "/bin/python"});
      }
    }
  }

  std::vector<uint8_t> out(shape.elements() * troupe::images::dtypeBytes(pipeline.dtype()));
  struct Native {
    std::string name;
    std::function<void(size_t)> one;
  };
  std::vector<Native> natives = {
      {"decode (libjpeg-turbo, RGB, whole)",
       [&](size_t i) { troupe::images::decode(jpegs[i], files[i], 3, 1); }},
      {"decode, the spec's part (troupe's floor)",
       [&](size_t i) {
         pipeline.decodeOnly({jpegs[i], 0, files[i]}, i);
       }},
      {"troupe: decode + spec",
       [&](size_t i) {
         pipeline.run({jpegs[i], 0, files[i]}, troupe::data::Encoding::kFile, {}, i, out);
       }},
      {"troupe: DCT-scaled whole decode + spec",
       [&](size_t i) {
         scaledWhole.run({jpegs[i], 0, files[i]}, troupe::data::Encoding::kFile, {}, i, out);
       }},
      {"troupe: whole decode + spec",
       [&](size_t i) {
         whole.run({jpegs[i], 0, files[i]}, troupe::data::Encoding::kFile, {}, i, out);
       }},
  };
  std::vector<Mode> modes;
  for (auto& n : natives) modes.push_back({n.name});
  for (auto& [m, py] : pythonModes) modes.push_back({m});
  for (size_t round = 0; round < rounds; ++round) {
    for (size_t k = 0; k < natives.size(); ++k) {
      for (size_t i = 0; i < std::min<size_t>(20, count); ++i) natives[k].one(i);  // warm-up
      double start = threadCpuSeconds();
      long faults = threadFaults();
      for (size_t i = 0; i < count; ++i) natives[k].one(i);
      modes[k].rates.push_back(count / std::max(1e-9, threadCpuSeconds() - start));
      // (per image, over the rounds so far)
      double mine = double(threadFaults() - faults) / count;
      modes[k].faults = modes[k].faults < 0 ? mine : (modes[k].faults * round + mine) / (round + 1);
    }
    for (size_t k = 0; k < pythonModes.size(); ++k) {
      auto& mode = modes[natives.size() + k];
      if (!mode.skipped.empty()) continue;
      auto r = runPython(pythonModes[k].second, script, pythonModes[k].first, list);
      if (r.contains("skipped")) {
        mode.skipped = r["skipped"].get<std::string>();
        continue;
      }
      mode.rates.push_back(r["images"].get<double>() /
                           std::max(1e-9, r["cpu_seconds"].get<double>()));
      if (r.contains("versions")) {
        std::string v;
        for (auto& [lib, ver] : r["versions"].items()) {
          v += (v.empty() ? "" : ", ") + lib + " " + ver.get<std::string>();
        }
        mode.version = v;
      }
    }
  }
  // Where the troupe row's time goes: the same run again with each stage timed.
  troupe::images::StageTimes stages;
  for (size_t i = 0; i < count; ++i) {
    pipeline.run({jpegs[i], 0, files[i]}, troupe::data::Encoding::kFile, {}, i, out, nullptr,
                 &stages);
  }
  auto stageNames = pipeline.stageNames();
  std::error_code ec;
  fs::remove_all(dir, ec);

  double baseline = 0, fastestPeer = 0;
  std::string fastestName;
  for (size_t k = natives.size(); k < modes.size(); ++k) {
    if (modes[k].name == "torchvision") {
      baseline = modes[k].median();
    } else if (modes[k].median() > fastestPeer) {
      fastestPeer = modes[k].median();
      fastestName = modes[k].name;
    }
  }
  double troupeRate = modes[2].median(), floor = modes[1].median();  // (natives' order)
  if (json) {
    nlohmann::json j = {{"bench", "images"},
                        {"images", count},
                        {"rounds", rounds},
                        {"size", std::to_string(width) + "x" + std::to_string(height)},
                        {"mean_jpeg_bytes", bytes / count},
                        {"spec", pipeline.describe()},
                        {"part_decoded_fraction", double(stages.partDecodes) / count},
                        {"troupe_vs_torchvision", baseline > 0 ? troupeRate / baseline : 0},
                        {"troupe_vs_fastest_peer", fastestPeer > 0 ? troupeRate / fastestPeer : 0},
                        {"troupe_vs_its_decode", floor > 0 ? troupeRate / floor : 0}};
    if (!peersSkip.empty()) j["peers_skipped"] = peersSkip;
    for (auto& m : modes) {
      nlohmann::json row = {{"mode", m.name},
                            {"images_per_cpu_s", m.median()},
                            {"spread", m.spread()},
                            {"rounds", m.rates}};
      if (m.faults >= 0) row["page_faults_per_image"] = m.faults;
      if (!m.skipped.empty()) row["skipped"] = m.skipped;
      if (!m.version.empty()) row["version"] = m.version;
      j["modes"].push_back(row);
    }
    if (!torchvision) j["torchvision_skipped"] = "--no-torchvision";
    for (size_t k = 0; k < stageNames.size(); ++k) {
      j["troupe_stages_us"][stageNames[k]] = 1e6 * stages.seconds[k] / count;
    }
    printf("%s\n", j.dump().c_str());
    return 0;
  }
  printf(
      "%zu JPEGs of %dx%d (%zu bytes on average, quality 90), one thread each mode, %zu "
      "interleaved rounds\n",
      count, width, height, bytes / count, rounds);
  printf("spec: %s\n", pipeline.describe().c_str());
  printf("JPEGs troupe decoded in part (a RandomResizedCrop's box): %.0f%%\n\n",
         100.0 * stages.partDecodes / count);
  printf("%-42s %14s %8s %14s %12s\n", "mode (median of rounds)", "images/CPU-s", "spread",
         "x torchvision", "faults/image");
  for (auto& m : modes) {
    if (!m.skipped.empty()) continue;
    char ratio[32] = "-";
    if (baseline > 0) snprintf(ratio, sizeof ratio, "%.2f", m.median() / baseline);
    char faults[32] = "-";
    if (m.faults >= 0) snprintf(faults, sizeof faults, "%.1f", m.faults);
    printf("%-42s %14.0f %7.0f%% %14s %12s\n", m.name.c_str(), m.median(), 100 * m.spread(), ratio,
           faults);
  }
  for (auto& m : modes) {
    if (!m.version.empty()) printf("%s: %s\n", m.name.c_str(), m.version.c_str());
  }
  printf("\ntroupe against its own decode (the spec's part): %.2f",
         floor > 0 ? troupeRate / floor : 0);
  if (fastestPeer > 0)
    printf("; against the fastest peer (%s): %.2f", fastestName.c_str(), troupeRate / fastestPeer);
  printf("\nthe troupe row's stages (us/image, timed in a run of their own):");
  for (size_t k = 0; k < stageNames.size(); ++k) {
    printf(" %s %.0f%s", stageNames[k].c_str(), 1e6 * stages.seconds[k] / count,
           k + 1 < stageNames.size() ? "," : "\n");
  }
  for (auto& m : modes) {
    if (!m.skipped.empty()) printf("%s: skipped: %s\n", m.name.c_str(), m.skipped.c_str());
  }
  if (!torchvision) printf("torchvision: skipped: --no-torchvision\n");
  if (!peersSkip.empty()) printf("peers: skipped: %s\n", peersSkip.c_str());
  if (!peers)
    printf("peers: not measured (--peers makes a venv of them from PyPI and runs each)\n");
  return 0;
}
