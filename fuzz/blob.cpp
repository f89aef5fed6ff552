// The activation blob decoder (actors/messages.cpp), which every shard and
// node daemon runs on bytes from the network: never crashes; a blob that
// decodes ok encodes back to the same floats.
#include "actors/messages.hpp"
#include "fuzz/common.hpp"

#include <cstring>

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<char> bytes(reinterpret_cast<const char*>(data), reinterpret_cast<const char*>(data) + size);
  auto b = actors::blob::decode(bytes);
  if (!b.ok()) return 0;
  auto again = actors::blob::decode(b.encode());
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(again.data.size() == b.data.size());
  if (!b.data.empty())  // an empty vector's data() may be null, which memcmp must not get
    FUZZ_CHECK(std::memcmp(again.data.data(), b.data.data(), b.data.size() * sizeof(float)) == 0);
  return 0;
}
