#include "verdict.h"

#include "digest.h"
#include "sim_lines.h"

#include <signal.h>
#include <string.h>

#include <cstdio>
#include <troupe/exit_codes.h>

namespace faults {

const char* outcomeName(Outcome o) {
  switch (o) {
    case Outcome::PASS:
      return "pass";
    case Outcome::NO_FAILURE_FILE:
      return "no-failure-file";
    case Outcome::WRONG_EXIT:
      return "wrong-exit";
    case Outcome::SAMPLES_LOST:
      return "samples-lost";
    case Outcome::HANG:
      return "hang";
    case Outcome::CRASH:
      return "crash";
    case Outcome::NO_START:
      return "no-start";
    case Outcome::LATE:
      return "late";
    case Outcome::NOT_INJECTED:
      return "not-injected";
    case Outcome::SKIPPED:
      return "skipped";
  }
  return "?";
}

const std::vector<Outcome>& allOutcomes() {
  static const std::vector<Outcome> all = {
      Outcome::PASS,         Outcome::WRONG_EXIT,      Outcome::CRASH,    Outcome::HANG,
      Outcome::SAMPLES_LOST, Outcome::NO_FAILURE_FILE, Outcome::NO_START, Outcome::LATE,
      Outcome::NOT_INJECTED, Outcome::SKIPPED};
  return all;
}

namespace {

std::string codeText(int code) {
  if (code < 0) return "(never exited)";
  if (code > 128 && code < 128 + 65) {
    const char* abbrev = sigabbrev_np(code - 128);
    return std::to_string(code) + " (SIG" + (abbrev ? abbrev : "?") + ")";
  }
  return std::to_string(code) + " (" + troupe::exitCodeName(code) + ")";
}

std::string allowedText(const std::set<int>& codes) {
  if (codes.empty()) return "any code but a crash";
  std::string out;
  for (int c : codes) out += (out.empty() ? "" : " or ") + codeText(c);
  return out;
}

bool isCrash(int code) {
  // abort, segfault, and their kin: SIGILL, SIGBUS, SIGFPE
  return code == 128 + SIGABRT || code == 128 + SIGSEGV || code == 128 + SIGILL ||
         code == 128 + SIGBUS || code == 128 + SIGFPE;
}

std::string label(const InstanceEnd& e) {
  auto who = e.role == "head" ? "head " : e.role == "victim" ? "data instance " : "worker ";
  return who + e.instance.host + " (" + e.instance.group + ")";
}

const RoleExpect& expectOf(const Case& c, const InstanceEnd& e) {
  if (e.role == "head") return c.expect.head;
  return e.role == "victim" ? c.expect.victim : c.expect.workers;
}

}  // namespace

std::string expectedDigestText(uint64_t samples) {
  return test_digest::everyIdOnce(samples);
}

namespace {

std::string seconds(double s) {
  char buf[32];
  snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

class Judge {
 public:
  Judge(const Case& c, const Observation& obs) : c_(c), obs_(obs) {}

  std::vector<Check> run() {
    if (!obs_.notStarted.empty()) {
      add(Outcome::NO_START,
          "training must start (a case proves nothing without it): " + obs_.notStarted, false);
      return checks_;
    }
    const char* stage =
        c_.setting.when == When::TRAINING ? "while training runs (it came after 'job finished')"
        : c_.setting.when == When::STARTING
            ? "before the instance it hits joined, or before the first step (it came after)"
            : "between 'cluster formed' and the first step (it came after)";
    add(Outcome::LATE,
        std::string("the fault must land ") + stage + ", else the case proves nothing (" +
            obs_.moment + ")",
        !obs_.late);
    std::string missing;
    for (auto& step : obs_.notInjected) missing += (missing.empty() ? "" : "; ") + step;
    add(Outcome::NOT_INJECTED,
        "every step of the injection must happen (else the case proves nothing): " +
            (missing.empty() ? std::string("all did") : "failed: " + missing),
        missing.empty());
    for (auto& e : obs_.instances) instance(e);
    sanitizers();
    sim();
    samples();
    return checks_;
  }

 private:
  void add(Outcome kind, std::string promise, bool ok) {
    checks_.push_back({kind, std::move(promise), ok});
  }

  std::string after() const { return "after " + obs_.plan + ", "; }

  void instance(const InstanceEnd& e) {
    auto& want = expectOf(c_, e);
    add(Outcome::CRASH,
        "no crash (docs/exit-codes.md: never 134 or 139): " + after() + label(e) + " exited " +
            codeText(e.code),
        !isCrash(e.code));
    bound(label(e), e.goneS, want.withinS);
    if (e.code < 0) {
      // Gone, but no word from the OS of how: the case cannot say it ended as promised.
      if (e.goneS) {
        add(Outcome::WRONG_EXIT,
            "exit status from the OS (troupe sim's exit-status file, or reaped here): " + label(e) +
                " is gone but its status is unknown" +
                (e.codeFrom.empty() ? std::string(" (no exit-status file)") : ": " + e.codeFrom),
            false);
      }
      return;
    }
    bool allowed = want.codes.empty() ? !isCrash(e.code) : want.codes.count(e.code) > 0;
    add(Outcome::WRONG_EXIT,
        "exit code (docs/exit-codes.md): " + after() + label(e) + " must exit " +
            allowedText(want.codes) + " (" + c_.expect.why + "); it exited " + codeText(e.code),
        allowed);
    if (e.code != 0 && e.code != 128 + SIGKILL) {
      add(Outcome::NO_FAILURE_FILE,
          "failure file (docs/exit-codes.md): " + label(e) + " exited " + codeText(e.code) +
              ", so " + e.instance.host + "/output/failure must say why; it is " +
              (e.failure.empty() ? "missing or empty" : "there"),
          !e.failure.empty());
      if (!e.failure.empty()) failureSays(e);
    }
  }

  // The failure file names the code the instance really exited with, and a reason of its kind.
  void failureSays(const InstanceEnd& e) {
    auto stamp = "exit code " + std::to_string(e.code) + " (" + troupe::exitCodeName(e.code) + ")";
    auto firstLine = e.failure.substr(0, e.failure.find('\n'));
    add(Outcome::NO_FAILURE_FILE,
        "failure file (docs/exit-codes.md): " + label(e) + "'s must say '" + stamp +
            "'; it says '" + e.failure.substr(0, 300) + "'",
        e.failure.find(stamp) != std::string::npos);
    std::vector<std::string> words;
    if (e.code == troupe::HEAD_LOST) words = {"head"};
    if (e.code == troupe::FENCED) words = {"lost", "frozen", "fenced", "cut"};
    if (e.code == troupe::INTERRUPTED) words = {"SIGTERM", "SIGINT"};
    if (e.code == troupe::JOIN_FAILED) words = {"did not form", "missing"};
    if (words.empty()) return;
    bool said = false;
    std::string list;
    for (auto& w : words) {
      said = said || firstLine.find(w) != std::string::npos;
      list += (list.empty() ? "'" : " or '") + w + "'";
    }
    add(Outcome::NO_FAILURE_FILE,
        "failure file (docs/exit-codes.md): the reason " + label(e) + " gives for " + stamp +
            " must name its cause (" + list + "); its first line is '" + firstLine + "'",
        said);
  }

  // Under `make test-sanitize` a finding ends its process with a plain exit code: the report in
  // the output is what makes it a crash.
  void sanitizers() {
    std::string first;
    for (auto marker : {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer", ": runtime error: "}) {
      auto at = obs_.output.find(marker);
      if (at == std::string::npos) continue;
      auto start = obs_.output.rfind('\n', at);
      start = start == std::string::npos ? 0 : start + 1;
      first = obs_.output.substr(start, obs_.output.find('\n', at) - start);
      break;
    }
    add(Outcome::CRASH,
        "no sanitizer report (make test-sanitize): " +
            (first.empty() ? std::string("there is none") : "the output has '" + first + "'"),
        first.empty());
  }

  void bound(const std::string& who, const std::optional<double>& goneS, int withinS) {
    add(Outcome::HANG,
        "bound (docs/lifecycle.md: no path leaves a process running): " + after() + who +
            " must be gone within " + std::to_string(withinS) + " s; " +
            (goneS ? "it was gone after " + seconds(*goneS) : "it still ran"),
        goneS && *goneS <= withinS);
  }

  void sim() {
    bound("troupe sim and everything it started", obs_.simGoneS, c_.expect.withinS);
    add(Outcome::CRASH, "no crash: troupe sim exited " + codeText(obs_.simCode),
        !isCrash(obs_.simCode));
    add(Outcome::WRONG_EXIT,
        "sim linger (docs/exit-codes.md): troupe sim never SIGTERMs instances while the head "
        "still runs; " +
            (obs_.simTermedLiveHead
                 ? std::string("it printed '... ") + sim::kLingerSigterm + "' while the head ran"
                 : std::string("it did not")),
        !obs_.simTermedLiveHead);
    // The job's outcome as SageMaker judges it: every host's final code.
    const auto* head = obs_.head();
    int judged = head ? head->code : -1;
    std::string whose = "the head's";
    if (judged == 0) {
      for (auto& e : obs_.instances) {
        if (e.role == "head" || e.code == 0) continue;
        judged = e.code;
        whose = e.instance.host + "'s final";
        break;
      }
    }
    int want = c_.expect.sim.value_or(judged);
    if (obs_.simCode < 0 || want < 0) return;
    add(Outcome::WRONG_EXIT,
        "sim exit (docs/exit-codes.md): " + after() + "troupe sim must exit with " +
            (c_.expect.sim ? "" : "the job's outcome as the cloud judges it, " + whose + " ") +
            codeText(want) + "; it exited " + codeText(obs_.simCode),
        obs_.simCode == want);
    if (c_.expect.rejoins) rejoined();
  }

  void rejoined() {
    for (auto& e : obs_.instances) {
      if (e.role != "victim") continue;
      add(Outcome::WRONG_EXIT,
          "rejoin (docs/lifecycle.md): " + after() + label(e) +
              " must be started again and rejoin; it ran " + std::to_string(e.processes) +
              " process(es)",
          e.processes >= 2);
      auto placed = "augmenters placed on " + e.instance.host + " as it joined";
      add(Outcome::WRONG_EXIT,
          "rejoin (docs/lifecycle.md): the process that rejoined on " + e.instance.host +
              " gets work: the output must say '" + placed + "'",
          obs_.output.find(placed) != std::string::npos);
      // The head's line is printed before the trainer has the new sources; the trainer's own
      // line is the evidence that a batch came from the rejoined host.
      auto fed = "on " + e.instance.host + ", added as its node joined";
      add(Outcome::WRONG_EXIT,
          "rejoin (docs/lifecycle.md): the trainer gets batches from the process that rejoined "
          "on " + e.instance.host + ": its output must say 'first batch from ... " + fed + "'",
          obs_.output.find(fed) != std::string::npos);
      // Augmenters restarted outside the data group while it lacked room (on the trainer's
      // instance) go when the rejoined host brings the room back.
      bool moved = false;
      for (size_t at = obs_.output.find("restarting '"); at != std::string::npos && !moved;
           at = obs_.output.find("restarting '", at + 1)) {
        auto line = obs_.output.substr(at, obs_.output.find('\n', at) - at);
        moved = line.find("(train.Augmenter #") != std::string::npos &&
                line.find(" (data_group) (restart ") == std::string::npos;
      }
      if (moved) {
        auto back = "stopped as " + e.instance.host + " joined";
        add(Outcome::WRONG_EXIT,
            "rejoin (docs/lifecycle.md): augmenters restarted outside data_group while " +
                e.instance.host + " was away stop when it rejoins: the output must say '" +
                back + "'",
            obs_.output.find(back) != std::string::npos);
      }
    }
  }

  void samples() {
    const auto* head = obs_.head();
    if (!head || head->code != 0) return;
    std::string promise =
        "exactly-once (docs/hetero_train.md): the job completed after " + obs_.plan + ", so ";
    if (!obs_.report) {
      add(Outcome::SAMPLES_LOST, promise + "its report must list every epoch: " + obs_.reportError,
          false);
      return;
    }
    auto& epochs = *obs_.report;
    add(Outcome::SAMPLES_LOST,
        promise + "the report must have " + std::to_string(c_.setting.epochs) + " epochs; it has " +
            std::to_string(epochs.size()),
        epochs.size() == c_.setting.epochs);
    static const std::string want = expectedDigestText(kSamples);
    for (size_t i = 0; i < epochs.size(); ++i) {
      auto& e = epochs[i];
      add(Outcome::SAMPLES_LOST,
          promise + "epoch " + std::to_string(i + 1) + " must have " + std::to_string(kSamples) +
              " samples, 0 duplicates, 0 missing; it has " + std::to_string(e.samples) + ", " +
              std::to_string(e.duplicates) + ", " + std::to_string(e.missing),
          e.samples == kSamples && e.duplicates == 0 && e.missing == 0);
      add(Outcome::SAMPLES_LOST,
          promise + "epoch " + std::to_string(i + 1) +
              "'s digest of the ids trained on must be that of ids 0.." +
              std::to_string(kSamples - 1) + " once each, " + want + "; it is " + e.digest,
          e.digest == want);
    }
  }

  const Case& c_;
  const Observation& obs_;
  std::vector<Check> checks_;
};

}  // namespace

std::vector<Check> judge(const Case& c, const Observation& obs) {
  if (!obs.skipped.empty()) return {};
  return Judge(c, obs).run();
}

Outcome outcomeOf(const Observation& obs, const std::vector<Check>& checks) {
  if (!obs.skipped.empty()) return Outcome::SKIPPED;
  auto worst = Outcome::PASS;
  for (auto& c : checks) {
    if (!c.ok && c.failsAs > worst) worst = c.failsAs;
  }
  return worst;
}

std::string codesText(const Observation& obs) {
  std::string out;
  for (auto& e : obs.instances) {
    out += e.role + " " + e.instance.host + "=" + (e.code < 0 ? "?" : std::to_string(e.code)) + " ";
  }
  return out + "sim=" + (obs.simCode < 0 ? "?" : std::to_string(obs.simCode));
}

}  // namespace faults
