// WebDataset shards (troupe/dataset/source.h): an index of every shard's tar headers, built once,
// then each image read in place with pread() at its offset. Members are grouped into samples by
// their key (the path up to the first dot of its last component, as WebDataset does); a sample is
// its image (.jpg .jpeg .png ...) and its label (.cls: the class as text; .json: an integer or
// {"label": N}). Tar is read here rather than through libarchive: an index needs only each
// header's name, size and offset (POSIX ustar, with GNU long names and pax `path` records), and
// libarchive reads archives as streams, where this reads one member anywhere in the file.

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <nlohmann/json.hpp>

#include "source_files.h"
#include "troupe/dataset/source.h"

namespace troupe::data {

namespace fs = std::filesystem;

namespace {

constexpr size_t kBlock = 512;

// Reads exactly `size` bytes at `offset`; false at EOF or on an error (errno set).
bool preadAll(int fd, void* out, size_t size, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(out);
  size_t got = 0;
  while (got < size) {
    ssize_t n = ::pread(fd, p + got, size - got, off_t(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0) errno = 0;
      return false;
    }
    got += size_t(n);
  }
  return true;
}

// A tar header's octal (or base-256) number.
std::optional<uint64_t> tarNumber(const char* field, size_t width) {
  auto bytes = reinterpret_cast<const unsigned char*>(field);
  if (bytes[0] & 0x80) {  // base-256, for sizes of 8 GiB and more
    uint64_t v = bytes[0] & 0x7f;
    for (size_t i = 1; i < width; ++i) v = (v << 8) | bytes[i];
    return v;
  }
  uint64_t v = 0;
  bool any = false;
  for (size_t i = 0; i < width; ++i) {
    char c = field[i];
    if (c == ' ' && !any) continue;
    if (c == '\0' || c == ' ') break;
    if (c < '0' || c > '7') return std::nullopt;
    v = v * 8 + uint64_t(c - '0');
    any = true;
  }
  return v;
}

std::string field(const char* p, size_t width) { return std::string(p, strnlen(p, width)); }

struct Member {
  uint32_t shard = 0;
  uint64_t offset = 0, size = 0;
  bool truncated = false;
};

struct Sample {
  std::string key;
  std::optional<Member> image;
  std::string imageExt;
  std::optional<int64_t> label;
  std::string labelProblem;
};

class WebDataset final : public Source {
 public:
  explicit WebDataset(std::vector<fs::path> shards) : shards_(std::move(shards)) {
    std::vector<Sample> samples;
    for (uint32_t s = 0; s < shards_.size(); ++s) {
      std::map<std::string, size_t> byKey;  // a key is a sample of its shard
      int fd = ::open(shards_[s].c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) {
        throw SourceError("WebDataset shard " + shards_[s].string() + ": cannot open: " +
                          strerror(errno));
      }
      fds_.push_back(fd);
      index(s, fd, byKey, samples);
    }
    int64_t maxLabel = -1;
    for (auto& sample : samples) {
      auto where = shards_[sample.image ? sample.image->shard : 0].string() + ": sample '" +
                   sample.key + "'";
      if (!sample.image) {
        throw SourceError("WebDataset " + where + " has no image (members " + sample.key +
                          ".jpg, .jpeg, .png ...)");
      }
      // A shard cut short inside an image, or between an image and its label: that sample is
      // a bad one (read() says so), its label gone with the rest of the shard.
      if (cutShards_.count(sample.image->shard) && !sample.label) sample.image->truncated = true;
      bool cut = sample.image->truncated;
      if (cut && !sample.label) sample.label = 0;
      if (!sample.labelProblem.empty() && !cut) {
        throw SourceError("WebDataset " + where + ": " + sample.labelProblem);
      }
      if (!sample.label) {
        throw SourceError("WebDataset " + where + " has no label (a member " + sample.key +
                          ".cls holding the class number, or " + sample.key + ".json)");
      }
      maxLabel = std::max(maxLabel, *sample.label);
      members_.push_back(*sample.image);
      names_.push_back(shards_[sample.image->shard].string() + ":" + sample.key +
                       sample.imageExt);
      targets_.push_back(*sample.label);
    }
    if (members_.empty()) {
      throw SourceError("WebDataset " + shards_.front().string() + (shards_.size() > 1 ? " ..." : "") +
                        ": no samples in " + std::to_string(shards_.size()) + " shard(s)");
    }
    classes_ = files::numberedClasses(maxLabel);
  }

  ~WebDataset() override {
    for (int fd : fds_) ::close(fd);
  }

  size_t size() const override { return members_.size(); }

  Encoded read(size_t i) const override {
    auto& m = members_.at(i);
    if (m.truncated) {
      throw SampleError(names_[i], "cut short: the shard ends inside this sample (its image " +
                                       std::to_string(m.size) +
                                       " bytes), and whatever followed it in the shard is lost");
    }
    std::vector<uint8_t> bytes;
    try {
      bytes.resize(m.size);
    } catch (const std::bad_alloc&) {
      throw SampleError(names_[i],
                        "out of memory reading its " + std::to_string(m.size) + " bytes");
    }
    if (!preadAll(fds_[m.shard], bytes.data(), bytes.size(), m.offset)) {
      throw SampleError(names_[i], errno ? std::string("cannot read: ") + strerror(errno)
                                         : "cut short: the shard ends inside this member");
    }
    if (bytes.empty()) throw SampleError(names_[i], "the member is empty (0 bytes)");
    return Encoded{std::move(bytes), targets_[i], names_[i]};
  }
  std::string nameOf(size_t i) const override { return names_.at(i); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<std::string> notes() const override { return notes_; }
  std::string kind() const override { return "WebDataset"; }
  std::string where() const override {
    return shards_.size() == 1 ? shards_[0].string()
                               : shards_[0].parent_path().string() + " (" +
                                     std::to_string(shards_.size()) + " shards)";
  }

 private:
  void index(uint32_t s, int fd, std::map<std::string, size_t>& byKey,
             std::vector<Sample>& samples) {
    struct stat st {};
    fstat(fd, &st);
    uint64_t fileSize = uint64_t(st.st_size), at = 0;
    std::string longName;
    auto bad = [&](const std::string& why) {
      return SourceError("WebDataset shard " + shards_[s].string() + ": " + why + " at byte " +
                         std::to_string(at) + "; is it a tar file (tar --format=ustar or gnu)?");
    };
    char h[kBlock];
    bool ended = false;     // tar's end-of-archive block seen
    std::string cutInside;  // the member the shard ends inside
    while (at + kBlock <= fileSize) {
      if (!preadAll(fd, h, kBlock, at)) throw bad(std::string("cannot read: ") + strerror(errno));
      if (std::all_of(h, h + kBlock, [](char c) { return c == 0; })) {
        ended = true;
        break;
      }
      auto size = tarNumber(h + 124, 12);
      if (!size) throw bad("a damaged header (size '" + field(h + 124, 12) + "')");
      char type = h[156];
      uint64_t data = at + kBlock;
      // A size past the shard's end: a member cut short, or a crafted size. Nothing is allocated
      // or skipped by it (skipping would wrap the offset round to an earlier header).
      bool past = *size > fileSize - data;
      std::string name = field(h, 100);
      if (memcmp(h + 257, "ustar", 5) == 0 && h[345] != '\0') name = field(h + 345, 155) + "/" + name;
      if (!longName.empty()) name = std::exchange(longName, std::string());
      if (type == 'L' || type == 'x') {
        constexpr uint64_t kMaxHeader = 1 << 20;
        if (past || *size > kMaxHeader) {
          throw bad("a " + std::string(type == 'L' ? "long-name" : "pax") + " header of " +
                    std::to_string(*size) + " bytes (" +
                    (past ? "past the shard's end, " + std::to_string(fileSize) + " bytes"
                          : "more than 1 MiB") +
                    ")");
        }
        std::string text(*size, '\0');
        if (!preadAll(fd, text.data(), text.size(), data)) throw bad("a header cut short");
        if (type == 'L') {
          longName = text.c_str();
        } else {
          // pax records: "LEN path=VALUE\n"
          for (size_t p = 0; p < text.size();) {
            size_t space = text.find(' ', p);
            if (space == std::string::npos) break;
            size_t len = std::strtoull(text.c_str() + p, nullptr, 10);
            if (len == 0 || p + len > text.size()) break;
            auto record = text.substr(space + 1, p + len - space - 2);
            if (record.rfind("path=", 0) == 0) longName = record.substr(5);
            p += len;
          }
        }
      } else if (type == '0' || type == '\0' || type == '7') {
        add(s, name, data, *size, past, fd, byKey, samples);
        if (past) cutInside = name;
      }
      if (past) break;
      at = data + (*size + kBlock - 1) / kBlock * kBlock;
    }
    // A shard cut short: the member it ends inside is a bad sample (read() says so); the members
    // after the cut are gone without a name, so the shard is named here with where it ends.
    if (!cutInside.empty() || (!ended && at < fileSize)) {
      cutShards_.insert(s);
      notes_.push_back("WebDataset shard " + shards_[s].string() +
                       " is cut short: it ends at byte " + std::to_string(fileSize) +
                       (cutInside.empty() ? " inside a header"
                                          : " inside member " + cutInside + " (a bad sample)") +
                       ", and every member after the cut is lost; copy the shard again");
    } else if (!ended) {
      notes_.push_back("WebDataset shard " + shards_[s].string() + " has no end-of-archive " +
                       "blocks after byte " + std::to_string(at) +
                       ": it may have been cut between members, losing those after the cut");
    }
  }

  void add(uint32_t s, const std::string& path, uint64_t offset, uint64_t size, bool truncated,
           int fd, std::map<std::string, size_t>& byKey, std::vector<Sample>& samples) {
    auto slash = path.rfind('/');
    auto dot = path.find('.', slash == std::string::npos ? 0 : slash + 1);
    if (dot == std::string::npos) return;  // no extension: not part of a sample
    auto key = path.substr(0, dot), ext = files::lower(path.substr(dot));
    auto [it, fresh] = byKey.emplace(key, samples.size());
    if (fresh) samples.push_back(Sample{key, std::nullopt, "", std::nullopt, ""});
    auto& sample = samples[it->second];
    if (files::isImageExtension(ext)) {
      sample.image = Member{s, offset, size, truncated};
      sample.imageExt = ext;
      return;
    }
    if (ext != ".cls" && ext != ".json") return;
    if (truncated || size > 4096) {
      sample.labelProblem = path + ": " + (truncated ? "cut short" : "too large for a label");
      return;
    }
    std::string text(size, '\0');
    if (!preadAll(fd, text.data(), size, offset)) {
      sample.labelProblem = path + ": cannot read";
      return;
    }
    std::optional<int64_t> label;
    if (ext == ".cls") {
      label = files::parseLabel(text);
    } else {
      try {
        auto j = nlohmann::json::parse(text);
        if (j.is_object() && j.contains("label")) j = j["label"];
        if (j.is_number_integer() && j.get<int64_t>() >= 0) label = j.get<int64_t>();
      } catch (const nlohmann::json::exception&) {
      }
    }
    if (!label) {
      sample.labelProblem = path + ": label '" + text.substr(0, 40) +
                            "' is out of range: a label is a class number, 0 or more";
      return;
    }
    sample.label = label;
  }

  std::vector<fs::path> shards_;
  std::vector<int> fds_;
  std::vector<Member> members_;
  std::vector<std::string> names_;
  std::vector<int64_t> targets_;
  std::vector<std::string> classes_, notes_;
  std::set<uint32_t> cutShards_;
};

}  // namespace

std::unique_ptr<Source> openWebDataset(std::vector<fs::path> shards) {
  return std::make_unique<WebDataset>(std::move(shards));
}

}  // namespace troupe::data
