// topologies/planner.hpp: the inference bottleneck checklist of `cellshard
// plan` (issue #10; CLI.md "plan"). Given a model (model_presets.hpp), a
// node type (plan_hardware.hpp), a node count, a topology, a batch and a
// context, it lays the model out on the nodes and runs six checks, each with
// a number and a verdict:
//   1. memory: weights + KV cache/state (context L, batch B) + buffers per node
//      against the node's budget;
//   2. per-node memory bandwidth: tokens/s bound = node bandwidth / bytes the
//      busiest node reads per token;
//   3. links: bytes per token on the busiest node's link against its bandwidth;
//   4. the serial chain: hops x (latency + transfer) + compute = time per
//      token; tokens/s with batching (micro-batches in flight);
//   5. failures: failures/hour from the node failure rate, the chance a
//      request of T tokens meets one (1 - exp(-lambda t)), goodput after
//      detection and recovery;
//   6. cost: power, energy per token, cost per million tokens (electricity +
//      hardware amortisation), beside a GPU-server baseline (8x H200).
// docs/planner.md states every formula with its source.
//
// Topologies:
// - pipeline[:S], tensor[:T], hybrid:PxT: as the runtime places a model
//   (topologies/placement.hpp): stages of whole layers, a TP group slicing
//   heads and FFN units (and every expert), embedding on rank 0 of the first
//   stage, the classifier's rows split over the ranks of the last, each
//   returning its slice of the logits to the session. The exchanges, layers
//   and classifier rows of a station are read off the program place() gives
//   its rank 0 (station_program, topologies/program.hpp count_program), and
//   check 1 counts rank 0's classifier slice, as place() does. All-reduces
//   are the runtime's direct exchange (every rank sends
//   its partial dim-vector to each other rank: one round of T-1 messages of
//   a vector), or with plan_assumptions::scatter_gather its reduce-scatter +
//   all-gather (`--reduce scatter`, placement.hpp reduce_algorithm: two
//   rounds of T-1 messages of 1/T of a vector each).
// - pipeline[:P],expert:E (mixtures of experts): the runtime's expert
//   placement (placement.hpp): P stage shards and E expert nodes per stage;
//   read off its programs like the above, the expert requests of a dispatch
//   op expected under uniform routing (program.hpp expected_dispatch).
// - expert[:T] (planner only; mixtures of experts): every group of layers is a
//   TP group of T nodes holding the attention, shared experts, router and
//   latent projections; every routed expert lives whole on an expert node
//   (experts spread evenly; whole copies repeated when nodes allow); a token
//   visits its k experts of each MoE layer: dispatch from the TP ranks (each
//   sends ceil(k/T) latent vectors), expert compute, combine back; the
//   embedding table and the classifier are split by vocabulary rows over
//   pools of nodes. Without T the planner searches layers-per-group and T for
//   the lowest time per token that fits.
//
// Cost model of one step of a micro-batch of b sequences (cost_terms): a node
// reads its weights once per step plus b x (KV cache + state) and does b x
// FLOPs: time = max(bytes / (BW x eff), flops / (FLOP/s x eff)); a message
// costs latency + bytes x 8 / (link x link_efficiency) on the wire plus a
// software overhead per message, per all-reduce round and per byte (the free
// parameters the calibration fits; see plan_calibrate.hpp).
//
// Pure functions over values, no CAF; thread-safe. Errors: result values
// naming the flag or limit.
#pragma once

#include "model/result.hpp"
#include "topologies/model_presets.hpp"
#include "topologies/plan_hardware.hpp"
#include "topologies/program.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace cellshard::topologies {

enum class plan_kind { pipeline, tensor, hybrid, expert, count };
static_assert(static_cast<int>(plan_kind::count) == 4, "update parse_plan_topology/to_string");

/// `--topology` of plan. 0 = chosen by the planner.
struct plan_topology {
  plan_kind kind = plan_kind::pipeline;
  int stages = 0;  // P (pipeline, hybrid)
  int tp = 0;      // T (tensor, hybrid, expert: TP width of the dense groups)
  /// pipeline only: E expert nodes per stage, the runtime's expert placement
  /// ("pipeline[:P],expert:E", placement.hpp): each stage one stage shard
  /// (attention, router, shared experts) plus E nodes holding its routed
  /// experts, expert e's replica j on node (e + j) mod E of the stage. 0 = none.
  int experts = 0;
  int expert_replicas = 1;  // R (--expert-replicas), with `experts`
};
/// "pipeline", "pipeline:S", "tensor", "tensor:T", "hybrid:PxT", "expert",
/// "expert:T" (the planner's own expert layout), "pipeline[:P],expert:E"
/// (the runtime's; replicas stay 1, the caller sets them).
result<plan_topology> parse_plan_topology(std::string_view text);
std::string to_string(const plan_topology& t);

/// Every constant the checks use that is not a property of the model or the
/// node. Defaults cite their source; calibration replaces the first four.
struct plan_assumptions {
  /// Fraction of peak memory bandwidth and FLOP/s the kernels reach. Default
  /// 1 (peak, an upper bound); `--calibrate` fits it.
  /// Of the node's full rate; under a CPU quota (hardware_spec::cpu_quota)
  /// the node sustains quota x that, and its steps on the chain are
  /// throttled as quota_step_seconds says.
  double compute_efficiency = 1.0;
  double message_overhead_s = 0;  // per message of a hop on the chain (stage to stage, session; calibrated)
  /// Per expert dispatch or combine message on the chain (a stage shard's
  /// latent vectors to an expert node and that node's outputs back; issue
  /// #25); separate from message_overhead_s because an expert exchange is a
  /// request and its reply between different actors than a hop. One constant
  /// for both directions: every layout sends as many combines as dispatches,
  /// so no sweep can tell the two apart. Calibrated from rows of the runtime's
  /// expert placement; a calibration without such rows sets it to the fitted
  /// message_overhead_s (plan_calibrate.cpp).
  double expert_message_overhead_s = 0;
  double sync_overhead_s = 0;     // per all-reduce round: the wait for the slowest rank (calibrated)
  /// Per message a rank sends inside an all-reduce round (T-1 per round
  /// direct), on the chain; separate from message_overhead_s because a round's
  /// messages leave back to back and are waited for together (calibrated).
  double sync_message_overhead_s = 0;
  /// Time a transfer takes beyond bytes / (link x link_efficiency), as a
  /// fraction of it (0: the link delivers its payload rate; tc tbf shaping,
  /// TCP slow start after idle and small messages make it more; calibrated
  /// from rows over shaped links).
  double transfer_excess = 0;
  /// CPU a node spends per message it sends or receives, at its sustained
  /// rate: it bounds a busy station's throughput (busy_seconds), not the
  /// chain's latency (calibrated from batch > 1 rows). Hop messages, the
  /// session's and expert dispatch/combine messages.
  double message_cpu_s = 0;
  /// The same for a message a rank sends or receives inside an all-reduce
  /// round (issue #25): a round's T-1 small partials arrive back to back and
  /// are handled in one go, so each costs less CPU than a hop (the 2026-12-02
  /// lab: ~0.17 ms each on tensor:8 at batch 8, where 0.2 ms per message for
  /// all messages over-predicts it by 41%). Calibrated from batch > 1 rows of
  /// TP groups; a calibration without such rows sets it to message_cpu_s.
  double sync_message_cpu_s = 0;
  /// CPU a busy rank spends per all-reduce round it takes part in, besides
  /// its messages' (issue #25): the hand-off that wakes the rank's step for
  /// the round's partials, paid once per round whatever the group's width.
  /// With sync_message_cpu_s it makes a round of T-1 messages cost c_r +
  /// 2(T-1) x c_rcpu, so the CPU per message falls with the width. Calibrated
  /// from batch > 1 rows of TP groups of two or more widths; 0 without them.
  double sync_cpu_s = 0;
  /// Fraction of the node's full rate a station's compute reaches while it
  /// interleaves the steps of several sequences (a request of batch > 1;
  /// busy_seconds of cost_terms with `concurrent`), in place of
  /// compute_efficiency (issue #25: on the lab's capped nodes one daemon
  /// took 24-35 ms per sequence step at batch 8 and 20-22 ms per token at
  /// batch 1, both bound by the same 25% quota). 0 = compute_efficiency.
  /// Calibrated from batch > 1 rows whose busy station sets the pace.
  double batch_compute_efficiency = 0;
  /// Per byte sent over a real link: serialisation. Default: the raw-blob
  /// payload encoding measured by `bench cluster`, 4,460 MB/s serialise +
  /// deserialise at 1M floats (docs/performance.md); calibrated when the sweep
  /// has shaped links (in process, messages are moved, not serialised).
  double byte_overhead_s = 1.0 / 4.46e9;
  /// TCP payload / line rate: 941 Mbit/s on gigabit Ethernet at MTU 1500
  /// (HARDWARE.md "Reference hardware", measured, itecnotes).
  double link_efficiency = 0.941;
  /// Detection of a silent node (a dead machine says nothing): phi accrual
  /// on 100 ms heartbeats, then a round of direct and indirect probes
  /// before any restart (issue #20; docs/reliability.md). Measured
  /// 2026-12-01: `cellshard bench failures --signal stop --nodes 8 --every 10
  /// --rounds 2` (8 daemons, 10 SIGSTOPs): 711-771 ms, mean 745 ms; `run
  /// --nodes 3 --spares 1 --fault silence:node=1:step=50` on stories260K:
  /// 733, 751, 754 ms. (Before the probes: 359-369 ms.) A process that dies
  /// with its host up (SIGKILL: the connection drops) is detected in tens of
  /// ms instead (`bench failures --signal kill`: mean 74 ms).
  double detect_s = 0.745;
  /// The runtime's own recovery (respawn, KV restore from checkpoint deltas,
  /// re-send): `bench recovery`, pipeline, silence, K = 16: 1.17-1.42 ms
  /// (docs/performance.md). The replay of lost positions and the reload of
  /// weights are added by the planner for the model at hand.
  double recover_s = 0.0012;
  /// A replacement node fetches its weights over its link (no local copy):
  /// reload = weight bytes / link. False: weights already on the spare.
  bool reload_over_link = true;
  int checkpoint_every = 16;     // positions between KV checkpoints (CLI.md default)
  int request_tokens = 256;      // tokens of one request (run's -n default)
  double electricity_usd_per_kwh = 0.12;  // HARDWARE.md assumptions
  double amortisation_years = 3;          // HARDWARE.md assumptions
  /// The last stage returns vocab f32 logits to the session, as the runtime
  /// does (DESIGN.md data flow); false: it samples and returns a token id.
  bool logits_to_session = true;
  /// A station steps one sequence at a time (the runtime today: concurrent
  /// sessions are separate steps, overlapped across pipeline stages) instead
  /// of micro-batches of ceil(B / stations) sequences. Calibration rows are
  /// planned this way (plan_calibrate.hpp); plans default to batched stations.
  bool one_sequence_per_step = false;
  /// Between two TP groups of the same width, rank i forwards x to rank i of
  /// the next group (every rank has x after the last all-reduce), instead of
  /// the runtime's rank 0 sending a copy to every rank (placement.hpp). A
  /// what-if for the runtime; false = as the runtime does it.
  bool peer_forwarding = false;
  /// All-reduces as the runtime's scatter_gather (`--reduce scatter`):
  /// 2(T-1)/T of a vector per rank in two rounds, instead of T-1 vectors in one.
  bool scatter_gather = false;
};

struct plan_request {
  model_spec model;
  hardware_spec hw;
  int nodes = 1;
  plan_topology topology;
  int batch = 1;       // concurrent sequences
  int context = 4096;  // positions of KV cache per sequence (and attention span per token)
  plan_assumptions assume;
};

/// Time terms of a piece of work at unit overheads: seconds(a) =
/// compute_s / eff + wire_s + messages x message_overhead + syncs x
/// sync_overhead + bytes x byte_overhead. Linear in the calibrated parameters.
struct cost_terms {
  double compute_s = 0;  // at efficiency 1, at the node's full rate
  double throttle_s = 0; // time a CPU quota adds to the chain's steps (at the request's efficiency)
  double quota = 1;      // share of the full rate a busy node sustains (hardware_spec::cpu_quota; 1 = none)
  double wire_s = 0;     // latency + transfer at the link's payload rate
  double transfer_s = 0; // the transfer part of wire_s (bytes / payload rate)
  double messages = 0;   // messages of hops
  double expert_messages = 0;  // expert dispatch and combine messages (each one message)
  double syncs = 0;      // all-reduce rounds
  double sync_messages = 0;  // messages the busiest rank sends inside all-reduce rounds
  double bytes = 0;      // bytes serialised (0 on in-process links)
  double hops = 0;       // transfers whose latency is on the path (not in seconds())
  double handled = 0;    // messages the busiest rank sends + receives (station work only), besides all-reduces
  double sync_handled = 0;  // messages the busiest rank sends + receives inside all-reduce rounds (station work)
  /// The station interleaves the steps of several sequences (a request of
  /// batch > 1): busy_seconds computes at batch_compute_efficiency.
  bool concurrent = false;
  /// On the chain (latency): compute_s / eff + throttle_s + wire_s +
  /// transfer_s x transfer_excess + messages x message_overhead +
  /// expert_messages x expert_message_overhead + syncs x
  /// sync_overhead + sync_messages x sync_message_overhead + bytes x byte_overhead.
  double seconds(const plan_assumptions& a) const;
  /// A busy station's step (throughput): compute at the sustained rate
  /// (compute_s / (eff x quota), eff = batch_compute_efficiency when
  /// `concurrent` and it is set) + handled x message_cpu_s + sync_handled x
  /// sync_message_cpu_s + syncs x sync_cpu_s + bytes x byte_overhead, plus (unless
  /// one_sequence_per_step: the runtime interleaves its sessions' steps, so
  /// their waits overlap) the rest of seconds(): latency, transfers, rounds.
  double busy_seconds(const plan_assumptions& a) const;
  cost_terms& operator+=(const cost_terms& o);
};

/// One station of the serial chain: a group of nodes that work on a token at
/// the same time (a pipeline stage / TP group with its expert step, or a
/// vocabulary pool).
struct plan_group {
  std::string role;      // "layers [0,1) TP 6", "embedding pool", "classifier"
  int first_layer = 0;   // [first_layer, end_layer)
  int end_layer = 0;
  int tp = 1;            // nodes in the group
  bool embedding = false;   // holds the embedding table (rank 0, or the pool)
  bool classifier = false;  // holds the classifier (rank 0, or the pool)
  bool experts_inside = false;  // routed experts sliced over the group's ranks (not expert topology)
  // Per node, the busiest rank (bytes):
  double weight_bytes = 0;
  double cache_bytes = 0;   // KV cache + state for the whole batch
  double buffer_bytes = 0;
  double total_bytes() const { return weight_bytes + cache_bytes + buffer_bytes; }
};

struct plan_layout {
  plan_topology topology;           // resolved (stages, tp filled in)
  int layers_per_group = 1;
  std::vector<plan_group> groups;   // chain order
  // Expert topology: routed experts on their own nodes.
  int expert_nodes = 0;
  int experts_per_node = 0;
  int expert_copies = 0;            // whole copies of every expert
  double expert_node_bytes = 0;     // stored per expert node (weights + buffers)
  int used_nodes = 0;
  int spare_nodes = 0;
};

/// A verdict line of the checklist.
struct plan_check {
  int number = 0;
  std::string name;     // "memory", "bandwidth", "links", "serial chain", "failures", "cost"
  std::string value;    // the headline number with its unit
  std::string verdict;  // "fits", "does not fit", "ok", "bottleneck", "warning"
  std::string detail;   // the numbers behind it
};

struct plan_result {
  plan_request request;
  plan_layout layout;
  // 1. memory
  bool memory_fit = false;
  double memory_per_node_bytes = 0;  // the busiest node
  double memory_budget_bytes = 0;
  std::string memory_busiest;        // its role
  double model_bytes = 0;            // all weights
  double cluster_memory_bytes = 0;   // nodes x budget
  // 2. bandwidth
  double read_bytes_per_token = 0;   // the busiest node, batch 1
  double bandwidth_bound_tokens_per_s = 0;           // node BW x eff / that
  double bandwidth_bound_sequence_tokens_per_s = 0;  // 1 / sum over the chain of read time
  // 3. links
  double link_bytes_per_token = 0;   // busiest node's link, max(sent, received)
  std::string link_busiest;
  double link_bound_tokens_per_s = 0;
  double wire_bytes_per_token = 0;   // summed over all links
  // 4. serial chain
  int hops = 0;                      // messages in sequence per token (batch 1)
  double chain_latency_s = 0;        // hops x latency
  double chain_transfer_s = 0;       // bytes / link
  double chain_compute_s = 0;        // compute (at efficiency; with a CPU quota's throttling)
  double chain_busy_compute_s = 0;   // the same compute at the sustained rate (quota x full rate; no idle before)
  double chain_overhead_s = 0;       // software overheads (calibrated)
  double chain_s = 0;                // time per token, batch 1
  int micro_batch = 1;               // sequences per station step at the requested batch
  double per_token_latency_s = 0;    // time between two tokens of one sequence at the batch
  double tokens_per_s = 0;
  std::string throughput_limit;      // "serial chain", "busiest station", "links"
  // 5. failures
  double failures_per_hour = 0;      // over the used nodes
  double request_seconds = 0;
  double request_failure_probability = 0;
  double downtime_per_failure_s = 0; // detection + recovery + reload + replay (node-weighted mean)
  double goodput_tokens_per_s = 0;
  double spares_last_hours = 0;      // spare nodes / failures per hour (inf: no failures)
  // 6. cost
  double power_w = 0;
  double energy_per_token_j = 0;
  double hardware_usd = 0;
  double usd_per_hour = 0;           // electricity + amortisation
  double cost_per_million_tokens_usd = 0;

  std::vector<plan_check> checks;
  std::vector<std::string> notes;
};

/// Lays the model out (does not reject layouts that overflow memory: check 1
/// says so). Errors: a topology beyond the model's limits or the nodes.
result<plan_layout> lay_out(const plan_request& r);

/// Time terms of the serial chain and of its busiest station for micro-batch b.
struct chain_costs {
  cost_terms chain;         // one token's trip: every hop and station
  cost_terms busiest;       // the station with the longest busy work (per step, busy_seconds)
  std::vector<cost_terms> station_work;  // per group: its work per step (compute, syncs, expert step)
  std::vector<cost_terms> station_hop;   // per group: the hop into it (delay)
  cost_terms return_hop;    // last group -> session
  double read_bytes_busiest = 0;
  double read_bytes_chain = 0;           // summed over the chain's stations (busiest rank each)
};
chain_costs chain_cost(const plan_request& r, const plan_layout& l, int micro_batch);

/// The program (topologies/program.hpp program_of) that place() gives the
/// shard at `rank` of station `station` of a pipeline, tensor or hybrid
/// layout, built from the model's shape alone: placement indices stage-major
/// as place() numbers them, the last stage's vocabulary split_even over its
/// ranks, the reduce algorithm of assume.scatter_gather. chain_cost and
/// check 3 read their messages, bytes, reduce rounds, layers, embedding and
/// classifier rows from rank 0's (the busiest rank's) program of every
/// station. Not for the expert topology (no placement builds it).
std::vector<shard_step> station_program(const plan_request& r, const plan_layout& l, int station, int rank);
/// Placement index of rank 0 of station `station` (the sum of the earlier stations' widths).
int station_first(const plan_layout& l, int station);

/// The six checks. Errors as lay_out.
result<plan_result> plan(const plan_request& r);

/// The same model, batch and context on GPU servers of `hw` (pipeline over as
/// many servers as memory needs, at most `max_servers`); default assumptions
/// except electricity, amortisation and request length, taken from `r`.
result<plan_result> plan_baseline(const plan_request& r, const hardware_spec& hw, int max_servers = 64);

/// The checklist as text (one line per check, then notes).
std::string to_text(const plan_result& p, const plan_result* baseline = nullptr);
/// The JSON object of CLI.md "plan" (without "baseline"/"calibration").
std::string to_json(const plan_result& p, int indent = -1);

/// Wall time of a step of `work_s` seconds of full-speed CPU on a node that
/// may use `share` of a core in every `period_s` (Linux CFS bandwidth
/// control: cpu.max), starting with its whole quota (idle before) at a
/// uniformly random phase of the period: it runs at full speed until the
/// quota or the period ends, waits for the next period when the quota is
/// spent. The mean over 64 phases. share <= 0 or >= 1: work_s.
double quota_step_seconds(double work_s, double share, double period_s);

/// Expected distinct experts among b tokens each picking k of E (uniform):
/// E x (1 - (1 - k/E)^b).
double distinct_experts(int experts, int k, int b);
/// Human-readable numbers: "1.56 TB", "245.1 MiB" (bytes), "3.4 ms".
std::string human_seconds(double s);
std::string human_si(double v, const std::string& unit);

}  // namespace cellshard::topologies
