// Measures the training libraries on real Fashion-MNIST: augmentation throughput on one thread,
// CPU/GPU epoch time and test accuracy per epoch. Not a test; run by hand:
//   training_bench [--epochs N] [--batch B] [--lr X] [--blur K] [--no-augment] [--save DIR]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "troupe/augment/augment.h"
#include "troupe/dataset/epoch.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/trainer/mlp.h"

using namespace troupe;
using Clock = std::chrono::steady_clock;

static double secondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int main(int argc, char** argv) {
  int epochs = 5, batchSize = 128, blur = 11;
  float lr = 0.02f;
  bool augment = true;
  std::string saveDir, dataDir = data::kDefaultFashionMnistDir;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&] {
      return i + 1 < argc
                 ? argv[++i]
                 : (std::fprintf(stderr, "%s needs a value\n", a.c_str()), std::exit(2), "");
    };
    if (a == "--epochs")
      epochs = std::atoi(value());
    else if (a == "--batch")
      batchSize = std::atoi(value());
    else if (a == "--lr")
      lr = std::atof(value());
    else if (a == "--blur")
      blur = std::atoi(value());
    else if (a == "--no-augment")
      augment = false;
    else if (a == "--save")
      saveDir = value();
    else if (a == "--data")
      dataDir = value();
    else {
      std::fprintf(stderr,
                   "usage: %s [--epochs N] [--batch B] [--lr X] [--blur K] [--no-augment] "
                   "[--save DIR] [--data DIR]\n",
                   argv[0]);
      return 2;
    }
  }
  if (!std::getenv("OMP_WAIT_POLICY")) {
    std::fprintf(stderr,
                 "note: run with OMP_WAIT_POLICY=passive, else OpenMP spins and starves "
                 "OpenBLAS\n");
  }
  const auto train = data::loadFashionMnist(dataDir, data::Split::kTrain);
  const auto test = data::loadFashionMnist(dataDir, data::Split::kTest);
  const auto testInputs = augment::normalizeImages(test.pixels);

  // Augmentation throughput on this thread, with the blur the PyTorch example used.
  {
    augment::AugmentConfig config;
    config.blurKernel = blur;
    augment::Augmenter augmenter(config);
    const size_t n = 20000;
    std::vector<float> out(n * 784);
    auto t = Clock::now();
    augmenter.augment(std::span(train.pixels).first(n * 784), 28, 28, 1, out);
    const double s = secondsSince(t);
    std::printf("augment: %.0f images/s on one thread (blur %d)\n", n / s, blur);
    config.blurKernel = 0;
    augment::Augmenter noBlur(config);
    t = Clock::now();
    noBlur.augment(std::span(train.pixels).first(n * 784), 28, 28, 1, out);
    std::printf("augment: %.0f images/s on one thread (no blur)\n", n / secondsSince(t));
  }

  auto selection = trainer::selectDevice();
  std::printf("device: %s\n", selection.reason.c_str());
  trainer::MlpConfig mlpConfig;
  mlpConfig.learningRate = lr;
  trainer::Mlp mlp(mlpConfig, std::move(selection.device));
  augment::AugmentConfig augConfig =
      augment ? augment::AugmentConfig{} : augment::AugmentConfig::none();
  augment::Augmenter augmenter(augConfig);
  data::EpochCursor cursor(data::shardIndices(train.size(), 0, 1), /*seed=*/1);
  double accuracy = 0;
  for (int epoch = 0; epoch < epochs; ++epoch) {
    double augmentSeconds = 0, trainSeconds = 0, lossSum = 0;
    int steps = 0;
    const auto t = Clock::now();
    for (auto b = cursor.next(batchSize); !b.samples.empty(); b = cursor.next(batchSize)) {
      auto t0 = Clock::now();
      const auto images = data::gatherSamples(train, b.samples);
      const auto inputs =
          augmenter.augment(images.pixels, 28, 28, data::mixSeed(1, b.epoch, b.begin));
      auto t1 = Clock::now();
      // Linear decay to 0 over the whole run.
      const double progress = (epoch + double(b.begin) / cursor.epochSize()) / epochs;
      mlp.setLearningRate(float(lr * (1.0 - progress)));
      lossSum += mlp.trainStep(inputs, images.labels);
      trainSeconds += secondsSince(t1);
      augmentSeconds += std::chrono::duration<double>(t1 - t0).count();
      ++steps;
      cursor.acknowledge(b.epoch, b.end());
    }
    cursor.startNextEpoch();
    const auto te = Clock::now();
    accuracy = mlp.evaluate(testInputs, test.labels);
    std::printf(
        "epoch %d: loss %.4f, test accuracy %.4f, train %.2f s + augment %.2f s "
        "(wall %.2f s), eval %.2f s\n",
        epoch + 1, lossSum / steps, accuracy, trainSeconds, augmentSeconds, secondsSince(t),
        secondsSince(te));
    std::fflush(stdout);
  }
  if (!saveDir.empty()) {
    mlp.save(saveDir, {.epoch = epochs, .accuracy = accuracy});
    std::printf("saved to %s\n", saveDir.c_str());
  }
  return 0;
}
