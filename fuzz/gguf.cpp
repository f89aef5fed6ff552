// The GGUF reader (model/gguf.cpp) on arbitrary bytes, in both byte orders:
// an accepted file's tensors lie inside it, and every metadata key answers
// its typed getters with a value or an error (never a crash).
#include "fuzz/common.hpp"
#include "model/gguf.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool swap : {false, true}) {
    model::gguf::open_options opts;
    opts.force_swap = swap;
    auto f = model::gguf::file::from_bytes(as_bytes(data, size), "fuzz.gguf", opts);
    if (!f) {
      FUZZ_CHECK(!f.message().empty());
      continue;
    }
    for (const auto& t : (*f)->tensors()) {
      FUZZ_CHECK(t.data >= (*f)->bytes() && t.data + t.bytes <= (*f)->bytes() + (*f)->file_bytes());
      if (t.bytes > 0) {
        volatile uint8_t s = t.data[0];
        s = t.data[t.bytes - 1];
        (void)s;
      }
      (void)t.shape_string();
      (void)t.rows();
    }
    for (const auto& k : (*f)->keys()) {
      (void)(*f)->get_string(k);
      (void)(*f)->get_int(k);
      (void)(*f)->get_f32(k);
      (void)(*f)->get_string_array(k);
      (void)(*f)->get_f32_array(k);
      (void)(*f)->get_i32_array(k);
      (void)(*f)->get_array_count(k);
    }
  }
  return 0;
}
