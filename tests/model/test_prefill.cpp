// Prefill in chunks (issue #18): engine::prefill computes a prompt's positions
// as matrix products, chunk by chunk, and must give every position's logits
// bit for bit as forward() one position at a time does -- on every backend,
// every native level, with f32, q8_0 and q4_0 weights, for chunk sizes that
// do and do not divide the prompt. (Fixture ids with prefill: test_fixtures.)
#include "kernels/backend.hpp"
#include "kernels/native.hpp"
#include "kernels/pool.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <cstring>
#include <vector>

using namespace cellshard;

TEST_CASE("prefill in chunks gives the logits of one position at a time bit for bit",
          "[model][prefill]") {
  const std::string mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  auto file = model::model_file::open(mpath);
  REQUIRE(file.ok());
  const auto& cfg = (*file)->cfg();
  const int vocab = cfg.vocab_size, n = 37, pos0 = 5;
  std::vector<int> tokens(pos0 + n);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int>((i * 131 + 7) % vocab);
  tokens[0] = 1;

  struct level {
    const char* backend;
    kernels::native::isa isa;
  };
  std::vector<level> levels;
  for (const char* b : {"reference", "blas", "spe"}) {
#ifdef CELLSHARD_NO_BLAS
    if (std::string(b) == "blas") continue;  // cross builds have no OpenBLAS
#endif
    levels.push_back({b, kernels::native::isa::portable});
  }
  const auto best = kernels::native::best_isa();
  for (auto i : kernels::native::all_isas)
    if (kernels::native::set_isa(i)) levels.push_back({"native", i});
  kernels::native::set_isa(best);
  kernels::pool two(2, 0);

  for (const auto fmt : {model::weight_format::f32, model::weight_format::q8_0, model::weight_format::q4_0}) {
    auto w = model::shard_weights::make(*file, model::slice_spec::whole(cfg), fmt);
    REQUIRE(w.ok());
    for (const level& lv : levels) {
      const kernels::backend* be = kernels::find_backend(lv.backend);
      if (!be) continue;  // spe is always registered; keep the test honest elsewhere
      if (std::string(lv.backend) == "native") REQUIRE(kernels::native::set_isa(lv.isa));
      for (kernels::pool* p : {static_cast<kernels::pool*>(nullptr), &two}) {
        if (p && std::string(lv.backend) != "native") continue;
        kernels::pool::scope use(p);
        // One position at a time: the oracle.
        model::engine one(*w, *be);
        std::vector<float> want(static_cast<size_t>(n) * vocab);
        for (int t = 0; t < pos0 + n; ++t) {
          const float* l = one.forward(tokens[t], t);
          if (t >= pos0) std::memcpy(&want[static_cast<size_t>(t - pos0) * vocab], l, vocab * sizeof(float));
        }
        for (int batch : {1, 4, 16, 37, 64}) {
          {
            INFO(model::to_string(fmt) << " " << lv.backend << " " << kernels::native::to_string(lv.isa)
                                       << (p ? " pool 2" : "") << " batch " << batch);
            model::engine eng(*w, *be);
            eng.set_batch_size(batch);
            for (int t = 0; t < pos0; ++t) eng.forward(tokens[t], t);  // a prefix, then the chunks
            std::vector<float> got(static_cast<size_t>(n) * vocab);
            const float* last = eng.prefill(tokens.data() + pos0, n, pos0, got.data());
            CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);
            CHECK(std::memcmp(last, &want[static_cast<size_t>(n - 1) * vocab], vocab * sizeof(float)) == 0);
            // Without all_logits: the last position's only, same bits; and
            // the KV cache it leaves behind decodes the next position the same.
            model::engine e2(*w, *be);
            e2.set_batch_size(batch);
            const float* l2 = e2.prefill(tokens.data(), pos0 + n, 0);
            CHECK(std::memcmp(l2, &want[static_cast<size_t>(n - 1) * vocab], vocab * sizeof(float)) == 0);
            const float* l1 = one.forward(3, pos0 + n);
            const std::vector<float> next_one(l1, l1 + vocab);
            const float* next_two = e2.forward(3, pos0 + n);
            CHECK(std::memcmp(next_two, next_one.data(), vocab * sizeof(float)) == 0);
          }
        }
      }
    }
  }
  kernels::native::set_isa(best);
}
