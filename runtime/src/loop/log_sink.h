// The log's sink when stderr is a pipe or a socket: it never blocks the thread that logs. A reader
// that stopped (a `troupe sim` or log shipper that is frozen, a full pipe nobody drains) would
// otherwise hold the event loop in write() until it came back: training stops, and the control
// thread, which does not log, keeps telling the head that this node is alive. A line that cannot
// be written at once is dropped and counted; the next line that can be written says how many were
// (docs/guide.md, "Logs").
#pragma once

#include <poll.h>
#include <unistd.h>

#include <spdlog/details/log_msg.h>
#include <spdlog/sinks/base_sink.h>

#include <cerrno>
#include <mutex>
#include <string>

namespace troupe {

class NonBlockingSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit NonBlockingSink(int fd) : fd_(fd) {}

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t text;
    formatter_->format(msg, text);
    if (dropped_ > 0) {
      std::string note = (partial_ ? "\n" : "") + std::string("... ") +
                         std::to_string(dropped_) +
                         " log line(s) dropped here: the log's reader fell behind or stopped\n";
      if (!writeNow(note.data(), note.size())) {
        ++dropped_;
        return;
      }
      dropped_ = 0;
    }
    if (!writeNow(text.data(), text.size())) ++dropped_;
  }
  void flush_() override {}  // unbuffered: each line is written, or dropped, as it comes

 private:
  // Writes `size` bytes when the fd takes them now. A pipe with room takes up to a page in one
  // write() without blocking (Linux: a free slot of its ring); a longer line goes a page at a
  // time, waiting at most 100 ms for room for each, and is cut off where it had to stop.
  bool writeNow(const char* data, size_t size) {
    constexpr size_t kPage = 4096;
    bool first = true;
    while (size > 0) {
      pollfd p{fd_, POLLOUT, 0};
      int ready;
      do {
        ready = poll(&p, 1, first ? 0 : 100);
      } while (ready < 0 && errno == EINTR);
      if (ready <= 0 || (p.revents & POLLOUT) == 0) {
        partial_ = !first;
        return false;
      }
      ssize_t n;
      do {
        n = write(fd_, data, size < kPage ? size : kPage);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) {
        partial_ = !first;
        return false;
      }
      data += n;
      size -= size_t(n);
      first = false;
    }
    partial_ = false;
    return true;
  }

  int fd_;
  uint64_t dropped_ = 0;
  bool partial_ = false;  // the last line was cut off: the next one starts on a line of its own
};

}  // namespace troupe
