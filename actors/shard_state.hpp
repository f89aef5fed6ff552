// actors/shard_state.hpp: the shard actor's state (internal to actors/shard.cpp;
// not installed, included by nothing else). Split from shard.cpp (issue #15)
// so that the file holding the shard's behaviour -- its program, the
// replay log, restore, expert dispatch and the handlers -- is not also the
// file declaring what it keeps: the worker's result messages, the state of a
// session at a shard (KV cache, the step in flight, the replay log, the MoE
// layer in flight), the fused jobs' partial-sum router shared with the data
// plane's reader threads, and the shard's own state. No behaviour here but
// fused_router's (its lock discipline is documented on it).
//
// Thread safety: shard_state and session_state are touched by the shard
// actor only; fused_router and fused_inbox are shared with the worker and
// the data plane's threads under fused_router::mu.
#pragma once

#include "actors/data_plane.hpp"
#include "actors/fault_env.hpp"
#include "actors/messages.hpp"
#include "actors/shard.hpp"
#include "actors/worker.hpp"
#include "model/transformer.hpp"
#include "topologies/placement.hpp"

#include <caf/all.hpp>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace cellshard::actors::shard_detail {

/// Partial sums for the fused job of one step (post_fused): the job waits for
/// its peers' partials here, filled by the data plane's reader threads
/// (data_plane::sink) and by the actor's partial_sum handler. Guarded by its
/// shard's fused_router::mu.
struct fused_inbox {
  uint32_t epoch = 0;
  int32_t pos0 = 0;
  bool abort = false;  // the step was abandoned (a newer epoch, the session closed)
  std::map<std::pair<int32_t, int32_t>, std::vector<blob>> parts;  // (layer, phase) -> by rank
  uint64_t bytes = 0;  // payload bytes taken from the data plane
};

/// Worker -> shard: the result of the compute op at `pc` of a step's program,
/// computed off the scheduler threads (actors/worker.hpp). `x` is the step's
/// residual stream, lent to the job and given back (with each layer half's
/// output added unless the op is partial); `out` is the last layer half's
/// output -- a partial op's partial sum. In process only.
struct computed {
  uint64_t session = 0;
  uint32_t epoch = 0;
  int32_t pos0 = 0;
  size_t pc = 0;
  bool partial = false;
  std::vector<float> x;
  blob out;
  int64_t ns = 0;
  // A fused job (post_fused): ops [pc, next_pc) ran on the worker, their
  // reductions included. shared: it stopped in the reduce at next_pc (a peer's
  // partial did not come in time) with `out` (this rank's partial, in its sync
  // format) sent; the actor's reduce waits for the rest.
  bool fused = false;
  size_t next_pc = 0;
  bool shared = false;
  std::shared_ptr<fused_inbox> inbox;
  std::vector<std::pair<int32_t, uint64_t>> sent;  // (peer node, payload bytes)
};

/// Worker -> shard: the logits of a step's last position (this shard's
/// vocabulary slice, starting at vocab_begin).
struct classified {
  step_id id;
  int32_t vocab_begin = 0;
  blob logits;
  int64_t ns = 0;
  int64_t compute_ns = 0;  // the step's critical-path compute before the classifier
  caf::actor reply_to;
};

/// Worker -> stage shard of an expert placement: the dispatch op at `pc`
/// prepared (issue #23): per position the FFN input xb, the chosen experts
/// and their weights (model::moe_route), and the shared expert's output and
/// gate when the model has one. `x` is lent and given back unchanged.
struct routed {
  uint64_t session = 0;
  uint32_t epoch = 0;
  int32_t pos0 = 0;
  size_t pc = 0;
  std::vector<float> x;
  std::vector<float> xb;        // [count x dim]
  std::vector<int32_t> ids;     // [count x k]
  std::vector<float> wts;       // [count x k]
  std::vector<float> shared_y;  // [count x dim], empty: no shared expert
  std::vector<float> shared_g;  // [count]
  int64_t ns = 0;
};

/// Worker -> expert node: the outputs of one expert_req, pair order.
struct expert_done {
  expert_req req;  // its xb moved out
  blob y;
  int64_t ns = 0;
};

/// Payload bytes of a blob as sent (q8_0 blocks or f32).
inline uint64_t payload_bytes(const blob& b) {
  return b.q8 ? q8_payload_bytes(b.data.size()) : b.data.size() * sizeof(float);
}

/// Per-session state of a shard: the KV cache, checkpoint progress, the step
/// in flight and (rank 0 with a next stage) the replay log.
struct session_state {
  // Shared with the compute job in flight, which may outlive this state (a
  // session closed or a shard killed mid-step).
  std::shared_ptr<model::kv_cache> kv;
  std::shared_ptr<model::scratch> s;
  bool computing = false;      // a job of this session is on the worker (it holds x)
  // Work that must not overlap the job in flight (a KV restore): run when it returns.
  std::vector<std::function<void()>> after_job;
  uint64_t charged = 0;
  uint32_t epoch = 0;
  int32_t ckpt_end = 0;        // positions [0, ckpt_end) are checkpointed at the session
  // The step in flight:
  bool busy = false;
  step_id id;
  int32_t replay_until = -1;
  std::vector<float> x;        // [count x dim] residual stream
  size_t pc = 0;               // the op of the program being executed
  bool posted = false;         // the compute op at pc is on the worker
  blob own;                    // this shard's partial for the reduce at pc
  bool shared = false;         // the reduce at pc has sent `own` (or its chunks) to its peers
  bool gathered = false;       // scatter_gather: the reduce at pc has sent its finished chunk
  bool checkpointed = false;   // this step's KV delta is out (or not due)
  int64_t compute_ns = 0;      // critical-path compute so far
  caf::actor reply_to;
  // Replay log: activations sent to the next stage, by first position.
  std::map<int32_t, std::vector<float>> sent;
  // Expert placement (issue #23): the MoE layer between its dispatch and its
  // combine. Slot = row * k + r (the r-th chosen expert of position row).
  struct expert_request {
    int index = -1;          // placement index of the expert node asked
    std::vector<int> slots;  // the slots it computes, request order
    int attempts = 0;
  };
  int moe_layer = -1;
  std::vector<float> moe_xb, moe_wts, moe_shared_y, moe_shared_g, moe_y;
  std::vector<int32_t> moe_ids;
  std::vector<char> moe_have;
  int moe_missing = 0;
  std::map<uint32_t, expert_request> moe_out;  // by request seq
  int64_t moe_since = 0;                       // steady ns of the dispatch
  // Steps that arrived while one was in flight (a replay followed by the
  // re-sent step: in a TP group the next can come before the peers' partial
  // sums of the current one). Run in arrival order.
  std::deque<activation> queued;
};


/// The fused jobs' inboxes of one shard, by session (at most one step of a
/// session is on the worker). Shared with the data plane's sink, which runs on
/// its reader threads: a partial sum for a step whose fused job is on the
/// worker goes straight to that job, with no hop through the actor's mailbox.
struct fused_router {
  std::mutex mu;
  std::condition_variable cv;  // a partial arrived or a job was aborted
  std::unordered_map<uint64_t, std::shared_ptr<fused_inbox>> by_session;
  int group_size = 0;
  bool enabled = false;  // data plane on, and not CELLSHARD_DATA_PLANE=unfused
  // The node's data plane: a job that borrowed its reading waits in pump(),
  // not on cv; kick() wakes it (set once at the shard's start).
  std::shared_ptr<data_plane> plane;
  bool lend = false;  // data_plane::lend_by_env(): unless CELLSHARD_DATA_PLANE=nolend

  /// Takes `p` when the fused job of its step waits for it (checksum good,
  /// rank and phase valid); false: the actor handles it as before.
  /// `count`: its bytes are counted here (the actor counted those it handed over).
  bool take(partial_sum& p, bool count) {
    if (!p.data.ok() || p.phase < 0 || p.phase > 1 || p.rank < 0 || p.rank >= group_size) return false;
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = by_session.find(p.id.session);
      if (it == by_session.end()) return false;
      auto& in = *it->second;
      if (in.abort || in.epoch != p.id.epoch || in.pos0 != p.id.pos0) return false;
      auto& v = in.parts[{p.layer, p.phase}];
      if (v.size() != static_cast<size_t>(group_size)) v.resize(static_cast<size_t>(group_size));
      if (count) in.bytes += payload_bytes(p.data);
      v[static_cast<size_t>(p.rank)] = std::move(p.data);
      // The job waits for the G - 1 partials of its peers: wake it once,
      // when they are all here, not at each (a wake-up is a context switch).
      int have = 0;
      for (const auto& b : v) have += b.data.empty() ? 0 : 1;
      if (have < group_size - 1) return true;
    }
    cv.notify_all();
    if (!count && plane) plane->kick();  // from the actor: the job may be in pump()
    return true;
  }
  /// The session's fused job (if any) stops at its next wait.
  void abort(uint64_t session) {
    {
      std::lock_guard<std::mutex> g(mu);
      auto it = by_session.find(session);
      if (it == by_session.end()) return;
      it->second->abort = true;
    }
    cv.notify_all();
    if (plane) plane->kick();
  }
};

struct shard_state {
  shard_init init;
  wiring wires;
  // What the shard does with every step (the placement's program for it,
  // checked against its slice when the wiring came); executed by run_program.
  std::vector<topologies::shard_step> program;
  bool wired = false;
  // Steps that arrived before the first wiring (none should: the runtime
  // confirms wiring before any step reaches a shard); handled once it comes.
  std::vector<caf::message> unwired;
  std::unordered_map<uint64_t, session_state> sessions;
  std::set<uint64_t> closed;   // sessions ended here: late messages are dropped
  // Partials received before this shard reached that (layer, phase):
  // key (session, epoch, pos0, layer, phase) -> per rank.
  std::map<std::tuple<uint64_t, uint32_t, int32_t, int32_t, int32_t>, std::vector<blob>> partials;
  // The fault plan around this shard and its links to other nodes (the
  // node's shaper inside the link faults' wrapper): actors/fault_env.hpp.
  // Set when the actor starts, never null after.
  std::unique_ptr<fault_env> faults;
  // Link probes run in their own actor (actors/links.hpp); the shard only
  // hands them over.
  caf::actor prober;
  int64_t compute_ns = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::map<int32_t, uint64_t> link_bytes;  // by destination node
  std::map<caf::node_id, std::string> peer_names;  // data plane keys, by CAF node
  // Activations over the data plane (actors/data_plane.hpp, frame kind 2):
  // a frame carries no reply_to, so the first activation of each (session,
  // epoch) to a shard goes through CAF and the later ones may take the frame.
  // Sender: (destination's node, its actor id, session) -> 1 + the epoch of
  // the last activation sent there through CAF (0: none). The node is part of
  // the key: actor ids are per process, and daemons with the same history
  // give their shards the same ids (keyed by id alone, rank 1's CAF
  // activation counted for ranks 2 and 3, which then never learnt reply_to).
  std::map<std::tuple<caf::node_id, caf::actor_id, uint64_t>, uint64_t> act_via_caf;
  // Receiver: by session, the epoch and reply_to of its newest activation
  // that came through CAF; a frame of that epoch takes this reply_to.
  std::unordered_map<uint64_t, std::pair<uint32_t, caf::actor>> act_reply;
  // Frames that overtook their epoch's CAF activation (the two channels are
  // not ordered): run in arrival order once it comes; dropped when a newer
  // epoch's comes, the session closes, or beyond act_hold_max (the session's
  // deadline re-sends the step in a new epoch, as for a lost message).
  std::deque<activation> act_held;
  uint64_t act_held_bytes = 0;
  std::shared_ptr<fused_router> fused = std::make_shared<fused_router>();
  std::map<uint64_t, int64_t> last_due;    // by session: arrival (steady ns) of its last payload sent
  std::set<std::pair<uint64_t, int32_t>> classifying;  // (session, pos0) of classifier jobs in flight
  // Expert placement (issue #23). Stage shard: expert nodes taken for dead
  // (down, or silent past a request's timeout) until their next wiring; the
  // expert actors it watches; request numbers; metrics.
  std::set<int> expert_down;
  // Expert nodes that let a request time out: avoided while another holder
  // is up, until they answer anything or are rewired (slow is not dead).
  std::set<int> expert_suspect;
  std::map<caf::actor_addr, int> expert_watch;
  uint32_t next_seq = 1;
  std::vector<uint64_t> expert_load;
  int64_t moe_wait_ns = 0;
  uint64_t redispatched = 0;
  // Expert node: its worker's scratch, and the steps it computes for.
  std::shared_ptr<model::scratch> expert_scratch;
  std::multiset<std::tuple<uint64_t, uint32_t, int32_t>> expert_jobs;
  uint64_t expert_pairs = 0;
  // Kernels run here, never on a CAF thread. Declared last: destroyed (and
  // joined, cancelling the job in flight) first.
  std::unique_ptr<compute_worker> worker;
  static inline const char* name = "cellshard.shard";
  // A shard that ends with sessions open (crashed, killed, taken away from a
  // silent node, or its front end gone) gives their KV caches back to the
  // node's budget: otherwise each failure would leak them on a daemon that
  // lives on, until it refuses every front end.
  shard_state() = default;
  shard_state(const shard_state&) = delete;
  shard_state& operator=(const shard_state&) = delete;
  ~shard_state() {
    if (init.node)
      for (auto& kv : sessions) {
        init.node->release(kv.second.charged);
        --init.node->sessions;
      }
  }
};

}  // namespace cellshard::actors::shard_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::computed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::classified)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::routed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::expert_done)
