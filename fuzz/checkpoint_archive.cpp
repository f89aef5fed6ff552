// KV checkpoint archives (supervision/checkpoint.cpp), which a node daemon
// decodes when a front end restores a shard: never crashes; an accepted
// archive encodes back to the same bytes.
#include "fuzz/common.hpp"
#include "supervision/checkpoint.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  supervision::bytes b(data, data + size);
  auto a = supervision::decode_archive(b);
  if (!a) return 0;
  FUZZ_CHECK(supervision::encode_archive(a->kind, a->key, a->begin, a->end, a->payload) == b);
  return 0;
}
