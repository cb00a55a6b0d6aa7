// File: troupe/log.h
//
// Lets spdlog (fmt) format KJ strings, so runtime, actor and app code log KJ and std strings alike.
#pragma once

#include <kj/string.h>
#include <spdlog/fmt/fmt.h>

#include <string>
#include <string_view>

namespace troupe {

// A reason of several lines (a training script's exception with a worker's traceback) as its
// first, saying how many more there are: what a log line shows of it; the failure file, written
// once per instance, holds the whole.
inline std::string firstLine(std::string_view reason) {
  auto end = reason.find('\n');
  if (end == std::string_view::npos) return std::string(reason);
  size_t more = 0;
  for (size_t at = end; at != std::string_view::npos; at = reason.find('\n', at + 1)) {
    if (at + 1 < reason.size()) ++more;
  }
  return std::string(reason.substr(0, end)) + " (" + std::to_string(more) +
         " more lines in the failure file)";
}

}  // namespace troupe

template <>
struct fmt::formatter<kj::StringPtr> : fmt::formatter<std::string_view> {
  auto format(kj::StringPtr s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.begin(), s.size()), ctx);
  }
};

template <>
struct fmt::formatter<kj::String> : fmt::formatter<std::string_view> {
  auto format(const kj::String& s, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(std::string_view(s.begin(), s.size()), ctx);
  }
};
