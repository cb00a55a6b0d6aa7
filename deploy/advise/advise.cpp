#include "advise.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>

#include "troupe/sched/instance_types.h"

namespace hetero_train::advise {

namespace {

using nlohmann::json;

// A prediction that needs more batch bytes/s than this many times the run's own is beyond what
// the run showed the stream can carry: marked, not refused.
constexpr double kStreamMargin = 1.5;

const char* kWrittenBy =
    "hetero_train --report writes it from the advisor's version on (the 'rates' object); "
    "run hetero_train again with --report FILE";

const json& field(const json& j, const std::string& path, const std::string& name) {
  if (!j.is_object() || !j.contains(name) || j.at(name).is_null()) {
    throw AdviseError("the report has no '" + path + name + "': " + kWrittenBy);
  }
  return j.at(name);
}

double number(const json& j, const std::string& path, const std::string& name, bool positive) {
  auto& v = field(j, path, name);
  if (!v.is_number() || v.get<double>() < 0 || (positive && v.get<double>() == 0)) {
    throw AdviseError("the report's '" + path + name + "' is " + v.dump() + ", not a number " +
                      (positive ? "> 0" : ">= 0") + ": " + kWrittenBy);
  }
  return v.get<double>();
}

std::string fmt(const char* format, double v) {
  char buf[64];
  snprintf(buf, sizeof(buf), format, v);
  return buf;
}

std::string countText(double v) {
  return std::fabs(v - std::round(v)) < 1e-9 ? fmt("%.0f", v) : fmt("%.2f", v);
}

}  // namespace

Measured fromReport(const json& report) {
  if (!report.is_object()) throw AdviseError("the report is not a JSON object");
  Measured m;
  auto& rates = field(report, "", "rates");
  m.augmentImagesPerVcpuSecond = number(rates, "rates.", "augment_images_per_vcpu_second", true);
  m.computeStepMs = number(rates, "rates.", "compute_step_ms", true);
  m.otherMsPerStep = number(rates, "rates.", "other_ms_per_step", false);
  m.trainerCpuMsPerStep = number(rates, "rates.", "trainer_cpu_ms_per_step", false);
  m.fillMsPerEpoch = number(rates, "rates.", "fill_ms_per_epoch", false);
  m.stepsPerEpoch = number(rates, "rates.", "steps_per_epoch", true);
  m.loadMsPerAugmenter = number(rates, "rates.", "load_ms_per_augmenter", false);
  m.epochs = unsigned(number(rates, "rates.", "epochs", true));
  m.streamBytesPerSecond = number(rates, "rates.", "stream_bytes_per_s", true);
  m.bytesPerBatch = number(rates, "rates.", "bytes_per_batch", true);
  m.batchSize = unsigned(number(rates, "rates.", "batch_size", true));
  auto& onCpu = field(rates, "rates.", "trainer_on_cpu");
  if (!onCpu.is_boolean()) throw AdviseError("the report's 'rates.trainer_on_cpu' is not true/false");
  m.trainerOnCpu = onCpu.get<bool>();
  m.augmentersPerNode = unsigned(number(rates, "rates.", "augmenters_per_node", false));
  // Reports from before the CPU budgets of troupe sim have none: a vCPU was a CPU.
  if (rates.contains("cpu_scale") && !rates.at("cpu_scale").is_null()) {
    m.cpuScale = number(rates, "rates.", "cpu_scale", true);
  }
  auto& dnnGroup = field(rates, "rates.", "dnn_group");
  auto& dataGroup = field(rates, "rates.", "data_group");
  m.measuredStepMs = number(report, "", "mean_step_ms", true);
  m.measuredWaitShare = number(report, "", "data_wait_fraction", false);
  m.spot = report.value("pricing", "on-demand") == "spot";
  auto& instances = field(report, "", "instances");
  if (!instances.is_array()) throw AdviseError("the report's 'instances' is not a list");
  m.dnnCount = 0;
  for (size_t i = 0; i < instances.size(); ++i) {
    auto path = "instances[" + std::to_string(i) + "].";
    auto& in = instances[i];
    auto group = field(in, path, "group").get<std::string>();
    auto type = field(in, path, "instance_type").get<std::string>();
    unsigned vcpus = unsigned(number(in, path, "vcpus", true));
    if (group == dnnGroup) {
      m.dnnType = type;
      m.dnnVcpus = vcpus;
      ++m.dnnCount;
    } else if (group == dataGroup) {
      m.dataType = type;
      m.dataVcpus = vcpus;
      ++m.dataCount;
    }
  }
  if (m.dnnCount == 0) {
    // A homogeneous run: the trainer and the augmenters shared the head's instances.
    if (instances.empty()) throw AdviseError("the report's 'instances' is empty");
    m.dnnType = instances[0].at("instance_type").get<std::string>();
    m.dnnVcpus = unsigned(instances[0].at("vcpus").get<double>());
    m.dnnCount = 1;
    m.dataType.clear();
    m.dataCount = 0;
  }
  m.cluster = std::to_string(m.dnnCount) + " x " + m.dnnType + " (" + std::to_string(m.dnnVcpus) +
              " vCPUs)";
  if (m.dataCount) {
    m.cluster += " + " + std::to_string(m.dataCount) + " x " + m.dataType + " (" +
                 countText(m.dataVcpus) + " vCPUs)";
  }
  return m;
}

void setDnnType(Measured& m, const std::string& type) {
  auto t = troupe::sched::findInstanceType(type);
  if (!t) {
    throw AdviseError("--dnn-type: instance type '" + type +
                      "' is not in troupe's instance table (docs/scheduler.md lists it)");
  }
  m.dnnType = type;
  m.dnnVcpus = t->vcpus;
  m.dnnCount = 1;
}

Measured loadReport(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw AdviseError("report '" + path + "' cannot be read (no such file, or no access)");
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    throw AdviseError("report '" + path + "' is not JSON: " + e.what());
  }
  try {
    return fromReport(j);
  } catch (const AdviseError& e) {
    throw AdviseError("report '" + path + "': " + e.what());
  }
}

Row predict(const Measured& m, const Candidate& c, const Prices& prices) {
  Row r;
  r.candidate = c;
  // CPU milliseconds one batch costs an augmenter (gathering, augmenting, building the push).
  double augMs = 1000.0 * m.batchSize / m.augmentImagesPerVcpuSecond;
  // How many CPUs of an instance augment at once: one augmenter per vCPU, or as many as the
  // run's --augmenters-per-node, each at most one CPU, all together at most the instance's CPUs
  // (its vCPUs times the CPU per vCPU).
  auto augmenting = [&](double vcpus) {
    double cpus = vcpus * m.cpuScale;
    return m.augmentersPerNode ? std::min<double>(m.augmentersPerNode, cpus) : cpus;
  };
  // The trainer's step loop is serial: a step (compute only) and the evaluation's share, at
  // best. Its instance's CPUs must also hold the trainer process's other work (receiving,
  // decoding, evaluating), and without a data group the augmentation too.
  double serialMs = m.computeStepMs + m.otherMsPerStep;
  double dnnVcpus = std::max(1u, m.dnnVcpus);
  double dnnCpus = dnnVcpus * m.cpuScale;
  double busyMs;
  if (c.count == 0) {
    r.dataMs = augMs / augmenting(dnnVcpus);
    r.trainerMs = std::max(serialMs, m.trainerCpuMsPerStep / dnnCpus);
    busyMs = std::max({serialMs, r.dataMs, (m.trainerCpuMsPerStep + augMs) / dnnCpus});
  } else {
    // With a data group every augmenter runs on it (hetero_train places them with
    // prefer(data_group)); augmentation scales with its vCPUs.
    r.dataMs = augMs / (c.count * augmenting(c.vcpus));
    r.trainerMs = std::max(serialMs, m.trainerCpuMsPerStep / dnnCpus);
    busyMs = std::max(r.trainerMs, r.dataMs);
  }
  // Each epoch starts by waiting for its first batch: as measured, but for the shards' loading
  // (single-threaded, once per run), which takes longer on an instance smaller than a CPU.
  auto loadVcpus = [&](double vcpus) { return std::min(1.0, std::max(vcpus * m.cpuScale, 0.01)); };
  double runVcpus = loadVcpus(m.dataCount ? m.dataVcpus : m.dnnVcpus);
  double candidateVcpus = loadVcpus(c.count ? c.vcpus : m.dnnVcpus);
  double fillPerEpoch =
      std::max(0.0, m.fillMsPerEpoch + m.loadMsPerAugmenter / std::max(1u, m.epochs) *
                                           (1 / candidateVcpus - 1 / runVcpus));
  double fillMs = m.stepsPerEpoch > 0 ? fillPerEpoch / m.stepsPerEpoch : 0;
  r.stepMs = busyMs + fillMs;
  r.waitShare = (std::max(0.0, busyMs - r.trainerMs) + fillMs) / r.stepMs;
  r.streamBytesPerSecond = m.bytesPerBatch / (r.stepMs / 1000.0);
  r.beyondStream = r.streamBytesPerSecond > kStreamMargin * m.streamBytesPerSecond;
  auto price = [&](const std::string& type) {
    auto p = prices.perHour(type, m.spot);
    if (!p) r.priced = false;
    return p.value_or(0);
  };
  r.pricePerHour = m.dnnCount * price(m.dnnType) + (c.count ? c.count * price(c.type) : 0);
  r.costPer1000 = r.pricePerHour * r.stepMs / 3600.0;  // $/h * (1000 steps * ms/step / 1000) s
  return r;
}

std::vector<Candidate> candidates(const std::vector<std::string>& types, unsigned maxCount) {
  std::vector<std::string> names = types;
  if (names.empty()) {
    for (auto& t : troupe::sched::knownInstanceTypes()) {
      if (t.name.rfind("ml.c5.", 0) == 0) names.emplace_back(t.name);
    }
  }
  std::vector<Candidate> out;
  out.push_back({"", 0, 0});
  for (auto& name : names) {
    auto t = troupe::sched::findInstanceType(name);
    if (!t) {
      throw AdviseError("--types: instance type '" + name +
                        "' is not in troupe's instance table (docs/scheduler.md lists it); use "
                        "a name such as ml.c5.9xlarge");
    }
    for (unsigned n = 1; n <= maxCount; ++n) out.push_back({name, n, double(t->vcpus)});
  }
  return out;
}

Advice recommend(const Measured& m, const std::vector<Candidate>& cs, const Prices& prices) {
  Advice a;
  a.measured = m;
  for (auto& c : cs) {
    a.rows.push_back(predict(m, c, prices));
    auto& r = a.rows.back();
    r.measured = m.whatIf.empty() && ((c.count == 0 && m.dataCount == 0) ||
                 (c.count == m.dataCount && c.type == m.dataType && c.count > 0));
  }
  auto fewer = [](const Row& x, const Row& y) {
    return x.candidate.count * x.candidate.vcpus < y.candidate.count * y.candidate.vcpus;
  };
  Row* fastest = nullptr;
  Row* cheapest = nullptr;
  for (auto& r : a.rows) {
    // Within a microsecond counts as a tie: the smaller group wins it.
    if (!fastest || r.stepMs < fastest->stepMs - 1e-3 ||
        (std::fabs(r.stepMs - fastest->stepMs) <= 1e-3 && fewer(r, *fastest)))
      fastest = &r;
    if (r.priced && (!cheapest || r.costPer1000 < cheapest->costPer1000 - 1e-9 ||
                     (std::fabs(r.costPer1000 - cheapest->costPer1000) <= 1e-9 &&
                      fewer(r, *cheapest))))
      cheapest = &r;
  }
  if (fastest) fastest->fastest = true;
  if (cheapest) cheapest->cheapest = true;
  return a;
}

std::vector<std::string> assumptions(const Measured& m) {
  std::vector<std::string> out = {
      "augmentation scales with vCPUs: every augmenting vCPU of a candidate does the run's " +
          fmt("%.0f", m.augmentImagesPerVcpuSecond) +
          " images per CPU-second (gathering, augmenting and sending; the same CPU generation as "
          "the run's)",
      "the trainer's step loop is serial: a step is at least its compute (" +
          fmt("%.2f", m.computeStepMs) + " ms, measured) plus evaluation and checkpoints (" +
          fmt("%.2f", m.otherMsPerStep) + " ms per step, measured), whatever the data group",
      "the trainer process's other CPU work (" + fmt("%.2f", m.trainerCpuMsPerStep) +
          " ms per step in all, measured: receiving, evaluating" +
          (m.trainerOnCpu ? ", the CPU steps" : "") +
          ") shares the dnn instance's vCPUs; with no data group the augmentation shares them too",
      "with a data group every augmenter runs on it (prefer(data_group), as in the run): the dnn "
      "instance's vCPUs do not augment",
      "each epoch first waits for its first batch as long as the run did (" +
          fmt("%.0f", m.fillMsPerEpoch) + " ms per epoch), but for loading the shards (" +
          fmt("%.0f", m.loadMsPerAugmenter) +
          " ms of CPU per augmenter, once), which an instance smaller than one CPU does slower",
      "the stream is not the limit up to " + fmt("%.1f", kStreamMargin) + "x the run's " +
          fmt("%.1f", m.streamBytesPerSecond / 1e6) +
          " MB/s of batches; rows needing more are marked '>stream' (not shown by the run)",
  };
  if (m.augmentersPerNode) {
    out.push_back("augmenters per node: " + std::to_string(m.augmentersPerNode) +
                  " (as the run's --augmenters-per-node): a node augments on at most that many "
                  "vCPUs");
  }
  out.push_back(
      "prices: the instance table's on-demand prices, or --prices FILE's; cost per 1,000 steps = "
      "cluster $/h x predicted step time");
  if (m.cpuScale != 1) {
    out.push_back("every vCPU is " + fmt("%.3g", m.cpuScale) +
                  " of a CPU of the run's machine, as in the run (troupe sim's CPU budget): the "
                  "rows predict that emulated cluster; --cpu-scale 1 predicts instances whose "
                  "vCPU is a whole CPU of it");
  }
  return out;
}

std::string table(const Advice& a) {
  auto& m = a.measured;
  std::string out;
  out += "measured: " + m.cluster + ": step " + fmt("%.1f", m.measuredStepMs) + " ms, data wait " +
         fmt("%.1f", 100 * m.measuredWaitShare) + " %" +
         (m.cpuScale != 1 ? ", " + fmt("%.3g", m.cpuScale) + " CPU per vCPU" : std::string()) +
         "\n";
  if (!m.whatIf.empty()) out += "what if: " + m.whatIf + "\n";
  out += "rates: augmentation " + fmt("%.0f", m.augmentImagesPerVcpuSecond) +
         " images/s per vCPU, compute-only step " + fmt("%.2f", m.computeStepMs) +
         " ms, other " + fmt("%.2f", m.otherMsPerStep) + " ms/step, trainer CPU " +
         fmt("%.2f", m.trainerCpuMsPerStep) + " ms/step, first batch " +
         fmt("%.0f", m.fillMsPerEpoch) + " ms/epoch (loading " +
         fmt("%.0f", m.loadMsPerAugmenter) + " ms), stream " +
         fmt("%.1f", m.streamBytesPerSecond / 1e6) + " MB/s\n\n";
  char line[256];
  snprintf(line, sizeof(line), "%-16s %5s %6s %10s %10s %10s %12s  %s\n", "data group", "count",
           "vCPUs", "step ms", "data wait", "$/hour", "$/1k steps", "");
  out += line;
  for (auto& r : a.rows) {
    std::string marks;
    if (r.cheapest) marks += " cheapest";
    if (r.fastest) marks += " fastest";
    if (r.measured) marks += " (measured: " + fmt("%.1f", m.measuredStepMs) + " ms)";
    if (r.beyondStream) marks += " >stream";
    if (!r.priced) marks += " (no price for an instance: counted as $0)";
    auto& c = r.candidate;
    snprintf(line, sizeof(line), "%-16s %5u %6s %10.1f %9.1f%% %10.3f %12.4f %s\n",
             c.count ? c.type.c_str() : "(none)", c.count,
             c.count ? countText(c.count * c.vcpus).c_str() : "-", r.stepMs, 100 * r.waitShare,
             r.pricePerHour, r.costPer1000, marks.c_str());
    out += line;
  }
  out += "\nthe model assumes:\n";
  for (auto& s : assumptions(m)) out += "  - " + s + "\n";
  return out;
}

json toJson(const Advice& a) {
  auto& m = a.measured;
  json rows = json::array();
  for (auto& r : a.rows) {
    rows.push_back({{"data_type", r.candidate.count ? json(r.candidate.type) : json(nullptr)},
                    {"data_count", r.candidate.count},
                    {"data_vcpus", r.candidate.count * r.candidate.vcpus},
                    {"step_ms", r.stepMs},
                    {"data_ms_per_batch", r.dataMs},
                    {"trainer_ms_per_step", r.trainerMs},
                    {"stream_bytes_per_s_needed", r.streamBytesPerSecond},
                    {"data_wait_fraction", r.waitShare},
                    {"price_per_hour_usd", r.pricePerHour},
                    {"priced", r.priced},
                    {"cost_per_1000_steps_usd", r.costPer1000},
                    {"beyond_measured_stream", r.beyondStream},
                    {"cheapest", r.cheapest},
                    {"fastest", r.fastest},
                    {"measured", r.measured}});
  }
  return {{"measured",
           {{"cluster", m.cluster},
            {"dnn_type", m.dnnType},
            {"dnn_count", m.dnnCount},
            {"dnn_vcpus", m.dnnVcpus},
            {"data_type", m.dataCount ? json(m.dataType) : json(nullptr)},
            {"data_count", m.dataCount},
            {"data_vcpus", m.dataVcpus},
            {"step_ms", m.measuredStepMs},
            {"data_wait_fraction", m.measuredWaitShare},
            {"augment_images_per_vcpu_second", m.augmentImagesPerVcpuSecond},
            {"compute_step_ms", m.computeStepMs},
            {"other_ms_per_step", m.otherMsPerStep},
            {"trainer_cpu_ms_per_step", m.trainerCpuMsPerStep},
            {"fill_ms_per_epoch", m.fillMsPerEpoch},
            {"load_ms_per_augmenter", m.loadMsPerAugmenter},
            {"steps_per_epoch", m.stepsPerEpoch},
            {"stream_bytes_per_s", m.streamBytesPerSecond},
            {"pricing", m.spot ? "spot" : "on-demand"},
            {"cpu_scale", m.cpuScale},
            {"what_if", m.whatIf.empty() ? json(nullptr) : json(m.whatIf)}}},
          {"rows", rows},
          {"assumptions", assumptions(m)}};
}

}  // namespace hetero_train::advise
