// PNG through libpng (decode_png.cpp), for decode.cpp.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "troupe/images/transforms.h"

namespace troupe::images {

bool isPng(std::span<const uint8_t> bytes);

/// `bytes`, a PNG, as 8-bit grey (channels 1) or RGB (3); throws data::SampleError naming `name`
/// when it is damaged or cut short.
Image decodePng(std::span<const uint8_t> bytes, const std::string& name, int channels);

}  // namespace troupe::images
