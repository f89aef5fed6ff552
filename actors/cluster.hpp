// actors/cluster.hpp: the library's public face for the distributed runtime.
// A cluster places a model over logical nodes (in one process: one CAF actor
// system, one memory budget per node), spawns a shard actor per placed shard,
// and runs generation requests as session actors that interleave through the
// pipeline. Typical use:
//
//   cellshard::actors::cluster_options o;
//   o.model = "stories260K.bin"; o.tokenizer = "tok512.bin";
//   o.nodes = 4; o.topology = "pipeline";
//   auto c = cellshard::actors::cluster::start(o);      // result<unique_ptr<cluster>>
//   auto r = (*c)->generate(params, on_token);           // blocking, with a deadline
//   auto id = (*c)->submit(params, on_token, on_done);   // asynchronous
//   (*c)->cancel(id);                                    // frees every shard's KV cache
//
// Thread safety: every member function may be called from any thread,
// concurrently. Callbacks run on CAF worker threads and must not block; calls
// back into the cluster from a callback are allowed except generate() and
// stats() (they would wait on the thread that must answer them).
// Errors: start() and generate() return cellshard::result with a message that
// names the file, node or limit; nothing waits without a deadline.
#pragma once

#include "actors/host.hpp"
#include "actors/messages.hpp"
#include "actors/recovery.hpp"
#include "actors/session.hpp"
#include "model/checkpoint.hpp"
#include "model/generate.hpp"
#include "model/result.hpp"
#include "model/tokenizer.hpp"
#include "topologies/placement.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace cellshard::actors {

struct cluster_options {
  // The model: a file path, or an already loaded model_file (takes precedence).
  std::string model;
  std::string tokenizer;  // default: tokenizer.bin beside the model
  std::shared_ptr<const model::model_file> file;
  std::shared_ptr<const model::tokenizer> tok;

  int nodes = 1;                      // in-process nodes offered to the placement
  int spares = 0;                     // extra nodes held as spares
  std::string topology = "pipeline";  // pipeline | tensor | hybrid:PxT | expert:E | pipeline:P,expert:E (topologies::parse_strategy)
  std::string reduce = "direct";      // tensor groups' all-reduce: direct | scatter (topologies::parse_reduce_algorithm)
  std::string sync = "f32";           // partial sums on the wire: f32 | q8_0 (topologies::parse_sync_format)
  int expert_replicas = 1;            // expert topologies: R expert nodes hold each expert (--expert-replicas)
  std::string profile = "host";       // host | ps3 | ps3-slim | rpi5
  uint64_t memory = 0;                // per-node budget override in bytes (0: the profile's)
  std::string link;                   // per-node link override "BANDWIDTH:LATENCY" ("": the profile's)
  std::string kernels = "native";     // kernel backend
  std::string weights = "f32";        // f32 | q8_0
  std::string matmul;                 // --matmul exact|ggml ("": the model's default)
  int ctx = 0;                        // --ctx: context length override (0: the file's)
  int sessions = 1;                   // concurrent sessions the memory check plans for

  int caf_threads = 2;   // scheduler.max-threads (CAF defaults to 4 on 2 cores)
  int blas_threads = 1;  // OpenBLAS threads per call (shards already run in parallel)
  int threads = 1;       // kernel threads per in-process node (kernels::pool; 1 = none)
  std::chrono::milliseconds step_timeout{30000};      // ceiling of a step's deadline (and of requests)
  std::chrono::milliseconds step_timeout_min{2000};   // first deadline of a prefill; floor of a decode
                                                      // step's (10x its moving average); doubled per re-send

  // Supervision (issue #6).
  int checkpoint_every = 16;                          // positions between KV checkpoint deltas
  int batch_size = 32;  // prompt positions per prefill chunk in a shard (--batch-size)
  uint32_t max_restarts = 3;                          // restart intensity: R restarts ...
  std::chrono::milliseconds restart_period{10000};    // ... in T
  supervision::phi_accrual_config detector;           // heartbeat failure detector
  std::chrono::milliseconds heartbeat{100};
  std::vector<supervision::fault_plan> faults;        // --fault / --faults
  int corrupt_checkpoints_of = -1;                    // test hook (session_spec)
  /// Creates a fault injector even without `faults`, so that inject() can
  /// add faults while the cluster runs (serve --allow-fault-injection).
  bool fault_injection = false;

  /// Where the shards live; null = in this process (nodes/spares/profile/memory above).
  std::shared_ptr<shard_host> host;
};

using token_callback = std::function<void(uint64_t request, int token, const std::string& piece)>;
using done_callback = std::function<void(uint64_t request, const session_outcome& outcome)>;

/// Per-request extras: a journal file, or the state of a killed run to resume.
struct request_options {
  std::string journal;          // append every token (JSON lines, flushed)
  std::vector<int> resume_ids;  // ids already produced (BOS first)
  uint64_t resume_rng = 0;      // sampler RNG state after the last of them
  /// The verified journal resume_ids come from: `journal` continues it
  /// (same running digest) instead of starting a new one.
  std::shared_ptr<const model::journal> resumed_journal;
  /// Sees the logits [vocab] after each position, prompt positions included
  /// (which are then prefilled one per step). Called on the session's thread.
  std::function<void(int pos, const float* logits)> on_logits;
};

class cluster {
public:
  /// Loads the model, places it (memory-fit check before anything is
  /// loaded), spawns and wires the shards.
  static result<std::unique_ptr<cluster>> start(const cluster_options& opts);
  ~cluster();
  cluster(const cluster&) = delete;
  cluster& operator=(const cluster&) = delete;

  /// Starts a request; returns its id at once. `params` are normalised as run.c does.
  /// When the cluster has failed or is shut down, on_done runs before submit
  /// returns, on the calling thread (no lock held: it may submit again; a
  /// client that resubmits on every failure should stop once failure() is set).
  uint64_t submit(model::generation_params params, token_callback on_token, done_callback on_done,
                  const request_options& extra = {});
  /// Cancels a request: its session stops and every shard frees its KV cache.
  void cancel(uint64_t request);
  /// Runs one request to the end (or to `deadline`).
  result<session_outcome> generate(model::generation_params params, token_callback on_token = {},
                                   std::chrono::milliseconds deadline = std::chrono::minutes(10),
                                   const request_options& extra = {});
  /// Statistics of every shard, in placement order (waits at most `deadline`).
  result<std::vector<shard_stats>> stats(std::chrono::milliseconds deadline = std::chrono::seconds(10));
  /// Statistics of every shard that answers within `each` (asked one after
  /// the other), in placement order; a shard that does not answer (frozen,
  /// restarting) is nullopt. For live views that must not stall on one node.
  std::vector<std::optional<shard_stats>> shard_statistics(std::chrono::milliseconds each);
  /// Bytes in use on each node (weights + KV caches), by node index.
  std::vector<uint64_t> node_memory() const;
  /// How each spawned shard's weights reached its node (shard_host::weight_loads).
  std::vector<weight_load> weight_loads() const;
  /// Nodes left out because they could not hold what the placement gave
  /// them (shard_host::drop_unfit), in the order they were found.
  const std::vector<skipped_node>& skipped_nodes() const;

  const topologies::placement& placement() const;
  /// Every fault that fired so far, with detection and recovery times.
  /// Asks the coordinator, which owns the records, and waits for its answer
  /// for at most 5 s (it answers after every report already in its mailbox:
  /// a session's reports precede its on_done, so a run's faults are all
  /// there once generate returns). After shutdown, or without an answer in
  /// time, the last answer stands. Blocks the caller: not for an actor.
  std::vector<fault_record> faults() const;
  /// Nodes the heartbeat detector suspected that then answered a probe (or
  /// heartbeated again): not restarted, not in faults() (issue #20). Asked
  /// as faults() is (the same answer, the same bound).
  std::vector<suspicion_info> suspicions() const;
  /// Measures every link the placement uses (probe bursts through the
  /// shapers: a tiny message for latency, then back-to-back 16 KiB messages
  /// for bandwidth, ~40 ms per link). Unshaped links are left out.
  struct link_measurement {
    int from = 0, to = 0;
    double target_bps = 0, target_latency_us = 0;
    double measured_bps = 0, measured_latency_us = 0;
  };
  result<std::vector<link_measurement>> measure_links(std::chrono::milliseconds deadline = std::chrono::seconds(20));

  /// Adds a fault while the cluster runs: it fires on the next step of
  /// placement index `p.node` that reaches `p.step` (step 0: its next step).
  /// Shards in this process only: a shard in a node daemon received its plans
  /// when it was spawned (an error says so). Needs fault_injection or faults.
  result<void> inject(const supervision::fault_plan& p);
  /// Why the runtime can no longer serve ("" while it can): restart intensity
  /// exhausted, or a shard lost with no spare left.
  std::string failure() const;

  /// The node each placement index runs on now (changes when shards move to spares).
  std::vector<int> current_nodes() const;
  const model::config& config() const;
  const model::tokenizer& tokenizer() const;
  /// XXH64 of the model file (model::model_file::digest()).
  uint64_t model_digest() const;
  /// Stops every actor; further submits fail. Idempotent; the destructor calls it.
  void shutdown();

  struct impl;

private:
  explicit cluster(std::unique_ptr<impl> p);
  std::unique_ptr<impl> impl_;
};

}  // namespace cellshard::actors
