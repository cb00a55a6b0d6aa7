// A batch's tensors as they cross the wire (troupe/train/batch_maker.h): the receiver makes a numpy
// array of each tensor's dtype and shape over its bytes, so both are checked against the bytes
// first, on the worker pool's side, the trainer's and the script's (python/src/native.cpp). Only
// numeric dtypes of their sizes are a tensor's: strings, objects, records and sizes numpy has
// no type for are refused (before: "<U8", "|S5" and "|V16" were taken as tensors).

#include <catch2/catch.hpp>

#include "troupe/train/batch_maker.h"

using troupe::train::numpyItemSize;
using troupe::train::tensorBytesFit;

TEST_CASE("the wire: a tensor's dtype is numeric, of its sizes, and its shape fits its bytes",
          "[wire]") {
  for (auto [dtype, size] : {std::pair<const char*, uint64_t>{"<f4", 4},
                             {"|u1", 1},
                             {"|b1", 1},
                             {"<i8", 8},
                             {">f8", 8},
                             {"<f2", 2},
                             {"<c16", 16},
                             {"=i4", 4}}) {
    INFO(dtype);
    CHECK(numpyItemSize(dtype) == size);
  }
  for (auto dtype : {"<U8", "|S5", "|V16", "|O8", "<M8", "<m8", "<f3", "<i3", "|b2", "<c4", "f4",
                     "<f", "<f44", "", "<f4x", "<i16"}) {
    INFO("'" << dtype << "'");
    CHECK(numpyItemSize(dtype) == 0);
    CHECK_FALSE(tensorBytesFit(dtype, {2}, 2 * 8));
  }
  CHECK(tensorBytesFit("<f4", {2, 3}, 24));
  CHECK_FALSE(tensorBytesFit("<f4", {2, 3}, 23));  // one byte short: a view would read past it
  CHECK_FALSE(tensorBytesFit("<f4", {2, 3}, 25));
  CHECK(tensorBytesFit("<f8", {}, 8));                            // a scalar
  CHECK(tensorBytesFit("|u1", {0, 5}, 0));                        // an empty batch
  CHECK_FALSE(tensorBytesFit("<f4", {-1, 3}, 12));                // a negative dimension
  CHECK_FALSE(tensorBytesFit("<f4", {1ll << 40, 1ll << 40}, 0));  // the product overflows
  CHECK_FALSE(tensorBytesFit("<c16", {1ll << 59}, 0));
}
