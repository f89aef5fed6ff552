// The cluster file (`run --cluster FILE`, actors/remote.cpp): JSON of any
// shape is refused or gives nodes with a host and a port.
#include "actors/remote.hpp"
#include "fuzz/common.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto nodes = actors::parse_cluster_json(as_text(data, size), "fuzz.json");
  if (!nodes) {
    FUZZ_CHECK(!nodes.message().empty());
    return 0;
  }
  for (const auto& n : *nodes) FUZZ_CHECK(!n.host.empty());
  return 0;
}
