// The cost probe (bench_pipeline.h): a child pinned to one CPU measures augmentation, a training
// step and the evaluation with the libraries directly, and prints one JSON object; probe() runs
// it.

#include <dlfcn.h>
#include <omp.h>

#include "bench_pipeline.h"
#include "troupe/augment/augment.h"
#include "troupe/trainer/device.h"
#include "troupe/trainer/mlp.h"

namespace bench_pipeline {

int openblasThreads() {
  using Get = int (*)();
  auto get = reinterpret_cast<Get>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return get ? get() : -1;
}

void setOpenblasThreads(int n) {
  using Set = void (*)(int);
  auto set = reinterpret_cast<Set>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set) set(n);
}

// Runs `fn(i)` for at least `seconds` and `minReps` times; returns each call's milliseconds.
template <typename Fn>
std::vector<double> timeReps(double seconds, size_t minReps, Fn&& fn) {
  std::vector<double> ms;
  auto start = Clock::now();
  for (size_t i = 0; i < minReps || secondsSince(start) < seconds; ++i) {
    auto t = Clock::now();
    fn(i);
    ms.push_back(1000 * secondsSince(t));
  }
  return ms;
}

json runProbe(const Options& o) {
  using namespace troupe;
  if (o.probe == "late-pin") {
    // As troupe::run does with TROUPE_CPUS: pin this thread once the libraries have started.
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(o.cpus.at(0), &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) throw std::runtime_error("sched_setaffinity");
  }
  omp_set_num_threads(1);  // as the trainer actor does
  const size_t B = o.batchSize;
  auto train = data::loadFashionMnist(o.dataDir, data::Split::kTrain);
  const size_t pixels = train.imageSize();
  const size_t span = std::min<size_t>(train.size(), std::max<size_t>(o.samples, B)) - B + 1;
  auto batchPixels = [&](size_t i) {
    return std::span<const uint8_t>(train.pixels).subspan((i * B) % span * pixels, B * pixels);
  };
  auto batchLabels = [&](size_t i) {
    return std::span<const uint8_t>(train.labels).subspan((i * B) % span, B);
  };
  json out;
  out["probe"] = o.probe;
  out["cpus"] = [] {
    cpu_set_t set;
    sched_getaffinity(0, sizeof(set), &set);
    return cpuList(set);
  }();
  out["openblas_threads"] = openblasThreads();

  auto preset = [&] {
    return o.augment == "heavy" ? augment::AugmentConfig::heavy() : augment::AugmentConfig::light();
  };
  augment::AugmentConfig config = preset();
  std::vector<float> scratch(B * pixels);
  if (o.probe == "pinned") {
    config.blurKernel = o.blur;
    augment::Augmenter heavy(config);
    auto ms = timeReps(o.measureSeconds, 5, [&](size_t i) {
      heavy.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    double total = std::accumulate(ms.begin(), ms.end(), 0.0);
    out["augment_batch_ms"] = median(ms);
    out["augment_images_per_s"] = 1000.0 * B / median(ms);
    out["augment_images_per_s_mean"] = 1000.0 * B * ms.size() / total;
    config.blurKernel = 0;
    augment::Augmenter light(config);
    ms = timeReps(o.measureSeconds / 4, 5, [&](size_t i) {
      light.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    out["augment_images_per_s_no_blur"] = 1000.0 * B / median(ms);
  }

  // Inputs as the trainer gets them: augmented batches (16 of them, cycled).
  config.blurKernel = 0;
  augment::Augmenter light(config);
  std::vector<std::vector<float>> inputs;
  for (size_t i = 0; i < 16; ++i) {
    inputs.push_back(light.augment(batchPixels(i), train.rows, train.cols, i));
  }
  // The trainer's step on the back end the runs train on: a GPU's is wall time, launches included.
  std::shared_ptr<trainer::Device> device =
      trainer::selectDevice(o.device == "cuda"  ? trainer::DeviceKind::kCuda
                            : o.device == "cpu" ? trainer::DeviceKind::kCpu
                                                : trainer::DeviceKind::kAuto)
          .device;
  out["train_device"] = device->name();
  trainer::MlpConfig mlpConfig;
  mlpConfig.learningRate = o.lr;
  trainer::Mlp model(mlpConfig, device);
  auto step = [&](size_t i) { model.trainStep(inputs[i % 16], batchLabels(i % 16)); };
  for (size_t i = 0; i < 3; ++i) step(i);  // warm-up
  auto ms = timeReps(o.measureSeconds, 10, step);
  out["train_step_ms"] = median(ms);
  out["train_step_ms_mean"] = std::accumulate(ms.begin(), ms.end(), 0.0) / ms.size();
  if (o.probe == "pinned") {
    // The same two costs while the other CPU augments too, as it does in the heterogeneous run:
    // two vCPUs of a VM may share a physical core (or its caches and memory bandwidth).
    std::atomic<bool> stop = false;
    std::atomic<uint64_t> otherBatches = 0;
    std::thread other([&] {
      cpu_set_t set;
      CPU_ZERO(&set);
      CPU_SET(o.cpus.at(1), &set);
      sched_setaffinity(0, sizeof(set), &set);
      augment::AugmentConfig heavyConfig = preset();
      heavyConfig.blurKernel = o.blur;
      augment::Augmenter heavy(heavyConfig);
      std::vector<float> out(B * pixels);
      for (size_t i = 0; !stop; ++i, ++otherBatches) {
        heavy.augment(batchPixels(i), train.rows, train.cols, i, out);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    config.blurKernel = o.blur;
    augment::Augmenter heavy(config);
    auto busyAug = timeReps(o.measureSeconds, 5, [&](size_t i) {
      heavy.augment(batchPixels(i), train.rows, train.cols, i, scratch);
    });
    auto busyTrain = timeReps(o.measureSeconds, 10, step);
    stop = true;
    other.join();
    out["augment_batch_ms_other_cpu_busy"] = median(busyAug);
    out["train_step_ms_other_cpu_busy"] = median(busyTrain);
    auto test = data::loadFashionMnist(o.dataDir, data::Split::kTest);
    auto testInputs = augment::normalizeImages(test.pixels);
    auto evalMs = timeReps(0, 2, [&](size_t) { model.evaluate(testInputs, test.labels); });
    out["evaluate_ms"] = *std::min_element(evalMs.begin(), evalMs.end());
  } else if (openblasThreads() > 1) {
    // The same with one BLAS thread: what a properly pinned trainer gets.
    setOpenblasThreads(1);
    for (size_t i = 0; i < 3; ++i) step(i);
    auto one = timeReps(o.measureSeconds, 10, step);
    out["train_step_ms_one_blas_thread"] = median(one);
  }
  return out;
}


json probe(const Options& o, const std::string& kind, const fs::path& dir, const char* self) {
  fprintf(stderr, "bench_pipeline: measuring costs (%s) on CPU %u ...\n", kind.c_str(), o.cpus[0]);
  static int count = 0;
  auto outPath = (dir / ("probe-" + kind + "-" + std::to_string(count++) + ".out")).string();
  std::vector<std::string> argv = {self,
                                   "--probe",
                                   kind,
                                   "--blur",
                                   std::to_string(o.blur),
                                   "--batch-size",
                                   std::to_string(o.batchSize),
                                   "--train-samples",
                                   std::to_string(o.samples),
                                   "--lr",
                                   std::to_string(o.lr),
                                   "--device",
                                   o.device,
                                   "--cpus",
                                   std::to_string(o.cpus[0]) + "," + std::to_string(o.cpus[1]),
                                   "--measure-seconds",
                                   std::to_string(o.measureSeconds),
                                   "--data-dir",
                                   o.dataDir};
  // OMP_WAIT_POLICY as hetero_train sets it; "pinned" is pinned before exec, "late-pin" after.
  Child child(argv, {"OMP_WAIT_POLICY=passive"}, outPath,
              kind == "pinned" ? static_cast<int>(o.cpus[0]) : -1, o.nice);
  int code = child.wait(120);
  auto text = child.output();
  if (code != 0) {
    throw std::runtime_error("cost probe (" + kind + ") failed with " + std::to_string(code) +
                             ":\n" + tail(text, 10));
  }
  auto at = text.rfind("\n{");
  return json::parse(text.substr(at == std::string::npos ? 0 : at + 1));
}

}  // namespace bench_pipeline
