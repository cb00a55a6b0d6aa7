// What cluster_test's files share: the cluster of `make run` as troupe sim's --group flags.

#pragma once

#include <string>
#include <vector>

namespace cluster_test {

inline const std::vector<std::string> kThree = {"--group", "data_group=2:ml.c5.xlarge", "--group",
                                                "dnn_group=1:ml.p3.2xlarge"};

inline std::vector<std::string> with(std::vector<std::string> a, std::vector<std::string> b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace cluster_test
