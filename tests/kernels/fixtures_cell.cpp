// The llama2.c fixtures through the whole engine (model::engine) with the
// Cell backends: spe with 1 and 6 SPE workers (6 = what a PS3 gives a
// program), and spu-host (SPU arithmetic: rounding toward zero, fused
// multiply-add). Ids and text must equal llama2.c's.
#include "kernels/backend.hpp"
#include "kernels/spe.hpp"
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "tests/kernels/common.hpp"
#include "tests/support.hpp"

using namespace cellshard;

TEST_CASE("spe and spu-host reproduce every llama2.c fixture", "[kernels][fixtures]") {
  const std::string mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  auto file = model::model_file::open(mpath);
  REQUIRE(file.ok());
  auto tok = model::tokenizer::open(test::shared_file("models/tok512.bin"));
  REQUIRE(tok.ok());
  auto w = model::shard_weights::make(*file, model::slice_spec::whole((*file)->cfg()));
  REQUIRE(w.ok());
  const kernels::spe::options saved = kernels::spe::get_options();
  struct run {
    const char* name;
    const kernels::backend* be;
    int workers;
  };
  const run runs[] = {{"spe, 1 worker", &kernels::spe_backend(), 1},
                      {"spe, 6 workers", &kernels::spe_backend(), 6},
                      {"spu-host, 6 workers", &kernels::spu_host_backend(), 6}};
  for (const run& rn : runs) {
    for (const auto& fc : test::fixture_cases()) {
      DYNAMIC_SECTION(rn.name << " " << fc.name) {
        kernels::spe::options o;
        o.workers = rn.workers;
        o.min_rows_per_worker = 8;  // stories260K's matrices are small: split them anyway
        kernels::spe::set_options(o);
        kernels::spe::reset_stats();
        model::engine eng(*w, *rn.be);
        model::generation_params gp;
        gp.prompt = fc.prompt;
        gp.steps = fc.steps;
        gp.sampling = {fc.temperature, fc.topp, fc.seed ? fc.seed : 1};
        auto res = model::generate(
            [&](int t, int p) -> result<const float*> { return eng.forward(t, p); }, **tok,
            (*file)->cfg().vocab_size, gp, nullptr);
        REQUIRE(res.ok());
        const auto want = test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids"));
        CHECK(res->ids == want);
        CHECK(res->text + "\n" ==
              test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
        const auto st = kernels::spe::get_stats();
        CHECK(st.errors == 0);
        CHECK(st.kernel_calls > 0);
        INFO(kernels::spe::last_error());
      }
    }
  }
  kernels::spe::set_options(saved);
}
