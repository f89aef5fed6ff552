// actors/run_report.hpp: the report of one generation run on a cluster, as
// `cellshard run` prints it (stderr summary) and writes it (`--json`, the keys
// of CLI.md "run --json"), and as the benches and `sweep` compute its figures.
//
// What it holds and where each figure comes from:
// - ttft_ms, tpot (p50/p99 of generation_result::step_ms with base/percentile.hpp,
//   i.e. linear interpolation between ranks), tokens/s: from the session;
// - comm_share = 1 - compute_ms / duration_ms, clamped to [0, 1]: the share
//   of the run's wall time that the critical path did not spend in kernels
//   (links, queues, recoveries); compute_ms is session_outcome::compute_ms;
// - nodes: per node (not per shard): the shards a node hosts are summed
//   (compute ms from shard_stats::compute_ns, bytes sent and received), its
//   role lists each of them as "stage S" or "stage S rank R" (T > 1) joined by
//   ", ", memory is node_memory()[node] (weights + KV caches in bytes); spares
//   that hold no shard are listed with role "spare"; ordered by node index;
// - links: one per (shard, destination) a shard sent on, with its payload
//   bytes and bytes per generated token, and the measured/target bandwidth
//   (bit/s) and latency (us) when cluster::measure_links() measured that link
//   (shaped links only; JSON null otherwise); destination -1 = the front end;
// - faults (with steady-clock ns: CLOCK_MONOTONIC, comparable with the clock
//   of a tool that signalled a daemon) and suspicions, as the cluster recorded them.
//
// Pure functions on values, except make_run_report (asks the cluster for its
// statistics, under the cluster's own deadline). Thread safety: none needed
// (no shared state). Errors: make_run_report returns the stats error.
#pragma once

#include "actors/cluster.hpp"
#include "actors/messages.hpp"
#include "actors/recovery.hpp"
#include "model/generate.hpp"
#include "model/result.hpp"
#include "topologies/placement.hpp"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace cellshard::actors {

/// 1 - compute_ms / duration_ms clamped to [0, 1]; 0 when duration_ms <= 0.
double comm_share(double compute_ms, double duration_ms);
/// Of a finished session: comm_share(out.compute_ms, out.result.duration_ms).
double comm_share(const session_outcome& out);

/// Decode-only figures of sessions run together (issue #25: what the
/// planner predicts, free of the first token's wait and of the prompt's).
/// token_s[i]: the times (seconds, one clock for all) at which session i's
/// tokens arrived, in order; the first at the end of its first forward pass
/// (run.c starts its tokens/s clock there).
///
/// Tokens per second: the sessions' tokens after their first, summed over
/// the common decode window [the latest first token, the earliest last
/// token] (when every session decodes; a session's count inside it is
/// interpolated linearly between its tokens' times), divided by that
/// window. One session: (tokens - 1) / (last - first), run.c's achieved
/// tok/s. Without a common window (sessions that did not overlap): all the
/// tokens after the firsts over [earliest first, latest last]. Sessions
/// with fewer than 2 tokens are left out; 0 when none is left.
double decode_tokens_per_s(const std::vector<std::vector<double>>& token_s);
/// Communication share of the decode: per session, comm_share(its kernel
/// time after the first step (decode_compute_ms[i]), its last - first token
/// time), the mean over the sessions with 2 or more tokens (0 when none).
/// The same quantity as the planner's predicted comm share (1 - a
/// sequence's compute per token / its time per token).
double decode_comm_share(const std::vector<double>& decode_compute_ms,
                         const std::vector<std::vector<double>>& token_s);

struct node_figures {
  int index = 0;                // node index (node_spec::index)
  std::string role;             // "stage 0, stage 1 rank 1", "spare", "whole model"
  uint64_t memory_bytes = 0;    // weights + KV caches held
  double compute_ms = 0;        // kernel time of its shards
  uint64_t bytes_sent = 0, bytes_received = 0;
  uint64_t shipped_bytes = 0;   // weight bytes shipped to it by the front end (issue #17)
  int cache_hits = 0;           // its spawns whose slice came from its --cache
};

struct link_figures {
  int from = 0;                 // node index of the sender
  int to = -1;                  // node index of the receiver; -1 = the front end
  std::optional<cluster::link_measurement> measured;  // absent: not measured (unshaped)
  uint64_t bytes = 0;           // payload bytes sent on it during the run
  double bytes_per_token = 0;   // bytes / max(1, generated tokens)
};

/// Sums the shards of each node (see the top of this file). `stats` in any
/// order; a stat whose index is outside plan.shards is ignored; memory of a
/// node beyond node_memory is 0.
std::vector<node_figures> aggregate_nodes(const topologies::placement& plan, const std::vector<shard_stats>& stats,
                                         const std::vector<uint64_t>& node_memory);
/// Every link each shard used, in stats order, matched with `measured` by (from, to).
std::vector<link_figures> link_reports(const std::vector<shard_stats>& stats,
                                      const std::vector<cluster::link_measurement>& measured, int tokens);
/// "link 0 -> 1 measured ..." when a measured link is more than 10% off its
/// target bandwidth or latency; "" otherwise.
std::string link_warning(const cluster::link_measurement& m);

struct run_report {
  bool ok = true;
  std::string error;                      // when !ok: what failed (the partial output is in result)
  std::string model, kernels, weights, matmul;  // what ran ("" = left out of the JSON)
  model::generation_result result;
  double comm_share = 0;
  bool batch_aggregate = false;           // tokens_per_s is the aggregate of a --batch
  std::vector<node_figures> nodes;
  std::vector<link_figures> links;
  std::vector<fault_record> faults;
  std::vector<suspicion_info> suspicions;
  /// Nodes left out of the placement because they could not hold their
  /// slice (issue #17; cluster::skipped_nodes()): JSON `skipped_nodes`,
  /// [{index, node, reason}] (node: "node N (HOST:PORT)").
  std::vector<skipped_node> skipped;
  std::optional<bool> diverged;           // set when the ids were compared (--expect-ids)
  /// Expert placement (issue #23; empty / 0 otherwise): per stage, the
  /// tokens routed to each expert (summed over the stage's layers, replays
  /// not counted); per expert node (placement index) the (position, expert)
  /// pairs it computed; the share of the run's duration the stage shards
  /// waited between dispatch and combine (summed over stages); requests
  /// re-dispatched to a replica.
  std::vector<std::vector<uint64_t>> expert_load;
  std::map<int, uint64_t> expert_pairs;
  double moe_wait_share = 0;
  uint64_t expert_redispatched = 0;

  int tokens() const { return static_cast<int>(result.ids.size()) - 1; }  // BOS excluded
  double tpot_p50() const;
  double tpot_p99() const;
};

/// The report of `out`, a request just finished on `c`: faults, suspicions,
/// and (when out.ok) per-node and per-link figures from c.stats() and
/// `measured` (cluster::measure_links() taken before the run).
result<run_report> make_run_report(cluster& c, const session_outcome& out,
                                   const std::vector<cluster::link_measurement>& measured = {});

/// One fault record as run --json lists it ("node" is the placement index,
/// "host_node" the node it ran on; *_ns steady-clock ns, 0 = not known).
nlohmann::json to_json(const fault_record& f);
nlohmann::json to_json(const suspicion_info& s);
/// The whole report as run --json writes it. !ok: ok, error, tokens, ids,
/// duration_ms, faults, suspicions (what a script needs to see why).
nlohmann::json to_json(const run_report& r);
/// "ttft 1.20 ms, tpot p50 0.400 ms p99 0.900 ms, 812.3 tok/s, comm share 0.31;
/// memory per node {0: 120 KiB, 1: 80 KiB}; 1 fault(s)" (run's stderr summary).
std::string summary_line(const run_report& r);

}  // namespace cellshard::actors
