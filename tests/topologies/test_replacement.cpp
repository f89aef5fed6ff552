// topologies::choose_node: where a lost shard starts again (issue #15), as a
// pure function: own node, then spares, then the survivor with the most room.
#include "topologies/replacement.hpp"

#include <catch2/catch.hpp>

using namespace cellshard::topologies;

namespace {

constexpr uint64_t MiB = 1024 * 1024;

/// 3 shards on nodes 0, 1, 2 needing 100, 60 and 40 MiB; nodes 0..4 of
/// 256 MiB; nodes 3 and 4 queued as spares.
replacement_input three_shards() {
  replacement_input in;
  in.node_of = {0, 1, 2};
  in.need_of = {100 * MiB, 60 * MiB, 40 * MiB};
  in.spares = {3, 4};
  for (int n = 0; n < 5; ++n) in.nodes.push_back(candidate_node{n, 256 * MiB});
  return in;
}

candidate_node& node(replacement_input& in, int n) { return in.nodes.at(static_cast<size_t>(n)); }

}  // namespace

TEST_CASE("choose_node: a usable own node keeps the shard and spares stay queued", "[replacement]") {
  auto in = three_shards();
  in.index = 1;
  const auto r = choose_node(in);
  CHECK(r.node == 1);
  CHECK(r.spares_taken == 0);
  CHECK(r.unreachable.empty());
  CHECK(r.why.empty());
}

TEST_CASE("choose_node: an unhealthy, unreachable or tried own node gives the first usable spare",
          "[replacement]") {
  auto in = three_shards();
  in.index = 1;
  node(in, 1).healthy = false;
  auto r = choose_node(in);
  CHECK(r.node == 3);
  CHECK(r.spares_taken == 1);
  CHECK(r.unreachable.empty());

  // Own node unreachable and the first spare tried: both passed over, the
  // unreachable one reported, the tried spare used up.
  in = three_shards();
  in.index = 1;
  node(in, 1).reachable = false;
  node(in, 3).tried = true;
  r = choose_node(in);
  CHECK(r.node == 4);
  CHECK(r.spares_taken == 2);
  CHECK(r.unreachable == std::vector<int>{1});
}

TEST_CASE("choose_node: no spare left -- the survivor with the most free memory that can hold it",
          "[replacement]") {
  auto in = three_shards();
  in.spares.clear();
  in.nodes.resize(3);  // nodes 0, 1, 2
  in.index = 2;
  node(in, 2).healthy = false;
  // Free: node 0 = 256 - 100 = 156 MiB, node 1 = 256 - 60 = 196 MiB.
  auto r = choose_node(in);
  CHECK(r.node == 1);
  CHECK(r.spares_taken == 0);
  // Node 1 smaller: 80 MiB budget -> 20 MiB free, too little for 40 MiB.
  node(in, 1).budget_bytes = 80 * MiB;
  r = choose_node(in);
  CHECK(r.node == 0);
  // A budget of 0 is no limit: the most room of all.
  node(in, 1).budget_bytes = 0;
  r = choose_node(in);
  CHECK(r.node == 1);
  // Equal room: the first in node order.
  node(in, 1).budget_bytes = 256 * MiB;
  in.need_of = {60 * MiB, 60 * MiB, 40 * MiB};
  r = choose_node(in);
  CHECK(r.node == 0);
  // The shard's own need is not counted against its node: node 2 itself is
  // not usable here, but a shard moved back to a node it left still fits
  // (its old incarnation's need is left out).
  in = three_shards();
  in.spares.clear();
  in.nodes.resize(3);
  in.index = 0;
  node(in, 0).budget_bytes = 100 * MiB;  // exactly its need, with itself left out
  node(in, 1).healthy = false;
  node(in, 2).healthy = false;
  r = choose_node(in);
  CHECK(r.node == 0);
}

TEST_CASE("choose_node: nowhere to go names the shard, its node and every survivor's room", "[replacement]") {
  auto in = three_shards();
  in.spares = {3};
  in.nodes.resize(4);
  in.index = 0;
  node(in, 0).healthy = false;
  node(in, 3).tried = true;
  node(in, 1).budget_bytes = 150 * MiB;  // 90 MiB free
  node(in, 2).budget_bytes = 120 * MiB;  // 80 MiB free
  auto r = choose_node(in);
  CHECK(r.node == -1);
  CHECK(r.spares_taken == 1);
  CHECK(r.why ==
        "no spare node left for placement index 0 (node 0 answered no liveness probe), and no surviving node "
        "has room for it (needs 100 MiB): node 1 has 90 MiB free of 150 MiB, node 2 has 80 MiB free of "
        "120 MiB");
  // Nobody usable at all.
  node(in, 1).healthy = false;
  node(in, 2).reachable = false;
  node(in, 0).reachable = false;
  r = choose_node(in);
  CHECK(r.node == -1);
  CHECK(r.unreachable == std::vector<int>{2});  // node 0 is unhealthy: its reachability is not looked at
  CHECK(r.why ==
        "no spare node left for placement index 0 (node 0 is unreachable), and no surviving node has room for it "
        "(needs 100 MiB): no healthy node left");
  // A bad index is an error, not a crash.
  in.index = 7;
  r = choose_node(in);
  CHECK(r.node == -1);
  CHECK(r.why == "placement index 7 outside the runtime's 3 placement indices (with 3 memory needs)");
}
