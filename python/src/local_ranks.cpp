#include "local_ranks.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "checkpoint.h"

namespace troupe::python {
namespace {

using train::ScriptLearner;

struct Closed : std::runtime_error {
  Closed() : std::runtime_error("the other process closed the socket") {}
};

// One answer or request, built in memory and written at once.
class Out {
 public:
  void u8(uint8_t v) { raw(&v, 1); }
  void u16(uint16_t v) { raw(&v, 2); }
  void u32(uint32_t v) { raw(&v, 4); }
  void u64(uint64_t v) { raw(&v, 8); }
  void i64(int64_t v) { raw(&v, 8); }
  void f64(double v) { raw(&v, 8); }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  void bytes(const void* p, size_t n) {
    u64(n);
    raw(p, n);
  }
  void send(int fd) {
    size_t done = 0;
    while (done < buf_.size()) {
      auto n = ::write(fd, buf_.data() + done, buf_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw Closed();
      done += size_t(n);
    }
    buf_.clear();
  }

 private:
  void raw(const void* p, size_t n) { buf_.append(static_cast<const char*>(p), n); }
  std::string buf_;
};

class In {
 public:
  explicit In(int fd) : fd_(fd) {}
  uint8_t u8() { return get<uint8_t>(); }
  uint16_t u16() { return get<uint16_t>(); }
  uint32_t u32() { return get<uint32_t>(); }
  uint64_t u64() { return get<uint64_t>(); }
  int64_t i64() { return get<int64_t>(); }
  double f64() { return get<double>(); }
  std::string str() {
    std::string s(u64(), '\0');
    read(s.data(), s.size());
    return s;
  }
  void read(void* p, size_t n) {
    auto* at = static_cast<char*>(p);
    while (n > 0) {
      auto got = ::read(fd_, at, n);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) throw Closed();
      at += got;
      n -= size_t(got);
    }
  }

 private:
  template <typename T>
  T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  int fd_;
};

void putItem(Out& out, ScriptLearner::Item& item) {
  out.u8(uint8_t(item.kind));
  out.u32(item.epoch);
  out.str(item.text);
  if (item.kind != ScriptLearner::Item::kBatch) return;
  auto& b = item.batch;
  out.u8(b.waited);
  out.u32(uint32_t(b.ids.size()));
  for (auto id : b.ids) out.u32(id);
  out.str(b.structure);
  out.u32(uint32_t(b.tensors.size()));
  for (auto& t : b.tensors) {
    out.str(t.dtype);
    out.u32(uint32_t(t.shape.size()));
    for (auto d : t.shape) out.i64(d);
    out.u64(t.offset);
    out.u64(t.bytes);
  }
  auto bytes = b.images.bytes();
  out.bytes(bytes.begin(), bytes.size());
}

ScriptLearner::Item getItem(In& in) {
  ScriptLearner::Item item;
  item.kind = ScriptLearner::Item::Kind(in.u8());
  item.epoch = in.u32();
  item.text = in.str();
  if (item.kind != ScriptLearner::Item::kBatch) return item;
  auto& b = item.batch;
  b.epoch = item.epoch;
  b.waited = in.u8() != 0;
  b.ids.resize(in.u32());
  for (auto& id : b.ids) id = in.u32();
  b.structure = in.str();
  b.tensors.resize(in.u32());
  for (auto& t : b.tensors) {
    t.dtype = in.str();
    t.shape.resize(in.u32());
    for (auto& d : t.shape) d = in.i64();
    t.offset = in.u64();
    t.bytes = in.u64();
  }
  // The bytes, read into a buffer of their own that the batch keeps (a copy, as Received makes of
  // bytes that did not arrive in a message).
  std::vector<kj::byte> bytes(in.u64());
  in.read(bytes.data(), bytes.size());
  b.images = Received::keep(capnp::Data::Reader(bytes.data(), bytes.size()));
  return item;
}

class LearnerFeed final : public Feed {
 public:
  explicit LearnerFeed(std::shared_ptr<ScriptLearner> learner) : learner_(std::move(learner)) {}
  ScriptLearner::Item next() override { return learner_->next(); }
  ScriptLearner::Peeked peek() override { return learner_->peek(); }
  std::string state() override { return learner_->state(); }
  uint32_t resumeFrom(const std::string& bytes, const std::string& name) override {
    return learner_->resumeFrom(bytes, name);
  }
  void begin() override { learner_->begin(); }
  void end(std::string failure) override { learner_->end(std::move(failure)); }
  void abandon(uint32_t epoch) override { learner_->abandon(epoch); }
  void handedOver(double seconds) override { learner_->handedOver(seconds); }
  train::Handoffs handoffs() override { return learner_->handoffs(); }
  ScriptLearner::Rank rank() override { return learner_->waitAttached(); }
  [[noreturn]] void waitForJobEnd() override {
    for (;;) pause();
  }

 private:
  std::shared_ptr<ScriptLearner> learner_;
};

class LocalRankFeed final : public Feed {
 public:
  explicit LocalRankFeed(int fd) : fd_(fd), in_(fd) {}
  ScriptLearner::Item next() override {
    std::lock_guard lock(mutex_);
    request('N');
    return getItem(in_);
  }
  ScriptLearner::Peeked peek() override {
    std::lock_guard lock(mutex_);
    request('P');
    auto kind = ScriptLearner::Item::Kind(in_.u8());
    bool stopping = in_.u8() != 0;
    return ScriptLearner::Peeked{kind, stopping};
  }
  std::string state() override {
    std::lock_guard lock(mutex_);
    request('S');
    auto status = in_.u8();
    auto text = in_.str();
    if (status != 0) throw std::runtime_error(text);
    return text;
  }
  uint32_t resumeFrom(const std::string& bytes, const std::string& name) override {
    std::lock_guard lock(mutex_);
    Out out;
    out.u8('L');
    out.str(bytes);
    out.str(name);
    out.send(fd_);
    auto status = in_.u8();
    if (status == 0) return in_.u32();
    auto why = in_.str();
    if (status == 2) throw train::CheckpointError(why);
    throw std::runtime_error(why);
  }
  void begin() override { simple('B', [](Out&) {}); }
  void end(std::string failure) override {
    failed_ = !failure.empty();
    simple('E', [&](Out& out) { out.str(failure); });
  }
  [[noreturn]] void waitForJobEnd() override {
    for (char c;;) {
      auto n = ::read(fd_, &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    _exit(failed_ ? 1 : 0);
  }
  void abandon(uint32_t epoch) override {
    simple('A', [&](Out& out) { out.u32(epoch); });
  }
  void handedOver(double seconds) override {
    {
      std::lock_guard lock(mutex_);
      ++handoffs_.count;
      handoffs_.seconds += seconds;
    }
    simple('H', [&](Out& out) { out.f64(seconds); });
  }
  train::Handoffs handoffs() override {
    std::lock_guard lock(mutex_);
    return handoffs_;
  }
  ScriptLearner::Rank rank() override {
    std::lock_guard lock(mutex_);
    request('R');
    ScriptLearner::Rank r;
    r.rank = in_.u32();
    r.ranks = in_.u32();
    r.localRank = in_.u32();
    r.localRanks = in_.u32();
    r.masterAddr = in_.str();
    r.masterPort = in_.u16();
    return r;
  }

 private:
  void request(uint8_t op) {
    Out out;
    out.u8(op);
    out.send(fd_);
  }
  template <typename F>
  void simple(uint8_t op, F&& args) {
    std::lock_guard lock(mutex_);
    Out out;
    out.u8(op);
    args(out);
    out.send(fd_);
    in_.u8();
  }
  std::mutex mutex_;
  int fd_;
  In in_;
  bool failed_ = false;
  train::Handoffs handoffs_;
};

// How the process at the other end ended, if it has (it is this process's child).
std::string howEnded(int pid) {
  int status = 0;
  for (int i = 0; i < 20; ++i) {  // up to 2 s for the kernel to report it
    auto r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFSIGNALED(status)) {
        return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
               strsignal(WTERMSIG(status)) + ")";
      }
      return "exited with " + std::to_string(WEXITSTATUS(status));
    }
    if (r < 0) break;  // reaped elsewhere
    usleep(100 * 1000);
  }
  return "closed its connection";
}

}  // namespace

std::unique_ptr<Feed> learnerFeed(std::shared_ptr<ScriptLearner> learner) {
  return std::make_unique<LearnerFeed>(std::move(learner));
}

std::unique_ptr<Feed> localRankFeed(int fd) { return std::make_unique<LocalRankFeed>(fd); }

void serveLocalRank(std::shared_ptr<ScriptLearner> learner, int fd, int pid, uint32_t localRank,
                    std::function<void(train::StepBatch&)> toTensors) {
  std::thread([learner, fd, pid, localRank, toTensors]() {
    In in(fd);
    bool ended = false;
    try {
      for (;;) {
        auto op = in.u8();
        Out out;
        switch (op) {
          case 'R': {
            auto r = learner->waitAttached();
            out.u32(r.rank);
            out.u32(r.ranks);
            out.u32(r.localRank);
            out.u32(r.localRanks);
            out.str(r.masterAddr);
            out.u16(r.masterPort);
            break;
          }
          case 'N': {
            auto item = learner->next();
            if (item.kind == ScriptLearner::Item::kBatch && item.batch.tensors.empty() &&
                toTensors) {
              toTensors(item.batch);
            }
            putItem(out, item);
            break;
          }
          case 'P': {
            auto peeked = learner->peek();
            out.u8(uint8_t(peeked.kind));
            out.u8(peeked.stopping ? 1 : 0);
            break;
          }
          case 'S':
            try {
              auto bytes = learner->state();
              out.u8(0);
              out.str(bytes);
            } catch (const std::exception& e) {
              out.u8(1);
              out.str(e.what());
            }
            break;
          case 'L': {
            auto bytes = in.str();
            auto name = in.str();
            try {
              auto epoch = learner->resumeFrom(bytes, name);
              out.u8(0);
              out.u32(epoch);
            } catch (const train::CheckpointError& e) {
              out.u8(2);
              out.str(e.what());
            } catch (const std::exception& e) {
              out.u8(1);
              out.str(e.what());
            }
            break;
          }
          case 'B':
            learner->begin();
            out.u8(0);
            break;
          case 'A':
            learner->abandon(in.u32());
            out.u8(0);
            break;
          case 'H':
            learner->handedOver(in.f64());
            out.u8(0);
            break;
          case 'E':
            learner->end(in.str());
            ended = true;
            out.u8(0);
            break;
          default:
            throw std::runtime_error("local rank " + std::to_string(localRank) +
                                     ": unknown request " + std::to_string(op));
        }
        out.send(fd);
      }
    } catch (const Closed&) {
    } catch (const std::exception& e) {
      if (!ended) {
        learner->end("local rank " + std::to_string(localRank) + " (pid " + std::to_string(pid) +
                     "): " + e.what());
        ended = true;
      }
    }
    if (!ended) {
      // Its process ended before its script did: the rank is lost, and with it the job.
      learner->end("the process of local rank " + std::to_string(localRank) + " (pid " +
                       std::to_string(pid) + ") " + howEnded(pid) + " before its script ended",
                   true);
    }
    close(fd);
  }).detach();
}

}  // namespace troupe::python
