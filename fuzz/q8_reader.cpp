// The q8_0 ("CSQ8") file reader (model/quant.cpp) on arbitrary bytes behind
// the CSQ8 magic: an accepted file's block views lie inside the input.
#include "fuzz/common.hpp"
#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/quant.hpp"

#include <cstring>

using namespace cellshard;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<uint8_t> bytes = as_bytes(data, size);
  // Most inputs should reach the q8_0 reader: force the magic when absent.
  if (!model::is_q8_image(bytes.data(), bytes.size())) {
    static const char magic[4] = {'C', 'S', 'Q', '8'};
    if (bytes.size() >= 4) std::memcpy(bytes.data(), magic, 4);
  }
  auto f = model::model_file::from_bytes(std::move(bytes), "fuzz.csq8");
  if (!f || !(*f)->quantized()) return 0;
  const auto& c = (*f)->cfg();
  auto touch = [](const model::q8_matrix& m) {
    if (!m.blocks || m.rows == 0) return;
    const uint64_t n = static_cast<uint64_t>(m.rows) * kernels::q8_blocks_per_row(m.cols);
    volatile auto s = m.blocks[0].d;
    s = m.blocks[n - 1].d;
    (void)s;
  };
  touch((*f)->q8_embedding());
  touch((*f)->q8_classifier());
  for (int l = 0; l < c.n_layers; ++l) {
    const auto q = (*f)->q8_layer(l);
    for (const auto* m : {&q.wq, &q.wk, &q.wv, &q.wo, &q.w1, &q.w2, &q.w3}) touch(*m);
    volatile float s = (*f)->layer(l).rms_att[c.dim - 1] + (*f)->layer(l).rms_ffn[0];
    (void)s;
  }
  volatile float s = (*f)->rms_final()[c.dim - 1];
  (void)s;
  return 0;
}
