#include "outputs.h"

#include <algorithm>
#include <ctime>
#include <set>

namespace fs = std::filesystem;

namespace sim {

fs::path defaultOutDir(const std::string& app) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::tm utc;
  gmtime_r(&now, &utc);
  std::strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", &utc);
  fs::path base = fs::path("troupe-out") / (fs::path(app).filename().string() + "-" + stamp);
  fs::path dir = base;
  for (int n = 2; fs::exists(dir); ++n) dir = base.string() + "-" + std::to_string(n);
  return dir;
}

std::vector<fs::path> keepOutputs(const std::vector<std::pair<std::string, fs::path>>& roots,
                                  const fs::path& out) {
  // (from inside a root, to inside `out`)
  const std::pair<const char*, const char*> folders[] = {{"model", "model"},
                                                         {"output/data", "output"}};
  std::vector<fs::path> kept;
  std::set<fs::path> written;
  for (auto& [host, root] : roots) {
    for (auto& [from, to] : folders) {
      fs::path src = root / from;
      std::error_code ec;
      if (!fs::is_directory(src, ec)) continue;
      for (auto it = fs::recursive_directory_iterator(src, ec); !ec && it != fs::end(it);
           it.increment(ec)) {
        if (!it->is_regular_file()) continue;
        fs::path rel = fs::path(to) / fs::relative(it->path(), src);
        if (written.count(rel)) rel = fs::path(host) / rel;  // a second instance's copy
        fs::create_directories((out / rel).parent_path());
        fs::copy_file(it->path(), out / rel, fs::copy_options::overwrite_existing);
        written.insert(rel);
        kept.push_back(rel);
      }
    }
  }
  std::sort(kept.begin(), kept.end());
  return kept;
}

}  // namespace sim
