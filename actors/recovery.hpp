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
// restarts it on the same node (the node is healthy). A node daemon that is
// killed loses its connection: the shard proxies go down at once
// (remote_link_unreachable), the host reports the node unreachable, and the
// factory starts the shards elsewhere. A silent node (a frozen daemon, or
// an injected silence) stops heartbeating from its own process; the phi
// detector suspects it, the coordinator marks it unhealthy and tells the
// stage supervisors (sv_exited) to restart its shards at once rather than
// wait for the connection timeout.
// Where a restarted shard goes (the factory): its own node if healthy; else
// the first spare; else -- re-placement over the survivors -- the healthy
// node with the most free memory (budget minus the placement's need of the
// shards it already holds) that can take it, so its slice, and therefore the
// checkpoints, still match. When none can, the restart fails with an error
// naming each node's free memory; the stage supervisor's intensity then ends
// the cluster and the sessions return that error with their partial output.
// Every restart is announced to the running sessions (shard_restarted) once
// the new shard and its upstream stage have confirmed their new wiring; the
// sessions restore the shard's KV cache from their checkpoints and replay.
// Messages of an older epoch -- e.g. from a frozen daemon that wakes up --
// are dropped by every receiver (actors/messages.hpp).
// Thread safety: the coordinator actor is the only owner of the placement
// state (where each shard runs, its actor, unhealthy nodes, spares, the
// failure): supervisors' factories ask it for starts by message, spawn
// results come back to it as messages, and everyone else reads the
// immutable snapshots it publishes (runtime_board). No lock guards it.
#pragma once

#include "actors/host.hpp"
#include "actors/messages.hpp"
#include "actors/fault_ledger.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/phi_accrual.hpp"
#include "supervision/suspicion.hpp"
#include "topologies/placement.hpp"

#include <caf/actor.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/actor_system.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <atomic>
#include <set>
#include <string>
#include <vector>

namespace cellshard::actors {

struct recovery_options {
  int checkpoint_every = 16;
  int batch_size = 32;  // prompt positions per prefill chunk (shard_init::batch_size)
  uint32_t max_restarts = 3;                       // restart intensity R ...
  std::chrono::milliseconds restart_period{10000}; // ... per T
  supervision::phi_accrual_config detector;        // heartbeat detector (defaults: issue #6)
  std::chrono::milliseconds heartbeat{100};
  supervision::suspicion_config suspicion;          // probes before a restart (issue #20)
  std::shared_ptr<supervision::fault_injector> faults;  // may be null
};

/// A node the heartbeat detector suspected that then answered a probe (or
/// heartbeated again): not restarted (CLI.md `suspicions` of `run --json`).
struct suspicion_info {
  int node = -1;
  int64_t at_ns = 0;            // steady_clock ns when it was suspected (as fault_record's *_ns)
  double cleared_after_ms = 0;  // suspected -> first answer
  std::string cleared_by;       // direct | indirect | heartbeat
};

/// The coordinator's answer to (fault_atom): what every fault did so far and
/// the suspicions that were cleared. The coordinator owns both (no lock):
/// shards report faults, factories and the coordinator record decisions,
/// sessions report recoveries, all as messages to it. In process only.
struct fault_snapshot {
  std::vector<fault_record> faults;
  std::vector<suspicion_info> suspicions;
};

/// What a runtime runs: fixed when start_runtime is called, never written
/// afterwards (shared read-only by the cluster, the coordinator and the
/// supervisors' factories; `opts.faults` is a thread-safe injector).
struct runtime_config {
  topologies::placement plan;
  std::shared_ptr<shard_host> host;
  model::weight_format weights = model::weight_format::f32;
  kernels::matmul_mode matmul = kernels::matmul_mode::count;
  int ctx = 0;
  std::string kernels = "native";
  recovery_options opts;
};

/// One immutable snapshot of the coordinator's placement state, published
/// by the coordinator after every change (it is the state's only owner and
/// writer; nothing else ever writes it). Readers see the latest snapshot
/// as a whole, never a half-made one.
struct runtime_view {
  std::vector<int> node_of;          // current node of each placement index (-1: none)
  std::vector<caf::actor> actor_of;  // current shard of each placement index (cleared once stopped)
  std::string failure;               // why the runtime can no longer serve; "" while it can
};

/// Where the coordinator publishes its runtime_view. Thread safety: any
/// thread; get() and publish() are atomic shared_ptr loads and stores.
class runtime_board {
public:
  /// The latest snapshot; null before the coordinator's first.
  std::shared_ptr<const runtime_view> get() const { return std::atomic_load(&view_); }
  /// Called by the coordinator only.
  void publish(std::shared_ptr<const runtime_view> v) { std::atomic_store(&view_, std::move(v)); }

private:
  std::shared_ptr<const runtime_view> view_;
};

/// A running runtime, as start_runtime hands it to its owner (the cluster).
/// The handles never change until stop_runtime; the placement state is the
/// coordinator's, read through `board`.
struct runtime {
  caf::actor supervisor;   // the cluster supervisor
  caf::actor coordinator;
  caf::actor heartbeat_monitor;
  std::vector<caf::actor> heartbeats;  // heartbeat sender by node index (may live in a daemon)
  std::shared_ptr<runtime_board> board = std::make_shared<runtime_board>();
};

/// Starts the coordinator, heartbeats and the supervision tree, which
/// spawns every shard (the supervisors' factories ask the coordinator, which
/// chooses nodes and spawns through cfg->host); waits -- as a request with
/// `deadline` -- until every shard runs and has its wiring, or for the
/// first error, after which everything started is stopped again.
result<runtime> start_runtime(caf::actor_system& sys, std::shared_ptr<const runtime_config> cfg,
                              std::chrono::milliseconds deadline);

/// Stops the supervision tree, the shards, heartbeats and the coordinator
/// (actors that re-arm timers would otherwise keep the actor system alive).
/// Afterwards the board holds the last node_of and failure, and no handle.
/// Releases rt's handles. Blocks for at most ~5 s (the coordinator's answer).
void stop_runtime(caf::actor_system& sys, runtime& rt);

/// The wiring of placement index `index`: its program (the placement's) and
/// the current actors of its group and of the next stage.
wiring wiring_of(const topologies::placement& plan, const std::vector<int>& node_of,
                 const std::vector<caf::actor>& actor_of, int index);

}  // namespace cellshard::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::fault_snapshot)
