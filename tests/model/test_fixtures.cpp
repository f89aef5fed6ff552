// Every llama2.c fixture, reproduced in process by the single-node engine with
// each kernel backend: ids and printed text identical.
#include "kernels/backend.hpp"
#include "kernels/pool.hpp"
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "tests/support.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

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

TEST_CASE("a classifier slice gives bit-identical logits for its vocabulary rows", "[model][classifier]") {
  // Issue #19: the last stage's ranks split the classifier by vocabulary
  // rows; each logit must be the same row dot product as on one node, so the
  // joined vector (and every sample drawn from it) is the single node's --
  // on every backend but blas with f32 weights (OpenBLAS, below).
  const std::string mpath = test::shared_file("models/stories260K.bin");
  if (mpath.empty()) return;
  auto file = model::model_file::open(mpath);
  REQUIRE(file.ok());
  const auto& cfg = (*file)->cfg();
  const int V = cfg.vocab_size, d = cfg.dim;
  std::vector<float> x0(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) x0[static_cast<size_t>(i)] = std::sin(0.37f * static_cast<float>(i)) + 0.1f;
  kernels::pool two(2);
  for (const char* be_name : {"reference", "blas", "spe", "native"}) {
#ifdef CELLSHARD_NO_BLAS
    if (std::string(be_name) == "blas") continue;  // cross builds have no OpenBLAS
#endif
    const kernels::backend* be = kernels::find_backend(be_name);
    REQUIRE(be != nullptr);
    for (auto fmt : {model::weight_format::f32, model::weight_format::q8_0, model::weight_format::q4_0}) {
      for (kernels::pool* pool : {static_cast<kernels::pool*>(nullptr), &two}) {
        DYNAMIC_SECTION(be_name << " " << model::to_string(fmt) << (pool ? " 2 threads" : "")) {
          kernels::pool::scope use_pool(pool);
          auto whole = model::shard_weights::make(*file, model::slice_spec::whole(cfg), fmt);
          REQUIRE(whole.ok());
          std::vector<float> x = x0, want(static_cast<size_t>(V));
          model::classify(*be, **whole, x.data(), want.data());
          for (const auto& [b, e] : {std::pair<int, int>{0, 171}, {171, 342}, {342, 512}, {1, 2}, {0, 512}}) {
            auto spec = model::slice_spec::whole(cfg);
            spec.embedding = false;
            spec.vocab_begin = b;
            spec.vocab_end = e;
            auto part = model::shard_weights::make(*file, spec, fmt);
            REQUIRE(part.ok());
            CHECK((*part)->classifier().rows == e - b);
            std::vector<float> y = x0, got(static_cast<size_t>(e - b));
            model::classify(*be, **part, y.data(), got.data());
            INFO("rows [" << b << "," << e << ")");
            if (std::string(be_name) == "blas" && fmt == model::weight_format::f32) {
              // OpenBLAS's sgemv blocks by the row count: the same row's dot
              // product can differ in the last bits between a slice and the
              // whole table (measured here), as its tensor-split wo/w2 sums
              // already do (docs/reliability.md, exactness item 3).
              for (size_t i = 0; i < got.size(); ++i)
                CHECK(std::abs(got[i] - want[static_cast<size_t>(b) + i]) <=
                      1e-5f * std::max(1.0f, std::abs(want[static_cast<size_t>(b) + i])));
            } else {
              CHECK(std::memcmp(got.data(), want.data() + b, got.size() * sizeof(float)) == 0);
            }
          }
        }
      }
    }
  }
  // Rows outside the vocabulary are refused, naming them.
  auto spec = model::slice_spec::whole(cfg);
  spec.vocab_begin = 300;
  spec.vocab_end = 600;
  auto bad = model::shard_weights::make(*file, spec);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.message().find("classifier rows outside [0,512)") != std::string::npos);
}

TEST_CASE("parse_ids reads a fixture's ids line and names the bad entry", "[model][ids]") {
  auto ok = model::parse_ids("1,450, 2\n", "a.ids");
  REQUIRE(ok);
  CHECK(*ok == std::vector<int>{1, 450, 2});
  CHECK(model::parse_ids(model::format_ids({1, 0, 31999}), "b.ids").value() == std::vector<int>{1, 0, 31999});
  auto neg = model::parse_ids("1,-3,4\n", "c.ids");
  REQUIRE_FALSE(neg);
  CHECK(neg.code() == error_code::bad_format);
  CHECK(neg.message() == "c.ids: entry 1 is '-3', expected a token id (an integer from 0 to 2147483647)");
  auto junk = model::parse_ids("1,2x\n", "d.ids");
  REQUIRE_FALSE(junk);
  CHECK(junk.message() == "d.ids: entry 1 is '2x', expected a token id (an integer from 0 to 2147483647)");
  CHECK(model::parse_ids("1,99999999999\n", "e.ids").message() ==
        "e.ids: entry 1 is '99999999999', expected a token id (an integer from 0 to 2147483647)");
  CHECK(model::parse_ids("\n", "f.ids").message() == "f.ids: no token ids");
}
