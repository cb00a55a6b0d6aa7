// A script's other local ranks, fed over a socket pair (local_ranks.h).

#include "troupe/train/local_ranks.h"

#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "troupe/train/checkpoint.h"
#include "troupe/train/script_job.h"

namespace troupe::train {
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
  out.u8(item.timedOut ? 1 : 0);
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
  item.timedOut = in.u8() != 0;
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
  ScriptLearner::Item next(double timeout) override { return learner_->next(timeout); }
  ScriptLearner::Peeked peek(double timeout) override { return learner_->peek(timeout); }
  std::string state() override { return learner_->state(); }
  ScriptLearner::Resumed resumeFrom(const std::string& bytes, const std::string& name) override {
    return learner_->resumeFrom(bytes, name);
  }
  void begin() override { learner_->begin(); }
  void beginPass(uint32_t pass, train::PassPlan plan) override {
    learner_->beginPass(pass, std::move(plan));
  }
  void endAll(const std::string& failure) override {
    // This process's learners are its local rank 0's, of every stream.
    ScriptLearner::endEvery([](uint64_t id) { return ((id - 1) & 0xFFFF) == 0; }, failure);
  }
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

// A local rank's process's connection to its troupe process: one for all its streams.
struct Connection {
  explicit Connection(int fd) : fd(fd), in(fd) {}
  std::mutex mutex;
  int fd;
  In in;
  bool failed = false;
};

std::mutex connectionMutex;
std::shared_ptr<Connection> theConnection;

class LocalRankFeed final : public Feed {
 public:
  LocalRankFeed(std::shared_ptr<Connection> c, uint32_t stream)
      : c_(std::move(c)), stream_(stream) {}
  ScriptLearner::Item next(double timeout) override {
    std::lock_guard lock(c_->mutex);
    auto out = request('N');
    out.f64(timeout);
    out.send(c_->fd);
    return getItem(c_->in);
  }
  ScriptLearner::Peeked peek(double timeout) override {
    std::lock_guard lock(c_->mutex);
    auto out = request('P');
    out.f64(timeout);
    out.send(c_->fd);
    auto kind = ScriptLearner::Item::Kind(c_->in.u8());
    bool stopping = c_->in.u8() != 0;
    bool timedOut = c_->in.u8() != 0;
    return ScriptLearner::Peeked{kind, stopping, timedOut};
  }
  std::string state() override {
    std::lock_guard lock(c_->mutex);
    request('S').send(c_->fd);
    auto status = c_->in.u8();
    auto text = c_->in.str();
    if (status != 0) throw std::runtime_error(text);
    return text;
  }
  ScriptLearner::Resumed resumeFrom(const std::string& bytes, const std::string& name) override {
    std::lock_guard lock(c_->mutex);
    auto out = request('L');
    out.str(bytes);
    out.str(name);
    out.send(c_->fd);
    auto status = c_->in.u8();
    if (status == 0) {
      ScriptLearner::Resumed r;
      r.pass = c_->in.u32();
      r.planned = c_->in.u8() != 0;
      r.label = c_->in.u32();
      return r;
    }
    auto why = c_->in.str();
    if (status == 2) throw train::CheckpointError(why);
    throw std::runtime_error(why);
  }
  void begin() override { simple('B', [](Out&) {}); }
  void beginPass(uint32_t pass, train::PassPlan plan) override {
    simple('G', [&](Out& out) {
      out.u32(pass);
      out.u32(plan.label);
      out.u64(plan.baseSeed);
      out.u32(uint32_t(plan.ids.size()));
      for (auto id : plan.ids) out.u32(id);
      out.u32(uint32_t(plan.ends.size()));
      for (auto end : plan.ends) out.u32(end);
      out.u32(uint32_t(plan.places.size()));
      for (auto place : plan.places) out.u64(place);
      out.str(plan.update);
    });
  }
  void endAll(const std::string& failure) override {
    c_->failed = !failure.empty();
    simple('E', [&](Out& out) { out.str(failure); });
  }
  [[noreturn]] void waitForJobEnd() override {
    for (char c;;) {
      auto n = ::read(c_->fd, &c, 1);
      if (n == 0 || (n < 0 && errno != EINTR)) break;
    }
    _exit(c_->failed ? 1 : 0);
  }
  void abandon(uint32_t epoch) override {
    simple('A', [&](Out& out) { out.u32(epoch); });
  }
  void handedOver(double seconds) override {
    {
      std::lock_guard lock(handoffsMutex_);
      ++handoffs_.count;
      handoffs_.seconds += seconds;
    }
    simple('H', [&](Out& out) { out.f64(seconds); });
  }
  train::Handoffs handoffs() override {
    std::lock_guard lock(handoffsMutex_);
    return handoffs_;
  }
  ScriptLearner::Rank rank() override {
    std::lock_guard lock(c_->mutex);
    request('R').send(c_->fd);
    auto& in = c_->in;
    ScriptLearner::Rank r;
    r.rank = in.u32();
    r.ranks = in.u32();
    r.localRank = in.u32();
    r.localRanks = in.u32();
    r.masterAddr = in.str();
    r.masterPort = in.u16();
    r.seed = in.u64();
    return r;
  }

 private:
  Out request(uint8_t op) {
    Out out;
    out.u8(op);
    out.u32(stream_);
    return out;
  }
  template <typename F>
  void simple(uint8_t op, F&& args) {
    std::lock_guard lock(c_->mutex);
    auto out = request(op);
    args(out);
    out.send(c_->fd);
    c_->in.u8();
  }
  std::shared_ptr<Connection> c_;
  uint32_t stream_;
  std::mutex handoffsMutex_;
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

// One request of a local rank's process, answered into `out`.
void serveOne(uint8_t op, ScriptLearner& learner, uint32_t localRank, In& in, Out& out,
              const std::function<void(train::StepBatch&)>& toTensors, bool& ended) {
  switch (op) {
    case 'R': {
      auto r = learner.waitAttached();
      out.u32(r.rank);
      out.u32(r.ranks);
      out.u32(r.localRank);
      out.u32(r.localRanks);
      out.str(r.masterAddr);
      out.u16(r.masterPort);
      out.u64(r.seed);
      break;
    }
    case 'N': {
      auto item = learner.next(in.f64());
      if (item.kind == ScriptLearner::Item::kBatch && item.batch.structure.empty()) {
        toTensors(item.batch);
      }
      putItem(out, item);
      break;
    }
    case 'P': {
      auto peeked = learner.peek(in.f64());
      out.u8(uint8_t(peeked.kind));
      out.u8(peeked.stopping ? 1 : 0);
      out.u8(peeked.timedOut ? 1 : 0);
      break;
    }
    case 'S':
      try {
        auto bytes = learner.state();
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
        auto r = learner.resumeFrom(bytes, name);
        out.u8(0);
        out.u32(r.pass);
        out.u8(r.planned ? 1 : 0);
        out.u32(r.label);
      } catch (const train::CheckpointError& e) {
        out.u8(2);
        out.str(e.what());
      } catch (const std::exception& e) {
        out.u8(1);
        out.str(e.what());
      }
      break;
    }
    case 'G': {
      uint32_t pass = in.u32();
      train::PassPlan plan;
      plan.label = in.u32();
      plan.baseSeed = in.u64();
      plan.ids.resize(in.u32());
      for (auto& id : plan.ids) id = in.u32();
      plan.ends.resize(in.u32());
      for (auto& end : plan.ends) end = in.u32();
      plan.places.resize(in.u32());
      for (auto& place : plan.places) place = in.u64();
      plan.update = in.str();
      learner.beginPass(pass, std::move(plan));
      out.u8(0);
      break;
    }
    case 'B':
      learner.begin();
      out.u8(0);
      break;
    case 'A':
      learner.abandon(in.u32());
      out.u8(0);
      break;
    case 'H':
      learner.handedOver(in.f64());
      out.u8(0);
      break;
    case 'E': {
      auto failure = in.str();
      ScriptLearner::endEvery(
          [localRank](uint64_t id) { return ((id - 1) & 0xFFFF) == localRank; }, failure);
      ended = true;
      out.u8(0);
      break;
    }
    default:
      throw std::runtime_error("local rank " + std::to_string(localRank) + ": unknown request " +
                               std::to_string(op));
  }
}

}  // namespace

std::unique_ptr<Feed> learnerFeed(std::shared_ptr<ScriptLearner> learner) {
  return std::make_unique<LearnerFeed>(std::move(learner));
}

std::unique_ptr<Feed> localRankFeed(int fd, uint32_t stream) {
  std::lock_guard lock(connectionMutex);
  if (!theConnection) theConnection = std::make_shared<Connection>(fd);
  return std::make_unique<LocalRankFeed>(theConnection, stream);
}

void serveLocalRank(int fd, int pid, uint32_t localRank,
                    std::function<void(uint32_t, train::StepBatch&)> toTensors) {
  std::thread([fd, pid, localRank, toTensors]() {
    In in(fd);
    bool ended = false;
    // The learners this thread serves, kept while it serves them (the table holds them weakly).
    std::map<uint32_t, std::shared_ptr<ScriptLearner>> held;
    try {
      for (;;) {
        auto op = in.u8();
        auto stream = in.u32();
        auto& learner = held[stream];
        if (!learner) learner = ScriptLearner::findOrCreate(learnerId(stream, localRank));
        Out out;
        serveOne(op, *learner, localRank, in, out,
                 [&](train::StepBatch& b) { if (toTensors) toTensors(stream, b); }, ended);
        out.send(fd);
      }
    } catch (const Closed&) {
    } catch (const std::exception& e) {
      if (!ended) {
        auto why = "local rank " + std::to_string(localRank) + " (pid " + std::to_string(pid) +
                   "): " + e.what();
        ScriptLearner::findOrCreate(learnerId(0, localRank))->end(why);
        ScriptLearner::endEvery(
            [localRank](uint64_t id) { return ((id - 1) & 0xFFFF) == localRank; }, why);
        ended = true;
      }
    }
    if (!ended) {
      // Its process ended before its script did: the rank is lost, and with it the job.
      auto why = "the process of local rank " + std::to_string(localRank) + " (pid " +
                 std::to_string(pid) + ") " + howEnded(pid) + " before its script ended";
      ScriptLearner::findOrCreate(learnerId(0, localRank))->end(why, true);
      ScriptLearner::endEvery(
          [localRank](uint64_t id) { return ((id - 1) & 0xFFFF) == localRank; }, why);
    }
    close(fd);
  }).detach();
}

}  // namespace troupe::train
