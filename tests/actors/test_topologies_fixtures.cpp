// The golden ids on every in-process topology (STYLE.md item 9): pipelines of
// 2, 3 and 5 stages, 8 nodes as 5 stages + 3 spares, tensor groups of 2, 3 and
// 4 shards, hybrid 2x2; every fixture, ids and text identical.
#include "tests/actors/fixture_runner.hpp"

using namespace cellshard;

TEST_CASE("every fixture on every in-process topology", "[actors][fixtures]") {
  if (!test::have_shared()) return;
  struct topo {
    int nodes;
    const char* topology;
    int stages, tp, spares;
  };
  const topo topos[] = {{2, "pipeline", 2, 1, 0}, {3, "pipeline", 3, 1, 0},
                        {5, "pipeline", 5, 1, 0}, {8, "pipeline", 5, 1, 3},
                        {2, "tensor", 1, 2, 0},   {3, "tensor", 1, 3, 0},
                        {4, "tensor", 1, 4, 0},   {4, "hybrid:2x2", 2, 2, 0}};
  for (const auto& t : topos) {
    DYNAMIC_SECTION(t.topology << " on " << t.nodes << " nodes") {
      auto c = actors::cluster::start(test::stories_options(t.nodes, t.topology));
      REQUIRE(c.ok());
      const auto& plan = (*c)->placement();
      CHECK(plan.stages.size() == static_cast<size_t>(t.stages));
      CHECK(plan.stages.front().shards.size() == static_cast<size_t>(t.tp));
      CHECK(plan.spares.size() == static_cast<size_t>(t.spares));
      for (const auto& fc : test::fixture_cases()) {
        auto r = (*c)->generate(test::params_of(fc));
        REQUIRE(r.ok());
        INFO(fc.name << ": " << r->error);
        REQUIRE(r->ok);
        CHECK(r->result.ids == test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids")));
        CHECK(r->result.text + "\n" ==
              test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
      }
    }
  }
}

// Shards compute a prefill step's positions in chunks of --batch-size
// (model::*_partial_batch; default 32 covers every fixture's prompt in one
// chunk above). Chunks of 1 (one position at a time) and 3 (prompts split
// over several chunks, the last partial) give the same ids.
TEST_CASE("fixtures with prefill chunks of 1 and 3 positions in shards", "[actors][fixtures][prefill]") {
  if (!test::have_shared()) return;
  for (const int batch : {1, 3}) {
    for (const char* topology : {"pipeline", "tensor", "hybrid:2x2"}) {
      DYNAMIC_SECTION(topology << " batch " << batch) {
        auto o = test::stories_options(std::string(topology) == "hybrid:2x2" ? 4 : 2, topology);
        o.batch_size = batch;
        auto c = actors::cluster::start(o);
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
}
