// Every llama2.c fixture, reproduced in process by the single-node engine with
// each kernel backend: ids and printed text identical.
#include "kernels/backend.hpp"
#include "kernels/pool.hpp"
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

using namespace cellshard;

TEST_CASE("engine reproduces every llama2.c fixture with each backend", "[model][fixtures]") {
  const std::string mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  auto file = model::model_file::open(mpath);
  REQUIRE(file.ok());
  auto tok = model::tokenizer::open(test::shared_file("models/tok512.bin"));
  REQUIRE(tok.ok());
  auto w = model::shard_weights::make(*file, model::slice_spec::whole((*file)->cfg()));
  REQUIRE(w.ok());
  // native also with a pool of 2 kernel threads (stories260K's matrices are
  // small: only the classifier, 512 x 64 floats, is split).
  kernels::pool two(2);
  struct subject {
    const char* backend;
    kernels::pool* pool;
  };
  for (const subject sj : {subject{"reference", nullptr}, subject{"blas", nullptr}, subject{"native", nullptr},
                           subject{"native", &two}}) {
    const char* be_name = sj.backend;
    const kernels::backend* be = kernels::find_backend(be_name);
#ifdef CELLSHARD_NO_BLAS
    if (!be && std::string(be_name) == "blas") continue;  // cross builds have no OpenBLAS
#endif
    REQUIRE(be != nullptr);
    // batch 0: one position at a time; 3 and 32: the prompt prefilled in
    // chunks of that many positions (engine::prefill, issue #18).
    for (const auto& fc : test::fixture_cases()) for (const int batch : {0, 3, 32}) {
      DYNAMIC_SECTION(be_name << (sj.pool ? " (2 threads) " : " ") << fc.name << " batch " << batch) {
        kernels::pool::scope use_pool(sj.pool);
        model::engine eng(*w, *be);
        if (batch > 0) eng.set_batch_size(batch);
        model::generation_params gp;
        gp.prompt = fc.prompt;
        gp.steps = fc.steps;
        gp.sampling = {fc.temperature, fc.topp, fc.seed ? fc.seed : 1};
        auto res = model::generate(
            [&](int t, int p) -> result<const float*> { return eng.forward(t, p); }, **tok,
            (*file)->cfg().vocab_size, gp, nullptr, {},
            batch > 0 ? model::prefill_fn([&](const int* t, int n, int p0) -> result<const float*> {
              return eng.prefill(t, n, p0);
            })
                      : model::prefill_fn());
        REQUIRE(res.ok());
        const auto want = test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids"));
        CHECK(res->ids == want);
        CHECK(res->text + "\n" == test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
      }
    }
  }
}
