// actors/recovery.hpp: the supervision tree of a cluster and the coordinator
// that turns its events into recoveries (DESIGN.md "Fault tolerance").
//
//   cluster supervisor (one_for_one, intensity 0: a stage that gives up ends the cluster)
//     stage supervisor s (one_for_one, restart intensity R per T, default 3 per 10 s)
//       shard children "shard-<placement index>"
//   heartbeat monitor (phi accrual) <- one heartbeat sender per node
//   coordinator: listener of all of the above, and of fault reports
//
// Detection: a crashed shard's down_msg reaches its stage supervisor, which
// restarts it on the same node (the node is healthy); a silent node is
// suspected by the phi detector, the coordinator marks it unhealthy and kills
// its shards, and the supervisor's factory starts them on a spare node.
// Every restart is announced to the running sessions (shard_restarted), which
// restore the shard's KV cache from their checkpoints and replay.
// Thread safety: runtime_shared is locked by its mutex; the rest are actors.
#pragma once

#include "actors/host.hpp"
#include "actors/messages.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/phi_accrual.hpp"
#include "topologies/placement.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

namespace cellshard::actors {

/// What one fault did, end to end (CLI.md `faults` of `run --json`).
struct fault_record {
  std::string kind;
  int index = -1;            // placement index
  int node = -1;
  int64_t step = 0;
  double detect_ms = -1;     // fault fired -> supervisor decision (-1: not detected)
  double recover_ms = -1;    // decision -> next token delivered (-1: not recovered)
  int replayed_positions = 0;
  int moved_to_node = -1;    // where the shard runs after recovery
};

struct recovery_options {
  int checkpoint_every = 16;
  uint32_t max_restarts = 3;                       // restart intensity R ...
  std::chrono::milliseconds restart_period{10000}; // ... per T
  supervision::phi_accrual_config detector;        // heartbeat detector (defaults: issue #6)
  std::chrono::milliseconds heartbeat{100};
  std::shared_ptr<supervision::fault_injector> faults;  // may be null
};

/// State shared by the cluster, the coordinator and the shard factories.
struct runtime_shared {
  std::mutex mu;
  topologies::placement plan;
  std::shared_ptr<shard_host> host;
  model::weight_format weights = model::weight_format::f32;
  std::string kernels = "blas";
  recovery_options opts;
  std::vector<int> node_of;             // current node of each placement index
  std::vector<caf::actor> actor_of;     // current actor of each placement index
  std::set<int> unhealthy;              // nodes suspected silent
  std::deque<int> spare_nodes;          // nodes free to take shards
  std::vector<caf::actor> heartbeats;   // heartbeat sender by node index
  caf::actor heartbeat_monitor;
  caf::actor coordinator;
  std::string last_error;               // why the last factory call failed
  std::vector<fault_record> faults;
  bool failed = false;
  std::string failure;
};

/// Starts heartbeats, the coordinator and the supervision tree, which spawns
/// every shard. Returns when all shards run (actor_of filled) or with an error.
result<caf::actor> start_runtime(caf::actor_system& sys, std::shared_ptr<runtime_shared> rt,
                                 std::chrono::milliseconds deadline);

/// Stops the supervision tree, the shards, heartbeats and the coordinator
/// (actors that re-arm timers would otherwise keep the actor system alive).
void stop_runtime(runtime_shared& rt, const caf::actor& supervisor);

/// The wiring of the shards of `stage`: their group and the next stage.
wiring wiring_of(const runtime_shared& rt, int stage);

/// Sends the placement's wiring to every shard (initially and after restarts).
void send_wiring(const runtime_shared& rt, int stage);

}  // namespace cellshard::actors
