// The digest docs/hetero_train.md defines for an epoch that trained on every id below `samples`
// exactly once ("0x" and 16 hex digits): the sum, modulo 2^64, of splitmix64's finaliser of each
// id, computed from the ids alone with no runtime code, so a check of it does not trust the
// trainer's own counters (restored from its checkpoint after a resume). The oracle is not the
// system under test.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace test_digest {

inline std::string everyIdOnce(uint64_t samples) {
  uint64_t sum = 0;
  for (uint64_t id = 0; id < samples; ++id) {
    uint64_t z = id + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    sum += z ^ (z >> 31);
  }
  char text[24];
  snprintf(text, sizeof(text), "0x%016llx", (unsigned long long)sum);
  return text;
}

}  // namespace test_digest
