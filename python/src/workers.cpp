#include "workers.h"

#include <errno.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <string>

namespace troupe::python {

namespace {

bool writeAll(int fd, const void* data, size_t size) {
  auto* p = static_cast<const char*>(data);
  while (size > 0) {
    auto n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= size_t(n);
  }
  return true;
}

bool readAll(int fd, void* data, size_t size) {
  auto* p = static_cast<char*>(data);
  while (size > 0) {
    auto n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;  // EOF: the worker is gone
    p += n;
    size -= size_t(n);
  }
  return true;
}

}  // namespace

ProcessWorkers::ProcessWorkers(const std::vector<WorkerFds>& workers) {
  for (auto& fds : workers) {
    Worker w;
    w.fds = fds;
    void* map = mmap(nullptr, fds.size, PROT_READ, MAP_SHARED, fds.memory, 0);
    if (map == MAP_FAILED) {
      throw std::runtime_error("cannot map a DataLoader worker's shared memory (" +
                               std::to_string(fds.size) + " bytes): " + strerror(errno));
    }
    w.memory = static_cast<const uint8_t*>(map);
    workers_.push_back(w);
  }
}

ProcessWorkers::~ProcessWorkers() {
  for (auto& w : workers_) munmap(const_cast<uint8_t*>(w.memory), w.fds.size);
}

size_t ProcessWorkers::alive() const {
  std::lock_guard lock(mutex_);
  size_t n = 0;
  for (auto& w : workers_) n += !w.dead;
  return n;
}

bool ProcessWorkers::tryMake(Worker& w, uint32_t epoch, std::span<const uint32_t> ids,
                             troupe::train::MadeBatch& out) {
  std::vector<uint32_t> request = {epoch, uint32_t(ids.size())};
  request.insert(request.end(), ids.begin(), ids.end());
  uint32_t length = 0;
  if (!writeAll(w.fds.request, request.data(), request.size() * 4) ||
      !readAll(w.fds.reply, &length, 4)) {
    return false;
  }
  std::string text(length, '\0');
  if (!readAll(w.fds.reply, text.data(), length)) return false;
  auto reply = nlohmann::json::parse(text);
  if (reply.contains("error")) {
    out.failure = reply["error"].get<std::string>();
    return true;
  }
  out.structure = reply["structure"].dump();
  if (reply.contains("skipped")) {
    for (auto& s : reply["skipped"]) {
      out.skipped.push_back(s[0].get<uint32_t>());
      out.skippedWhy.push_back(s[1].get<std::string>());
    }
  }
  uint64_t total = 0;
  for (auto& t : reply["tensors"]) total += t["bytes"].get<uint64_t>();
  out.data = SendBuffer::allocate(total);
  auto* dst = out.data.bytes().begin();
  uint64_t at = 0;
  for (auto& t : reply["tensors"]) {
    troupe::train::MadeTensor m;
    m.dtype = t["dtype"].get<std::string>();
    m.shape = t["shape"].get<std::vector<int64_t>>();
    m.bytes = t["bytes"].get<uint64_t>();
    auto from = t["offset"].get<uint64_t>();
    if (from + m.bytes > w.fds.size) {
      out.failure = "a DataLoader worker's tensor of " + std::to_string(m.bytes) + " bytes at " +
                    std::to_string(from) + " lies beyond its shared memory";
      return true;
    }
    std::memcpy(dst + at, w.memory + from, m.bytes);
    m.offset = at;
    at += m.bytes;
    out.tensors.push_back(kj::mv(m));
  }
  return true;
}

troupe::train::MadeBatch ProcessWorkers::make(uint32_t epoch, std::span<const uint32_t> ids) {
  for (;;) {
    Worker* w = nullptr;
    {
      std::unique_lock lock(mutex_);
      for (;;) {
        bool anyAlive = false;
        for (auto& x : workers_) {
          anyAlive = anyAlive || !x.dead;
          if (!x.dead && !x.busy) {
            w = &x;
            break;
          }
        }
        if (w != nullptr) break;
        if (!anyAlive) {
          troupe::train::MadeBatch none;
          none.failure =
              "every DataLoader worker process of this instance has died (the "
              "system log says why: out of memory, a crash in a C extension)";
          return none;
        }
        freed_.wait(lock);
      }
      w->busy = true;
    }
    troupe::train::MadeBatch out;
    bool ok = false;
    try {
      ok = tryMake(*w, epoch, ids, out);
    } catch (const nlohmann::json::exception& e) {
      out.failure = std::string("a DataLoader worker's reply is not one: ") + e.what();
      ok = true;
    }
    if (!ok) {
      // Its pipe closed as it died: reap it, and say how it ended (it becomes a zombie within
      // moments of the close; a worker that closed its pipe and lives on is not waited for).
      int status = 0;
      for (int tries = 0; tries < 200; ++tries) {
        if (waitpid(w->fds.pid, &status, WNOHANG) != 0) break;
        usleep(5000);
      }
      spdlog::warn("DataLoader worker {} (pid {}) died{}: its batch goes to another worker",
                   w - workers_.data(), w->fds.pid,
                   WIFSIGNALED(status)
                       ? std::string(" of signal ") + std::to_string(WTERMSIG(status))
                       : std::string());
    }
    {
      std::lock_guard lock(mutex_);
      w->busy = false;
      w->dead = w->dead || !ok;
    }
    freed_.notify_all();
    if (ok) return out;
  }
}

}  // namespace troupe::python
