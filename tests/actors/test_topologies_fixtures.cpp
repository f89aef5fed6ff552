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

// Issue #19: the same fixtures with the reductions as reduce-scatter +
// all-gather (--reduce scatter). Each element is summed in the same rank
// order as the direct exchange, so ids and text stay llama2.c's. The bytes
// each rank sent to the rest of its group (the shards' own link counters)
// are only reduce traffic for ranks > 0 of the last stage; against a direct
// run of the same fixture they scale as the placement's reduce_floats_sent
// says: (T-1) vectors direct, 2(T-1)/T of one scattered.
TEST_CASE("every fixture with the scatter_gather reduce on tensor 2, 3, 4 and hybrid 2x2",
          "[actors][fixtures][reduce]") {
  if (!test::have_shared()) return;
  struct topo {
    int nodes;
    const char* topology;
  };
  const topo topos[] = {{2, "tensor"}, {3, "tensor"}, {4, "tensor"}, {4, "hybrid:2x2"}};
  const auto& fixtures = test::fixture_cases();
  for (const auto& t : topos) {
    DYNAMIC_SECTION(t.topology << " on " << t.nodes << " nodes") {
      // Bytes a rank > 0 of the last stage sent to the other nodes of its group.
      auto group_bytes = [](const topologies::placement& plan, const std::vector<actors::shard_stats>& stats,
                            int index) {
        const auto& sh = plan.shards[static_cast<size_t>(index)];
        uint64_t b = 0;
        for (const auto& s : stats)
          if (s.index == index)
            for (size_t i = 0; i < s.link_to.size(); ++i)
              for (int peer : plan.stages[static_cast<size_t>(sh.stage)].shards)
                if (peer != index && plan.shards[static_cast<size_t>(peer)].node == s.link_to[i])
                  b += s.link_bytes[i];
        return b;
      };
      std::vector<uint64_t> sent[2];  // [direct, scatter] per fixture
      for (int alg = 0; alg < 2; ++alg) {
        auto o = test::stories_options(t.nodes, t.topology);
        o.reduce = alg ? "scatter" : "direct";
        auto c = actors::cluster::start(o);
        REQUIRE(c.ok());
        const auto& plan = (*c)->placement();
        for (const auto& sh : plan.shards)
          for (const auto& op : sh.program)
            if (op.op == topologies::shard_op::reduce)
              CHECK(op.algorithm == (alg ? topologies::reduce_algorithm::scatter_gather
                                         : topologies::reduce_algorithm::direct_rank_order));
        const int probe = plan.stages.back().shards.back();  // a rank > 0 of the last stage
        uint64_t before = 0;
        for (const auto& fc : fixtures) {
          auto r = (*c)->generate(test::params_of(fc));
          REQUIRE(r.ok());
          INFO(o.reduce << " " << fc.name << ": " << r->error);
          REQUIRE(r->ok);
          CHECK(r->result.ids == test::read_ids(test::shared_file("fixtures/" + fc.name + ".ids")));
          CHECK(r->result.text + "\n" == test::read_file(test::shared_file("fixtures/" + fc.name + ".txt")));
          auto st = (*c)->stats();
          REQUIRE(st.ok());
          const uint64_t now = group_bytes(plan, *st, probe);
          sent[alg].push_back(now - before);
          before = now;
        }
        if (alg == 0) continue;
        const auto& sh = plan.shards[static_cast<size_t>(probe)];
        const int T = sh.group_size;
        const int dim = plan.config.dim;
        const uint64_t per_position =
            2ull * sh.layers.size() * sizeof(float);  // reduces per position x float size
        const uint64_t fd = topologies::reduce_floats_sent(topologies::reduce_algorithm::direct_rank_order, dim, T, sh.rank);
        const uint64_t fs = topologies::reduce_floats_sent(topologies::reduce_algorithm::scatter_gather, dim, T, sh.rank);
        for (size_t i = 0; i < fixtures.size(); ++i) {
          INFO(fixtures[i].name << ": direct " << sent[0][i] << " B, scatter " << sent[1][i] << " B");
          REQUIRE(sent[1][i] > 0);
          // Whole positions' worth, and the same positions in both runs.
          CHECK(sent[0][i] % (per_position * fd) == 0);
          CHECK(sent[1][i] % (per_position * fs) == 0);
          CHECK(sent[0][i] / (per_position * fd) == sent[1][i] / (per_position * fs));
        }
      }
    }
  }
}
