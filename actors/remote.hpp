// actors/remote.hpp: a shard_host whose nodes are node daemons (actors/daemon.hpp)
// reached over CAF's middleman, as `cellshard run --cluster FILE.json` uses it.
//
// The cluster file (CLI.md):
//   {"nodes": [{"host": "127.0.0.1", "port": 4242, "profile": "ps3", "spare": false,
//               "memory": "256MiB"}, ...]}
// "profile", "spare" and "memory" are optional (defaults: remote_options). A
// node's index is its position in the list; the placement sees the profiles
// and budgets written here, and each daemon enforces its own budget when it
// loads a slice.
//
// connect() does, for every node at once and each under a deadline:
//   1. opens the connection (plain, or mutual TLS when remote_options::net.tls
//      is set) with the middleman's heartbeat and connection timeout on, so a
//      frozen daemon fails the connect instead of hanging it (CAF-0.17.md §4);
//   2. joins: the daemon opens its own copies of the model and tokenizer files
//      by file name and returns their digests; a different model, tokenizer or
//      protocol version is an error naming the node (host:port) and what
//      differs (the cluster fingerprint);
//   3. links the daemons to each other directly (node i connects to every
//      node j > i), so that when the front end later hands stage s the handle
//      of stage s+1, stage s already has a direct route to it and CAF 0.17
//      does not route their traffic through the front end (CAF-0.17.md §4b).
// spawn() asks the node's daemon to load the slice and spawn the shard; the
// reply carries the shard's handle (a proxy here).
//
// Thread safety: as shard_host (the cluster's thread; spawn() may also run on
// a CAF worker inside the supervision tree: it blocks that thread for at most
// request_timeout from the last chunk shipped; see docs/runtime.md on
// supervision::child_spec::start_may_block, which it does not use yet).
// Errors: cellshard::result naming the node and the cause.
#pragma once

#include "actors/host.hpp"
#include "actors/tls.hpp"

#include <caf/actor.hpp>

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cellshard::actors {

class weight_store;  // actors/weight_server.hpp
struct shard_spawn;  // actors/messages.hpp

/// One entry of the cluster file.
struct remote_node {
  std::string host;
  uint16_t port = 0;
  std::string profile;  // "" = remote_options::default_profile
  uint64_t memory = 0;  // budget override in bytes (0: remote_options::default_memory, then the profile's)
  bool spare = false;
  std::string address() const { return host + ":" + std::to_string(port); }
};

struct remote_options {
  net_options net{{}, std::chrono::milliseconds(1000), std::chrono::milliseconds(3000), 0};
  std::string default_profile = "host";
  uint64_t default_memory = 0;
  std::chrono::milliseconds connect_timeout{5000};   // connection + TLS handshake
  std::chrono::milliseconds request_timeout{30000};  // join (the daemon may hash a large file), spawn
  /// Link the daemons directly (see above). false only to show, in tests, that
  /// stage-to-stage traffic then passes through the front end.
  bool direct_links = true;
  /// Test hook (issue #17): the first N chunks the weight server ships carry
  /// a wrong digest, so daemons must detect them and get them again.
  int corrupt_chunks = 0;
  /// 1 MiB chunks in flight per slice being shipped (slice_shipment, actors/weight_server.hpp).
  int ship_window = 2;
};

/// Parses the cluster file's text; `name` names it in errors.
result<std::vector<remote_node>> parse_cluster_json(const std::string& text, const std::string& name);

class remote_host : public shard_host {
public:
  remote_host(std::vector<remote_node> nodes, remote_options opts);
  ~remote_host() override;
  /// Reads and parses the cluster file and checks the TLS files.
  static result<std::shared_ptr<remote_host>> from_file(const std::string& path, remote_options opts);

  std::vector<topologies::node_spec> nodes() const override;
  result<void> configure(caf::actor_system_config& cfg) override;
  result<void> connect(caf::actor_system& sys, const model::model_file& file,
                       const model::tokenizer& tok) override;
  /// Waits for spawn_async's result (not on an actor's thread: it blocks).
  result<caf::actor> spawn(caf::actor_system& sys, const shard_request& req) override;
  /// The spawn as an actor of its own (a hidden event-based "spawner"):
  /// returns at once; `done` is called once, on that actor's thread, with
  /// the shard or an error naming the node -- the daemon's refusal, its
  /// connection lost, the slice not shipped in 4 rounds, req.abandon()
  /// (asked every 100 ms) or no answer within request_timeout (counted from
  /// the last chunk served while shipping). Nothing blocks (issue #15).
  void spawn_async(caf::actor_system& sys, const shard_request& req, spawn_done done) override;
  bool spawn_is_async() const override { return true; }
  /// Asks every daemon (deadline 2 s each, in parallel); 0 for a node that did not answer.
  std::vector<uint64_t> node_memory() const override;
  /// Asks the daemon to heartbeat from its own process (heartbeat_start).
  result<caf::actor> start_heartbeat(caf::actor_system& sys, int node, caf::actor monitor,
                                     std::chrono::milliseconds interval) override;
  /// Every successful spawn's weight figures, in order (thread-safe).
  std::vector<weight_load> weight_loads() const override;
  /// False once the daemon's connection went down (watched by the owner actor).
  bool reachable(int node) const override;
  /// Asks the daemons (slice_room_ask, in parallel, request_timeout): the
  /// slices' manifests are made here (and kept for the spawns). A daemon
  /// that does not answer is kept (its spawn will say what is wrong).
  std::vector<skipped_node> drop_unfit(caf::actor_system& sys, const topologies::placement& plan) override;
  void shutdown(caf::actor_system& sys) override;

  /// "node 2 (127.0.0.1:4243)".
  std::string describe(int node) const;
  const std::vector<remote_node>& entries() const { return entries_; }
  /// The daemon actor of `node` after connect() (invalid before).
  caf::actor daemon(int node) const;

  /// After connect(): one line per node whose build lacks backend `kernels`
  /// (its shards run on kernels::choose_backend()'s substitute), naming the
  /// node, its byte order and the backend it uses instead. Empty otherwise.
  std::vector<std::string> join_notes(const std::string& kernels) const;

private:
  std::vector<remote_node> entries_;
  std::vector<std::vector<std::string>> backends_;  // per node, from its join
  std::vector<bool> big_endian_;
  remote_options opts_;
  std::vector<topologies::node_spec> specs_;
  std::vector<bool> dropped_;  // by node index: left out by drop_unfit()
  // A cluster whose start fails destroys its actor system without calling
  // shutdown(), and a strong handle released after that would touch a dead
  // system: the daemons are held weakly (their proxies live in the
  // middleman's proxy registry), the owner strongly until shutdown() (else
  // the destructor leaves it to the end of the process).
  std::vector<caf::actor_addr> daemons_;
  caf::actor owner_;
  caf::actor_system* sys_ = nullptr;
  std::shared_ptr<weight_store> weights_;  // the front end's model, for shipping
  caf::actor weight_server_;
  /// The shard_spawn message for `req` (the manifest made, faults pending).
  result<shard_spawn> make_spawn(const shard_request& req) const;
  struct load_log {
    std::mutex mu;
    std::vector<weight_load> all;
  };
  // Shared with spawners still running when this host is destroyed.
  std::shared_ptr<load_log> loads_ = std::make_shared<load_log>();
  // Set by the owner actor when a daemon's proxy goes down (connection lost).
  std::shared_ptr<std::vector<std::atomic<bool>>> down_;
};

}  // namespace cellshard::actors
