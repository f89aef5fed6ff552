// actors/daemon.hpp: the node daemon (`cellshard node`). One per process (or
// machine): it publishes one actor on the middleman (plain TCP or mutual TLS)
// that front ends talk to with the protocol in actors/messages.hpp ("node
// daemons"):
//   - node_join: the daemon checks the protocol version and, when its
//     --models folder holds the tokenizer the front end names, its digest
//     (the cluster fingerprint); it does not open the model (it may hold
//     none of it: issue #17);
//   - node_peers: the daemon connects directly to the other daemons of the
//     cluster, so that stage-to-stage messages go daemon to daemon;
//   - shard_spawn: the daemon gets the slice's bytes named by the spawn's
//     weight manifest (model/manifest.hpp), first found of: slices it has
//     loaded already, its --cache (verified; a corrupt file is dropped), its
//     --models copy of the file (only the manifest's bytes are read, then
//     verified: a difference refuses the spawn, "model differs"), else the
//     front end: the daemon answers "need" and the front end's weight
//     server ships the chunks (slice_fetch + slice_chunk, a few in flight;
//     the daemon answers each with a slice_ack: stored, or failed its
//     digest and shipped again; progress in the log), then sends the spawn
//     again; the slice is verified whole and stored in --cache. Then it
//     builds the shard's weights from the
//     slice alone (model::open_slice), checks them against the node's
//     memory budget and spawns the shard locally (actors/shard.hpp); the
//     reply carries the shard's handle, a proxy on the front end's side,
//     and how the slice came (shard_spawned::source, shipped bytes, time);
//   - slice_room_ask: before any spawn, per slice, whether the node can
//     hold it (memory budget; --cache-max for a slice it would be shipped),
//     so that the front end leaves a node without room out of the placement;
//   - stats_atom: a node_report (memory in use, the cache's figures).
// The daemon monitors each front end's `owner` actor: when it goes down (or
// its connection is lost: heartbeats, CAF-0.17.md §4), the shards spawned for
// it are stopped and their memory released.
//
// Thread safety: node_daemon's member functions are for the thread that
// started it. Errors: cellshard::result with messages naming the flag, file
// or limit.
#pragma once

#include "actors/tls.hpp"
#include "model/result.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/guard.hpp"

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace cellshard::actors {

struct daemon_options {
  std::string host = "127.0.0.1";  // address to listen on ("0.0.0.0": every interface)
  /// Without TLS a daemon listens on loopback only, unless this is set
  /// (`node --insecure`): plain CAF traffic is unauthenticated.
  bool insecure = false;
  /// The pre-handshake guard in front of CAF (actors/guard.hpp).
  guard_options guard;
  uint16_t port = 0;               // 0: the OS picks a free port
  std::string profile = "host";    // topologies profile name: host | ps3 | ps3-slim | rpi5
  uint64_t memory = 0;             // budget override in bytes (0: the profile's)
  /// Shaping of the shards' outgoing links, "BANDWIDTH:LATENCY" as --link
  /// (topologies::parse_link; "": the profile's link, unshaped for host).
  /// Applied by the link shaper in front of every shard-to-shard send
  /// (actors/transport.hpp), as for in-process nodes.
  std::string link;
  std::string models_dir;          // where the model and tokenizer files are found by name (may be empty)
  /// Where shipped slices are kept by manifest key (`node --cache`, model/
  /// slice_cache.hpp); "": shipped slices live in memory only.
  std::string cache_dir;
  uint64_t cache_max = 0;          // `--cache-max` bytes (0: unbounded)
  /// Bytes per shipped chunk: the front end's slice_chunk_bytes
  /// (actors/weight_server.hpp).
  uint64_t chunk_bytes = 1u << 20;
  net_options net;                 // heartbeats, connection timeout, TLS, CAF threads
  std::chrono::milliseconds peer_timeout{5000};  // deadline of a connection to another daemon
  int blas_threads = 1;            // OpenBLAS threads per call
  int threads = 0;                 // kernel threads (kernels::pool); 0 = the CPUs this process may use
  /// Where the daemon reports joins, spawns and departures (one line each,
  /// no newline); null: silent. Called from CAF threads.
  std::function<void(const std::string&)> log;
};

class node_daemon {
public:
  /// Validates the options (profile, memory, models folder, TLS files) before
  /// CAF starts, starts the actor system and publishes the daemon actor.
  static result<std::unique_ptr<node_daemon>> start(const daemon_options& o);
  ~node_daemon();
  node_daemon(const node_daemon&) = delete;
  node_daemon& operator=(const node_daemon&) = delete;

  /// The address and the bound port ("listening HOST:PORT").
  const std::string& host() const;
  uint16_t port() const;
  caf::actor_system& system();
  /// The published daemon actor.
  caf::actor handle() const;
  /// Stops the daemon and its shards and the actor system. Idempotent.
  void stop();

  struct impl;

private:
  explicit node_daemon(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

/// Spawns the daemon actor in an existing actor system (which must have the
/// middleman, and caf-openssl when `o.net.tls` is set); node_daemon::start
/// does this and publishes it. Stopping it (an exit message) stops its shards.
caf::actor spawn_daemon(caf::actor_system& sys, const daemon_options& o);

}  // namespace cellshard::actors
