// File: config_error.h
//
// The text of the troupe::ConfigError `f` throws, or "no error": how the tests compare a bad
// input's message with what a person should read.
//
//   CHECK_THAT(configErrorOf([&] { parse("{"); }), Contains("is not valid JSON"));

#pragma once

#include <functional>
#include <string>

#include "troupe/config.h"

namespace troupe::testing {

inline std::string configErrorOf(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace troupe::testing
