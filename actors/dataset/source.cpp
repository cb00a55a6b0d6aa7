// Datasets the data group reads (troupe/dataset/source.h): ImageFolder, manifest, IDX, and
// openSource(), which finds the kind from what is at the path. WebDataset shards are in
// webdataset.cpp.

#include "troupe/dataset/source.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "source_files.h"
#include "troupe/dataset/fashion_mnist.h"

namespace troupe::data {

namespace fs = std::filesystem;

const std::vector<std::string>& imageExtensions() {
  static const std::vector<std::string> kAll = {".jpg", ".jpeg", ".png", ".ppm", ".bmp",
                                                ".pgm", ".tif", ".tiff", ".webp"};
  return kAll;
}

namespace files {

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool isImageExtension(const std::string& ext) {
  auto& all = imageExtensions();
  return std::find(all.begin(), all.end(), lower(ext)) != all.end();
}

bool isImage(const fs::path& p) { return isImageExtension(p.extension().string()); }

std::string extensionList() {
  std::string out;
  for (auto& e : imageExtensions()) out += (out.empty() ? "" : " ") + e;
  return out;
}

std::vector<uint8_t> readWhole(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SampleError(path, std::string("cannot open: ") + strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw SampleError(path, std::string("cannot stat: ") + strerror(e));
  }
  if (uint64_t(st.st_size) > kMaxSampleFileBytes) {
    ::close(fd);
    throw SampleError(path, "the file is " + std::to_string(st.st_size) +
                                " bytes, more than troupe reads for one sample (" +
                                std::to_string(kMaxSampleFileBytes) +
                                "): not an image a model trains on (a decompression bomb, a video, "
                                "a disk image); move it out of the dataset");
  }
  std::vector<uint8_t> bytes(size_t(st.st_size));
  size_t got = 0;
  while (got < bytes.size()) {
    ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = n < 0 ? errno : 0;
      ::close(fd);
      throw SampleError(path, n < 0 ? std::string("cannot read: ") + strerror(e)
                                    : "cut short: " + std::to_string(got) + " of " +
                                          std::to_string(bytes.size()) + " bytes");
    }
    got += size_t(n);
  }
  ::close(fd);
  if (bytes.empty()) throw SampleError(path, "the file is empty (0 bytes)");
  return bytes;
}

std::vector<std::string> numberedClasses(int64_t maxLabel) {
  std::vector<std::string> out;
  for (int64_t i = 0; i <= maxLabel; ++i) out.push_back(std::to_string(i));
  return out;
}

// A non-negative integer label, or nullopt.
std::optional<int64_t> parseLabel(const std::string& text) {
  size_t b = text.find_first_not_of(" \t\r\n"), e = text.find_last_not_of(" \t\r\n");
  if (b == std::string::npos) return std::nullopt;
  auto t = text.substr(b, e - b + 1);
  if (t.empty() || t.size() > 12 || !std::all_of(t.begin(), t.end(), ::isdigit)) {
    return std::nullopt;
  }
  return std::stoll(t);
}

}  // namespace files

namespace {

using files::isImage;

// A list of files, each read whole: what an ImageFolder and a manifest both are once opened.
class FileList : public Source {
 public:
  size_t size() const override { return paths_.size(); }
  Encoded read(size_t i) const override {
    try {
      return Encoded{files::readWhole(paths_.at(i)), targets_.at(i), paths_[i]};
    } catch (const std::bad_alloc&) {
      throw SampleError(paths_[i], "out of memory reading it whole");
    }
  }
  std::string nameOf(size_t i) const override { return paths_.at(i); }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::vector<std::string> notes() const override { return notes_; }

 protected:
  std::vector<std::string> classes_, notes_;
  std::vector<std::string> paths_;
  std::vector<int64_t> targets_;
};

// ---------------------------------------------------------------------------------------------
// ImageFolder

class ImageFolder final : public FileList {
 public:
  explicit ImageFolder(const fs::path& root) : root_(root) {
    std::error_code ec;
    for (auto& e : fs::directory_iterator(root, ec)) {
      auto name = e.path().filename().string();
      if (name.empty() || name[0] == '.') continue;
      std::error_code entry;
      if (e.is_directory(entry)) classes_.push_back(name);
      if (entry == std::errc::too_many_symbolic_link_levels) throw loop(e.path(), entry);
    }
    if (ec) throw SourceError("ImageFolder " + root.string() + ": cannot list: " + ec.message());
    std::sort(classes_.begin(), classes_.end());
    if (classes_.empty()) {
      throw SourceError("ImageFolder " + root.string() +
                        ": no class folders (an ImageFolder holds one folder per class, each "
                        "with that class's images)");
    }
    std::vector<std::string> empty, notImages;
    auto realRoot = fs::canonical(root, ec);
    if (ec) throw cannotList(root, ec);
    for (size_t c = 0; c < classes_.size(); ++c) {
      std::vector<std::pair<std::string, std::string>> found;  // (folder, name)
      auto dir = root / classes_[c];
      // The folders the listing is inside (and the root), as their real paths: a folder that is
      // one of them again is a symlink loop, which os.walk(followlinks=True) would follow until the
      // path is too long. Error codes throughout: a filesystem_error would end every process.
      std::vector<fs::path> inside{fs::canonical(dir, ec)};
      if (ec) throw cannotList(dir, ec);
      for (auto it = fs::recursive_directory_iterator(
               dir, fs::directory_options::follow_directory_symlink, ec);
           !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
        auto name = it->path().filename().string();
        std::error_code entry;
        bool folder = it->is_directory(entry);
        if (entry == std::errc::too_many_symbolic_link_levels) throw loop(it->path(), entry);
        if (!name.empty() && name[0] == '.') {
          if (folder) it.disable_recursion_pending();
          continue;
        }
        if (folder) {
          auto real = fs::canonical(it->path(), entry);
          if (entry) throw cannotList(it->path(), entry);
          inside.resize(size_t(it.depth()) + 1);
          if (real == realRoot || std::find(inside.begin(), inside.end(), real) != inside.end()) {
            throw SourceError("ImageFolder " + root.string() + ": " + it->path().string() +
                              " is a symlink loop: it leads back to " + real.string() +
                              ", a folder it is inside; remove the link or point it elsewhere");
          }
          inside.push_back(real);
          continue;
        }
        if (!it->is_regular_file(entry)) continue;  // a dangling link, a socket
        if (!isImage(it->path())) {
          notImages.push_back(it->path().string());
          continue;
        }
        found.emplace_back(it->path().parent_path().string(), name);
      }
      if (ec == std::errc::too_many_symbolic_link_levels) throw loop(dir, ec);
      if (ec) throw cannotList(dir, ec);
      if (found.empty()) empty.push_back(classes_[c]);
      // torchvision: sorted(os.walk(...)), then each folder's files sorted.
      std::sort(found.begin(), found.end());
      for (auto& [folder, name] : found) {
        paths_.push_back(folder + "/" + name);
        targets_.push_back(int64_t(c));
      }
    }
    if (!empty.empty()) {
      std::string list;
      for (auto& e : empty) list += (list.empty() ? "" : ", ") + e;
      throw SourceError("ImageFolder " + root.string() + ": no image in the class folder(s) " +
                        list + " (image files end in " + files::extensionList() +
                        "); remove the folder or add its images");
    }
    if (!notImages.empty()) {
      // torchvision's ImageFolder leaves them out without a word; this says how many.
      std::string list;
      for (size_t i = 0; i < notImages.size() && i < 5; ++i) {
        list += (list.empty() ? "" : ", ") + notImages[i];
      }
      if (notImages.size() > 5) list += " and " + std::to_string(notImages.size() - 5) + " more";
      notes_.push_back("ImageFolder " + root.string() + ": left out " +
                       std::to_string(notImages.size()) + " file(s) that are not images, as " +
                       "torchvision's ImageFolder does: " + list + " (image files end in " +
                       files::extensionList() + ")");
    }
  }

  std::string kind() const override { return "ImageFolder"; }
  std::string where() const override { return root_.string(); }

 private:
  fs::path root_;

  SourceError cannotList(const fs::path& p, std::error_code ec) const {
    if (ec == std::errc::too_many_symbolic_link_levels) return loop(p, ec);
    return SourceError("ImageFolder " + root_.string() + ": cannot list " + p.string() + ": " +
                       ec.message());
  }
  SourceError loop(const fs::path& p, std::error_code ec) const {
    return SourceError("ImageFolder " + root_.string() + ": " + p.string() +
                       " is a symlink loop (" + ec.message() +
                       "); remove the link or point it elsewhere");
  }
};

// ---------------------------------------------------------------------------------------------
// Manifest: CSV (path,label) or JSON lines ({"path": ..., "label": ...})

class Manifest final : public FileList {
 public:
  explicit Manifest(const fs::path& file) : file_(file) {
    std::ifstream in(file);
    if (!in) throw SourceError("manifest " + file.string() + ": cannot open: " + strerror(errno));
    auto base = file.parent_path();
    std::string line;
    size_t number = 0;
    int64_t maxLabel = -1;
    bool json = files::lower(file.extension().string()) != ".csv";
    while (std::getline(in, line)) {
      ++number;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line.find_first_not_of(" \t") == std::string::npos) continue;
      std::string path, label;
      auto where = [&]() { return "manifest " + file.string() + ", line " + std::to_string(number); };
      if (json) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(line);
        } catch (const nlohmann::json::exception& e) {
          throw SourceError(where() + ": not JSON (" + e.what() +
                            "); each line is {\"path\": \"...\", \"label\": N}");
        }
        if (!j.is_object() || !j.contains("path") || !j["path"].is_string() ||
            !j.contains("label")) {
          throw SourceError(where() + ": " + line + ": each line is {\"path\": \"...\", \"label\": N}");
        }
        path = j["path"].get<std::string>();
        label = j["label"].is_number_integer() ? std::to_string(j["label"].get<int64_t>())
                                               : j["label"].dump();
      } else {
        auto comma = line.rfind(',');
        if (comma == std::string::npos) {
          throw SourceError(where() + ": '" + line + "': each line is PATH,LABEL");
        }
        path = line.substr(0, comma);
        label = line.substr(comma + 1);
        if (path.size() >= 2 && path.front() == '"' && path.back() == '"') {
          path = path.substr(1, path.size() - 2);
        }
        if (number == 1 && files::lower(label) == "label") continue;  // the header
      }
      auto value = files::parseLabel(label);
      if (!value) {
        throw SourceError(where() + ": label '" + label + "' of " + path +
                          " is out of range: a label is a class number, 0 or more");
      }
      maxLabel = std::max(maxLabel, *value);
      paths_.push_back(fs::path(path).is_absolute() ? path : (base / path).string());
      targets_.push_back(*value);
    }
    if (paths_.empty()) {
      throw SourceError("manifest " + file.string() + ": no samples (lines of PATH,LABEL in a .csv; "
                        "{\"path\": ..., \"label\": N} in a .jsonl)");
    }
    classes_ = files::numberedClasses(maxLabel);
  }

  std::string kind() const override { return "manifest"; }
  std::string where() const override { return file_.string(); }

 private:
  fs::path file_;
};

// ---------------------------------------------------------------------------------------------
// Fashion-MNIST IDX files: 28x28 grey pixels, held in memory (47 MB for the training split).

class Idx final : public Source {
 public:
  explicit Idx(const fs::path& dir) : dir_(dir) {
    try {
      images_ = loadFashionMnist(dir, Split::kTrain);
    } catch (const DatasetError& e) {
      throw SourceError(std::string("IDX files: ") + e.what());
    }
    classes_ = files::numberedClasses(int64_t(kFashionMnistClasses) - 1);
  }

  size_t size() const override { return images_.size(); }
  Encoded read(size_t i) const override {
    auto px = images_.image(i);
    return Encoded{std::vector<uint8_t>(px.begin(), px.end()), images_.labels.at(i), nameOf(i)};
  }
  std::string nameOf(size_t i) const override {
    return dir_.string() + "/train-images-idx3-ubyte[" + std::to_string(i) + "]";
  }
  const std::vector<std::string>& classes() const override { return classes_; }
  std::string kind() const override { return "IDX"; }
  std::string where() const override { return dir_.string(); }
  Encoding encoding() const override { return Encoding::kRawGrey8; }
  std::pair<int, int> rawShape() const override {
    return {int(images_.rows), int(images_.cols)};
  }

 private:
  fs::path dir_;
  LabeledImages images_;
  std::vector<std::string> classes_;
};

bool isManifest(const fs::path& p) {
  auto ext = files::lower(p.extension().string());
  return ext == ".csv" || ext == ".jsonl" || ext == ".json";
}

}  // namespace

std::unique_ptr<Source> openImageFolder(const fs::path& root) {
  return std::make_unique<ImageFolder>(root);
}
std::unique_ptr<Source> openManifest(const fs::path& file) { return std::make_unique<Manifest>(file); }
std::unique_ptr<Source> openIdx(const fs::path& dir) { return std::make_unique<Idx>(dir); }

namespace {

std::unique_ptr<Source> openAt(const fs::path& path) {
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (ec || !fs::exists(status)) {
    throw SourceError("dataset " + path.string() + ": not found" +
                      (ec ? " (" + ec.message() + ")" : std::string()));
  }
  if (fs::is_regular_file(status)) {
    if (files::lower(path.extension().string()) == ".tar") return openWebDataset({path});
    if (isManifest(path)) return openManifest(path);
    throw SourceError("dataset " + path.string() +
                      ": a file that is neither a .tar shard nor a manifest (.csv, .jsonl)");
  }
  std::vector<fs::path> shards, manifests;
  bool idx = false, folders = false;
  for (auto& e : fs::directory_iterator(path, ec)) {
    auto name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    std::error_code entry;  // a symlink loop: the ImageFolder names it
    if (e.is_directory(entry) || entry == std::errc::too_many_symbolic_link_levels) folders = true;
    if (!e.is_regular_file(entry)) continue;
    if (files::lower(e.path().extension().string()) == ".tar") shards.push_back(e.path());
    if (isManifest(e.path())) manifests.push_back(e.path());
    if (name.rfind("train-images-idx3-ubyte", 0) == 0) idx = true;
  }
  if (ec) throw SourceError("dataset " + path.string() + ": cannot list: " + ec.message());
  if (!shards.empty()) {
    std::sort(shards.begin(), shards.end());
    return openWebDataset(shards);
  }
  if (idx) return openIdx(path);
  if (!manifests.empty() && folders) {
    throw SourceError("dataset " + path.string() + ": both class folders (an ImageFolder) and " +
                      "a manifest, " + manifests.front().filename().string() +
                      ": which to read is unclear; give the manifest's own path to read it, or "
                      "move it out of the folder to read the class folders");
  }
  if (manifests.size() == 1) return openManifest(manifests.front());
  if (folders) return openImageFolder(path);
  throw SourceError("dataset " + path.string() +
                    ": found no dataset there: looked for class folders (an ImageFolder), .tar "
                    "shards (WebDataset), one manifest (.csv, .jsonl) and Fashion-MNIST's IDX "
                    "files (train-images-idx3-ubyte)");
}

}  // namespace

std::unique_ptr<Source> openSource(const fs::path& path) {
  try {
    return openAt(path);
  } catch (const fs::filesystem_error& e) {  // one the listing did not foresee: still named
    throw SourceError("dataset " + path.string() + ": " + e.what());
  }
}

}  // namespace troupe::data
