// Expert placement (issue #23): `pipeline:P,expert:E` with R replicas --
// placement-index order, expert assignment (round-robin on equal nodes,
// memory-aware on unequal ones), each node's memory, the programs
// (attention, dispatch, combine on the stage shard; one expert op on an
// expert node), check_program's refusals and the clear errors for bad input.
#include "topologies/placement.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

using namespace cellshard;
using namespace cellshard::topologies;

namespace {

// moe-small-f32.gguf's shape (../shared/models/gguf): 8 experts, top-2.
model::config moe_small() {
  model::config c;
  c.dim = 128;
  c.hidden_dim = 256;
  c.n_layers = 4;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.vocab_size = 512;
  c.seq_len = 256;
  c.shared_classifier = true;
  c.n_experts = 8;
  c.n_experts_used = 2;
  return c;
}

placement must(result<placement> r) {
  if (!r) FAIL(r.message());
  return std::move(r).value();
}

strategy expert(int p, int e, int r = 1) {
  strategy s;
  s.kind = strategy_kind::expert;
  s.stages = p;
  s.tp = 1;
  s.experts = e;
  s.expert_replicas = r;
  return s;
}

// One expert's f32 bytes per layer: w1, w3 [hidden x dim] and w2 [dim x hidden].
uint64_t expert_bytes(const model::config& c) { return 3ull * c.dim * c.hidden_dim * 4; }

}  // namespace

TEST_CASE("parse_strategy: expert:E and pipeline:P,expert:E", "[placement][expert]") {
  auto s = parse_strategy("expert:2");
  REQUIRE(s);
  CHECK(s->kind == strategy_kind::expert);
  CHECK(s->stages == 1);
  CHECK(s->experts == 2);
  CHECK(s->expert_replicas == 1);
  CHECK(to_string(*s) == "expert:2");
  s = parse_strategy("pipeline:2,expert:4");
  REQUIRE(s);
  CHECK(s->kind == strategy_kind::expert);
  CHECK(s->stages == 2);
  CHECK(s->experts == 4);
  CHECK(to_string(*s) == "pipeline:2,expert:4");
  REQUIRE(parse_strategy(to_string(*s)));
  CHECK(parse_strategy(to_string(*s))->stages == 2);
  s = parse_strategy("pipeline,expert:3");
  REQUIRE(s);
  CHECK(s->stages == 0);
  CHECK(to_string(*s) == "pipeline,expert:3");
  for (const char* bad : {"expert", "expert:0", "expert:x", "tensor:2,expert:2", "pipeline:2,tensor:2",
                          "pipeline:0,expert:2", "pipeline:2,expert", "hybrid:2x2,expert:2"}) {
    INFO(bad);
    CHECK_FALSE(parse_strategy(bad));
  }
}

TEST_CASE("expert:2: stage shard then its expert nodes, experts round-robin", "[placement][expert]") {
  const auto cfg = moe_small();
  const auto p = must(place(cfg, make_nodes(3, host_profile(), 1), expert(1, 2)));
  REQUIRE(p.shards.size() == 3);
  REQUIRE(p.spares.size() == 1);
  CHECK(p.spares[0].index == 3);
  REQUIRE(p.stages.size() == 1);
  CHECK(p.stages[0].shards == std::vector<int>{0, 1, 2});
  CHECK(p.stages[0].expert_nodes == std::vector<int>{1, 2});
  const shard& head = p.shards[0];
  CHECK_FALSE(head.expert_node);
  CHECK_FALSE(head.routed);
  CHECK(head.has_embedding);
  CHECK(head.has_classifier);
  CHECK(head.layers == range{0, 4});
  CHECK(p.shards[1].expert_node);
  CHECK(p.shards[1].experts == std::vector<int>{0, 2, 4, 6});
  CHECK(p.shards[2].experts == std::vector<int>{1, 3, 5, 7});
  CHECK_FALSE(p.shards[1].has_embedding);
  CHECK_FALSE(p.shards[1].has_classifier);
  for (int e = 0; e < 8; ++e) CHECK(p.stages[0].holders[e] == std::vector<int>{1 + e % 2});

  // Memory: the stage shard is the whole model without the routed experts;
  // an expert node holds 4 whole experts of 4 layers and no KV cache.
  const memory_need whole =
      shard_memory(cfg, p.options, 4, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, true, cfg.vocab_size);
  CHECK(head.memory.weights == whole.weights - 4 * 8 * expert_bytes(cfg));
  CHECK(head.memory.kv_cache == whole.kv_cache);
  CHECK(p.shards[1].memory.weights == 4 * 4 * expert_bytes(cfg));
  CHECK(p.shards[1].memory.kv_cache == 0);

  // Programs: per layer attention, dispatch, combine; then classify.
  const auto& prog = head.program;
  REQUIRE(prog.size() == 1 + 4 * 3 + 1);
  CHECK(prog[0].op == shard_op::embed);
  CHECK(prog[0].peers == std::vector<int>{0});
  for (int l = 0; l < 4; ++l) {
    const auto& c = prog[1 + 3 * l];
    CHECK(c.op == shard_op::compute);
    CHECK(c.part == layer_part::attention);
    CHECK_FALSE(c.partial);
    CHECK(c.layers == range{l, l + 1});
    CHECK(prog[2 + 3 * l].op == shard_op::dispatch);
    CHECK(prog[2 + 3 * l].peers == std::vector<int>{1, 2});
    CHECK(prog[2 + 3 * l].holders == p.stages[0].holders);
    CHECK(prog[3 + 3 * l].op == shard_op::combine);
  }
  CHECK(prog.back().op == shard_op::classify);
  REQUIRE(p.shards[2].program.size() == 1);
  const auto& x = p.shards[2].program[0];
  CHECK(x.op == shard_op::expert);
  CHECK(x.layers == range{0, 4});
  CHECK(x.experts == std::vector<int>{1, 3, 5, 7});
  CHECK(x.peers == std::vector<int>{0});
  for (const auto& s : p.shards) {
    INFO(s.index);
    CHECK(check_program(s, s.program));
  }

  const std::string text = to_string(p);
  CHECK_THAT(text, Catch::Contains("expert:2"));
  CHECK_THAT(text, Catch::Contains("stage 0 / expert node 1"));
  CHECK_THAT(text, Catch::Contains("experts {1,3,5,7}"));
  CHECK_THAT(text, Catch::Contains("dispatch to [1,2]"));
  CHECK_THAT(text, Catch::Contains("expert layers [0,4) experts {0,2,4,6} for [0]"));
}

TEST_CASE("pipeline:2,expert:4 with 2 replicas: P + P x E nodes, each expert on 2 distinct nodes",
          "[placement][expert]") {
  const auto cfg = moe_small();
  auto r = place(cfg, make_nodes(9, host_profile()), expert(2, 4, 2));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("needs 10 nodes"));
  const auto p = must(place(cfg, make_nodes(10, host_profile(), 2), expert(2, 4, 2)));
  REQUIRE(p.shards.size() == 10);
  REQUIRE(p.stages.size() == 2);
  CHECK(p.stages[0].shards == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(p.stages[1].shards == std::vector<int>{5, 6, 7, 8, 9});
  CHECK(p.spares.front().index == 10);
  CHECK(p.stages[0].layers == range{0, 2});
  CHECK(p.stages[1].layers == range{2, 4});
  for (int s = 0; s < 2; ++s) {
    const int base = 5 * s + 1;
    std::vector<int> held(4, 0);
    for (int e = 0; e < 8; ++e) {
      const auto& h = p.stages[s].holders[e];
      // Round robin: replica j of expert e on expert node (e + j) mod 4.
      CHECK(h == std::vector<int>{base + e % 4, base + (e + 1) % 4});
      for (int i : h) ++held[i - base];
    }
    CHECK(held == std::vector<int>{4, 4, 4, 4});
  }
  CHECK(p.shards[6].experts == std::vector<int>{0, 3, 4, 7});
  // Stage 0 forwards to stage 1's shard only, never to its expert nodes.
  const auto& prog0 = p.shards[0].program;
  CHECK(prog0.back().op == shard_op::forward);
  CHECK(prog0.back().peers == std::vector<int>{5});
  CHECK_FALSE(p.shards[5].has_embedding);
  CHECK(p.shards[5].has_classifier);
  CHECK_FALSE(p.shards[6].has_classifier);
  for (const auto& s : p.shards) CHECK(check_program(s, s.program));
}

TEST_CASE("expert assignment is memory-aware and an expert node that does not fit is named",
          "[placement][expert]") {
  const auto cfg = moe_small();
  const uint64_t one = 4 * expert_bytes(cfg);  // one expert over the 4 layers
  // Node 1 can hold 6 experts, node 2 only 2: node 1 gets more.
  auto nodes = make_nodes(3, host_profile());
  for (auto& n : nodes) n.prof.memory_bytes = 64ull << 20;
  nodes[1].prof.memory_bytes = 6 * one + (1 << 20);
  nodes[2].prof.memory_bytes = 2 * one + (1 << 20);
  const auto p = must(place(cfg, nodes, expert(1, 2)));
  CHECK(p.shards[1].experts.size() == 6);
  CHECK(p.shards[2].experts.size() == 2);
  CHECK(p.fits());
  // Too little room on every expert node: a clear error naming the node.
  nodes[1].prof.memory_bytes = 2 * one;
  auto r = place(cfg, nodes, expert(1, 2));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("does not fit"));
  CHECK_THAT(r.message(), Catch::Contains("expert node"));
  CHECK_THAT(r.message(), Catch::Contains("experts of each layer"));

  // assign_experts on its own: equal nodes -> round robin; replicas distinct.
  const auto h = assign_experts(5, 3, {100, 100, 100}, 10, 0);
  REQUIRE(h.size() == 5);
  for (int e = 0; e < 5; ++e) {
    std::set<int> distinct(h[e].begin(), h[e].end());
    CHECK(distinct.size() == 3);
  }
  CHECK(h[0] == std::vector<int>{0, 1, 2});
}

TEST_CASE("expert placement: clear errors for bad input", "[placement][expert]") {
  auto cfg = moe_small();
  auto r = place(cfg, make_nodes(10, host_profile()), expert(1, 3, 4));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("--expert-replicas 4"));
  r = place(cfg, make_nodes(20, host_profile()), expert(1, 9));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("at most 8"));
  r = place(cfg, make_nodes(20, host_profile()), expert(5, 2));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("exceeds the model's 4 layers"));
  model::config dense = cfg;
  dense.n_experts = dense.n_experts_used = 0;
  r = place(dense, make_nodes(3, host_profile()), expert(1, 2));
  REQUIRE_FALSE(r);
  CHECK_THAT(r.message(), Catch::Contains("mixture-of-experts"));
  CHECK_THAT(r.message(), Catch::Contains("dense"));
}

TEST_CASE("expert programs: check_program refuses what a shard could not execute", "[placement][expert]") {
  const auto p = must(place(moe_small(), make_nodes(3, host_profile()), expert(1, 2)));
  const shard& head = p.shards[0];
  const shard& node = p.shards[1];
  // A combine before its dispatch.
  auto prog = head.program;
  std::swap(prog[2], prog[3]);
  CHECK_THAT(check_program(head, prog).message(), Catch::Contains("followed by the dispatch and combine"));
  // A combine of another layer than its dispatch's.
  prog = head.program;
  prog[3].layers = range{1, 2};
  CHECK_THAT(check_program(head, prog).message(), Catch::Contains("dispatch and combine of its layer"));
  // A dispatch whose expert has no holder.
  prog = head.program;
  prog[2].holders[3].clear();
  CHECK_THAT(check_program(head, prog).message(), Catch::Contains("expert 3 has no holder"));
  // A holder that is not among the peers.
  prog = head.program;
  prog[2].holders[0] = {7};
  prog[3].holders[0] = {7};
  CHECK_THAT(check_program(head, prog).message(), Catch::Contains("not among its peers"));
  // The stage shard has no routed experts: it cannot compute a whole FFN.
  prog = head.program;
  prog[1].part = layer_part::both;
  prog.erase(prog.begin() + 2, prog.begin() + 4);
  CHECK_THAT(check_program(head, prog).message(), Catch::Contains("no routed experts"));
  // An expert node serves exactly the experts it holds.
  prog = node.program;
  prog[0].experts = {0, 1};
  CHECK_THAT(check_program(node, prog).message(), Catch::Contains("experts served differ"));
  CHECK_THAT(check_program(head, node.program).message(), Catch::Contains("only an expert node"));
}
