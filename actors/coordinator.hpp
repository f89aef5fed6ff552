// actors/coordinator.hpp: the coordinator's protocol (actors/recovery.cpp),
// for the runtime that drives it (start_runtime, stop_runtime), the
// sessions that report to it, and tests that drive it alone on CAF's
// test_coordinator (tests/actors/test_coordinator.cpp).
//
// The coordinator owns the runtime's placement state (where each placement
// index runs, its actor, unhealthy nodes, spares, the failure, the fault
// ledger, cleared suspicions) and changes it only on these messages:
//   (setup, heartbeat senders by node)      before any start; answered once stored
//   start_request                           a stage supervisor's factory: start one incarnation
//   spawn_outcome                           a host's spawn ended (private to recovery.cpp)
//   (ready)                                 answered "" once every placement index runs,
//                                           or with the first failed start's error
//   (stages, stage supervisors by stage)    where the detector's verdicts go
//   sv_event (child_restarted, escalated)   a restart enters the wiring; a supervisor gave up
//   hb_suspect / hb_alive                   the heartbeat detector's verdicts: probe, clear
//   fault_report, (recovered, ...)          what fired, what a session recovered
//   (join | leave, session)                 who hears shard_restarted and cluster_failed
//   (fault)                                 answered with a fault_snapshot (recovery.hpp)
//   (stop)                                  kill the shards, publish a view without handles, quit
// After every change it publishes an immutable runtime_view on its board.
// In process only: start_request carries a callback.
#pragma once

#include "actors/recovery.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/atom.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace cellshard::actors {

/// (join, session) / (leave, session): a session starts or stops hearing of
/// restarts (shard_restarted) and of the cluster's failure (cluster_failed).
using join_atom = caf::atom_constant<caf::atom("cs_join")>;
using leave_atom = caf::atom_constant<caf::atom("cs_leave")>;
/// (recovered, index, replayed positions, steady ns): a session recovered a
/// restarted placement index (its next token came).
using recovered_atom = caf::atom_constant<caf::atom("cs_recov")>;

namespace coord_msg {

using setup_atom = caf::atom_constant<caf::atom("cs_setup")>;
using ready_atom = caf::atom_constant<caf::atom("cs_ready")>;
using stages_atom = caf::atom_constant<caf::atom("cs_stages")>;
using stop_atom = caf::atom_constant<caf::atom("cs_stop")>;

/// A stage supervisor's factory asks the coordinator to start one
/// incarnation of placement index `idx` (child_spec::start_async): the
/// coordinator chooses the node and spawns; `done` gets the shard, or an
/// invalid handle when no node can take it.
struct start_request {
  int idx = -1;
  uint64_t incarnation = 0;
  caf::error last_reason;  // why the previous incarnation ended
  std::function<void(caf::actor)> done;  // a supervision::start_done
};

/// A host's spawn of attempt `attempt` on `node` ended (from any thread).
struct spawn_outcome {
  uint64_t attempt = 0;
  int node = -1;
  caf::actor shard;   // invalid on failure
  std::string error;  // the host's error when `shard` is invalid
};

}  // namespace coord_msg

/// Spawns a coordinator over `cfg` publishing on `board` (start_runtime
/// does, then sets it up; see above).
caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const runtime_config> cfg,
                             std::shared_ptr<runtime_board> board);

}  // namespace cellshard::actors

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::coord_msg::start_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::coord_msg::spawn_outcome)
