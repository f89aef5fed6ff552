// actors/shard.hpp: the shard actor. It holds one slice of the model (a
// layer range, and within it a range of KV/query heads and FFN units) and,
// per session, its KV cache. For every step it executes its program -- the
// placement's list of ops for this shard (topologies::shard::program: embed,
// compute a layer range or a layer half of its slice, reduce over its TP
// group in a fixed order, forward to the next stage, classify its vocabulary
// rows), which arrives with its `wiring` and is checked against its slice
// (topologies::check_program) before the shard takes it. Nothing about the
// order of exchanges is decided here (issue #15). See actors/messages.hpp
// for the protocol.
//
// Recovery (DESIGN.md "Fault tolerance"): every `checkpoint_every` positions
// a shard sends its new KV rows to the session as a kv_delta; a restarted
// shard is given them back with a restore_req. Rank 0 of a stage that has a
// next stage keeps a replay log of the activations it sent, trimmed when the
// session acknowledges checkpoints (trim_atom), and re-sends a range on
// (replay_atom, session, epoch, from, to). Messages of an older epoch than the
// newest seen for a session are dropped.
//
// Compute never runs on CAF's threads: each shard posts its kernels (a layer
// half over a step's positions, the classifier) to its own compute_worker
// (actors/worker.hpp) and handles the result as a message, so it answers
// liveness probes (alive_atom), step probes (step_query_atom), partial sums
// and statistics while a step computes, and heartbeats never wait for
// kernels (issues #15 and #20). Each session has at most one step in flight
// at a shard; steps of different sessions interleave on the worker in
// posting order.
#pragma once

#include "actors/compute_gate.hpp"
#include "actors/messages.hpp"
#include "actors/node.hpp"
#include "kernels/backend.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include <memory>

namespace cellshard::actors {

struct shard_init {
  int index = 0;        // placement index
  int stage = 0;        // pipeline stage
  int rank = 0;         // rank within its TP group
  int group_size = 1;
  int checkpoint_every = 16;  // positions between KV checkpoint deltas (0 = none)
  /// Positions of a step computed together (model::*_partial_batch: each
  /// weight row read once per chunk); a prefill step of more positions runs
  /// in chunks of this many. Results do not depend on it (bit-identical).
  int batch_size = 32;
  bool restarted = false;     // a restart: sessions older than it must restore it first
  std::shared_ptr<supervision::fault_injector> faults;  // may be null
  caf::actor heartbeat;       // the node's heartbeat sender (silenced with the shard)
  caf::actor coordinator;     // gets fault_report messages (may be invalid)
  std::shared_ptr<const model::shard_weights> weights;
  const kernels::backend* backend = nullptr;
  std::shared_ptr<node_state> node;
  /// Tests on CAF's test_coordinator only: kernels run inside the shard's
  /// handler (compute_worker's inline mode), so every message order is the
  /// test coordinator's. Never set by the runtime.
  bool compute_inline = false;
  /// Tests only (actors/compute_gate.hpp): a latch the shard's worker
  /// passes every job through, so a test can hold a step mid-compute and
  /// probe the shard meanwhile. Null in a runtime (never set by cluster,
  /// daemons or recovery).
  std::shared_ptr<compute_gate> gate;
};

/// Spawns a shard; send it a `wiring` (with wire_atom) before any step.
caf::actor spawn_shard(caf::actor_system& sys, shard_init init);

}  // namespace cellshard::actors
