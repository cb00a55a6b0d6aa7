// A DataLoader's worker processes on this instance and the batch maker over them
// (worker_pool.h).

#include "troupe/train/worker_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <kj/debug.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <stdexcept>

namespace troupe::train {
namespace {

using nlohmann::json;
using train::MadeBatch;

std::string errnoText(const char* what) { return std::string(what) + ": " + strerror(errno); }

// The fork server (python/troupe/_forkserver.py): one request and its answer at a time.
class ForkServer {
 public:
  explicit ForkServer(int fd) : fd_(fd) {}

  json call(const json& request, const std::vector<int>& fds) {
    std::lock_guard lock(mutex_);
    auto text = request.dump();
    iovec iov{text.data(), text.size()};
    msghdr message{};
    message.msg_iov = &iov;
    message.msg_iovlen = 1;
    std::vector<char> control(CMSG_SPACE(sizeof(int) * std::max<size_t>(fds.size(), 1)));
    if (!fds.empty()) {
      message.msg_control = control.data();
      message.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
      auto* c = CMSG_FIRSTHDR(&message);
      c->cmsg_level = SOL_SOCKET;
      c->cmsg_type = SCM_RIGHTS;
      c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
    }
    ssize_t n;
    do n = sendmsg(fd_, &message, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0) throw std::runtime_error(errnoText("the DataLoader's fork server is gone"));
    std::string answer(1 << 16, '\0');
    do n = recv(fd_, answer.data(), answer.size(), 0);
    while (n < 0 && errno == EINTR);
    if (n <= 0) {
      throw std::runtime_error(
          "the DataLoader's fork server ended (killed, or out of memory: the system log says)");
    }
    answer.resize(size_t(n));
    return json::parse(answer);
  }

 private:
  std::mutex mutex_;
  int fd_;
};

std::mutex serverMutex;
std::shared_ptr<ForkServer> theServer;

std::shared_ptr<ForkServer> forkServer() {
  std::lock_guard lock(serverMutex);
  if (!theServer) {
    throw std::runtime_error(
        "no DataLoader fork server in this process: DataLoader workers start in the script's "
        "process of an instance (troupe.data.DataLoader)");
  }
  return theServer;
}

// splitmix64 of FNV-1a: where an instance's workers' numbers start (their seeds differ by it).
uint64_t hostOffset(const std::string& host) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : host) h = (h ^ c) * 0x100000001b3ull;
  uint64_t z = h + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (z ^ (z >> 31)) & ~0xFFFFull;  // the low bits are the worker's id
}

std::string cpuList(int pid) {
  cpu_set_t set;
  if (sched_getaffinity(pid, sizeof set, &set) != 0) return "?";
  std::string out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &set)) continue;
    int last = c;
    while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) ++last;
    if (!out.empty()) out += ",";
    out += last > c ? std::to_string(c) + "-" + std::to_string(last) : std::to_string(c);
    c = last;
  }
  return out;
}

void closeFd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace

void setForkServer(int fd) {
  std::lock_guard lock(serverMutex);
  theServer = std::make_shared<ForkServer>(fd);
}

uint32_t defaultWorkers(uint32_t vcpus) {
  if (const char* pinned = getenv("TROUPE_CPUS"); pinned != nullptr && *pinned) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  }
  if (const char* scale = getenv("TROUPE_CPU_SCALE"); scale != nullptr && *scale) {
    double share = strtod(scale, nullptr) * vcpus;
    if (share > 0) return std::max<uint32_t>(1, uint32_t(std::ceil(share - 1e-9)));
  }
  return std::max<uint32_t>(1, vcpus);
}

WorkerPool::WorkerPool(std::shared_ptr<const train::WorkerSettings> settings)
    : settings_(std::move(settings)) {
  auto& s = *settings_;
  count_ = s.workers > 0 ? s.workers : defaultWorkers(s.vcpus);
  uint32_t slots = std::max<uint32_t>(1, s.prefetchFactor);
  slotBytes_ = (s.sharedMemoryBytes / slots) & ~uint64_t(4095);
  seedOffset_ = hostOffset(s.host);
  wake_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_ < 0) throw std::runtime_error(errnoText("eventfd for a DataLoader's workers"));
  thread_ = std::thread([this] { run(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
  if (thread_.joinable()) thread_.join();
  for (auto& w : workers_) {
    closeFd(w.request);
    closeFd(w.reply);
    if (w.memory != nullptr) munmap(w.memory, slotBytes_ * w.slotBusy.size());
  }
  closeFd(wake_);
}

kj::Promise<MadeBatch> WorkerPool::make(train::MakeRequest request) {
  auto paf = kj::newPromiseAndCrossThreadFulfiller<MadeBatch>();
  {
    std::lock_guard lock(mutex_);
    incoming_.push_back(std::make_unique<Job>(Job{std::move(request), kj::mv(paf.fulfiller)}));
  }
  uint64_t one = 1;
  (void)!::write(wake_, &one, sizeof one);
  return kj::mv(paf.promise);
}

WorkerPool::Worker WorkerPool::start(uint32_t id) {
  auto& s = *settings_;
  Worker w;
  w.id = id;
  w.slotBusy.assign(std::max<uint32_t>(1, s.prefetchFactor), false);
  int request[2], reply[2];
  if (pipe2(request, O_CLOEXEC) != 0) throw std::runtime_error(errnoText("pipe"));
  if (pipe2(reply, O_CLOEXEC) != 0) {
    ::close(request[0]);
    ::close(request[1]);
    throw std::runtime_error(errnoText("pipe"));
  }
  auto name = "troupe-dataloader-" + std::to_string(s.loader) + "-" + std::to_string(id);
  int memory = memfd_create(name.c_str(), MFD_CLOEXEC);
  int pickled = -1;
  KJ_DEFER({
    ::close(request[0]);
    ::close(reply[1]);
    if (memory >= 0) ::close(memory);
    if (pickled >= 0) ::close(pickled);
  });
  w.request = request[1];
  w.reply = reply[0];
  auto fail = [&](const std::string& why) {
    closeFd(w.request);
    closeFd(w.reply);
    throw std::runtime_error(why);
  };
  uint64_t bytes = slotBytes_ * w.slotBusy.size();
  if (memory < 0 || ftruncate(memory, off_t(bytes)) != 0) {
    fail(errnoText("the shared memory of a DataLoader worker (shared_memory_mb)"));
  }
  std::vector<int> fds{request[0], reply[1], memory};
  if (s.pickled && !s.pickled->empty()) {
    pickled = memfd_create("troupe-dataloader-spec", MFD_CLOEXEC);
    if (pickled < 0 || ::write(pickled, s.pickled->data(), s.pickled->size()) !=
                           ssize_t(s.pickled->size()) ||
        lseek(pickled, 0, SEEK_SET) != 0) {
      fail(errnoText("a DataLoader's pickled dataset into a memfd"));
    }
    fds.push_back(pickled);
  }
  json answer;
  try {
    answer = forkServer()->call({{"op", "spawn"},
                                 {"loader", s.loader},
                                 {"worker", id},
                                 {"workers", count_},
                                 {"seed_offset", seedOffset_},
                                 {"slots", w.slotBusy.size()},
                                 {"slot_bytes", slotBytes_},
                                 {"host", s.host}},
                                fds);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  if (answer.contains("error")) fail(answer["error"].get<std::string>());
  w.pid = answer["pid"].get<int>();
  void* map = mmap(nullptr, bytes, PROT_READ, MAP_SHARED, memory, 0);
  if (map == MAP_FAILED) fail(errnoText("mapping a DataLoader worker's shared memory"));
  w.memory = static_cast<uint8_t*>(map);
  fcntl(w.request, F_SETFL, fcntl(w.request, F_GETFL) | O_NONBLOCK);
  fcntl(w.reply, F_SETFL, fcntl(w.reply, F_GETFL) | O_NONBLOCK);
  return w;
}

void WorkerPool::startWorkers() {
  auto& s = *settings_;
  std::string pids;
  try {
    for (uint32_t id = 0; id < count_; ++id) {
      workers_.push_back(start(id));
      pids += (id ? ", " : "") + std::to_string(workers_.back().pid);
    }
  } catch (const std::exception& e) {
    if (workers_.empty()) {
      broken_ = std::string("no DataLoader worker could start on ") + s.host + ": " + e.what();
      spdlog::error("{}", broken_);
      return;
    }
    spdlog::warn("DataLoader {} on {}: {} of {} workers started ({})", s.loader, s.host,
                 workers_.size(), count_, e.what());
  }
  spdlog::info("DataLoader {} on {}: {} worker process{} (pid{} {}) on CPUs {}, {} batches in "
               "the making each (prefetch_factor)",
               s.loader, s.host, workers_.size(), workers_.size() == 1 ? "" : "es",
               workers_.size() == 1 ? "" : "s", pids, cpuList(workers_.front().pid),
               workers_.front().slotBusy.size());
}

void WorkerPool::run() {
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe, nullptr);  // a worker gone: EPIPE here, not the process's end
  startWorkers();
  std::vector<pollfd> fds;
  struct Watch {
    size_t worker;
    bool reply;
  };
  std::vector<Watch> watched;
  for (;;) {
    {
      std::lock_guard lock(mutex_);
      if (stop_) return;
      while (!incoming_.empty()) {
        queued_.push_back(std::move(incoming_.front()));
        incoming_.pop_front();
      }
    }
    if (!broken_.empty()) failAll(broken_);
    assign();
    fds.assign(1, pollfd{wake_, POLLIN, 0});
    watched.assign(1, Watch{0, false});
    for (size_t k = 0; k < workers_.size(); ++k) {
      auto& w = workers_[k];
      if (w.dead) continue;
      fds.push_back(pollfd{w.reply, POLLIN, 0});
      watched.push_back(Watch{k, true});
      if (w.written < w.out.size()) {
        fds.push_back(pollfd{w.request, POLLOUT, 0});
        watched.push_back(Watch{k, false});
      }
    }
    if (poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) {
      failAll(errnoText("poll over the DataLoader's workers"));
      return;
    }
    if (fds[0].revents != 0) {
      uint64_t v;
      (void)!::read(wake_, &v, sizeof v);
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto& w = workers_[watched[i].worker];
      if (w.dead) continue;
      if (watched[i].reply) {
        readSome(w);
      } else {
        writeSome(w);
      }
    }
    // Dead workers' places taken (starting one may move workers_: after the loop over it).
    for (size_t k = 0, n = workers_.size(); k < n; ++k) {
      if (!workers_[k].dead || workers_[k].pid == 0) continue;
      workers_[k].pid = 0;  // replaced (or given up on) once
      if (replaced_ >= 4 * count_) continue;
      try {
        auto id = workers_[k].id;
        workers_.push_back(start(id));
        ++replaced_;
        spdlog::info("DataLoader {} on {}: worker {} started again (pid {})", settings_->loader,
                     settings_->host, id, workers_.back().pid);
      } catch (const std::exception& e) {
        lastStartError_ = e.what();
        spdlog::warn("DataLoader {} on {}: a worker could not start again: {}", settings_->loader,
                     settings_->host, e.what());
      }
    }
    bool any = std::any_of(workers_.begin(), workers_.end(), [](auto& w) { return !w.dead; });
    if (!any && broken_.empty()) {
      broken_ = "every DataLoader worker process on " + settings_->host + " has died and none " +
                (lastStartError_.empty()
                     ? std::string("could start again (the system log says why: out of memory, "
                                   "a crash in a C extension)")
                     : "could start again: " + lastStartError_);
    }
  }
}

void WorkerPool::assign() {
  while (!queued_.empty()) {
    auto& job = queued_.front();
    if (!job->done->isWaiting()) {  // its augmenter's stream ended meanwhile: not wanted
      queued_.pop_front();
      continue;
    }
    Worker* best = nullptr;
    for (auto& w : workers_) {
      if (w.dead || w.outstanding.size() >= w.slotBusy.size()) continue;
      if (best == nullptr || w.outstanding.size() < best->outstanding.size()) best = &w;
    }
    if (best == nullptr) return;  // every worker has prefetch_factor batches in the making
    uint32_t slot = 0;
    while (best->slotBusy[slot]) ++slot;
    best->slotBusy[slot] = true;
    auto& r = job->request;
    auto put = [&](const void* p, size_t n) { best->out.append(static_cast<const char*>(p), n); };
    uint32_t head[2] = {r.pass, r.label};
    put(head, sizeof head);
    put(&r.baseSeed, 8);
    uint32_t tail[2] = {slot, uint32_t(r.ids.size())};
    put(tail, sizeof tail);
    put(r.ids.data(), r.ids.size() * 4);
    put(r.places.data(), r.places.size() * 8);
    uint32_t update = uint32_t(r.update.size());
    put(&update, 4);
    put(r.update.data(), r.update.size());
    best->outstanding.push_back(Worker::Outstanding{std::move(job), slot});
    queued_.pop_front();
    writeSome(*best);
  }
}

void WorkerPool::writeSome(Worker& w) {
  while (w.written < w.out.size()) {
    auto n = ::write(w.request, w.out.data() + w.written, w.out.size() - w.written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) return;
    if (n <= 0) return died(w, "");  // EPIPE: it is gone; its reply pipe says so too
    w.written += size_t(n);
  }
  w.out.clear();
  w.written = 0;
}

void WorkerPool::readSome(Worker& w) {
  char buffer[1 << 16];
  for (;;) {
    auto n = ::read(w.reply, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) break;
    if (n <= 0) return died(w, "");
    w.in.append(buffer, size_t(n));
  }
  while (w.in.size() >= 4) {
    uint32_t length;
    std::memcpy(&length, w.in.data(), 4);
    if (w.in.size() < 4 + size_t(length)) return;
    auto text = w.in.substr(4, length);
    w.in.erase(0, 4 + size_t(length));
    answered(w, text);
    if (w.dead) return;
  }
}

void WorkerPool::answered(Worker& w, const std::string& text) {
  if (w.outstanding.empty()) return died(w, "answered a request it was not given");
  auto job = std::move(w.outstanding.front().job);
  uint32_t slot = w.outstanding.front().slot;
  w.outstanding.pop_front();
  MadeBatch out;
  try {
    auto reply = json::parse(text);
    if (reply.value("slot", ~0u) != slot) {
      throw std::runtime_error("its answer is for slot " + reply.value("slot", json()).dump() +
                               ", not " + std::to_string(slot));
    }
    if (reply.contains("error")) {
      out.failure = reply["error"].get<std::string>();
      out.traceback = reply.value("traceback", "");
    } else {
      out.structure = reply["structure"].dump();
      for (auto& s : reply["skipped"]) {
        out.skipped.push_back(s[0].get<uint32_t>());
        out.skippedWhy.push_back(s[1].get<std::string>());
      }
      uint64_t total = 0;
      for (auto& t : reply["tensors"]) {
        train::MadeTensor m;
        m.dtype = t["dtype"].get<std::string>();
        m.shape = t["shape"].get<std::vector<int64_t>>();
        m.bytes = t["bytes"].get<uint64_t>();
        m.offset = t["offset"].get<uint64_t>();  // in the slot, for now
        if (!train::tensorBytesFit(m.dtype, m.shape, m.bytes) || m.offset > slotBytes_ ||
            m.bytes > slotBytes_ - m.offset) {
          throw std::runtime_error("a tensor of dtype " + m.dtype + ", shape " +
                                   t["shape"].dump() + " and " + std::to_string(m.bytes) +
                                   " bytes at " + std::to_string(m.offset) + " of its " +
                                   std::to_string(slotBytes_) + "-byte slot is not one");
        }
        total = (total + 63) / 64 * 64 + m.bytes;
        out.tensors.push_back(std::move(m));
      }
      out.data = SendBuffer::allocate(total);
      uint64_t at = 0;
      const uint8_t* from = w.memory + uint64_t(slot) * slotBytes_;
      for (auto& m : out.tensors) {
        at = (at + 63) / 64 * 64;
        std::memcpy(out.data.bytes().begin() + at, from + m.offset, m.bytes);
        m.offset = at;
        at += m.bytes;
      }
    }
  } catch (const std::exception& e) {
    out = MadeBatch();
    out.failure = "DataLoader worker " + std::to_string(w.id) + " on " + settings_->host +
                  " answered with what is not a batch: " + e.what();
  }
  w.slotBusy[slot] = false;
  if (job->done->isWaiting()) job->done->fulfill(std::move(out));
}

void WorkerPool::died(Worker& w, const std::string& how) {
  if (w.dead) return;
  w.dead = true;
  std::string ended = how;
  if (ended.empty()) {
    try {
      auto status = forkServer()->call({{"op", "status"}, {"pid", w.pid}}, {});
      if (status.contains("signal")) {
        int sig = status["signal"].get<int>();
        ended = "died of signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
      } else if (status.contains("exit")) {
        ended = "exited with " + std::to_string(status["exit"].get<int>());
      } else {
        ended = "closed its pipes";
      }
    } catch (const std::exception& e) {
      ended = std::string("is gone (") + e.what() + ")";
    }
  }
  spdlog::warn("DataLoader {} on {}: worker {} (pid {}) {}; its {} batches go to other workers",
               settings_->loader, settings_->host, w.id, w.pid, ended, w.outstanding.size());
  // Its batches, first in line again. One that has now killed two workers is not tried again: a
  // sample that crashes its worker (a C extension, memory) would take every worker down.
  for (auto it = w.outstanding.rbegin(); it != w.outstanding.rend(); ++it) {
    auto& job = it->job;
    if (++job->killed < 2) {
      queued_.push_front(std::move(job));
      continue;
    }
    auto& ids = job->request.ids;
    std::string which;
    for (size_t k = 0; k < ids.size() && k < 8; ++k) which += (k ? ", " : "") + std::to_string(ids[k]);
    MadeBatch out;
    out.failure = "the batch of samples " + which + (ids.size() > 8 ? ", ..." : "") + " (epoch " +
                  std::to_string(job->request.label) + ") ended " + std::to_string(job->killed) +
                  " DataLoader workers on " + settings_->host + " (the last " + ended +
                  "): a sample of it crashes the process that loads it";
    if (job->done->isWaiting()) job->done->fulfill(std::move(out));
  }
  w.outstanding.clear();
  closeFd(w.request);
  closeFd(w.reply);
  if (w.memory != nullptr) munmap(w.memory, slotBytes_ * w.slotBusy.size());
  w.memory = nullptr;
}

void WorkerPool::failAll(const std::string& why) {
  auto fail = [&](std::unique_ptr<Job>& job) {
    if (job->done->isWaiting()) {
      job->done->reject(kj::Exception(kj::Exception::Type::FAILED, __FILE__, __LINE__, kj::str(why)));
    }
  };
  for (auto& job : queued_) fail(job);
  queued_.clear();
  for (auto& w : workers_) {
    for (auto& o : w.outstanding) fail(o.job);
    w.outstanding.clear();
  }
}

kj::Promise<MadeBatch> ProcessBatchMaker::make(train::MakeRequest request) {
  std::shared_ptr<WorkerPool> pool;
  {
    std::lock_guard lock(mutex_);
    auto& slot = pools_[request.settings->loader];
    if (!slot) slot = std::make_shared<WorkerPool>(request.settings);
    pool = slot;
  }
  return pool->make(std::move(request));
}

}  // namespace troupe::train
