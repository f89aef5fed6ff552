// The llama2.c checkpoint loader (model/checkpoint.cpp) on arbitrary bytes:
// an accepted file has a config whose size is the input's, and every weight
// view it hands out lies inside the input.
#include "fuzz/common.hpp"
#include "model/checkpoint.hpp"

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (bool swap : {false, true}) {
    model::load_options opts;
    opts.force_swap = swap;
    auto f = model::model_file::from_bytes(as_bytes(data, size), "fuzz.bin", opts);
    if (!f) continue;
    const auto& c = (*f)->cfg();
    if ((*f)->quantized()) continue;  // the q8_0 target covers those
    FUZZ_CHECK(model::checkpoint_bytes(c) == size);
    // Touch the first and last float of every view: ASan flags any view
    // outside the buffer.
    volatile float sink = (*f)->token_embedding()[0] + (*f)->rms_final()[c.dim - 1] +
                          (*f)->classifier()[static_cast<uint64_t>(c.vocab_size) * c.dim - 1];
    for (int l = 0; l < c.n_layers; ++l) {
      const auto v = (*f)->layer(l);
      sink = sink + v.w3[static_cast<uint64_t>(c.hidden_dim) * c.dim - 1] + v.rms_att[0];
    }
    (void)sink;
    (void)(*f)->digest();
  }
  return 0;
}
