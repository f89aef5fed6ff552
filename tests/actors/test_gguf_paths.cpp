// GGUF models on the actor runtime: every llama2.c fixture from
// stories260K.gguf (--ctx 512) on pipeline 3, tensor 2 and hybrid 2x2 with the
// reference, blas and spe kernels, with a crash and a silence;
// llama.cpp's ids of llama2-small-f32.gguf on every topology (tensor 2 with
// both reduce algorithms); a synthetic dense qwen2 model (Q/K/V biases, NEOX
// RoPE) gives the ids of the independent float64 pass on every topology and
// through a crash.
#include "model/generate.hpp"
#include "model/gguf.hpp"
#include "model/synth.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"
#include "tests/actors/fixture_runner.hpp"
#include "tests/model/float64_ref.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>

using namespace cellshard;

namespace {

actors::cluster_options gguf_options(const std::string& model, int nodes, const std::string& topology,
                                     int ctx) {
  auto o = test::stories_options(nodes, topology);
  o.model = test::shared_file("models/gguf/" + model);
  o.tokenizer = test::shared_file("models/tok512.bin");
  o.ctx = ctx;
  return o;
}

const test::fixture_case& fixture(const std::string& name) {
  for (const auto& fc : test::fixture_cases())
    if (fc.name == name) return fc;
  FAIL("no fixture " << name);
  return test::fixture_cases().front();
}

}  // namespace

TEST_CASE("gguf: every fixture from stories260K.gguf on pipeline, tensor and hybrid",
          "[actors][gguf][fixtures]") {
  if (test::shared_file("models/gguf/stories260K.gguf").empty()) return;
  struct topo {
    int nodes;
    const char* topology;
    const char* kernels;
  };
  const topo topos[] = {{3, "pipeline", "reference"}, {2, "tensor", "blas"},
                        {4, "hybrid:2x2", "spe"}};
  for (const auto& t : topos) {
    DYNAMIC_SECTION(t.topology << " on " << t.nodes << " nodes, " << t.kernels) {
      auto o = gguf_options("stories260K.gguf", t.nodes, t.topology, 512);
      o.kernels = t.kernels;
      auto c = actors::cluster::start(o);
      INFO((c.ok() ? std::string() : c.message()));
      REQUIRE(c.ok());
      for (const auto& fc : test::fixture_cases()) {
        auto r = (*c)->generate(test::params_of(fc));
        REQUIRE(r.ok());
        INFO(fc.name << ": " << r->error);
        REQUIRE(r->ok);
        CHECK(r->result.ids == test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids")));
      }
    }
  }
}

TEST_CASE("gguf: a crash and a silence on stories260K.gguf reproduce the fixtures",
          "[actors][gguf][recovery]") {
  if (test::shared_file("models/gguf/stories260K.gguf").empty()) return;
  struct fault_case {
    int nodes, spares;
    const char* topology;
    const char* fixture;
    const char* fault;
  };
  const fault_case cases[] = {
      {3, 1, "pipeline", "topp_t1.0_p0.9_s133742_n256", "crash:node=1:step=40"},
      {2, 1, "tensor", "greedy_bos_n200", "silence:node=1:step=33"},
      {4, 0, "hybrid:2x2", "greedy_bos_n200", "crash:node=3:step=64"},
  };
  for (const auto& fc : cases) {
    DYNAMIC_SECTION(fc.topology << " " << fc.fault) {
      auto o = gguf_options("stories260K.gguf", fc.nodes, fc.topology, 512);
      o.spares = fc.spares;
      auto f = supervision::parse_fault_spec(fc.fault);
      REQUIRE(f.ok());
      o.faults.push_back(*f);
      auto c = actors::cluster::start(o);
      REQUIRE(c.ok());
      auto r = (*c)->generate(test::params_of(fixture(fc.fixture)), {}, std::chrono::seconds(60));
      REQUIRE(r.ok());
      INFO(r->error);
      REQUIRE(r->ok);
      CHECK(r->result.ids == test::read_ids(test::shared_file(std::string("fixtures/") + fc.fixture + ".ids")));
      CHECK((*c)->faults().size() == 1);
      CHECK(r->recoveries.size() >= 1);
    }
  }
}

TEST_CASE("gguf: llama.cpp's ids of llama2-small-f32.gguf on every topology", "[actors][gguf]") {
  const auto ref_path = test::shared_file("models/gguf/gguf-small-reference-ids.json");
  if (ref_path.empty()) return;
  const auto ref = nlohmann::json::parse(test::read_file(ref_path));
  struct topo_case {
    int nodes;
    const char* topology;
    const char* reduce;
  };
  // tensor 2 also with the reduce-scatter + all-gather reduce (issue #19).
  for (const auto& topo : {topo_case{3, "pipeline", "direct"}, topo_case{2, "tensor", "direct"},
                           topo_case{2, "tensor", "scatter"}, topo_case{4, "hybrid:2x2", "direct"}}) {
    DYNAMIC_SECTION(topo.topology << " reduce " << topo.reduce) {
      auto o = gguf_options("llama2-small-f32.gguf", topo.nodes, topo.topology, 0);
      o.reduce = topo.reduce;
      auto c = actors::cluster::start(o);
      REQUIRE(c.ok());
      for (const auto& run : ref["runs"]) {
        if (run["model"] != "llama2-small-f32.gguf") continue;
        const auto prompt = run["prompt_ids"].get<std::vector<int>>();
        const auto gen = run["generated_ids"].get<std::vector<int>>();
        model::generation_params gp;
        gp.prompt = run["prompt"].get<std::string>();
        // -n N runs N positions and yields N + 1 ids (the first is the prompt's BOS).
        gp.steps = static_cast<int>(prompt.size() + gen.size()) - 1;
        gp.sampling = {0.0f, 0.9f, 1};
        auto r = (*c)->generate(gp);
        REQUIRE(r.ok());
        REQUIRE(r->ok);
        std::vector<int> want = prompt;
        want.insert(want.end(), gen.begin(), gen.end());
        // No BOS among llama.cpp's ids, so run.c's stop rule never fires.
        CHECK(r->result.ids == want);
      }
    }
  }
}

TEST_CASE("gguf: a dense qwen2 model gives the float64 pass's ids on every topology and through a crash",
          "[actors][gguf][qwen2]") {
  if (test::shared_file("models/tok512.bin").empty()) return;
  // Qwen2-shaped (grouped-query attention, Q/K/V biases, NEOX RoPE, epsilon
  // 1e-6, base 1e6, tied classifier), 4 layers, tok512's vocabulary.
  model::config c;
  c.arch = "qwen2";
  c.dim = 64;
  c.hidden_dim = 96;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.vocab_size = 512;
  c.seq_len = 64;
  c.rms_eps = 1e-6f;
  c.rope_theta = 1000000.0f;
  const std::string path = test::temp_dir("gguf-qwen2") + "/qwen2-synth.gguf";
  REQUIRE(model::synth_gguf_file(c, 5, path).ok());
  auto g = model::gguf::file::open(path).value();

  model::generation_params gp;
  gp.prompt = "Once upon a time";
  gp.steps = 40;
  gp.sampling = {0.0f, 0.9f, 1};
  gp.ignore_eos = true;
  struct topo_case {
    int nodes, spares;
    const char* topology;
    const char* fault;
  };
  for (const auto& t : {topo_case{1, 0, "pipeline", ""}, topo_case{3, 0, "pipeline", ""},
                        topo_case{2, 0, "tensor", ""}, topo_case{4, 0, "hybrid:2x2", ""},
                        topo_case{3, 1, "pipeline", "crash:node=1:step=20"}}) {
    DYNAMIC_SECTION(t.topology << " on " << t.nodes << " nodes " << t.fault) {
      auto o = test::stories_options(t.nodes, t.topology);
      o.model = path;
      o.spares = t.spares;
      if (*t.fault) {
        auto f = supervision::parse_fault_spec(t.fault);
        REQUIRE(f.ok());
        o.faults.push_back(*f);
      }
      auto cl = actors::cluster::start(o);
      INFO((cl.ok() ? std::string() : cl.message()));
      REQUIRE(cl.ok());
      auto r = (*cl)->generate(gp);
      REQUIRE(r.ok());
      INFO(r->error);
      REQUIRE(r->ok);
      const auto& ids = r->result.ids;
      const int np = r->result.prompt_tokens;
      REQUIRE(np >= 2);
      REQUIRE(ids.size() == static_cast<size_t>(gp.steps) + 1);
      // The float64 pass (tests/model/float64_ref.hpp) fed the same prompt,
      // then its own argmax: every generated id, with a margin far above f32
      // rounding.
      test::float64_ref ref(*g);
      std::vector<int> want(ids.begin(), ids.begin() + np);
      double margin = 1e300;
      for (int p = 0; p < gp.steps; ++p) {
        auto l = ref.forward(want[static_cast<size_t>(p)], p);
        if (p + 1 < np) continue;
        const int best = static_cast<int>(std::max_element(l.begin(), l.end()) - l.begin());
        const double top = l[static_cast<size_t>(best)];
        l[static_cast<size_t>(best)] = -1e300;
        margin = std::min(margin, top - *std::max_element(l.begin(), l.end()));
        want.push_back(best);
      }
      REQUIRE(margin > 1e-3);
      CHECK(ids == want);
      if (*t.fault) {
        CHECK((*cl)->faults().size() == 1);
        CHECK(r->recoveries.size() >= 1);
      }
    }
  }
}
