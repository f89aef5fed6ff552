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
//   classifier holder (last stage, rank 0) --logits_msg--> session
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

#include <caf/actor.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>
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

// -- payloads --------------------------------------------------------------------
/// A float vector with a byte-order-neutral, checksummed raw encoding.
struct blob {
  std::vector<float> data;
  /// False when the received bytes failed their checksum or were malformed.
  bool ok() const { return status == 0; }
  /// 0 ok, 1 checksum mismatch, 2 malformed (set on deserialisation).
  uint8_t status = 0;

  /// The wire form: [u8 big_endian][u32 count][u64 xxh64 of payload][payload].
  /// Count and checksum are written in the sender's byte order too.
  std::vector<char> encode() const;
  /// Parses a wire form (converting byte order, verifying the checksum).
  static blob decode(const std::vector<char>& bytes);
  /// Test hook: encode as if the host had the other byte order.
  std::vector<char> encode_swapped() const;
};

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
    auto bytes = x.encode();
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
struct forward_req {
  step_id id;
  std::vector<int32_t> tokens;
  caf::actor reply_to;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, forward_req& x) {
  return f(caf::meta::type_name("forward_req"), x.id, x.tokens, x.reply_to);
}

/// stage -> next stage: the residual stream x [count x dim] after the stage.
/// compute_ns accumulates kernel time along the critical path.
struct activation {
  step_id id;
  blob x;
  int64_t compute_ns = 0;
  caf::actor reply_to;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, activation& x) {
  return f(caf::meta::type_name("activation"), x.id, x.x, x.compute_ns, x.reply_to);
}

/// TP rank -> the other ranks of its group: its partial sum [count x dim] of
/// layer `layer`, phase 0 (after attention) or 1 (after FFN).
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
struct logits_msg {
  step_id id;
  blob logits;
  int64_t compute_ns = 0;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, logits_msg& x) {
  return f(caf::meta::type_name("logits_msg"), x.id, x.logits, x.compute_ns);
}

/// A shard's failure reported to the session (out of memory, corrupt payload).
struct shard_error {
  step_id id;
  int32_t node = 0;
  std::string message;
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_error& x) {
  return f(caf::meta::type_name("shard_error"), x.id, x.node, x.message);
}

/// Where a shard sends: its TP group in rank order and the next stage's
/// shards (empty for the last stage).
struct wiring {
  std::vector<caf::actor> group;
  std::vector<caf::actor> next;
  std::vector<int32_t> group_nodes;  // node index of each group member
  std::vector<int32_t> next_nodes;   // node index of each next-stage shard
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, wiring& x) {
  return f(caf::meta::type_name("wiring"), x.group, x.next, x.group_nodes, x.next_nodes);
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
};
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, shard_stats& x) {
  return f(caf::meta::type_name("shard_stats"), x.node, x.index, x.weight_bytes, x.kv_bytes,
           x.sessions, x.compute_ns, x.bytes_sent, x.bytes_received, x.link_to, x.link_bytes);
}

/// Registers every message type above with a config (call in every process).
void register_messages(caf::actor_system_config& cfg);

}  // namespace cellshard::actors
