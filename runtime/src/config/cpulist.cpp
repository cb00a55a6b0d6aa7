// CPU lists ("0-3,7"), as Linux writes them in cpusets and as --cpus takes them.

#include <algorithm>
#include <sstream>

#include "troupe/config.h"

namespace troupe {

std::vector<unsigned> parseCpuList(const std::string& text, const std::string& what) {
  std::vector<unsigned> cpus;
  std::stringstream ss(text);
  std::string part;
  auto bad = [&]() {
    return ConfigError(what + " '" + text + "' is not a CPU list like \"0-3,7\"");
  };
  while (std::getline(ss, part, ',')) {
    auto dash = part.find('-');
    auto lo = part.substr(0, dash);
    auto hi = dash == std::string::npos ? lo : part.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 4 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(lo) || !digits(hi) || std::stoul(hi) < std::stoul(lo)) throw bad();
    for (unsigned c = std::stoul(lo); c <= std::stoul(hi); ++c) cpus.push_back(c);
  }
  if (cpus.empty()) throw bad();
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string formatCpuList(const std::vector<unsigned>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(cpus[i]);
    if (j > i) out += "-" + std::to_string(cpus[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace troupe
