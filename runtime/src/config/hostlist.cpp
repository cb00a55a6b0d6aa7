// Slurm's host list syntax (expandHostList in troupe/config.h).

#include <algorithm>
#include <sstream>

#include "troupe/config.h"

namespace troupe {

namespace {

std::vector<std::string> splitTopLevel(const std::string& text, const std::string& what) {
  // Splits at commas outside brackets.
  std::vector<std::string> parts;
  std::string part;
  int depth = 0;
  for (char ch : text) {
    if (ch == '[') ++depth;
    if (ch == ']' && --depth < 0) break;
    if (ch == ',' && depth == 0) {
      parts.push_back(part);
      part.clear();
    } else {
      part += ch;
    }
  }
  if (depth != 0) {
    throw ConfigError(what + " '" + text + "' is not a Slurm host list: unbalanced brackets");
  }
  parts.push_back(part);
  return parts;
}

void expandOne(const std::string& expr, const std::string& list, const std::string& what,
               std::vector<std::string>& out) {
  auto bad = [&](const std::string& why) {
    return ConfigError(what + " '" + list + "' is not a Slurm host list: " + why);
  };
  auto open = expr.find('[');
  if (open == std::string::npos) {
    if (expr.empty()) throw bad("an empty host name");
    out.push_back(expr);
    return;
  }
  auto close = expr.find(']', open);
  auto prefix = expr.substr(0, open);
  auto rest = expr.substr(close + 1);
  std::string ranges = expr.substr(open + 1, close - open - 1);
  std::stringstream ss(ranges);
  std::string range;
  bool any = false;
  while (std::getline(ss, range, ',')) {
    any = true;
    auto dash = range.find('-');
    auto lo = range.substr(0, dash);
    auto hi = dash == std::string::npos ? lo : range.substr(dash + 1);
    auto digits = [](const std::string& s) {
      return !s.empty() && s.size() <= 9 &&
             std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!digits(lo) || !digits(hi)) throw bad("'" + range + "' is not a number or range");
    unsigned from = std::stoul(lo), to = std::stoul(hi);
    if (to < from) throw bad("range '" + range + "' runs backwards");
    if (to - from > 100000) throw bad("range '" + range + "' is too large");
    for (unsigned i = from; i <= to; ++i) {
      auto n = std::to_string(i);
      if (n.size() < lo.size()) n = std::string(lo.size() - n.size(), '0') + n;
      expandOne(prefix + n + rest, list, what, out);
    }
  }
  if (!any) throw bad("empty brackets");
}

}  // namespace

std::vector<std::string> expandHostList(const std::string& list, const std::string& what) {
  std::vector<std::string> hosts;
  for (auto& part : splitTopLevel(list, what)) expandOne(part, list, what, hosts);
  return hosts;
}

}  // namespace troupe
