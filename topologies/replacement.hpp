// topologies/replacement.hpp: where a lost shard starts again (issue #15:
// the re-placement policy as a pure function, apart from the runtime that
// applies it in actors/recovery.cpp).
//
// Policy (DESIGN.md "Fault tolerance", recovery step 1), in this order:
//  1. the shard's own node, when it is usable (healthy, reachable, not
//     tried already for this restart);
//  2. else the first usable spare, spares taken from the front of the queue
//     (an unusable spare taken on the way is used up: it is not put back);
//  3. else re-placement over the survivors: the usable node with the most
//     free memory (budget minus the placement's need of the shards the
//     runtime keeps there now, this shard's own need left out) that can hold
//     the shard's need; ties go to the first in `nodes` order. A budget of 0
//     means no limit (always the most room). The shard keeps its slice, so
//     the KV checkpoints of its old incarnation still restore.
//  4. else none: `why` names the shard, its node, and every usable node's
//     free memory ("no healthy node left" when there is none).
//
// Thread safety: a pure function over values. Units: bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::topologies {

/// A node as the policy sees it.
struct candidate_node {
  int index = 0;              // node index
  uint64_t budget_bytes = 0;  // 0 = no limit
  bool healthy = true;        // not suspected silent
  bool reachable = true;      // its host can reach it (a daemon's connection is up)
  bool tried = false;         // a spawn there failed already during this restart
  bool usable() const { return healthy && reachable && !tried; }
};

struct replacement_input {
  int index = 0;                   // the placement index to start
  std::vector<int> node_of;        // current node of every placement index
  std::vector<uint64_t> need_of;   // memory need of every placement index (shard::memory.total())
  std::vector<int> spares;         // spare nodes queued, front first
  std::vector<candidate_node> nodes;  // every node the host offers, in its order
};

struct replacement {
  int node = -1;            // where to start the shard; -1: nowhere
  int spares_taken = 0;     // spares to remove from the front of the queue
  /// Nodes the policy looked at and found unreachable (the runtime marks
  /// them unhealthy), in the order it looked.
  std::vector<int> unreachable;
  std::string why;          // when node is -1
};

/// Chooses the node for `in.index` (see the policy above). Input errors
/// (an index outside node_of/need_of) give node -1 with `why` saying so.
replacement choose_node(const replacement_input& in);

}  // namespace cellshard::topologies
