// topologies/program.hpp: a shard's program (placement.hpp shard_step) as a
// pure function of the shard's *role* -- its layer range, its group, the next
// stage's group, embedding/classifier, expert holdings, the reduce algorithm
// -- with no model file and no placement, and what a program costs per
// position, counted op by op (issue #15: "the planner's cost model reads the
// same steps").
//
// One generator, two users:
// - place() (placement.cpp shard_program) builds each shard's role from the
//   placement and hands actors/ the list program_of returns: the list the
//   shard actor executes (actors/shard.cpp run_program);
// - the planner (planner.cpp chain_cost, check 3) builds the role of the
//   busiest rank (rank 0) of every station of a pipeline / tensor / hybrid
//   layout from the model's shape (model_presets.hpp model_spec: no weights,
//   so Kimi K3 on 100,000 nodes works) and reads its messages, bytes, reduce
//   rounds, layers, embedding and classifier rows from count_program. Only
//   rank 0's list is generated per station, not one per node: ranks of a
//   group differ only in rank 0's embed/forward and in their reduce chunks,
//   and reduce_rounds() evaluates rank 0's reduce op for any other rank of
//   the group (the op names the whole group). For Kimi K3 at 93 stations
//   that is 93 lists, whatever the node count. The planner's expert:T layout
//   (embedding/classifier pools, TP groups with expert nodes) is not one the
//   placement can build and keeps its own formulas (planner.hpp).
//
// Units: floats (4-byte f32 as the runtime sends them; the planner prices
// them at its wire format) per position of a step; messages per position
// (a step of n positions sends the same messages, n times the floats).
// Thread safety: pure functions over values.
#pragma once

#include "topologies/placement.hpp"

#include <cstdint>
#include <vector>

namespace cellshard::topologies {

/// What program_of needs to know about one shard (placement.hpp shard and
/// stage fields, by value; indices are placement indices).
struct shard_role {
  int index = 0;  // its placement index
  int rank = 0;   // position in `group` (0: embeds and forwards)
  range layers;   // [l0, l1)
  bool has_embedding = false;
  bool has_classifier = false;  // a rank of the last stage
  range vocab;                  // classifier rows it returns
  /// Its stage's group: the TP ranks in rank order (itself included), or the
  /// stage shard alone under expert placement.
  std::vector<int> group;
  /// The next stage's group (empty: the last stage).
  std::vector<int> next_group;
  /// Expert node: holds only `experts` of every layer of `layers`.
  bool expert_node = false;
  std::vector<int> experts;
  /// Stage shard of an expert placement: its stage's expert nodes and, per
  /// routed expert, the expert nodes holding it (preference order).
  std::vector<int> expert_nodes;
  std::vector<std::vector<int>> holders;
  reduce_algorithm reduce = reduce_algorithm::direct_rank_order;
  sync_format sync = sync_format::f32;
};

/// The program of a shard in role `r` (the rules of placement.hpp
/// shard_program, which calls this).
std::vector<shard_step> program_of(const shard_role& r);

/// One round of a reduce as one rank sees it: messages it sends and floats
/// in them, per position.
struct reduce_round {
  int messages = 0;
  uint64_t floats = 0;
};
/// The rounds of reduce op `s` (s.op == reduce) for the rank at position
/// `rank` of s.peers, over a vector of `dim` floats: direct_rank_order one
/// round of T-1 messages, (T-1) x dim floats; scatter_gather a
/// reduce-scatter round (T-1 messages: every chunk but its own, dim - c_rank
/// floats) and an all-gather round (T-1 messages of its chunk c_rank:
/// (T-1) x c_rank floats), chunks = reduce_chunks(dim, T). T = 1: none.
std::vector<reduce_round> reduce_rounds(const shard_step& s, int rank, int dim);

/// A program's work and traffic per position, counted op by op.
struct program_counts {
  // Compute.
  std::vector<int> layers;  // the layers it computes (any part), ascending, each once
  /// Layers whose attention / FFN half it computes (a `both` compute counts
  /// each of its layers in both; an expert-placement stage shard's MoE FFNs
  /// are its dispatches instead).
  int attention_halves = 0;
  int ffn_halves = 0;
  bool partial = false;     // its computes are TP slices (followed by reduces)
  int embedding_rows = 0;   // 1 on the embedding holder (one row per position)
  int classifier_rows = 0;  // classifier rows for the step's last position (its vocab slice)
  int expert_layers = 0;    // expert node: layers it serves
  // Traffic this shard sends, per position.
  int embed_messages = 0;   // x to the rest of its group
  uint64_t embed_floats = 0;
  int forward_messages = 0; // x to every shard of the next stage
  uint64_t forward_floats = 0;
  int reduces = 0;          // reduce ops
  std::vector<reduce_round> rounds;  // every reduce's rounds, program order
  int reduce_messages = 0;           // sum over rounds
  uint64_t reduce_floats = 0;        // sum over rounds
  int dispatches = 0;       // dispatch ops (MoE layers whose routed experts are on expert nodes)
  int logits_messages = 0;  // 1 with classify
  uint64_t logits_floats = 0;  // its vocab rows
  /// All messages it sends per position and their floats (embed, forward,
  /// reduces, logits; dispatches depend on the routing and are not in here).
  int messages() const { return embed_messages + forward_messages + reduce_messages + logits_messages; }
  uint64_t floats() const { return embed_floats + forward_floats + reduce_floats + logits_floats; }
};

/// What a dispatch op (and the combine after it) sends, expected per step of
/// `positions` positions, each choosing `k` distinct routed experts of
/// `n_experts` uniformly at random (the planner's routing assumption; the
/// runtime's router decides per token). A position's chosen expert e goes
/// to one of s.holders[e] (the runtime rotates over replicas with the
/// position): expert node i serves h_i = (experts it holds) / R of the
/// choices, and one position sends it something with probability
/// p_i = 1 - prod_{j<k} (n - h_i - j) / (n - j) (hypergeometric: exact for
/// R = 1). The stage shard sends one expert_req per node hit, carrying xb of
/// the positions that hit it, and gets one expert_out back per request
/// carrying one output per (position, expert) pair.
struct dispatch_traffic {
  double messages = 0;          // expert_req messages (as many expert_out back): sum_i 1 - (1 - p_i)^positions
  double vectors_out = 0;       // xb vectors dispatched: positions x sum_i p_i
  double vectors_back = 0;      // outputs combined: positions x k
  double busiest_pairs = 0;     // (position, expert) pairs of the busiest expert node: positions x k x h_i / n
  double busiest_experts = 0;   // distinct experts it runs: h_i x (1 - (1 - k/n)^positions)
  double busiest_in = 0;        // vectors it receives: positions x p_i
};
dispatch_traffic expected_dispatch(const shard_step& dispatch, int n_experts, int k, int positions);

/// Counts `program`, the program of placement index `self`, for vectors of
/// `dim` floats. Messages to itself (an embed's own slot) are not counted.
program_counts count_program(const std::vector<shard_step>& program, int self, int dim);

}  // namespace cellshard::topologies
