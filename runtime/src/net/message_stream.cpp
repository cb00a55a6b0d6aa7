#include "message_stream.h"

#include <capnp/serialize.h>
#include <kj/debug.h>
#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <new>

#include "troupe/received.h"

namespace troupe {

namespace {

constexpr size_t kMaxSegments = 512;  // as capnp's own reader
constexpr size_t kPoolBuffers = 8;
constexpr size_t kPoolBytes = 128 << 20;
constexpr size_t kBufferGranule = 64 << 10;
constexpr std::align_val_t kBufferAlign{64};
// Buffers this large are the kernel's pages (mmap), given back when freed (beyond the pool's
// few): from malloc they come from the heap (run.cpp keeps allocations up to 32 MiB there, for
// the sending side's sake), which a trainer holding a few hundred received batches of 12 MB left
// 20% larger than what it held (the ImageNet-shaped soak, docs/benchmarks.md).
constexpr size_t kMappedBytes = 1 << 20;

kj::byte* allocate(size_t capacity) {
  if (capacity < kMappedBytes) return static_cast<kj::byte*>(::operator new(capacity, kBufferAlign));
  void* p = mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return static_cast<kj::byte*>(p);
}

void release(kj::byte* data, size_t capacity) {
  if (capacity < kMappedBytes) {
    ::operator delete(data, kBufferAlign);
  } else {
    munmap(data, capacity);
  }
}

struct IncomingBuffer {
  // One large received message's memory. Shared by the message's reader and every Received that
  // keeps bytes in it; returned to the pool by the last of them, on whichever thread that is.
  kj::byte* data;
  size_t capacity;
  ~IncomingBuffer();
};

class BufferPool {
 public:
  std::shared_ptr<IncomingBuffer> take(size_t bytes) {
    kj::byte* data = nullptr;
    size_t capacity = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // The smallest free buffer that fits and wastes at most half of itself.
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        capacity = it->first;
        data = it->second;
        free_.erase(it);
        freeBytes_ -= capacity;
        ++reused_;
      } else {
        ++allocated_;
      }
    }
    if (data == nullptr) {
      capacity = (bytes + kBufferGranule - 1) / kBufferGranule * kBufferGranule;
      data = allocate(capacity);
    }
    auto buffer = std::shared_ptr<IncomingBuffer>(new IncomingBuffer{data, capacity});
    std::lock_guard<std::mutex> lock(mutex_);
    live_[reinterpret_cast<uintptr_t>(data)] = buffer;
    return buffer;
  }

  void give(kj::byte* data, size_t capacity) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      live_.erase(reinterpret_cast<uintptr_t>(data));
      if (free_.size() < kPoolBuffers && freeBytes_ + capacity <= kPoolBytes) {
        free_.emplace(capacity, data);
        freeBytes_ += capacity;
        return;
      }
    }
    release(data, capacity);
  }

  std::shared_ptr<IncomingBuffer> find(const kj::byte* begin, const kj::byte* end) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = live_.upper_bound(reinterpret_cast<uintptr_t>(begin));
    if (it == live_.begin()) return nullptr;
    --it;
    auto buffer = it->second.lock();  // null while the last holder is releasing it
    if (buffer == nullptr || end > buffer->data + buffer->capacity) return nullptr;
    return buffer;
  }

  RetainedBuffers stats() {
    std::lock_guard<std::mutex> lock(mutex_);
    return {live_.size(), free_.size(), freeBytes_, reused_, allocated_};
  }

 private:
  std::mutex mutex_;
  std::map<uintptr_t, std::weak_ptr<IncomingBuffer>> live_;  // by start address
  std::multimap<size_t, kj::byte*> free_;                    // by capacity
  size_t freeBytes_ = 0;
  uint64_t reused_ = 0, allocated_ = 0;
};

BufferPool& pool() {
  static BufferPool* instance = new BufferPool;  // never destroyed: buffers may outlive main()
  return *instance;
}

IncomingBuffer::~IncomingBuffer() {
  pool().give(data, capacity);
}

kj::Exception prematureEof() {
  return KJ_EXCEPTION(DISCONNECTED, "premature EOF: the peer closed in the middle of a message");
}

}  // namespace

RetainedBuffers retainedBuffers() {
  return pool().stats();
}

std::shared_ptr<void> pooledBuffer(size_t bytes) {
  auto buffer = pool().take(bytes);
  return std::shared_ptr<void>(buffer, buffer->data);  // shares buffer's count
}

// ---------------------------------------------------------------------------------------------
// IncomingMessageStream

IncomingMessageStream::IncomingMessageStream(kj::AsyncIoStream& stream)
    : stream_(stream), writer_(stream) {}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> IncomingMessageStream::tryReadMessage(
    kj::ArrayPtr<kj::AutoCloseFd>, capnp::ReaderOptions options, kj::ArrayPtr<capnp::word>) {
  // One continuation for both outcomes (no extra promise node per message on the hot path).
  return stream_.tryRead(first_.begin(), sizeof(first_), sizeof(first_))
      .then(
          [this, options](size_t n) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
            if (n == 0) {
              if (peer_.empty()) return kj::Maybe<capnp::MessageReaderAndFds>(nullptr);
              return kj::Exception(
                  kj::Exception::Type::DISCONNECTED, __FILE__, __LINE__,
                  kj::str("the connection to ", peer_,
                          " closed: its process exited, or the node was lost or cut off"));
            }
            if (n < sizeof(first_)) return prematureEof();
            return readTable(options);
          },
          [this](kj::Exception&& e) -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
            if (peer_.empty()) return kj::mv(e);
            return kj::Exception(
                e.getType(), e.getFile(), e.getLine(),
                kj::str("the connection to ", peer_, " broke: ", e.getDescription()));
          });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> IncomingMessageStream::readTable(
    capnp::ReaderOptions options) {
  // The segment table: the segment count less one, each segment's size in words, padded to a
  // whole word. The first word (count and first size) is read.
  uint32_t count = first_[0] + 1;
  KJ_REQUIRE(count != 0 && count <= kMaxSegments, "message has too many segments", count);
  // The rest of the table (sizes 1.. and, for an even count, a padding word) follows.
  auto sizes = kj::heapArray<uint32_t>(1 + (count & ~1u));
  sizes[0] = first_[1];
  if (count == 1) return readSegments(kj::mv(sizes), options);
  auto rest = sizes.slice(1, sizes.size());
  return stream_.tryRead(rest.begin(), rest.size() * 4, rest.size() * 4)
      .then([this, sizes = kj::mv(sizes), need = rest.size() * 4,
             options](size_t n) mutable -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n < need) return prematureEof();
        return readSegments(kj::mv(sizes), options);
      });
}

kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> IncomingMessageStream::readSegments(
    kj::Array<uint32_t> table, capnp::ReaderOptions options) {
  size_t count = first_[0] + 1;
  uint64_t words = 0;
  for (size_t i = 0; i < count; ++i) words += table[i];
  KJ_REQUIRE(words <= options.traversalLimitInWords,
             "Message is too large.  To increase the limit on the receiving end, see "
             "capnp::ReaderOptions.",
             words * sizeof(capnp::word), options.traversalLimitInWords * sizeof(capnp::word));
  size_t bytes = words * sizeof(capnp::word);

  capnp::word* memory;
  kj::Array<capnp::word> small;
  std::shared_ptr<IncomingBuffer> large;
  if (bytes >= kRetainableBytes) {
    large = pool().take(bytes);
    memory = reinterpret_cast<capnp::word*>(large->data);
  } else {
    small = kj::heapArray<capnp::word>(words);
    memory = small.begin();
  }
  auto segments = kj::heapArray<kj::ArrayPtr<const capnp::word>>(count);
  size_t offset = 0;
  for (size_t i = 0; i < count; ++i) {
    segments[i] = kj::arrayPtr(memory + offset, table[i]);
    offset += table[i];
  }
  return stream_.tryRead(memory, bytes, bytes)
      .then([bytes, options, segments = kj::mv(segments), small = kj::mv(small),
             large = kj::mv(large)](
                size_t n) mutable -> kj::Promise<kj::Maybe<capnp::MessageReaderAndFds>> {
        if (n < bytes) return prematureEof();
        auto reader = kj::heap<capnp::SegmentArrayMessageReader>(segments, options);
        kj::Own<capnp::MessageReader> owned =
            reader.attach(kj::mv(segments), kj::mv(small), kj::mv(large));
        return kj::Maybe<capnp::MessageReaderAndFds>(
            capnp::MessageReaderAndFds{kj::mv(owned), nullptr});
      });
}

void IncomingMessageStream::sent(std::vector<std::shared_ptr<void>> lent) {
  if (!lent.empty()) lent_.push_back({sent_, kj::mv(lent)});
  ++sent_;
}

kj::Promise<void> IncomingMessageStream::holdLent(kj::Promise<void> write) {
  // Written are the messages before written_; what the ones just handed to the writer lend stays
  // with the write until it completes or is cancelled.
  std::vector<std::shared_ptr<void>> held;
  while (!lent_.empty() && lent_.front().message < written_) {
    for (auto& memory : lent_.front().memory) held.push_back(kj::mv(memory));
    lent_.pop_front();
  }
  if (held.empty()) return write;
  return write.attach(kj::mv(held));
}

kj::Promise<void> IncomingMessageStream::writeMessage(
    kj::ArrayPtr<const int> fds, kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segments) {
  ++written_;
  return holdLent(writer_.writeMessage(fds, segments));
}

kj::Promise<void> IncomingMessageStream::writeMessages(
    kj::ArrayPtr<kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>> messages) {
  written_ += messages.size();
  return holdLent(writer_.writeMessages(messages));
}

kj::Maybe<int> IncomingMessageStream::getSendBufferSize() {
  return writer_.getSendBufferSize();
}

kj::Promise<void> IncomingMessageStream::end() {
  return writer_.end();
}

// ---------------------------------------------------------------------------------------------
// Received

Received Received::keep(capnp::Data::Reader bytes) {
  Received r;
  if (bytes.size() == 0) return r;
  if (auto buffer = pool().find(bytes.begin(), bytes.end())) {
    r.bytes_ = bytes;
    r.owner_ = kj::mv(buffer);
    return r;
  }
  auto copy = std::shared_ptr<kj::byte[]>(new kj::byte[bytes.size()]);
  memcpy(copy.get(), bytes.begin(), bytes.size());
  r.bytes_ = kj::arrayPtr(copy.get(), bytes.size());
  r.owner_ = kj::mv(copy);
  r.copied_ = true;
  return r;
}

void Received::checkLayout(size_t size, size_t align) const {
  KJ_REQUIRE(bytes_.size() % size == 0, "received bytes are not a whole number of elements",
             bytes_.size(), size);
  KJ_REQUIRE(reinterpret_cast<uintptr_t>(bytes_.begin()) % align == 0,
             "received bytes are not aligned for their element type", align);
}

}  // namespace troupe
