// File: troupe/log.h
//
// Lets spdlog (fmt) format KJ strings, so runtime, actor and app code log KJ and std strings alike.
#pragma once

#include <kj/string.h>
#include <spdlog/fmt/fmt.h>

#include <string_view>

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
