#include "troupe/process.h"

#include <signal.h>

#include <kj/debug.h>

namespace troupe {

struct ChildProcess::State {
  uv_process_t process;
  uv_pipe_t pipes[2];
  std::string partial[2];
  int openHandles = 0;
  bool running = true;
  bool detached = false;  // the ChildProcess is gone: drop output, delete when closed
  bool exitSeen = false;
  ChildExit exit;
  kj::Function<void(kj::StringPtr, bool)> onLine = [](kj::StringPtr, bool) {};
  kj::Own<kj::PromiseFulfiller<ChildExit>> fulfiller;
  EventLoop* loop;
  ChildProcess* owner;

  void closed() {
    if (--openHandles == 0) {
      if (!detached) {
        owner->state_ = nullptr;
        fulfiller->fulfill(kj::cp(exit));
      }
      delete this;
    }
  }
  void deliver(int which, const char* data, size_t len) {
    if (detached) return;
    partial[which].append(data, len);
    size_t start = 0, nl;
    while ((nl = partial[which].find('\n', start)) != std::string::npos) {
      std::string line = partial[which].substr(start, nl - start);
      onLine(kj::StringPtr(line.c_str()), which == 1);
      start = nl + 1;
    }
    partial[which].erase(0, start);
  }
  void flush(int which) {
    if (!detached && !partial[which].empty()) {
      onLine(kj::StringPtr(partial[which].c_str()), which == 1);
    }
    partial[which].clear();
  }
};

namespace {

void closeHandle(uv_handle_t* h) {
  uv_close(h,
           [](uv_handle_t* handle) { static_cast<ChildProcess::State*>(handle->data)->closed(); });
}

}  // namespace

ChildProcess::ChildProcess(EventLoop& loop, Options options)
    : loop_(loop), state_(new State), pid_(0), exited_(nullptr) {
  auto paf = kj::newPromiseAndFulfiller<ChildExit>();
  exited_ = paf.promise.fork();
  state_->fulfiller = kj::mv(paf.fulfiller);
  state_->loop = &loop;
  state_->owner = this;
  bool capture = false;
  KJ_IF_MAYBE(f, options.onLine) {
    capture = true;
    state_->onLine = kj::mv(*f);
  }

  std::vector<char*> argv;
  for (auto& a : options.args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  uv_stdio_container_t stdio[3];
  stdio[0].flags = UV_IGNORE;
  for (int i = 0; i < 2; ++i) {
    if (capture) {
      uv_pipe_init(loop.uv(), &state_->pipes[i], 0);
      state_->pipes[i].data = state_;
      stdio[i + 1].flags = static_cast<uv_stdio_flags>(UV_CREATE_PIPE | UV_WRITABLE_PIPE);
      stdio[i + 1].data.stream = reinterpret_cast<uv_stream_t*>(&state_->pipes[i]);
    } else {
      stdio[i + 1].flags = UV_INHERIT_FD;
      stdio[i + 1].data.fd = i + 1;
    }
  }

  uv_process_options_t opts = {};
  opts.file = argv[0];
  opts.args = argv.data();
  opts.env = options.env.empty() ? nullptr : envp.data();
  opts.stdio_count = 3;
  opts.stdio = stdio;
  opts.exit_cb = [](uv_process_t* p, int64_t status, int sig) {
    auto* s = static_cast<State*>(p->data);
    s->running = false;
    s->exit = ChildExit{status, sig};
    closeHandle(reinterpret_cast<uv_handle_t*>(p));
  };
  state_->process.data = state_;
  int rc = uv_spawn(loop.uv(), &state_->process, &opts);
  if (rc != 0) {
    // uv_spawn still requires the handle to be closed.
    state_->running = false;
    state_->openHandles = 1 + (capture ? 2 : 0);
    state_->detached = true;
    closeHandle(reinterpret_cast<uv_handle_t*>(&state_->process));
    if (capture) {
      closeHandle(reinterpret_cast<uv_handle_t*>(&state_->pipes[0]));
      closeHandle(reinterpret_cast<uv_handle_t*>(&state_->pipes[1]));
    }
    state_ = nullptr;
    loop.kick();
    KJ_FAIL_REQUIRE("could not start process", options.args[0], uv_strerror(rc));
  }
  pid_ = state_->process.pid;
  state_->openHandles = 1;
  if (capture) {
    for (int i = 0; i < 2; ++i) {
      ++state_->openHandles;
      uv_read_start(
          reinterpret_cast<uv_stream_t*>(&state_->pipes[i]),
          [](uv_handle_t*, size_t suggested, uv_buf_t* buf) {
            buf->base = new char[suggested];
            buf->len = suggested;
          },
          [](uv_stream_t* stream, ssize_t n, const uv_buf_t* buf) {
            auto* s = static_cast<State*>(stream->data);
            int which = reinterpret_cast<uv_pipe_t*>(stream) == &s->pipes[0] ? 0 : 1;
            if (n > 0) s->deliver(which, buf->base, n);
            delete[] buf->base;
            if (n < 0) {
              s->flush(which);
              uv_read_stop(stream);
              closeHandle(reinterpret_cast<uv_handle_t*>(stream));
            }
          });
    }
  }
  loop.kick();
}

ChildProcess::~ChildProcess() noexcept(false) {
  if (state_ == nullptr) return;
  if (state_->running) uv_process_kill(&state_->process, SIGKILL);
  state_->detached = true;
  loop_.kick();
}

bool ChildProcess::running() const {
  return state_ != nullptr && state_->running;
}

kj::Promise<ChildExit> ChildProcess::onExit() {
  return exited_.addBranch();
}

void ChildProcess::kill(int signum) {
  if (running()) {
    uv_process_kill(&state_->process, signum);
    loop_.kick();
  }
}

}  // namespace troupe
