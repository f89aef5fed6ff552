// tests/model/greedy.hpp: greedy decoding through the engine, for tests that
// compare ids (and logits) with llama.cpp's references or the float64 pass.
//
// greedy(f, ids, n, backend): feeds the prompt `ids` (at least one id) one
// position at a time on a whole-model engine, then appends `n` argmax ids (the
// first maximal index; no stop token). Returns only the `n` generated ids;
// with `logits`, also the logits row each of them was chosen from. `backend`
// goes through kernels::choose_backend, so "blas" runs native in a build
// without OpenBLAS (the cross builds).
#pragma once

#include "kernels/backend.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <algorithm>
#include <memory>
#include <vector>

namespace cellshard::test {

inline std::vector<int> greedy(std::shared_ptr<const model::model_file> f, std::vector<int> ids, int n,
                               const char* backend, std::vector<std::vector<float>>* logits = nullptr) {
  auto w = model::shard_weights::make(f, model::slice_spec::whole(f->cfg()));
  REQUIRE(w.ok());
  const kernels::backend* be = kernels::choose_backend(backend).be;
  REQUIRE(be != nullptr);
  model::engine eng(*w, *be);
  const int vocab = f->cfg().vocab_size;
  std::vector<int> gen;
  const size_t np = ids.size();
  for (size_t p = 0; p + 1 < np + n; ++p) {
    const float* l = eng.forward(ids[p], static_cast<int>(p));
    if (p + 1 >= np) {
      if (logits) logits->emplace_back(l, l + vocab);
      const int next = static_cast<int>(std::max_element(l, l + vocab) - l);
      gen.push_back(next);
      ids.push_back(next);
    }
  }
  return gen;
}

}  // namespace cellshard::test
