// One source of truth for exchange steps (issue #15): the planner's per-token
// counts -- hop messages, all-reduce rounds and their messages and bytes,
// layers, classifier rows, the link check's bytes -- equal a count made here,
// op by op, over the programs the runtime's placement gives its shards (the
// lists actors/shard.cpp executes), for pipeline, tensor and hybrid layouts
// with either reduce algorithm. The count below is this file's own (it does
// not call count_program); the programs the planner generates from the
// model's shape are compared with the placement's op for op.
#include "model/config.hpp"
#include "topologies/model_presets.hpp"
#include "topologies/placement.hpp"
#include "topologies/plan_hardware.hpp"
#include "topologies/planner.hpp"
#include "topologies/profile.hpp"
#include "topologies/program.hpp"

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <vector>

using namespace cellshard;
using namespace cellshard::topologies;

namespace {

struct layout_case {
  const char* model;
  int nodes;
  const char* topology;  // the same text for `plan` and `run --topology`
  bool scatter;
};

/// What the runtime's programs do per position, counted op by op.
struct runtime_count {
  std::vector<int> hop_messages;   // per stage: messages into it (stage 0: the token + the embed op's copies)
  std::vector<int> rounds;         // per stage, rank 0: reduce rounds
  std::vector<int> round_messages; // per stage, rank 0: messages it sends in them
  std::vector<double> round_bytes; // per stage, rank 0: bytes it sends in them
  std::vector<range> layers;       // per stage, rank 0: layers its computes cover
  std::vector<int> classify_rows;  // per stage, rank 0: classifier rows
  int logits_messages = 0;         // shards that send logits to the session
  double busiest_link = 0;         // max over shards and the session of max(sent, received)
  double wire = 0;                 // every shard's sent bytes
};

runtime_count count_runtime(const placement& p) {
  runtime_count c;
  const double d = p.config.dim;
  const int S = static_cast<int>(p.stages.size());
  c.hop_messages.assign(static_cast<size_t>(S), 0);
  c.hop_messages[0] = 1;  // the session's token ids
  for (const shard& sh : p.shards) {
    const bool rank0 = sh.rank == 0;
    const size_t s = static_cast<size_t>(sh.stage);
    if (rank0) {
      c.rounds.push_back(0);
      c.round_messages.push_back(0);
      c.round_bytes.push_back(0);
      c.classify_rows.push_back(0);
      c.layers.push_back(range{-1, -1});
    }
    double sent = 0, received = sh.has_embedding ? 4 : d * 4;
    for (const shard_step& st : sh.program) {
      const int T = static_cast<int>(st.peers.size());
      switch (st.op) {
        case shard_op::embed:
          c.hop_messages[0] += T - 1;
          sent += (T - 1) * d * 4;
          break;
        case shard_op::forward:
          c.hop_messages[s + 1] += T;
          sent += T * d * 4;
          break;
        case shard_op::reduce: {
          const int me = static_cast<int>(std::find(st.peers.begin(), st.peers.end(), sh.index) - st.peers.begin());
          double bytes;
          int rounds;
          if (st.algorithm == reduce_algorithm::scatter_gather) {
            const double own = reduce_chunks(p.config.dim, T)[static_cast<size_t>(me)].size();
            bytes = ((d - own) + (T - 1) * own) * 4;
            rounds = 2;
          } else {
            bytes = (T - 1) * d * 4;
            rounds = 1;
          }
          sent += bytes;
          received += bytes;  // each rank receives as much as it sends in a reduce
          if (rank0) {
            c.rounds.back() += rounds;
            c.round_messages.back() += rounds * (T - 1);
            c.round_bytes.back() += bytes;
          }
          break;
        }
        case shard_op::compute:
          if (rank0) {
            range& l = c.layers.back();
            l.begin = l.begin < 0 ? st.layers.begin : std::min(l.begin, st.layers.begin);
            l.end = std::max(l.end, st.layers.end);
          }
          break;
        case shard_op::classify:
          ++c.logits_messages;
          sent += st.vocab.size() * 4.0;
          if (rank0) c.classify_rows.back() += st.vocab.size();
          break;
        default:
          FAIL("op " << to_string(st.op) << " in a pipeline/tensor/hybrid program");
      }
    }
    c.busiest_link = std::max({c.busiest_link, sent, received});
    c.wire += sent;
  }
  c.busiest_link = std::max(c.busiest_link, p.config.vocab_size * 4.0);  // the session receives the logits
  return c;
}

}  // namespace

TEST_CASE("the planner's per-token counts are a count over the runtime's own programs", "[planner][programs]") {
  const std::vector<layout_case> cases = {
      {"stories260k", 5, "pipeline", false},      {"stories260k", 3, "pipeline:3", false},
      {"stories260k", 4, "tensor", false},        {"stories260k", 4, "tensor:3", true},
      {"stories260k", 4, "hybrid:2x2", false},    {"stories260k", 6, "hybrid:3x2", true},
      {"stories110m", 5, "pipeline:5", false},    {"stories110m", 12, "hybrid:3x4", false},
      {"stories110m", 10, "hybrid:2x5", true},    {"stories15m", 6, "tensor:6", true},
  };
  for (const layout_case& k : cases) {
    INFO(k.model << " " << k.topology << (k.scatter ? " --reduce scatter" : ""));
    // The planner, from the preset's shape.
    plan_request r;
    r.model = *find_model_preset(k.model);
    r.hw = *find_hardware_preset("ps3");
    r.nodes = k.nodes;
    r.topology = *parse_plan_topology(k.topology);
    r.context = 256;
    r.assume.scatter_gather = k.scatter;
    auto lay = lay_out(r);
    REQUIRE(lay);
    const plan_layout& l = *lay;
    const chain_costs cc = chain_cost(r, l, 1);
    auto planned = plan(r);
    REQUIRE(planned);

    // The runtime's placement of the same shape on as many equal nodes.
    const model_spec& m = r.model;
    model::config cfg{m.dim, m.ffn_hidden, m.n_layers, m.n_heads, m.n_kv_heads, m.vocab, m.context,
                      m.shared_classifier};
    placement_options o;
    o.check_memory = false;
    o.context = 256;
    o.reduce = k.scatter ? reduce_algorithm::scatter_gather : reduce_algorithm::direct_rank_order;
    auto placed = place(cfg, make_nodes(k.nodes, host_profile()), *parse_strategy(k.topology), o);
    REQUIRE(placed);
    const placement& p = *placed;
    REQUIRE(l.groups.size() == p.stages.size());

    // The planner's lists are the runtime's, op for op.
    for (const shard& sh : p.shards) {
      const auto mine = station_program(r, l, sh.stage, sh.rank);
      REQUIRE(mine.size() == sh.program.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        CHECK(to_string(mine[i]) == to_string(sh.program[i]));
        CHECK(mine[i].peers == sh.program[i].peers);
      }
    }

    // Its counts are a count over those lists.
    const runtime_count rc = count_runtime(p);
    const double act = m.act_bytes;
    REQUIRE(act == 4.0);  // the stories presets travel as f32, as the runtime sends them
    for (size_t s = 0; s < p.stages.size(); ++s) {
      INFO("stage " << s);
      CHECK(l.groups[s].first_layer == rc.layers[s].begin);
      CHECK(l.groups[s].end_layer == rc.layers[s].end);
      CHECK(cc.station_hop[s].messages == rc.hop_messages[s]);
      CHECK(cc.station_work[s].syncs == rc.rounds[s]);
      CHECK(cc.station_work[s].sync_messages == rc.round_messages[s]);
      CHECK(cc.station_work[s].bytes == Approx(rc.round_bytes[s]));  // ps3 links: every byte is serialised
    }
    CHECK(cc.return_hop.messages == rc.logits_messages);
    CHECK(planned->link_bytes_per_token == Approx(rc.busiest_link));
    CHECK(planned->wire_bytes_per_token == Approx(rc.wire));
    // Check 1: the busiest node's memory is the placement's busiest shard's
    // (weights, KV cache, buffers; the classifier split as the programs say).
    uint64_t most = 0;
    for (const shard& sh : p.shards) most = std::max(most, sh.memory.total());
    CHECK(planned->memory_per_node_bytes == static_cast<double>(most));
    // Classifier rows: the last stage's rank 0 computes its vocabulary slice.
    const auto last = count_program(station_program(r, l, static_cast<int>(l.groups.size()) - 1, 0),
                                    station_first(l, static_cast<int>(l.groups.size()) - 1), m.dim);
    CHECK(last.classifier_rows == rc.classify_rows.back());
  }
}

TEST_CASE("count_program counts each op of a program", "[planner][programs]") {
  // hybrid:2x2 of stories260K (5 layers: [0,3) and [3,5)), scatter_gather:
  // rank 0 of stage 0 embeds to 1 other rank, runs 3 layers x 2 reduces of
  // 2 rounds, forwards to the 2 ranks of stage 1.
  model::config cfg{64, 172, 5, 8, 4, 512, 512, true};
  placement_options o;
  o.reduce = reduce_algorithm::scatter_gather;
  auto p = place(cfg, make_nodes(4, host_profile()), *parse_strategy("hybrid:2x2"), o);
  REQUIRE(p);
  const program_counts c0 = count_program(p->shards[0].program, 0, cfg.dim);
  CHECK(c0.layers == std::vector<int>{0, 1, 2});
  CHECK(c0.attention_halves == 3);
  CHECK(c0.ffn_halves == 3);
  CHECK(c0.partial);
  CHECK(c0.embedding_rows == 1);
  CHECK(c0.embed_messages == 1);
  CHECK(c0.embed_floats == 64u);
  CHECK(c0.reduces == 6);
  CHECK(c0.rounds.size() == 12u);
  CHECK(c0.reduce_messages == 12);
  CHECK(c0.reduce_floats == 6u * (32 + 32));  // chunks of 32: 32 scattered + 32 gathered per reduce
  CHECK(c0.forward_messages == 2);
  CHECK(c0.forward_floats == 128u);
  CHECK(c0.logits_messages == 0);
  CHECK(c0.messages() == 1 + 12 + 2);
  // Rank 1 of stage 1: 2 layers, classifies rows [256, 512).
  const program_counts c3 = count_program(p->shards[3].program, 3, cfg.dim);
  CHECK(c3.layers == std::vector<int>{3, 4});
  CHECK(c3.embedding_rows == 0);
  CHECK(c3.forward_messages == 0);
  CHECK(c3.classifier_rows == 256);
  CHECK(c3.logits_messages == 1);
  CHECK(c3.logits_floats == 256u);
  // A pipeline shard: one compute of its whole range, both halves.
  auto q = place(cfg, make_nodes(2, host_profile()), *parse_strategy("pipeline:2"));
  REQUIRE(q);
  const program_counts s0 = count_program(q->shards[0].program, 0, cfg.dim);
  CHECK(s0.attention_halves == s0.ffn_halves);
  CHECK(s0.attention_halves == q->shards[0].layers.size());
  CHECK_FALSE(s0.partial);
  CHECK(s0.reduces == 0);
  CHECK(s0.embed_messages == 0);  // its group is itself
  // reduce_rounds on an uneven split: dim 10 over 3 ranks, chunks 4,3,3.
  shard_step red;
  red.op = shard_op::reduce;
  red.peers = {0, 1, 2};
  red.algorithm = reduce_algorithm::scatter_gather;
  const auto r0 = reduce_rounds(red, 0, 10), r2 = reduce_rounds(red, 2, 10);
  REQUIRE(r0.size() == 2u);
  CHECK(r0[0].floats == 6u);   // chunks 1 and 2
  CHECK(r0[1].floats == 8u);   // its chunk of 4 to 2 others
  CHECK(r2[0].floats == 7u);
  CHECK(r2[1].floats == 6u);
  red.algorithm = reduce_algorithm::direct_rank_order;
  const auto d1 = reduce_rounds(red, 1, 10);
  REQUIRE(d1.size() == 1u);
  CHECK(d1[0].messages == 2);
  CHECK(d1[0].floats == 20u);
}

TEST_CASE("the runtime's expert placement in the planner: its programs and expected dispatches",
          "[planner][programs][expert]") {
  // A mixture of experts of GQA layers (8 experts, top-2, no shared expert)
  // as the planner's shape and as the runtime's config.
  model_spec m;
  m.name = "moe-test";
  m.dim = 64;
  m.n_layers = 4;
  m.vocab = 512;
  m.context = 256;
  m.n_heads = 8;
  m.n_kv_heads = 4;
  m.n_experts = 8;
  m.n_active_experts = 2;
  m.expert_ffn = 32;
  m.ffn_hidden = 32;
  model::config cfg{64, 32, 4, 8, 4, 512, 256, true};
  cfg.n_experts = 8;
  cfg.n_experts_used = 2;

  struct expert_case {
    const char* topology;
    int nodes;
    int replicas;
  };
  for (const expert_case& k : {expert_case{"pipeline:2,expert:2", 6, 1}, expert_case{"pipeline:2,expert:3", 8, 1},
                               expert_case{"pipeline:1,expert:4", 5, 1}, expert_case{"pipeline:2,expert:3", 8, 2}}) {
    INFO(k.topology << " --expert-replicas " << k.replicas);
    plan_request r;
    r.model = m;
    r.hw = *find_hardware_preset("ps3");
    r.nodes = k.nodes;
    r.topology = *parse_plan_topology(k.topology);
    r.topology.expert_replicas = k.replicas;
    r.context = 256;
    CHECK(to_string(r.topology) == k.topology);
    auto lay = lay_out(r);
    REQUIRE(lay);
    const plan_layout& l = *lay;
    auto planned = plan(r);
    REQUIRE(planned);

    auto strat = parse_strategy(k.topology);
    REQUIRE(strat);
    strat->expert_replicas = k.replicas;
    placement_options o;
    o.check_memory = false;
    o.context = 256;
    auto placed = place(cfg, make_nodes(k.nodes, host_profile()), *strat, o);
    REQUIRE(placed);
    const placement& p = *placed;
    REQUIRE(l.groups.size() == p.stages.size());
    CHECK(l.used_nodes == static_cast<int>(p.shards.size()));
    CHECK(l.expert_nodes == static_cast<int>(p.stages.size()) * strat->experts);

    // The planner's lists are the runtime's: stage shards and expert nodes.
    for (const shard& sh : p.shards) {
      const int rank = sh.index - p.stages[static_cast<size_t>(sh.stage)].shards.front();
      const auto mine = station_program(r, l, sh.stage, rank);
      REQUIRE(mine.size() == sh.program.size());
      for (size_t i = 0; i < mine.size(); ++i) {
        CHECK(to_string(mine[i]) == to_string(sh.program[i]));
        CHECK(mine[i].peers == sh.program[i].peers);
        CHECK(mine[i].holders == sh.program[i].holders);
        CHECK(mine[i].experts == sh.program[i].experts);
      }
    }
    if (k.replicas != 1) continue;  // the expectation below is exact for one holder per expert

    // Expected expert requests of one position per MoE layer, by
    // enumeration over the placement's holders: every pair of distinct
    // experts equally likely; one request per distinct expert node chosen.
    const chain_costs cc = chain_cost(r, l, 1);
    const double vec = m.dim * 4.0;
    double wire = 0;
    for (const stage& sg : p.stages) {
      const shard& head = p.shards[static_cast<size_t>(sg.shards.front())];
      double distinct = 0, pairs = 0;
      for (int a = 0; a < m.n_experts; ++a)
        for (int b = a + 1; b < m.n_experts; ++b) {
          const int na = sg.holders[static_cast<size_t>(a)].front(), nb = sg.holders[static_cast<size_t>(b)].front();
          distinct += na == nb ? 1 : 2;
          pairs += 1;
        }
      const double per_layer = distinct / pairs;
      int dispatches = 0;
      for (const shard_step& st : head.program) dispatches += st.op == shard_op::dispatch ? 1 : 0;
      CHECK(dispatches == sg.layers.size());
      INFO("stage " << sg.index << ": " << per_layer << " requests per MoE layer");
      // Expert messages of the station's work (priced apart from hop
      // messages): a request and a reply per expert node chosen.
      CHECK(cc.station_work[static_cast<size_t>(sg.index)].expert_messages == Approx(2 * dispatches * per_layer));
      CHECK(cc.station_work[static_cast<size_t>(sg.index)].messages == 0);
      // Bytes: xb once per request, one output per chosen expert back.
      CHECK(cc.station_work[static_cast<size_t>(sg.index)].bytes ==
            Approx(dispatches * (per_layer + m.n_active_experts) * vec));
      wire += dispatches * (per_layer + m.n_active_experts) * vec;
      if (sg.index + 1 < static_cast<int>(p.stages.size())) wire += vec;  // forward to the next stage shard
    }
    wire += m.vocab * 4.0;  // the logits, from the last stage shard
    CHECK(planned->wire_bytes_per_token == Approx(wire));
    CHECK(cc.return_hop.messages == 1);
  }
}
