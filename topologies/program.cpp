// topologies/program.cpp: program_of (the generator behind place()'s
// programs) and count_program (what the planner reads). See program.hpp.
#include "topologies/program.hpp"

#include <algorithm>
#include <cmath>
#include <map>

namespace cellshard::topologies {

std::vector<shard_step> program_of(const shard_role& r) {
  std::vector<shard_step> prog;
  if (r.expert_node) {
    shard_step x;
    x.op = shard_op::expert;
    x.layers = r.layers;
    x.experts = r.experts;
    x.peers = r.group;
    prog.push_back(std::move(x));
    return prog;
  }
  const bool last = r.next_group.empty();
  if (r.has_embedding) {
    shard_step e;
    e.op = shard_op::embed;
    e.peers = r.group;
    prog.push_back(std::move(e));
  }
  if (!r.expert_nodes.empty()) {
    for (int l = r.layers.begin; l < r.layers.end; ++l) {
      shard_step c;
      c.op = shard_op::compute;
      c.layers = range{l, l + 1};
      c.part = layer_part::attention;
      prog.push_back(c);
      for (shard_op op : {shard_op::dispatch, shard_op::combine}) {
        shard_step d;
        d.op = op;
        d.layers = range{l, l + 1};
        d.part = layer_part::ffn;
        d.peers = r.expert_nodes;
        d.holders = r.holders;
        prog.push_back(std::move(d));
      }
    }
  } else if (r.group.size() == 1) {
    shard_step c;
    c.op = shard_op::compute;
    c.layers = r.layers;
    c.part = layer_part::both;
    prog.push_back(std::move(c));
  } else {
    for (int l = r.layers.begin; l < r.layers.end; ++l)
      for (layer_part part : {layer_part::attention, layer_part::ffn}) {
        shard_step c;
        c.op = shard_op::compute;
        c.layers = range{l, l + 1};
        c.part = part;
        c.partial = true;
        prog.push_back(c);
        shard_step red;
        red.op = shard_op::reduce;
        red.layers = range{l, l + 1};
        red.part = part;
        red.algorithm = r.reduce;
        red.sync = r.sync;
        red.peers = r.group;
        prog.push_back(std::move(red));
      }
  }
  if (!last && r.rank == 0) {
    shard_step f;
    f.op = shard_op::forward;
    f.peers = r.next_group;
    prog.push_back(std::move(f));
  }
  if (last && r.has_classifier) {
    shard_step c;
    c.op = shard_op::classify;
    c.vocab = r.vocab;
    prog.push_back(std::move(c));
  }
  return prog;
}

std::vector<reduce_round> reduce_rounds(const shard_step& s, int rank, int dim) {
  std::vector<reduce_round> out;
  const int T = static_cast<int>(s.peers.size());
  if (s.op != shard_op::reduce || T < 2 || rank < 0 || rank >= T) return out;
  const uint64_t d = static_cast<uint64_t>(dim);
  if (s.algorithm == reduce_algorithm::scatter_gather) {
    const auto chunks = reduce_chunks(dim, T);
    const uint64_t own = static_cast<uint64_t>(chunks[static_cast<size_t>(rank)].size());
    out.push_back(reduce_round{T - 1, d - own});                             // reduce-scatter
    out.push_back(reduce_round{T - 1, static_cast<uint64_t>(T - 1) * own});  // all-gather
  } else {
    out.push_back(reduce_round{T - 1, static_cast<uint64_t>(T - 1) * d});
  }
  return out;
}

dispatch_traffic expected_dispatch(const shard_step& s, int n_experts, int k, int positions) {
  dispatch_traffic t;
  if (s.op != shard_op::dispatch || n_experts < 1 || k < 1) return t;
  const double n = n_experts, b = positions;
  std::map<int, double> share;  // node -> the choices it serves (one pass over the holders)
  for (const auto& h : s.holders)
    for (int node : h) share[node] += 1.0 / static_cast<double>(h.size());
  for (int node : s.peers) {
    const auto it = share.find(node);
    const double held = it == share.end() ? 0.0 : it->second;
    double miss = 1;  // no chosen expert of one position is served here
    for (int j = 0; j < k && j < n_experts; ++j) miss *= std::max(0.0, (n - held - j) / (n - j));
    const double p = 1 - miss;
    t.messages += 1 - std::pow(miss, b);
    t.vectors_out += b * p;
    const double pairs = b * k * held / n;
    if (pairs > t.busiest_pairs) {
      t.busiest_pairs = pairs;
      t.busiest_experts = held * (1 - std::pow(1 - k / n, b));
      t.busiest_in = b * p;
    }
  }
  t.vectors_back = b * k;
  return t;
}

program_counts count_program(const std::vector<shard_step>& program, int self, int dim) {
  program_counts c;
  const uint64_t d = static_cast<uint64_t>(dim);
  auto add_layers = [&](const range& rg) {
    for (int l = rg.begin; l < rg.end; ++l) c.layers.push_back(l);
  };
  for (const shard_step& s : program) {
    switch (s.op) {
      case shard_op::embed: {
        c.embedding_rows = 1;
        const int others = static_cast<int>(std::count_if(s.peers.begin(), s.peers.end(),
                                                          [&](int p) { return p != self; }));
        c.embed_messages += others;
        c.embed_floats += static_cast<uint64_t>(others) * d;
        break;
      }
      case shard_op::compute:
        add_layers(s.layers);
        if (s.part != layer_part::ffn) c.attention_halves += s.layers.size();
        if (s.part != layer_part::attention) c.ffn_halves += s.layers.size();
        c.partial = c.partial || s.partial;
        break;
      case shard_op::reduce: {
        ++c.reduces;
        const auto it = std::find(s.peers.begin(), s.peers.end(), self);
        const int rank = it == s.peers.end() ? -1 : static_cast<int>(it - s.peers.begin());
        for (const reduce_round& r : reduce_rounds(s, rank, dim)) {
          c.rounds.push_back(r);
          c.reduce_messages += r.messages;
          c.reduce_floats += r.floats;
        }
        break;
      }
      case shard_op::forward:
        c.forward_messages += static_cast<int>(s.peers.size());
        c.forward_floats += static_cast<uint64_t>(s.peers.size()) * d;
        break;
      case shard_op::classify:
        c.classifier_rows += s.vocab.size();
        c.logits_messages += 1;
        c.logits_floats += static_cast<uint64_t>(s.vocab.size());
        break;
      case shard_op::dispatch:
        ++c.dispatches;
        add_layers(s.layers);
        break;
      case shard_op::combine:
        break;
      case shard_op::expert:
        c.expert_layers += s.layers.size();
        add_layers(s.layers);
        break;
      case shard_op::count:
        break;
    }
  }
  std::sort(c.layers.begin(), c.layers.end());
  c.layers.erase(std::unique(c.layers.begin(), c.layers.end()), c.layers.end());
  return c;
}

}  // namespace cellshard::topologies
