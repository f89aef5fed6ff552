// actors/messages.hpp: every atom and message struct of the inference runtime,
// with its CAF 0.17 `inspect` overload, and the registration helper
// (STYLE.md item 7). Atoms are at most 10 characters (CAF 0.17 limit).
//
// Data path of one forward step (DESIGN.md "Data flow of one token"):
//   session --forward_req--> embedding holder (stage 0, rank 0)
//   embedding holder --activation--> every shard of stage 0
//   stage s, TP group: per layer two all-reduces, each rank sending its
//     partial_sum to every other rank; sums are taken in rank order
//   rank 0 of stage s --activation--> every shard of stage s+1
//   every rank of the last stage --logits_msg (its vocabulary slice)--> session
// Every message carries (session id, position, epoch): messages of an older
// epoch than the receiver knows are dropped.
//
// Float payloads travel as `blob`: raw bytes after a byte-order flag, the
// element count and an XXH64 checksum of the bytes as sent. CAF 0.17 would
// otherwise encode float vectors element by element (~300 MB/s, CAF-0.17.md
// §3). On receipt the checksum is verified (a mismatch marks the blob
// corrupt: blob::ok() is false and the receiver reports it) and the bytes are
// swapped when the sender's byte order differs from ours.
#pragma once

#include "model/result.hpp"
#include "topologies/placement.hpp"

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
#include <caf/timespan.hpp>
#include <caf/meta/type_name.hpp>

#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace cellshard::actors {

// -- atoms ---------------------------------------------------------------------
using stats_atom = caf::atom_constant<caf::atom("cs_stats")>;      // node/shard statistics
using close_atom = caf::atom_constant<caf::atom("cs_close")>;      // free a session's state
using cancel_atom = caf::atom_constant<caf::atom("cs_cancel")>;    // cancel a session
using timeout_atom = caf::atom_constant<caf::atom("cs_tmo")>;      // a step's deadline passed
using wire_atom = caf::atom_constant<caf::atom("cs_wire")>;        // tell a shard its neighbours
/// Liveness (issue #20): (alive) -> (alive, int32 node), answered by a shard
/// even while it computes; a frozen or silenced shard never answers.
using alive_atom = caf::atom_constant<caf::atom("cs_alive")>;
/// Indirect probe: (probe_peer, actor target, timespan) -> bool: the receiver
/// asks `target` (alive) itself and says whether it answered in time.
using probe_peer_atom = caf::atom_constant<caf::atom("cs_ppeer")>;
/// Step probe: (step_query, uint64 session, uint32 epoch, int32 pos0) ->
/// (int32 working, int64 due_ns): 1 if the shard works on that step now, and
/// when its last payload of the session arrives (steady ns, 0: none).
using step_query_atom = caf::atom_constant<caf::atom("cs_stepq")>;

// -- payloads --------------------------------------------------------------------
/// A float vector with a byte-order-neutral, checksummed raw encoding.
struct blob {
  std::vector<float> data;
  /// False when the received bytes failed their checksum or were malformed.
  bool ok() const { return status == 0; }
  /// 0 ok, 1 checksum mismatch, 2 malformed (set on deserialisation).
  uint8_t status = 0;
  /// Fault injection (`corrupt`): the damaged wire form, sent verbatim
  /// instead of encode() when the blob crosses a process boundary, so the
  /// receiving process finds the checksum mismatch itself. Empty normally.
  std::vector<char> damaged_wire;
  /// `--sync q8_0` (topologies::sync_format): `data` is on the q8_0 grid
  /// (kernels::round_to_q8, done by the sender before it uses or sends the
  /// values) and crosses a process as q8_0 blocks; decode() sets it again.
  /// Rounding is idempotent, so the receiver gets exactly `data`. A blob
  /// with q8 set whose data is not on the grid is sent rounded.
  bool q8 = false;

  /// The wire form: [u8 flags][u32 count][u64 xxh64 of payload][payload].
  /// flags bit 0: the sender is big-endian; bit 1: the payload is q8_0
  /// (protocol 8): ceil(count / 32) blocks of [u16 binary16 scale][32 x i8]
  /// (ggml block_q8_0, 34 bytes; the last block zero-padded), else count
  /// floats. Count, checksum, floats and scales in the sender's byte order.
  std::vector<char> encode() const;
  /// Parses a wire form (converting byte order, verifying the checksum).
  static blob decode(const std::vector<char>& bytes);
  /// Test hook: encode as if the host had the other byte order.
  std::vector<char> encode_swapped() const;
};

/// q8_0 payloads (blob::q8, the data plane's frames): bytes of `n` floats as
/// blocks; `n` floats rounded and packed as ceil(n/32) blocks of ggml's
/// block_q8_0 at `out` (scales byte-swapped when `swap`); and back (`in` from
/// a sender of the other byte order when `swap`). No checks: the caller has
/// q8_payload_bytes(n) bytes.
size_t q8_payload_bytes(size_t n);
void q8_pack(const float* x, size_t n, char* out, bool swap);
void q8_unpack(const char* in, size_t n, float* out, bool swap);

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, blob& x) {
  if constexpr (std::is_same<typename Inspector::result_type, void>::value) {
    auto n = x.data.size();
    return f(caf::meta::type_name("blob"), n);  // to_string: the size only
  } else if constexpr (Inspector::writes_state) {
    std::vector<char> bytes;
    auto err = f(caf::meta::type_name("blob"), bytes);
    if (!err) x = blob::decode(bytes);
    return err;
  } else {
    auto bytes = x.damaged_wire.empty() ? x.encode() : x.damaged_wire;
    return f(caf::meta::type_name("blob"), bytes);
  }
}

/// The step's identity: which session, which positions, which epoch.
struct step_id {
  uint64_t session = 0;
  uint32_t epoch = 0;
  int32_t pos0 = 0;    // first position of the batch
  int32_t count = 1;   // positions [pos0, pos0 + count)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, step_id& x) {
  return f(caf::meta::type_name("step_id"), x.session, x.epoch, x.pos0, x.count);
}

/// session -> embedding holder: tokens of positions [pos0, pos0+count).
/// `reply_to` receives the logits of the batch's last position.
/// `replay_until` >= 0 marks a replay (recovery): the stages up to and
/// including that stage recompute the positions (rebuilding their KV caches;
/// KV writes are idempotent by position) and nothing goes past it.
struct forward_req {
  step_id id;
  std::vector<int32_t> tokens;
  caf::actor reply_to;
  int32_t replay_until = -1;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forward_req& x) {
  return f(caf::meta::type_name("forward_req"), x.id, x.tokens, x.reply_to, x.replay_until);
}

/// stage -> next stage: the residual stream x [count x dim] after the stage.
/// compute_ns accumulates kernel time along the critical path.
struct activation {
  step_id id;
  blob x;
  int64_t compute_ns = 0;
  caf::actor reply_to;
  int32_t replay_until = -1;  // as forward_req
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, activation& x) {
  return f(caf::meta::type_name("activation"), x.id, x.x, x.compute_ns, x.reply_to, x.replay_until);
}

/// TP rank -> the other ranks of its group: its partial sum [count x dim] of
/// layer `layer`, phase 0 (after attention) or 1 (after FFN). With the
/// scatter_gather reduce (topologies::reduce_algorithm) the same message
/// carries [count x chunk] rows: phase 0/1, rank r's partial of the
/// receiver's chunk; phase 2/3, sender `rank`'s finished chunk of x
/// (topologies::reduce_chunks). No field changed: protocol 4 still.
struct partial_sum {
  step_id id;
  int32_t layer = 0;
  int32_t phase = 0;
  int32_t rank = 0;
  blob data;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, partial_sum& x) {
  return f(caf::meta::type_name("partial_sum"), x.id, x.layer, x.phase, x.rank, x.data);
}

/// classifier holder -> session: logits [vocab] of position id.pos0+count-1.
/// The logits of a step's last position for vocabulary ids [vocab_begin,
/// vocab_begin + logits.size()): every rank of the last stage sends its slice
/// of the classifier's output; the session joins them (issue #19).
struct logits_msg {
  step_id id;
  blob logits;
  int64_t compute_ns = 0;
  int32_t vocab_begin = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, logits_msg& x) {
  return f(caf::meta::type_name("logits_msg"), x.id, x.logits, x.compute_ns, x.vocab_begin);
}

/// A shard's failure reported to the session (out of memory, corrupt payload).
/// `retry`: the step can be re-sent (a payload failed its checksum on the way).
struct shard_error {
  step_id id;
  int32_t node = 0;
  std::string message;
  bool retry = false;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_error& x) {
  return f(caf::meta::type_name("shard_error"), x.id, x.node, x.message, x.retry);
}

/// One op of a shard's program (topologies::shard_step, issue #15) as it
/// travels: the enums as their values, ranges as begin/end.
struct program_op {
  int32_t op = 0;         // topologies::shard_op
  int32_t layer_begin = 0, layer_end = 0;
  int32_t part = 0;       // topologies::layer_part
  bool partial = false;
  int32_t algorithm = 0;  // topologies::reduce_algorithm
  int32_t sync = 0;       // topologies::sync_format (protocol 8)
  std::vector<int32_t> peers;
  int32_t vocab_begin = 0, vocab_end = 0;
  // Expert placement (issue #23): dispatch/combine's holders, flattened
  // (holders_len[e] entries per expert e, in order); an expert op's experts.
  std::vector<int32_t> holders;
  std::vector<int32_t> holders_len;
  std::vector<int32_t> experts;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, program_op& x) {
  return f(caf::meta::type_name("program_op"), x.op, x.layer_begin, x.layer_end, x.part, x.partial, x.algorithm,
           x.sync, x.peers, x.vocab_begin, x.vocab_end, x.holders, x.holders_len, x.experts);
}
program_op to_wire(const topologies::shard_step& s);
/// Errors: an op, part or algorithm value this build does not know (a newer
/// front end), naming it.
result<topologies::shard_step> from_wire(const program_op& w);

/// What a shard executes and with whom: its program (the placement's
/// topologies::shard::program, which it runs op by op for every step), and
/// the actors its ops name by placement index -- its TP group in rank order
/// and the next stage's shards (empty for the last stage).
struct wiring {
  std::vector<caf::actor> group;
  std::vector<caf::actor> next;
  std::vector<int32_t> group_nodes;  // node index of each group member
  std::vector<int32_t> next_nodes;   // node index of each next-stage shard
  std::vector<int32_t> group_index;  // placement index of each group member
  std::vector<int32_t> next_index;   // placement index of each next-stage shard
  std::vector<program_op> program;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wiring& x) {
  return f(caf::meta::type_name("wiring"), x.group, x.next, x.group_nodes, x.next_nodes, x.group_index,
           x.next_index, x.program);
}

/// Expert placement (issue #23), stage shard -> expert node: run layer
/// `layer`'s routed experts on rows of the step. `xb` [rows x dim] holds the
/// normalised FFN inputs of the distinct positions asked for; pair p asks for
/// expert pair_expert[p] on row pair_row[p] (an index into xb's rows). `seq`
/// names the request at the stage shard (its re-sends keep it); `reply_to` /
/// `reply_node` are the stage shard and its node; `session` gets error reports.
struct expert_req {
  step_id id;
  int32_t layer = 0;
  uint32_t seq = 0;
  std::vector<int32_t> pair_row;
  std::vector<int32_t> pair_expert;
  blob xb;
  caf::actor reply_to;
  int32_t reply_node = 0;
  caf::actor session;
  bool held = false;  // already held back once by a `slow` fault at the expert node
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_req& x) {
  return f(caf::meta::type_name("expert_req"), x.id, x.layer, x.seq, x.pair_row, x.pair_expert, x.xb, x.reply_to,
           x.reply_node, x.session, x.held);
}

/// Expert node -> stage shard: the outputs [pairs x dim] of request `seq`,
/// pair order; `index` is the expert node's placement index. status 0: ok;
/// 1: the request's payload failed its checksum (the stage shard re-sends it).
struct expert_out {
  step_id id;
  int32_t layer = 0;
  uint32_t seq = 0;
  int32_t index = 0;
  int32_t status = 0;
  blob y;
  int64_t compute_ns = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, expert_out& x) {
  return f(caf::meta::type_name("expert_out"), x.id, x.layer, x.seq, x.index, x.status, x.y, x.compute_ns);
}

/// The node index that stands for the session's side (the front end) in
/// link statistics.
constexpr int32_t front_end_node = -1;

/// Statistics of one shard (reply to stats_atom).
struct shard_stats {
  int32_t node = 0;
  int32_t index = 0;             // placement index
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes = 0;         // KV caches currently held
  int32_t sessions = 0;          // sessions with a KV cache here
  int64_t compute_ns = 0;        // kernel time so far
  uint64_t bytes_sent = 0;
  uint64_t bytes_received = 0;
  std::vector<int32_t> link_to;      // destination node of each link used (-1: front end)
  std::vector<uint64_t> link_bytes;  // payload bytes sent on it
  // Expert placement (issue #23). Stage shard: tokens routed to each expert
  // (index = expert, summed over its layers) and the time steps waited
  // between a dispatch and its combine; requests re-dispatched to a replica
  // or re-sent. Expert node: (row, expert) pairs it computed.
  std::vector<uint64_t> expert_load;
  int64_t moe_wait_ns = 0;
  uint64_t expert_redispatched = 0;
  uint64_t expert_pairs = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_stats& x) {
  return f(caf::meta::type_name("shard_stats"), x.node, x.index, x.weight_bytes, x.kv_bytes,
           x.sessions, x.compute_ns, x.bytes_sent, x.bytes_received, x.link_to, x.link_bytes, x.expert_load,
           x.moe_wait_ns, x.expert_redispatched, x.expert_pairs);
}

// -- recovery (issue #6) -----------------------------------------------------------
using restore_atom = caf::atom_constant<caf::atom("cs_restore")>;  // reply to a restore
using replay_atom = caf::atom_constant<caf::atom("cs_replay")>;    // upstream: re-send a range
using trim_atom = caf::atom_constant<caf::atom("cs_trim")>;        // upstream: drop log below c
using resume_atom = caf::atom_constant<caf::atom("cs_resume")>;    // a slowed step may run now
using fault_atom = caf::atom_constant<caf::atom("cs_fault")>;      // a fault fired (report)

/// shard -> session: KV rows of positions [begin, end) of every layer of the
/// shard (K then V per layer, model::kv_cache::rows), a checkpoint delta.
struct kv_delta {
  uint64_t session = 0;
  int32_t index = 0;  // placement index of the shard
  int32_t begin = 0, end = 0;
  blob rows;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, kv_delta& x) {
  return f(caf::meta::type_name("kv_delta"), x.session, x.index, x.begin, x.end, x.rows);
}

/// session -> restarted shard: restore the session's KV cache from deltas
/// (each [begins[i], ends[i]) with rows parts[i]); replied with restore_atom.
struct restore_req {
  uint64_t session = 0;
  uint32_t epoch = 0;
  std::vector<int32_t> begins, ends;
  std::vector<blob> parts;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, restore_req& x) {
  return f(caf::meta::type_name("restore_req"), x.session, x.epoch, x.begins, x.ends, x.parts);
}

/// A fault that fired, as the shard saw it (for the fault report).
struct fault_report {
  std::string kind;
  int32_t index = 0;   // placement index
  int32_t node = 0;
  int64_t step = 0;
  int64_t at_ns = 0;   // steady_clock time since epoch
  std::string spec;    // the plan that fired, in its CLI form (supervision::to_string(fault_plan))
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, fault_report& x) {
  return f(caf::meta::type_name("fault_report"), x.kind, x.index, x.node, x.step, x.at_ns, x.spec);
}

/// coordinator -> sessions: shard `index` runs again as `handle` (new epoch needed).
struct shard_restarted {
  int32_t index = 0;
  int32_t stage = 0;
  int32_t node = 0;          // where it runs now
  caf::actor handle;
  caf::actor entry;          // the (possibly new) embedding holder
  caf::actor stage_head;     // rank 0 of the previous stage (the replay source), if any
  std::vector<caf::actor> stage_group;  // the shards of its stage, rank order
  int32_t remaining = 0;     // notices of the same batch still to come (recover at 0)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_restarted& x) {
  return f(caf::meta::type_name("shard_restarted"), x.index, x.stage, x.node, x.handle, x.entry,
           x.stage_head, x.stage_group, x.remaining);
}

/// coordinator -> sessions: recovery is impossible (intensity exceeded, no capacity).
struct cluster_failed {
  std::string message;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_failed& x) {
  return f(caf::meta::type_name("cluster_failed"), x.message);
}

// -- link measurement (issue #8) ---------------------------------------------------
using probe_atom = caf::atom_constant<caf::atom("cs_probe")>;  // start a probe burst

/// One message of a probe burst over a shaped link: seq 0 is tiny (latency),
/// seqs 1..n carry `bytes` each, back to back (bandwidth from inter-arrivals).
struct probe_msg {
  int32_t seq = 0;
  int32_t n = 0;
  int32_t from_node = 0;
  int64_t sent_ns = 0;  // steady_clock at the sender (same host)
  blob payload;
  caf::actor reply_to;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, probe_msg& x) {
  return f(caf::meta::type_name("probe_msg"), x.seq, x.n, x.from_node, x.sent_ns, x.payload, x.reply_to);
}

/// What a probe measured on the link from -> to.
struct probe_result {
  int32_t from = 0, to = 0;
  double latency_us = 0;
  double bandwidth_bps = 0;
  uint64_t bytes = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, probe_result& x) {
  return f(caf::meta::type_name("probe_result"), x.from, x.to, x.latency_us, x.bandwidth_bps, x.bytes);
}

/// Registers every message type above with a config (call in every process).
void register_messages(caf::actor_system_config& cfg);

// -- node daemons (issue #5: actors/daemon.hpp, actors/remote.hpp) ------------------
// A front end (actors/remote.hpp) talks to each node daemon's published actor:
//   node_join   -> node_joined      fingerprint check; the daemon learns its node index
//   node_peers  -> node_peers_done  the daemon opens direct connections to other daemons
//   slice_room_ask -> slice_room    before any spawn: can the node hold these slices?
//   shard_spawn -> shard_spawned    the daemon loads the slice and spawns a shard
//   slice_fetch + slice_chunk -> slice_ack  one shipped chunk of a slice, acknowledged
//   stats_atom  -> node_report      memory in use on the node
//   heartbeat_start -> heartbeat_started  the daemon heartbeats to the front end's
//                                   monitor, so that a frozen daemon falls silent
// Every request carries a deadline on the requesting side. These types are
// registered by register_messages() as well.

/// Version of the protocol above; part of the cluster fingerprint.
constexpr uint32_t node_protocol_version = 9;  // 2: fault plans in shard_spawn, daemon heartbeats;
                                               // 3: vocab slices (shard_spawn, logits_msg), GGUF matmul/ctx options;
                                               // 4: shard programs in wiring (issue #15);
                                               // 5: expert placement (issue #23): expert_req/expert_out,
                                               //    holders/experts in program_op, experts in shard_spawn,
                                               //    expert metrics in shard_stats
                                               // 6: weight manifests and shipping (issue #17): manifest and
                                               //    weight_server in shard_spawn, slice_fetch/slice_chunk,
                                               //    load figures in shard_spawned and node_report; the join
                                               //    no longer opens the model file
                                               // 7: slice_room_ask/slice_room (a node without room is not
                                               //    used), slice_ack (shipping with chunks in flight),
                                               //    cache figures in node_report, ship_ns in shard_spawned
                                               // 8: --sync q8_0 (issue #19): sync in program_op, q8_0
                                               //    blobs (flags bit 1), q8_0 data-plane frames
                                               // 9: activations as data-plane frames (kind 2, issue #19;
                                               //    actors/data_plane.hpp), the first of each (session,
                                               //    epoch) to a shard still through CAF

/// What every member of a cluster must agree on, checked when a node joins.
struct cluster_fingerprint {
  uint32_t protocol = node_protocol_version;
  std::string model_name;         // file name of the model (no folder)
  /// Since protocol 6 the daemon does not open the model at the join (it may
  /// hold none of it): it echoes this, and each shard_spawn's manifest is the
  /// check (model/manifest.hpp). The front end sends model_file::file_bytes().
  uint64_t model_digest = 0;
  std::string tokenizer_name;     // file name of the tokenizer
  uint64_t tokenizer_digest = 0;  // model::tokenizer::digest()
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, cluster_fingerprint& x) {
  return f(caf::meta::type_name("cluster_fingerprint"), x.protocol, x.model_name, x.model_digest,
           x.tokenizer_name, x.tokenizer_digest);
}

/// front end -> daemon: join the cluster as node `node` (its position in the
/// cluster file). `owner` lives as long as the front end's cluster; when it
/// goes down (or its connection is lost) the daemon stops the shards it
/// spawned for it.
struct node_join {
  cluster_fingerprint fp;  // the front end's
  int32_t node = 0;
  caf::actor owner;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_join& x) {
  return f(caf::meta::type_name("node_join"), x.fp, x.node, x.owner);
}

/// daemon -> front end. A non-empty `error` refuses the join (e.g. the model
/// file is not in the daemon's --models folder); `fp` is the daemon's own
/// fingerprint (of its copies of the files), compared by the front end.
struct node_joined {
  std::string error;
  cluster_fingerprint fp;
  std::string models_dir;
  std::string profile;
  uint64_t budget_bytes = 0;  // 0 = unlimited
  uint64_t used_bytes = 0;
  uint64_t link_bandwidth_bps = 0;  // the daemon's link shaping (0 / 0: unshaped), so that
  double link_latency_us = 0;       // the front end measures it against this target
  /// The kernel backends of the daemon's build (kernels::backend_names()): a
  /// cross build has no "blas"; a shard asked for a backend its node lacks
  /// runs on kernels::choose_backend()'s substitute, which the front end
  /// reports (remote_host::join_notes()).
  std::vector<std::string> backends;
  bool big_endian = false;          // the daemon's CPU byte order (docs/cell.md)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_joined& x) {
  return f(caf::meta::type_name("node_joined"), x.error, x.fp, x.models_dir, x.profile,
           x.budget_bytes, x.used_bytes, x.link_bandwidth_bps, x.link_latency_us, x.backends,
           x.big_endian);
}

/// front end -> daemon: open direct connections to these daemons, so that
/// stage-to-stage traffic does not pass through the front end (CAF 0.17
/// routes through the node that introduced an actor otherwise).
struct node_peers {
  std::vector<int32_t> nodes;  // node index of each peer (for messages)
  std::vector<std::string> hosts;
  std::vector<uint16_t> ports;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_peers& x) {
  return f(caf::meta::type_name("node_peers"), x.nodes, x.hosts, x.ports);
}

/// daemon -> front end: empty `error` when every peer is connected.
struct node_peers_done {
  std::string error;
  int32_t connected = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_peers_done& x) {
  return f(caf::meta::type_name("node_peers_done"), x.error, x.connected);
}

/// front end -> daemon: start the shard at placement index `index` (the
/// fields of topologies::shard and model::slice_spec it needs). The daemon
/// loads the slice from its copy of the joined model file.
struct shard_spawn {
  caf::actor owner;
  int32_t index = 0, stage = 0, rank = 0, group_size = 1, node = 0;
  int32_t layer_begin = 0, layer_end = 0, kv_head_begin = 0, kv_head_end = 0;
  int32_t ffn_begin = 0, ffn_end = 0;
  bool embedding = false, classifier = false;
  int32_t vocab_begin = 0, vocab_end = 0;  // classifier rows (model::slice_spec; 0, 0 = all)
  std::string weights = "f32";   // f32 | q8_0
  std::string matmul;            // exact | ggml ("": the model's default)
  int32_t ctx = 0;               // context length override the front end opened the model with
  std::string kernels = "native";
  uint64_t kv_bytes = 0;         // the placement's KV cache and buffer need beyond
  uint64_t buffer_bytes = 0;     // the weights (checked against the node's budget)
  int32_t checkpoint_every = 16;
  int32_t batch_size = 32;       // shard_init::batch_size
  caf::actor heartbeat;          // shard_init::heartbeat (may be invalid)
  caf::actor coordinator;        // shard_init::coordinator (may be invalid)
  /// Fault plans of this placement index that have not fired yet, in their
  /// CLI form (supervision::to_string(fault_plan)); the daemon builds the
  /// shard's injector from them. A one-shot plan that fired on an earlier
  /// incarnation is left out, so a restart does not fire it again.
  std::vector<std::string> faults;
  bool restarted = false;        // shard_init::restarted
  bool routed = true;            // model::slice_spec::routed (expert placement)
  std::vector<int32_t> experts;  // model::slice_spec::experts (an expert node's)
  /// The slice's weight manifest (model::manifest::encode()): which bytes of
  /// the model file the shard needs and their XXH3 digests. The daemon takes
  /// them from its cache (--cache), else its --models copy of the file
  /// (verified: a differing entry refuses the spawn as "model differs"), else
  /// answers source "need" and `weight_server` ships them (slice_fetch +
  /// slice_chunk, acknowledged by slice_ack), then the spawn comes again.
  std::string manifest;
  caf::actor weight_server;      // the front end's (may be invalid: no shipping)
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_spawn& x) {
  return f(caf::meta::type_name("shard_spawn"), x.owner, x.index, x.stage, x.rank, x.group_size,
           x.node, x.layer_begin, x.layer_end, x.kv_head_begin, x.kv_head_end, x.ffn_begin,
           x.ffn_end, x.embedding, x.classifier, x.vocab_begin, x.vocab_end, x.weights, x.matmul, x.ctx, x.kernels,
           x.kv_bytes, x.buffer_bytes, x.checkpoint_every, x.batch_size, x.heartbeat, x.coordinator, x.faults,
           x.restarted, x.routed, x.experts, x.manifest, x.weight_server);
}

/// The header of a shipped chunk (weight server -> daemon): bytes [offset,
/// offset + length) of the slice image (model/manifest.hpp) whose manifest
/// key is `key`.
struct slice_fetch {
  uint64_t key = 0;     // model::manifest::digest()
  uint64_t offset = 0;  // into the slice image
  uint64_t length = 0;  // at most 4 MiB
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slice_fetch& x) {
  return f(caf::meta::type_name("slice_fetch"), x.key, x.offset, x.length);
}

/// weight server -> daemon: the chunk and the XXH3-64 of its bytes (checked
/// by the daemon; a mismatch is shipped again), or why not. Sent with its
/// slice_fetch as the header, in one message; the daemon answers slice_ack.
struct slice_chunk {
  std::string error;
  uint64_t offset = 0;
  std::vector<char> bytes;  // std::vector<char>: CAF's raw fast path
  uint64_t digest = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slice_chunk& x) {
  return f(caf::meta::type_name("slice_chunk"), x.error, x.offset, x.bytes, x.digest);
}

/// daemon -> the sender of a chunk (the front end's weight server): what
/// became of the chunk at `offset` of slice `key`. The weight server keeps a
/// few chunks in flight and sends the next one per acknowledgement
/// (actors/weight_server.hpp).
struct slice_ack {
  uint64_t key = 0;
  uint64_t offset = 0;
  /// 0: stored; 1: failed its size or digest check (ship it again);
  /// 2: the daemon expects no such slice (stop shipping it; `error` says why).
  int32_t status = 0;
  std::string error;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slice_ack& x) {
  return f(caf::meta::type_name("slice_ack"), x.key, x.offset, x.status, x.error);
}

/// front end -> daemon, after the placement and before any spawn (issue
/// #17): can this node hold these slices? One entry per slice: its manifest
/// key (model::manifest::digest()), its bytes (model::manifest::bytes()) and
/// the placement's memory need of the shard (weights + KV cache + buffers,
/// topologies::memory_need::total()). `model_name` and `file_bytes` name the
/// model file, so that the daemon knows whether its --models copy serves.
struct slice_room_ask {
  std::string model_name;
  uint64_t file_bytes = 0;
  std::vector<uint64_t> keys;
  std::vector<uint64_t> bytes;
  std::vector<uint64_t> need;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slice_room_ask& x) {
  return f(caf::meta::type_name("slice_room_ask"), x.model_name, x.file_bytes, x.keys, x.bytes, x.need);
}

/// daemon -> front end: per asked slice, "" when the node can hold it, else
/// why not (the bytes needed and available: "out of memory (...)", "no room
/// for the slice: ... --cache-max ..."). A node that cannot hold what the
/// placement gives it is left out of the placement (remote_host::drop_unfit).
struct slice_room {
  std::vector<std::string> verdicts;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, slice_room& x) {
  return f(caf::meta::type_name("slice_room"), x.verdicts);
}

/// front end -> daemon: send heartbeats for node `peer` to `monitor` (the
/// front end's phi-accrual monitor, supervision/heartbeat.hpp) every
/// `interval_ms`. The sender runs in the daemon's process, so a frozen daemon
/// (SIGSTOP) falls silent; it stops when `owner` goes down.
struct heartbeat_start {
  caf::actor owner;
  caf::actor monitor;
  uint64_t peer = 0;
  int64_t interval_ms = 100;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat_start& x) {
  return f(caf::meta::type_name("heartbeat_start"), x.owner, x.monitor, x.peer, x.interval_ms);
}

/// daemon -> front end: the heartbeat sender (shards get it as shard_init::heartbeat), or why not.
struct heartbeat_started {
  std::string error;
  caf::actor sender;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, heartbeat_started& x) {
  return f(caf::meta::type_name("heartbeat_started"), x.error, x.sender);
}

/// daemon -> front end: the shard (a proxy on the front end's side), or why not.
struct shard_spawned {
  std::string error;
  caf::actor shard;
  uint64_t weight_bytes = 0;
  /// How the slice reached the node (issue #17): "memory" (already loaded
  /// there), "cache" (--cache), "models" (its --models copy, bytes_read of
  /// it read) or "shipped" (shipped_bytes from the weight server).
  std::string source;
  uint64_t shipped_bytes = 0;
  uint64_t bytes_read = 0;
  int64_t reload_ns = 0;   // from the spawn's arrival to the slice verified and loaded
  /// "shipped": from the daemon's "need" answer to the last chunk stored
  /// (the transfer alone; reload_ns adds the checks, the cache and the load).
  int64_t ship_ns = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_spawned& x) {
  return f(caf::meta::type_name("shard_spawned"), x.error, x.shard, x.weight_bytes, x.source, x.shipped_bytes,
           x.bytes_read, x.reload_ns, x.ship_ns);
}

/// daemon -> (stats_atom) requester: the node's memory and load.
struct node_report {
  int32_t node = 0;
  std::string profile;
  uint64_t budget_bytes = 0;  // 0 = unlimited
  uint64_t used_bytes = 0;    // weights + KV caches of every shard on it
  int32_t shards = 0;
  int32_t clients = 0;        // front ends with shards here
  int32_t pid = 0;            // the daemon's process id (for signals from tools on the same host)
  // `cellshard status` (issue #20):
  int32_t sessions = 0;       // sessions with a KV cache on this node, over all its shards
  int64_t uptime_ms = 0;      // since the daemon started
  std::string link;           // its shaped links "BANDWIDTH:LATENCY" ("" = unshaped)
  std::string version;        // cellshard version of the daemon
  bool tls = false;           // listening with mutual TLS
  uint64_t guard_rejected = 0;  // connections closed by the pre-handshake guard (bad preamble or deadline)
  uint64_t shipped_bytes = 0;   // slice bytes received from weight servers since start
  uint64_t cache_hits = 0;      // spawns served from --cache
  uint64_t cache_bytes = 0;     // bytes in --cache now
  std::string cache_dir;        // --cache ("" = none: shipped slices live in memory only)
  uint64_t cache_max = 0;       // --cache-max bytes (0 = unbounded)
  uint64_t cache_entries = 0;   // slice files in --cache now
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, node_report& x) {
  return f(caf::meta::type_name("node_report"), x.node, x.profile, x.budget_bytes, x.used_bytes,
           x.shards, x.clients, x.pid, x.sessions, x.uptime_ms, x.link, x.version, x.tls, x.guard_rejected,
           x.shipped_bytes, x.cache_hits, x.cache_bytes, x.cache_dir, x.cache_max, x.cache_entries);
}

}  // namespace cellshard::actors
