#include "prices.h"

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "troupe/sched/instance_types.h"

namespace hetero_train {

namespace {

std::vector<std::string> splitCsv(const std::string& line) {
  std::vector<std::string> out;
  std::stringstream ss(line);
  std::string cell;
  while (std::getline(ss, cell, ',')) {
    auto b = cell.find_first_not_of(" \t\r");
    auto e = cell.find_last_not_of(" \t\r");
    out.push_back(b == std::string::npos ? "" : cell.substr(b, e - b + 1));
  }
  if (!line.empty() && line.back() == ',') out.push_back("");
  return out;
}

}  // namespace

Prices Prices::load(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("price file '" + path + "' cannot be read");
  Prices p;
  std::string line;
  int number = 0, typeAt = -1, onDemandAt = -1, spotAt = -1;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos || line[0] == '#') continue;
    auto cells = splitCsv(line);
    auto where = "price file '" + path + "' line " + std::to_string(number);
    if (typeAt < 0) {
      for (int i = 0; i < int(cells.size()); ++i) {
        if (cells[i] == "instance_type") typeAt = i;
        if (cells[i] == "on_demand_usd_per_hour") onDemandAt = i;
        if (cells[i] == "spot_usd_per_hour") spotAt = i;
      }
      if (typeAt < 0 || (onDemandAt < 0 && spotAt < 0)) {
        throw std::invalid_argument(where +
                                    ": the header needs instance_type and "
                                    "on_demand_usd_per_hour and/or spot_usd_per_hour, got '" +
                                    line + "'");
      }
      continue;
    }
    auto cell = [&](int at) { return at >= 0 && at < int(cells.size()) ? cells[at] : ""; };
    auto number_ = [&](int at, const char* column) -> std::optional<double> {
      auto text = cell(at);
      if (text.empty()) return std::nullopt;
      try {
        size_t used = 0;
        double v = std::stod(text, &used);
        if (used == text.size() && v >= 0) return v;
      } catch (const std::exception&) {
      }
      throw std::invalid_argument(where + ": " + column + " '" + text +
                                  "' is not a price (a number >= 0, USD per hour)");
    };
    auto type = cell(typeAt);
    if (type.empty()) throw std::invalid_argument(where + ": no instance_type");
    p.rows_[type] = {number_(onDemandAt, "on_demand_usd_per_hour"),
                     number_(spotAt, "spot_usd_per_hour")};
  }
  if (typeAt < 0) throw std::invalid_argument("price file '" + path + "' has no header line");
  return p;
}

std::optional<double> Prices::perHour(const std::string& instanceType, bool spot) const {
  auto it = rows_.find(instanceType);
  if (it != rows_.end()) {
    auto& v = spot ? it->second.spot : it->second.onDemand;
    if (v) return v;
  }
  if (spot) return std::nullopt;
  auto type = troupe::sched::findInstanceType(instanceType);
  if (type) return type->pricePerHour;
  return std::nullopt;
}

}  // namespace hetero_train
