// `troupe sim`: what a job leaves behind. On SageMaker an instance's /opt/ml/model is uploaded as
// model.tar.gz and /opt/ml/output/data as output.tar.gz when the job ends; the simulator's roots
// are temporary, so it copies the same folders of every instance into one that stays:
//
//   OUT/model/...    every instance's <root>/model/
//   OUT/output/...   every instance's <root>/output/data/
//
// OUT is --out, else troupe-out/<app>-<UTC time> under the current folder, made only when some
// instance wrote something there.

#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

namespace sim {

std::filesystem::path defaultOutDir(const std::string& app);
// troupe-out/<app's file name>-<YYYYMMDD-HHMMSS> (UTC), with -2, -3, ... if that exists.

std::vector<std::filesystem::path> keepOutputs(
    const std::vector<std::pair<std::string, std::filesystem::path>>& roots,
    const std::filesystem::path& out);
// Copies every root's model/ and output/data/ into `out` (made when there is anything to copy)
// and returns the files copied, relative to `out`, sorted. A file two instances wrote (the same
// relative path) is kept from the first host in `roots`; each other one goes under
// `out/<host>/` instead, so nothing is lost. Throws std::filesystem::filesystem_error when `out`
// cannot be written.

}  // namespace sim
