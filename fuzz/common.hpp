// fuzz/common.hpp: helpers shared by the libFuzzer targets (one per parser,
// see fuzz/CMakeLists.txt and scripts/fuzz.sh). A target returns 0 for every
// input; a crash, a sanitizer report or a failed FUZZ_CHECK is a finding.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

/// A property the parser must keep on every input it accepts (e.g. a round
/// trip); failing it is reported like a crash (abort is the fuzzer's signal).
#define FUZZ_CHECK(cond)                                                              \
  do {                                                                                \
    if (!(cond)) {                                                                    \
      std::fprintf(stderr, "FUZZ_CHECK failed: %s (%s:%d)\n", #cond, __FILE__, __LINE__); \
      std::abort();                                                                   \
    }                                                                                 \
  } while (0)

inline std::string as_text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}
inline std::vector<uint8_t> as_bytes(const uint8_t* data, size_t size) {
  return std::vector<uint8_t>(data, data + size);
}
