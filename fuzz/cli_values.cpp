// The small parsers of command-line values: --link BANDWIDTH:LATENCY,
// --memory SIZE (topologies/profile.cpp) and --topology (placement.cpp).
#include "fuzz/common.hpp"

#include <cmath>

#include "topologies/placement.hpp"
#include "topologies/profile.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = as_text(data, size);
  auto l = topologies::parse_link(text);
  if (l) FUZZ_CHECK(std::isfinite(l->latency_us) && l->latency_us >= 0);
  auto m = topologies::parse_memory(text);
  if (!m) FUZZ_CHECK(!m.message().empty());
  auto s = topologies::parse_strategy(text);
  if (s) {
    auto again = topologies::parse_strategy(topologies::to_string(*s));
    FUZZ_CHECK(again && again->kind == s->kind && again->stages == s->stages && again->tp == s->tp);
  }
  return 0;
}
