// GGUF models on the actor runtime: every llama2.c fixture from
// stories260K.gguf (--ctx 512) on pipeline 3, tensor 2 and hybrid 2x2 with the
// reference, blas and spe kernels, with a crash and a silence;
// llama.cpp's ids of llama2-small-f32.gguf on every topology (tensor 2 with
// both reduce algorithms).
#include "model/generate.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"
#include "tests/actors/fixture_runner.hpp"

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
