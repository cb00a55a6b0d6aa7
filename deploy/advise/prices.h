// hetero_train's cost table: what an instance costs per hour, on demand or on managed spot
// capacity. On-demand prices come from the scheduler's instance table; a price file
// (`--prices FILE`, CSV) overrides them and adds spot prices, which change with region and time
// and so are not built in:
//
//   # comment lines start with '#'
//   instance_type,on_demand_usd_per_hour,spot_usd_per_hour
//   ml.p3.2xlarge,3.825,1.148
//   ml.c5.xlarge,0.204,
//
// An empty column means "not given". deploy/sagemaker/prices-example.csv is an example.

#pragma once

#include <map>
#include <optional>
#include <string>

namespace hetero_train {

struct Price {
  std::optional<double> onDemand, spot;  // USD per hour
};

class Prices {
 public:
  /// The built-in on-demand prices only.
  Prices() = default;
  /// Reads a price file. Throws std::invalid_argument naming the file, the line and the value
  /// (a missing file, a header without the columns, a price that is not a number >= 0).
  static Prices load(const std::string& path);

  /// The price per hour of `instanceType` under `spot` or on-demand pricing: the file's figure,
  /// else (on demand only) the built-in one. Nothing when neither knows it.
  std::optional<double> perHour(const std::string& instanceType, bool spot) const;

 private:
  std::map<std::string, Price> rows_;
};

}  // namespace hetero_train
