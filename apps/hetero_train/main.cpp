// hetero_train: the seeds' job on troupe. Augmenter actors on the data group stream augmented
// Fashion-MNIST batches straight to a trainer actor on the dnn group, which trains an MLP (CUDA
// when there is a GPU, Thrust's CPU back end otherwise). Run without flags for the defaults;
// `--help` lists the settings. Nothing here names a host, detects a role, or signals an exit:
// troupe does that.

#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <deque>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "train.capnp.h"
#include "troupe/train/actors.h"
#include "troupe/train/spawn.h"
#include "troupe/train/checkpoint.h"
#include "end_report.h"
#include "settings.h"
#include "advise.h"
#include "prices.h"
#include "troupe/trainer/mlp.h"
#include "troupe/cli11.h"
#include "troupe/dataset/fashion_mnist.h"
#include "troupe/dataset/source.h"
#include "troupe/images/transforms.h"
#include "troupe/sagemaker.h"
#include "troupe/sched/instance_types.h"
#include "troupe/troupe.h"

namespace {

using hetero_train::Settings;
using hetero_train::parseSettings;
using troupe::Placement;

using hetero_train::hex;

std::string fmt(const char* format, double v) {
  char buf[64];
  snprintf(buf, sizeof(buf), format, v);
  return buf;
}

struct Placed {
  std::string actor, type, host, group;
};

class Job {
 public:
  Job(troupe::Driver& job, Settings settings) : job_(job), s_(kj::mv(settings)) {}

  troupe::Co<void> run() {
    // Check the dataset before any work starts, on the pool: unpacking it takes long enough to
    // starve the head's heartbeats if done on the event loop.
    auto count = job_.loop().offload([dir = s_.dataDir, source = s_.source]() {
      if (source) return source->size();
      return troupe::data::loadFashionMnist(dir, troupe::data::Split::kTrain).size();
    });
    size_t available = co_await kj::mv(count);  // (no lambda inside co_await: see troupe/co.h)
    KJ_REQUIRE(s_.samples <= available, "--train-samples is larger than the training set",
               s_.samples, available);
    if (s_.source) {
      printf("dataset: %s (%s), %zu samples, %u classes; transform %s -> %s %dx%dx%d\n",
             s_.source->where().c_str(), s_.source->kind().c_str(), s_.source->size(),
             s_.classes, s_.transform.c_str(), troupe::images::dtypeName(s_.dtype),
             s_.shape.channelsFirst ? s_.shape.channels : s_.shape.height,
             s_.shape.channelsFirst ? s_.shape.height : s_.shape.width,
             s_.shape.channelsFirst ? s_.shape.width : s_.shape.channels);
      fflush(stdout);
    }
    samples_ = s_.samples ? s_.samples : available;
    co_await start();
  }

 private:
  // The trainer goes to the dnn group, on a GPU when it has one. A cluster without that group (a
  // homogeneous one) runs it on the head, which then fate-shares with it as it does on the dnn
  // group's first host (troupe::run() chose the head with a warning already).
  Placement trainerPlacement() {
    bool found = false, gpus = false;
    for (auto& n : job_.nodes()) {
      if (n.group() != s_.dnnGroup.c_str()) continue;
      found = true;
      gpus = gpus || n.gpus() > 0;
    }
    if (found) return Placement::group(s_.dnnGroup).gpus(gpus ? 1 : 0);
    auto& head = job_.node();
    return Placement::any()
        .labels(std::string("host=") + head.host().cStr())
        .gpus(head.gpus() > 0 ? 1 : 0);
  }

  kj::Promise<void> start() {
    troupe::train::TrainerSpec spec;
    spec.batchSize = s_.batchSize;
    spec.seed = s_.seed;
    spec.prefetch = s_.prefetch;
    spec.samplesSetting = s_.samples;
    if (s_.source) {
      spec.sample = troupe::train::SampleSpec{s_.shape, s_.dtype, s_.classes};
      spec.batched = true;
      spec.dropLast = s_.dropLast;
    }
    // Stopped early (SIGTERM), it finishes its step and writes a checkpoint: seconds, well
    // within SageMaker's 120 s between SIGTERM and SIGKILL.
    spec.stopTimeout = 30 * kj::SECONDS;
    auto trainer = job_.spawn<hetero::Trainer>(
        trainerPlacement(),
        troupe::train::trainerOptions(spec, [&](hetero::TrainerArgs::Builder a) {
          // The MLP's own: its optimiser, data, device, model and checkpoints.
          a.setLearningRate(s_.learningRate);
          a.setMomentum(s_.momentum);
          a.setDataDir(s_.dataDir);
          a.setModelDir(s_.modelDir);
          a.setDevice(s_.device);
          a.setCheckpointDir(s_.checkpointDir);
          a.setCheckpointEvery(s_.checkpointEvery);
          a.setCheckpointKeep(s_.checkpointKeep);
          a.setFresh(s_.fresh);
          a.setKillDuringCheckpoint(s_.killDuringCheckpoint);
          if (s_.source) {
            a.setTestDataset(s_.testDataset);
            a.setTestTransform(s_.testTransform);
          }
        }));
    auto augmenters =
        job_.spawnMany<hetero::Augmenter>(troupe::train::augmenterPlacement(augmenterSpec()),
                                          troupe::train::augmenterOptions(augmenterSpec(), "augmenter"));
    placed_.push_back(
        {"trainer", "train.Trainer", trainer.address().host, trainer.address().group});
    for (auto& a : augmenters) {
      placed_.push_back({a.address().name, "train.Augmenter", a.address().host, a.address().group});
    }
    printPlacements();
    reportOnEveryEnd();
    augmenters_.assign(augmenters.begin(), augmenters.end());
    // A data node that joins the running job (a late host, one started again after a crash or a
    // partition) gets augmenters of its own, which take shards from the trainer's queue at once.
    troupe::train::growOnJoin(
        job_, augmenterSpec(), troupe::train::trainerList(kj::arrayPtr(&trainer, 1)),
        augmenters, tasks_,
        [this](const std::string& host, kj::ArrayPtr<troupe::Ref<hetero::Augmenter>> added) {
          for (auto& a : added) {
            placed_.push_back({a.address().name, "train.Augmenter", host, a.address().group});
            end_->placements.push_back({{"actor", a.address().name},
                                        {"type", "train.Augmenter"},
                                        {"host", host},
                                        {"group", a.address().group}});
            augmenters_.emplace_back(a);
          }
        });

    auto req = troupe::train::trainRequest(trainer, s_.epochs, samples_, augmenters);
    // After training, each augmenter's stats(): the advisor's augmentation rate per vCPU.
    auto done =
        req.send().then([this](capnp::Response<hetero::Trainer::TrainResults>&& r) mutable {
          auto results = kj::heap(kj::mv(r));
          auto stats = gatherStats(placed_.front().host);
          return kj::Promise<AugmentStats>(kj::mv(stats))
              .then([this, results = kj::mv(results)](AugmentStats st) mutable { report(*results, st); });
        });
    return done.exclusiveJoin(progressLoop(trainer)).attach(kj::mv(augmenters));
  }

  // A job that ends before report() (SIGTERM, a failed actor, a lost node) still says what it
  // trained, and writes report.json with it (end_report.h): after the cascade, so the trainer's
  // checkpoint written as it stopped is the one read.
  void reportOnEveryEnd() {
    end_->reportPath = s_.report;
    end_->checkpointDir = s_.checkpointDir;
    end_->identity = jobIdentity(s_);
    end_->epochs = s_.epochs;
    for (auto& p : placed_) {
      end_->placements.push_back(
          {{"actor", p.actor}, {"type", p.type}, {"host", p.host}, {"group", p.group}});
    }
    job_.onJobEnd([state = end_, &job = job_](const troupe::JobEnd& end) {
      if (state->reported) return;
      nlohmann::json instances = nlohmann::json::array();
      for (auto& n : job.nodes()) {
        instances.push_back({{"host", n.host().cStr()},
                             {"group", n.group().cStr()},
                             {"instance_type", n.instanceType().cStr()},
                             {"vcpus", n.vcpus()}});
      }
      hetero_train::reportEnd(*state, end, kj::mv(instances), job.membershipChanges());
    });
  }

  // What hetero_train's augmenters are (spawn.h).
  troupe::train::AugmenterSpec augmenterSpec() const {
    return troupe::train::augmenterSpecOf(s_, samples_, s_.augmentConfig, s_.source != nullptr);
  }

  void printPlacements() {
    printf("\n%-14s %-16s %-8s %s\n", "actor", "type", "host", "group");
    for (auto& p : placed_) {
      printf("%-14s %-16s %-8s %s\n", p.actor.c_str(), p.type.c_str(), p.host.c_str(),
             p.group.c_str());
    }
    printf("\n");
    fflush(stdout);
  }

  troupe::Co<void> progressLoop(troupe::Ref<hetero::Trainer> trainer) {
    // Runs until the training call returns, which drops (cancels) it. On a terminal the line is
    // redrawn in place twice a second; otherwise (troupe sim, a log file) a new line each time.
    // The trainer is asked every second at most, for what a job that ends early reports.
    double seconds = live_ ? std::min(s_.progressEvery, 0.5) : s_.progressEvery;
    auto every = static_cast<int64_t>(seconds * 1000) * kj::MILLISECONDS;
    auto poll = std::min(every, 1000 * kj::MILLISECONDS);
    auto nextLine = job_.timer().now() + every;
    for (;;) {
      co_await job_.timer().afterDelay(poll);
      auto p = co_await trainer.progressRequest().send();
      double secs = p.getSeconds();
      uint64_t steps = p.getSteps();
      uint64_t total = p.getPlannedSteps();
      end_->progress = {true, p.getEpoch(), steps, total, p.getSamples(), secs,
                        std::chrono::steady_clock::now()};
      if (job_.timer().now() < nextLine) continue;
      nextLine = job_.timer().now() + every;
      // This run's pace: a resumed run did not do the steps the checkpoint brought.
      uint64_t mine = steps - std::min(steps, p.getResumedSteps());
      double rate = secs > 0 ? (p.getSamples() - p.getResumedSamples()) / secs : 0;
      double eta = mine ? secs * double(total - std::min(total, steps)) / mine : 0;
      printf(
          "%sprogress: epoch %u/%u, step %lu/%lu, %.0f samples/s, data wait %.0f%%, ETA %.0f s%s",
          live_ ? "\r" : "", p.getEpoch() + 1, s_.epochs, (unsigned long)steps,
          (unsigned long)total, rate, secs > 0 ? 100 * p.getWaitSeconds() / secs : 0, eta,
          live_ ? "\x1b[K" : "\n");
      fflush(stdout);
    }
  }

  struct AugmentStats {
    uint64_t images = 0, batches = 0, bytes = 0;
    double seconds = 0;
    double secondsBesideTrainer = 0;  // of `seconds`: on the trainer's host (in its process)
    double loadSeconds = 0;           // loading shards, all augmenters
    unsigned answered = 0, lost = 0;
  };

  // Each augmenter's stats(); one gone for good (its restarts spent) is counted as lost.
  // Every augmenter's stats() at once, each within 2 s: a slow node's answer (its link still
  // full of pushes the trainer no longer wanted) must not hold the job's end for each of its
  // augmenters in turn. One that does not answer is counted as lost.
  kj::Promise<AugmentStats> gatherStats(std::string trainerHost) {
    struct One {
      uint64_t images, batches, bytes;
      double seconds, loadSeconds;
      bool beside;
    };
    auto calls = kj::heapArrayBuilder<kj::Promise<kj::Maybe<One>>>(augmenters_.size());
    for (auto& a : augmenters_) {
      bool beside = a.address().host == trainerHost;
      calls.add(job_.timer()
                    .timeoutAfter(2 * kj::SECONDS, a.statsRequest().send())
                    .then(
                        [beside](auto r) -> kj::Maybe<One> {
                          return One{r.getImages(),         r.getBatches(),     r.getBytes(),
                                     r.getAugmentSeconds(), r.getLoadSeconds(), beside};
                        },
                        [](kj::Exception&&) -> kj::Maybe<One> { return nullptr; }));
    }
    return kj::joinPromises(calls.finish()).then([](kj::Array<kj::Maybe<One>> all) {
      AugmentStats st;
      for (auto& maybe : all) {
        KJ_IF_MAYBE(r, maybe) {
          st.images += r->images;
          st.batches += r->batches;
          st.bytes += r->bytes;
          st.seconds += r->seconds;
          if (r->beside) st.secondsBesideTrainer += r->seconds;
          st.loadSeconds += r->loadSeconds;
          ++st.answered;
        } else {
          ++st.lost;
        }
      }
      return st;
    });
  }

  void report(capnp::Response<hetero::Trainer::TrainResults>& r, const AugmentStats& st) {
    if (live_) printf("\n");  // end the live progress line
    printf("\ntrainer device: %s\n\n", r.getDevice().cStr());
    printf("%5s %9s %10s %8s %9s %8s %9s %8s\n", "epoch", "samples", "duplicates", "missing",
           "rejected", "skipped", "accuracy", "seconds");
    double seconds = 0, wait = 0, stepSeconds = 0, stepCpuSeconds = 0, fill = 0;
    unsigned epochCount = 0;
    uint64_t steps = 0, samples = 0;
    nlohmann::json epochs = nlohmann::json::array();
    for (auto e : r.getEpochs()) {
      printf("%5u %9lu %10lu %8lu %9lu %8lu %9.4f %8.1f\n", e.getEpoch() + 1,
             (unsigned long)e.getSamples(), (unsigned long)e.getDuplicates(),
             (unsigned long)e.getMissing(), (unsigned long)e.getRejected(),
             (unsigned long)e.getSkipped(), e.getTestAccuracy(), e.getSeconds());
      seconds += e.getSeconds();
      wait += e.getWaitSeconds();
      stepSeconds += e.getStepSeconds();
      stepCpuSeconds += e.getStepCpuSeconds();
      fill += e.getFillSeconds();
      ++epochCount;
      steps += e.getSteps();
      samples += e.getSamples();
      epochs.push_back({{"epoch", e.getEpoch() + 1},
                        {"samples", e.getSamples()},
                        {"duplicates", e.getDuplicates()},
                        {"missing", e.getMissing()},
                        {"rejected", e.getRejected()},
                        {"test_accuracy", e.getTestAccuracy()},
                        {"seconds", e.getSeconds()},
                        {"from_checkpoint", e.getFromCheckpoint()},
                        {"skipped", e.getSkipped()},
                        {"digest", hex(e.getDigest())}});
    }
    nlohmann::json skippedFiles = nlohmann::json::array();
    for (auto f : r.getSkippedFiles()) skippedFiles.push_back(f.cStr());
    if (!skippedFiles.empty()) {
      printf("\n%zu training samples could not be read and were skipped (--skip-bad-samples):\n",
             skippedFiles.size());
      for (auto& f : skippedFiles) printf("  %s\n", f.get<std::string>().c_str());
    }
    nlohmann::json warnedFiles = nlohmann::json::array();
    for (auto f : r.getWarnedFiles()) warnedFiles.push_back(f.cStr());
    if (!warnedFiles.empty()) {
      printf("\n%zu training samples were decoded despite libjpeg's warning, as PIL decodes "
             "them:\n",
             warnedFiles.size());
      for (auto& f : warnedFiles) printf("  %s\n", f.get<std::string>().c_str());
    }
    nlohmann::json dataset = nullptr;
    if (s_.source) {
      dataset = {{"path", s_.source->where()},
                 {"kind", s_.source->kind()},
                 {"samples", s_.source->size()},
                 {"classes", s_.classes},
                 {"transform", s_.transform},
                 {"test_dataset", s_.testDataset},
                 {"test_transform", s_.testTransform},
                 {"sample_shape", s_.shape.channelsFirst
                                      ? nlohmann::json::array({s_.shape.channels, s_.shape.height,
                                                               s_.shape.width})
                                      : nlohmann::json::array({s_.shape.height, s_.shape.width,
                                                               s_.shape.channels})},
                 {"dtype", troupe::images::dtypeName(s_.dtype)}};
    }
    auto c = r.getCheckpoints();
    nlohmann::json resumed = nullptr;
    if (c.getResumedFrom().size() > 0) {
      // The counts above include what the interrupted run trained on: the checkpoint carried
      // each sample's count of its epoch, and this run counted its own against them.
      printf("\nresumed from %s: epoch %u continued from sample %lu of %lu\n",
             c.getResumedFrom().cStr(), c.getResumedEpoch() + 1,
             (unsigned long)c.getResumedSamples(), (unsigned long)samples_);
      resumed = {{"checkpoint", c.getResumedFrom().cStr()},
                 {"epoch", c.getResumedEpoch() + 1},
                 {"step", c.getResumedStep()},
                 {"samples_of_epoch", c.getResumedSamples()}};
    }
    if (c.getWritten() > 0) {
      printf("checkpoints written    %u (%.2f s), the newest %s\n", c.getWritten(),
             c.getWriteSeconds(), c.getLast().cStr());
    }
    bool spot = s_.pricing == "spot";
    double pricePerHour = 0;
    std::vector<std::string> unpriced;
    nlohmann::json instances = nlohmann::json::array();
    for (auto& n : job_.nodes()) {
      auto price = s_.prices.perHour(n.instanceType().cStr(), spot);
      pricePerHour += price.value_or(0);
      if (!price) unpriced.push_back(n.instanceType().cStr());
      instances.push_back({{"host", n.host().cStr()},
                           {"group", n.group().cStr()},
                           {"instance_type", n.instanceType().cStr()},
                           {"vcpus", n.vcpus()}});
    }
    double stepMs = steps ? 1000 * seconds / steps : 0;
    double rate = seconds > 0 ? samples / seconds : 0;
    double waitShare = seconds > 0 ? wait / seconds : 0;
    double cost = pricePerHour / 3600 * stepMs / 1000 * 1000;
    printf("\n%-22s %s\n", "mean step", (fmt("%.1f", stepMs) + " ms").c_str());
    printf("%-22s %s\n", "samples/s", fmt("%.0f", rate).c_str());
    printf("%-22s %s\n", "trainer data wait", (fmt("%.1f", 100 * waitShare) + " %").c_str());
    printf("%-22s %s\n", "cluster price",
           ("$" + fmt("%.3f", pricePerHour) + "/h" + (spot ? " (spot)" : "")).c_str());
    for (auto& t : unpriced) {
      printf("%-22s no %s price for %s: counted as $0\n", "", spot ? "spot" : "on-demand",
             t.c_str());
    }
    printf("%-22s %s\n", "cost per 1,000 steps", ("$" + fmt("%.4f", cost)).c_str());
    auto cpu = r.getCpu();
    double perBatch = cpu.getBatches() ? 1000.0 / cpu.getBatches() : 0;
    printf("%-22s %s\n", "trainer CPU per batch",
           (fmt("%.3f", cpu.getLoopSeconds() * perBatch) + " ms receiving, " +
            fmt("%.2f", cpu.getProcessSeconds() * perBatch) + " ms in all")
               .c_str());

    // The sizing advisor's inputs (advise.h), and its recommendation from them.
    nlohmann::json rates = nullptr;
    std::string noAdvice;
    if (steps == 0 || stepSeconds <= 0) {
      noAdvice = "no training steps were measured";
    } else if (st.seconds <= 0 || st.images == 0) {
      noAdvice = "no augmenter answered stats() with augmentation time";
    } else {
      double bytesPerBatch = st.batches ? double(st.bytes) / st.batches : 0;
      // The CPU trainer's compute is its step thread's CPU time: its wall time also holds what
      // augmenters on the same CPUs took from it (no data group). A GPU trainer's is wall time.
      bool onCpu = std::string(r.getDevice().cStr()).find("using CPU") == 0;
      double computeSeconds = onCpu && stepCpuSeconds > 0 ? stepCpuSeconds : stepSeconds;
      // The trainer process's CPU per step once batches flow, without the augmenters that ran
      // in it (no data group): steps, evaluation, receiving.
      auto trainerCpu = r.getCpu();
      double trainerCpuMs = trainerCpu.getBatches()
                                ? 1000 *
                                      std::max(0.0, trainerCpu.getSteadyProcessSeconds() -
                                                        st.secondsBesideTrainer) /
                                      trainerCpu.getBatches()
                                : 0;
      rates = {{"augment_images_per_vcpu_second", st.images / st.seconds},
               {"augmented_images", st.images},
               {"augmenters_answered", st.answered},
               {"augmenters_lost", st.lost},
               {"compute_step_ms", 1000 * computeSeconds / steps},
               {"step_wall_ms", 1000 * stepSeconds / steps},
               {"trainer_cpu_ms_per_step", trainerCpuMs},
               {"fill_ms_per_epoch", epochCount ? 1000 * fill / epochCount : 0},
               {"load_ms_per_augmenter", st.answered ? 1000 * st.loadSeconds / st.answered : 0},
               {"epochs", epochCount},
               {"steps_per_epoch", epochCount ? double(steps) / epochCount : 0},
               {"other_ms_per_step",
                std::max(0.0, 1000 * (seconds - stepSeconds - wait) / steps)},
               {"stream_bytes_per_s", seconds > 0 ? steps * bytesPerBatch / seconds : 0},
               {"bytes_per_batch", bytesPerBatch},
               {"batch_size", s_.batchSize},
               {"trainer_on_cpu", onCpu},
               {"augmenters_per_node", s_.perNode},
               {"augment", s_.augment},
               {"blur", s_.augmentConfig.blurKernel},
               {"cpu_scale", cpuScale()},
               {"dnn_group", s_.dnnGroup},
               {"data_group", s_.dataGroup}};
    }
    nlohmann::json advice = nullptr;
    if (!rates.is_null()) {
      nlohmann::json partial = {{"rates", rates},
                                {"instances", instances},
                                {"mean_step_ms", stepMs},
                                {"data_wait_fraction", waitShare},
                                {"pricing", s_.pricing}};
      try {
        namespace adv = hetero_train::advise;
        auto m = adv::fromReport(partial);
        std::vector<std::string> types = {"ml.c5.xlarge", "ml.c5.2xlarge", "ml.c5.4xlarge",
                                          "ml.c5.9xlarge", "ml.c5.18xlarge"};
        if (!m.dataType.empty() &&
            std::find(types.begin(), types.end(), m.dataType) == types.end() &&
            troupe::sched::findInstanceType(m.dataType)) {
          types.push_back(m.dataType);
        }
        auto a = adv::recommend(m, adv::candidates(types, std::max(4u, m.dataCount)), s_.prices);
        printf("\nsizing advice (troupe advise REPORT.json for other types and counts):\n%s",
               adv::table(a).c_str());
        for (auto& row : a.rows) {
          if (row.candidate.count != 0 || m.dataCount == 0) continue;
          printf("homogeneous (%s alone, augmenting on its own vCPUs) would be %.1f ms/step, "
                 "$%.4f per 1k steps (predicted)\n",
                 m.dnnType.c_str(), row.stepMs, row.costPer1000);
        }
        advice = adv::toJson(a);
      } catch (const hetero_train::advise::AdviseError& e) {
        noAdvice = e.what();
      }
    }
    if (!noAdvice.empty()) printf("\nno sizing advice: %s\n", noAdvice.c_str());
    auto changes = job_.membershipChanges();
    if (!changes.empty()) {
      printf("\nmembership changes during the job:\n");
      for (auto& m : changes) printf("  %s\n", m.c_str());
    }
    fflush(stdout);
    end_->reported = true;  // the end callback has nothing to add (a report that cannot be
                            // written fails the job, and says so)
    if (!s_.report.empty()) {
      nlohmann::json placements = nlohmann::json::array();
      for (auto& p : placed_) {
        placements.push_back(
            {{"actor", p.actor}, {"type", p.type}, {"host", p.host}, {"group", p.group}});
      }
      nlohmann::json j = {{"placements", placements},
                          {"instances", instances},
                          {"epochs", epochs},
                          {"device", r.getDevice().cStr()},
                          {"mean_step_ms", stepMs},
                          {"samples_per_s", rate},
                          {"data_wait_fraction", waitShare},
                          {"cost_per_1000_steps_usd", cost},
                          {"pricing", s_.pricing},
                          {"cluster_price_per_hour_usd", pricePerHour},
                          {"resumed_from", resumed},
                          {"checkpoints_written", c.getWritten()},
                          {"checkpoint_write_seconds", c.getWriteSeconds()},
                          {"trainer_cpu",
                           {{"batches", cpu.getBatches()},
                            {"copied_batches", cpu.getCopiedBatches()},
                            {"receive_ms_per_batch", cpu.getLoopSeconds() * perBatch},
                            {"process_ms_per_batch", cpu.getProcessSeconds() * perBatch},
                            {"handoffs", cpu.getHandoffs()},
                            {"handoff_us_per_batch",
                             cpu.getHandoffs() ? 1e6 * cpu.getHandoffSeconds() / cpu.getHandoffs()
                                               : 0.0}}},
                          {"rates", rates},
                          {"advice", advice},
                          {"membership", changes},
                          {"dataset", dataset},
                          {"skipped_files", skippedFiles},
                          {"warned_files", warnedFiles},
                          {"exit_status", 0}};
      hetero_train::writeReport(s_.report, j.dump(2) + "\n");
    }
  }

  // CPUs of this machine per vCPU: troupe sim's CPU budget (TROUPE_CPU_SCALE), else 1 (a real
  // instance's vCPU is one of its CPUs).
  static double cpuScale() {
    const char* text = getenv("TROUPE_CPU_SCALE");
    if (text == nullptr || *text == '\0') return 1;
    char* end = nullptr;
    double scale = strtod(text, &end);
    return *end == '\0' && scale > 0 && scale <= 64 ? scale : 1;
  }

  troupe::Driver& job_;
  Settings s_;
  uint64_t samples_ = 0;
  std::vector<Placed> placed_;
  // What the job's end reports when the job ends before report() (a stop, a failure).
  std::shared_ptr<hetero_train::EndState> end_ = std::make_shared<hetero_train::EndState>();
  std::deque<troupe::Ref<hetero::Augmenter>> augmenters_;  // every one, joined nodes' too
  struct Quiet : kj::TaskSet::ErrorHandler {
    void taskFailed(kj::Exception&& e) override {
      printf("could not place augmenters on a node that joined: %s\n", e.getDescription().cStr());
      fflush(stdout);
    }
  } quiet_;
  kj::TaskSet tasks_{quiet_};
  bool live_ = isatty(STDOUT_FILENO);  // a terminal: one progress line, redrawn
};

}  // namespace

int main(int argc, char* argv[]) {
  // The CPU trainer's OpenMP threads must sleep when idle, or they spin on the cores BLAS and the
  // augmenters need (measured here: 86 ms/step instead of 211). libgomp reads the setting before
  // main() runs, so set it and start again.
  // One OpenMP thread: the model's elementwise work is small, and the setting must reach the pool
  // threads that run the training steps (omp_set_num_threads() would only reach the caller's).
  if (getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "passive", 1);
    setenv("OMP_NUM_THREADS", "1", 0);
    // A stop that came already, or comes during the exec, is pending for the new image
    // (troupe/loop.h).
    troupe::blockStopSignalsForExec();
    execv("/proc/self/exe", argv);
    troupe::holdStopSignals();  // the exec failed: this image goes on
  }
  auto settings = parseSettings(argc, argv);
  troupe::Registry types;
  troupe::train::addActorTypes(types);  // train.Augmenter and train.Trainer
  troupe::RunOptions options;
  options.headGroup = settings.dnnGroup;  // the head fate-shares with the trainer
  return troupe::run(
      argc, argv, types,
      [settings](troupe::Driver& job) mutable {
        auto j = kj::heap<Job>(job, settings);
        auto& ref = *j;
        return ref.run().promise().attach(kj::mv(j));
      },
      options);
}

