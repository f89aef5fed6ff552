// actors/host.hpp: where a cluster's shards live. The in-process host spawns
// them in the front end's own actor system, one logical node per placement
// node (actors/cluster.cpp). A remote host (issue #5, actors/remote.hpp) asks
// node daemons over CAF's middleman to spawn them, each loading its slice
// from its own copy of the model.
//
// The cluster calls, in order: nodes() for the placement, configure() before
// its actor system exists, connect() once it does, then spawn() per shard.
// Thread safety: called from the thread that runs cluster::start only.
#pragma once

#include "model/checkpoint.hpp"
#include "model/result.hpp"
#include "model/tokenizer.hpp"
#include "model/transformer.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/heartbeat.hpp"
#include "topologies/placement.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <vector>

namespace cellshard::actors {

struct node_state;

/// What a host needs to start one shard.
struct shard_request {
  const topologies::shard* placed = nullptr;   // the placement's shard
  model::slice_spec spec;                      // the same as a slice of the model
  model::weight_format weights = model::weight_format::f32;
  kernels::matmul_mode matmul = kernels::matmul_mode::count;  // count: the model's default
  int ctx = 0;  // context length the model was opened with (0: the file's); daemons reopen with it
  std::string kernels = "native";
  // Runtime hooks of the shard (shard_init): checkpoint interval, fault
  // injection, the node's heartbeat sender, and the coordinator.
  int checkpoint_every = 16;
  int batch_size = 32;  // shard_init::batch_size
  bool restarted = false;  // shard_init::restarted
  std::shared_ptr<supervision::fault_injector> faults;
  caf::actor heartbeat;
  caf::actor coordinator;
  /// Asked while a remote spawn waits (every 100 ms): true ends the wait
  /// with an error, e.g. once the target node is suspected silent (a spare
  /// frozen just before it was needed). May be empty. Any thread.
  std::function<bool()> abandon;
};

/// How one spawned shard's weights reached its node (issue #17): "memory",
/// "cache", "models" or "shipped" (shard_spawned), with the bytes shipped
/// to or read on the node and the time from the spawn's arrival to the slice
/// loaded (ms). In-process hosts report none.
struct weight_load {
  int index = -1;  // placement index
  int node = -1;
  std::string source;
  uint64_t shipped_bytes = 0;
  uint64_t bytes_read = 0;
  double reload_ms = 0;
  double ship_ms = 0;  // source "shipped": the transfer alone (shard_spawned::ship_ns)
};

/// A node left out of the placement (issue #17): it said it cannot hold
/// what the placement gave it (its memory budget, or a --cache-max too small
/// for a slice it would have to be shipped).
struct skipped_node {
  int node = -1;
  std::string who;  // "node 2 (127.0.0.1:4243)"
  std::string why;  // the node's reason, naming the bytes needed and available
};

class shard_host {
public:
  virtual ~shard_host() = default;
  /// The nodes offered to the placement (working nodes first, spares flagged).
  virtual std::vector<topologies::node_spec> nodes() const = 0;
  /// Adjusts the actor system's config (e.g. loads the middleman, heartbeats, TLS).
  virtual result<void> configure(caf::actor_system_config& cfg) = 0;
  /// Reaches the nodes (connects, checks fingerprints) before any shard starts.
  virtual result<void> connect(caf::actor_system& sys, const model::model_file& file,
                               const model::tokenizer& tok) = 0;
  /// Starts one shard; an error names the node and the cause.
  virtual result<caf::actor> spawn(caf::actor_system& sys, const shard_request& req) = 0;
  /// The result of spawn_async: the shard, or an error naming the node.
  using spawn_done = std::function<void(result<caf::actor>)>;
  /// Starts one shard without waiting: `done` gets the result exactly once,
  /// from any thread (possibly before this returns). The request's `placed`
  /// pointer is read during the call only. Default: spawn(), then done.
  virtual void spawn_async(caf::actor_system& sys, const shard_request& req, spawn_done done) {
    done(spawn(sys, req));
  }
  /// True when spawn_async returns before the shard exists (a remote host):
  /// the runtime then starts shards asynchronously (child_spec::start_async).
  virtual bool spawn_is_async() const { return false; }
  /// Every successful spawn's weight figures, in spawn order (empty in process).
  virtual std::vector<weight_load> weight_loads() const { return {}; }
  /// Bytes in use on each node, by node index (empty when unknown).
  virtual std::vector<uint64_t> node_memory() const { return {}; }
  /// Starts node `node`'s heartbeat sender towards `monitor` (the phi-accrual
  /// monitor, supervision/heartbeat.hpp). It must run where the node runs, so
  /// that a frozen node falls silent: in process here; a remote host asks
  /// the node daemon. Called once per node by start_runtime.
  virtual result<caf::actor> start_heartbeat(caf::actor_system& sys, int node, caf::actor monitor,
                                             std::chrono::milliseconds interval) {
    (void)node;
    supervision::heartbeat_sender_config hc;
    hc.monitor = std::move(monitor);
    hc.peer = static_cast<uint64_t>(node);
    hc.interval = interval;
    return supervision::spawn_heartbeat_sender(sys, hc);
  }
  /// False once the node is known to be gone for good (a daemon whose
  /// connection was lost); a shard is then never started there again.
  /// Thread safety: any thread.
  virtual bool reachable(int node) const {
    (void)node;
    return true;
  }
  /// After connect(), before any spawn: asks every node of `plan` whether it
  /// can hold its shards (a spare: at least one shard of the plan) and
  /// leaves every node that cannot out of nodes() from then on (no shard, no
  /// spare, no heartbeats); returns those, in node order. The caller places
  /// the model again over nodes(). Default (nodes in process): none.
  virtual std::vector<skipped_node> drop_unfit(caf::actor_system& sys, const topologies::placement& plan) {
    (void)sys;
    (void)plan;
    return {};
  }
  /// Called by cluster::shutdown after the shards were told to stop.
  virtual void shutdown(caf::actor_system&) {}
};

}  // namespace cellshard::actors
