#include "actors/shard.hpp"

#include "actors/worker.hpp"
#include "supervision/fault_hooks.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace cellshard::actors::shard_detail {

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

}  // namespace cellshard::actors::shard_detail

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::computed)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::actors::shard_detail::classified)

namespace cellshard::actors {

namespace {

using shard_detail::classified;
using shard_detail::computed;
using clock_type = std::chrono::steady_clock;

int64_t since_ns(clock_type::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
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
  // Steps that arrived while one was in flight (a replay followed by the
  // re-sent step: in a TP group the next can come before the peers' partial
  // sums of the current one). Run in arrival order.
  std::deque<activation> queued;
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
  std::unique_ptr<supervision::fault_hooks> hooks;
  std::unordered_map<uint64_t, session_state> sessions;
  std::set<uint64_t> closed;   // sessions ended here: late messages are dropped
  // Partials received before this shard reached that (layer, phase):
  // key (session, epoch, pos0, layer, phase) -> per rank.
  std::map<std::tuple<uint64_t, uint32_t, int32_t, int32_t, int32_t>, std::vector<blob>> partials;
  std::vector<activation> slowed;  // steps held back by a `slow` fault
  uint32_t drop_left = 0;          // outgoing messages still to drop (fault `drop`)
  uint32_t corrupt_left = 0;       // outgoing payloads still to corrupt (fault `corrupt`)
  caf::actor_clock::time_point partitioned_until{};  // fault `partition`
  // Probe bursts being received, by (reply_to, from node): arrival times.
  std::map<std::pair<caf::actor, int32_t>, std::vector<int64_t>> probes;
  int64_t compute_ns = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::map<int32_t, uint64_t> link_bytes;  // by destination node
  std::map<uint64_t, int64_t> last_due;    // by session: arrival (steady ns) of its last payload sent
  std::set<std::pair<uint64_t, int32_t>> classifying;  // (session, pos0) of classifier jobs in flight
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

using shard_actor = caf::stateful_actor<shard_state>;

uint64_t payload_bytes(const blob& b) { return b.data.size() * sizeof(float); }

void report(shard_actor* self, const caf::actor& to, const step_id& id, std::string msg,
            bool retry = false) {
  if (to) self->send(to, shard_error{id, self->state.init.node->index, std::move(msg), retry});
}

/// Counts a payload sent to `node` (self-sends on the same node are free).
void count_sent(shard_actor* self, int32_t node, uint64_t bytes) {
  auto& st = self->state;
  if (node == st.init.node->index) return;
  st.bytes_sent += bytes;
  st.link_bytes[node] += bytes;
}

/// Flips one bit of a payload the way a bad link would, then checks it as a
/// receiver does: the checksum fails and the blob arrives marked corrupt.
void corrupt_payload(blob& b) {
  auto bytes = b.encode();
  if (bytes.size() > 13) bytes[13 + (bytes.size() - 13) / 2] ^= 0x04;
  b = blob::decode(bytes);
  b.damaged_wire = std::move(bytes);  // what another process receives
}

blob* payload_of(activation& m) { return &m.x; }
blob* payload_of(partial_sum& m) { return &m.data; }
blob* payload_of(logits_msg& m) { return &m.logits; }
blob* payload_of(kv_delta& m) { return &m.rows; }
uint64_t session_of(const activation& m) { return m.id.session; }
uint64_t session_of(const partial_sum& m) { return m.id.session; }
uint64_t session_of(const logits_msg& m) { return m.id.session; }
uint64_t session_of(const kv_delta& m) { return m.session; }

/// Sends a data message over this node's link to `node`: counted, subject to
/// the link faults (drop, corrupt) and delivered after the shaper's delay.
template <class T>
void deliver(shard_actor* self, const caf::actor& to, int32_t node, T msg) {
  auto& st = self->state;
  const uint64_t bytes = payload_bytes(*payload_of(msg));
  count_sent(self, node, bytes);
  if (node == st.init.node->index) {  // same node: no link
    self->send(to, std::move(msg));
    return;
  }
  if (st.drop_left > 0) {
    --st.drop_left;
    return;
  }
  if (st.corrupt_left > 0) {
    --st.corrupt_left;
    corrupt_payload(*payload_of(msg));
  }
  const auto delay = st.init.node->shaper->schedule(node, bytes);
  // When the last payload of this session reaches its receiver: a step
  // probe (step_query) reports it, so a message still crossing a slow link
  // is not taken for a lost one.
  auto& due = st.last_due[session_of(msg)];
  due = std::max<int64_t>(due, (clock_type::now() + delay).time_since_epoch().count());
  if (delay.count() > 0) self->delayed_send(to, delay, std::move(msg));
  else self->send(to, std::move(msg));
}

void drop_partials(shard_actor* self, uint64_t session, uint32_t below_epoch) {
  auto& p = self->state.partials;
  for (auto it = p.begin(); it != p.end();) {
    if (std::get<0>(it->first) == session && std::get<1>(it->first) < below_epoch) it = p.erase(it);
    else ++it;
  }
}

/// Finds or creates the session's state (charging its KV cache to the node).
/// Null for a closed session, a stale epoch, or no memory (reported).
session_state* session_for(shard_actor* self, const step_id& id, const caf::actor& reply_to) {
  auto& st = self->state;
  if (st.closed.count(id.session)) return nullptr;
  auto it = st.sessions.find(id.session);
  if (it != st.sessions.end()) {
    if (id.epoch < it->second.epoch) return nullptr;  // a stale message
    if (id.epoch > it->second.epoch) {
      it->second.epoch = id.epoch;
      it->second.busy = false;  // the step of the older epoch is abandoned
      it->second.queued.clear();
      drop_partials(self, id.session, id.epoch);
    }
    return &it->second;
  }
  // A restarted incarnation knows nothing of a session that began before it:
  // until the session restores it (restore_req creates the state at
  // position 0), a step past position 0 would run over an empty KV cache.
  // It is dropped; the session's recovery of this shard follows.
  if (st.init.restarted && id.pos0 > 0) return nullptr;
  const auto& w = *st.init.weights;
  const int kv_dim = w.spec().n_kv_heads() * w.cfg().head_size();
  const uint64_t need = w.cfg().seq_len * 2ull * w.spec().n_layers() * kv_dim * sizeof(float);
  if (!st.init.node->try_charge(need)) {
    auto& n = *st.init.node;
    report(self, reply_to, id,
           "node " + std::to_string(n.index) + " (" + n.profile + ") out of memory: session " +
               std::to_string(id.session) + " needs " + std::to_string(need) +
               " bytes of KV cache at placement index " + std::to_string(st.init.index) + "; " +
               std::to_string(n.used_bytes.load()) + " of " + std::to_string(n.budget_bytes) +
               " bytes in use");
    return nullptr;
  }
  session_state& ss = st.sessions[id.session];
  ss.kv = std::make_shared<model::kv_cache>(w.spec().n_layers(), w.cfg().seq_len, kv_dim);
  ss.s = std::make_shared<model::scratch>(w);
  ss.charged = need;
  ss.epoch = id.epoch;
  ++st.init.node->sessions;
  return &ss;
}

/// The actor and node of placement index `index` among the wiring's peers;
/// false when the wiring does not name it (check_wiring refuses such programs).
bool peer_of(const shard_state& st, int index, caf::actor& to, int32_t& node) {
  const auto& w = st.wires;
  for (size_t i = 0; i < w.group_index.size() && i < w.group.size(); ++i)
    if (w.group_index[i] == index) {
      to = w.group[i];
      node = w.group_nodes[i];
      return true;
    }
  for (size_t i = 0; i < w.next_index.size() && i < w.next.size(); ++i)
    if (w.next_index[i] == index) {
      to = w.next[i];
      node = w.next_nodes[i];
      return true;
    }
  return false;
}

/// Sends `m` to every placement index of `peers`, in order.
template <class T>
void send_to(shard_actor* self, const std::vector<int>& peers, const T& m) {
  for (int idx : peers) {
    caf::actor to;
    int32_t node = 0;
    if (peer_of(self->state, idx, to, node)) deliver(self, to, node, m);
  }
}

/// The program's forward op (to the next stage), or null.
const topologies::shard_step* forward_op(const shard_state& st) {
  for (const auto& op : st.program)
    if (op.op == topologies::shard_op::forward) return &op;
  return nullptr;
}

void start_step(shard_actor* self, activation& a);

/// The step's KV delta to the session, once per step, before the stage's
/// output leaves (every `checkpoint_every` positions; not for replays).
void checkpoint_step(shard_actor* self, session_state& ss) {
  if (ss.checkpointed) return;
  ss.checkpointed = true;
  auto& st = self->state;
  const int32_t end = ss.id.pos0 + ss.id.count;
  const int K = st.init.checkpoint_every;
  if (ss.replay_until >= 0 || K <= 0 || end - ss.ckpt_end < K || !ss.reply_to) return;
  kv_delta d;
  d.session = ss.id.session;
  d.index = st.init.index;
  d.begin = ss.ckpt_end;
  d.end = end;
  d.rows.data = ss.kv->rows(ss.ckpt_end, end);
  deliver(self, ss.reply_to, front_end_node, std::move(d));
  ss.ckpt_end = end;
}

/// Posts the compute op `op` (at ss.pc) to the worker; its result comes back
/// as a `computed` message (on_computed).
void post_compute(shard_actor* self, uint64_t session, session_state& ss, const topologies::shard_step& op) {
  auto& st = self->state;
  ss.computing = true;
  ss.posted = true;
  computed c;
  c.session = session;
  c.epoch = ss.id.epoch;
  c.pos0 = ss.id.pos0;
  c.pc = ss.pc;
  c.partial = op.partial;
  c.x = std::move(ss.x);
  const int count = ss.id.count;
  const int chunk = std::max(1, st.init.batch_size);
  const int l0 = op.layers.begin, l1 = op.layers.end;
  const bool attention = op.part != topologies::layer_part::ffn;
  const bool ffn = op.part != topologies::layer_part::attention;
  auto weights = st.init.weights;
  const kernels::backend* be = st.init.backend;
  auto kv = ss.kv;
  auto scr = ss.s;
  caf::actor_addr me = self->address();
  std::shared_ptr<kernels::pool> kpool = st.init.node ? st.init.node->kernel_pool : nullptr;
  st.worker->post([c = std::move(c), count, chunk, l0, l1, attention, ffn, weights, be, kv, scr, me,
                   kpool](const std::atomic<bool>& cancelled) mutable {
    kernels::pool::scope use_pool(kpool.get());
    const auto& w = *weights;
    const int dim = w.cfg().dim;
    const auto t0 = clock_type::now();
    const size_t n = static_cast<size_t>(count) * dim;
    c.out.data.resize(n);
    for (int layer = l0; layer < l1; ++layer)
      for (int phase = 0; phase < 2; ++phase) {
        if ((phase == 0 && !attention) || (phase == 1 && !ffn)) continue;
        // One position alone as before; more in chunks of `chunk` positions
        // (bit-identical: model::*_partial_batch).
        for (int i = 0; i < count; i += chunk) {
          if (cancelled) return;  // the shard is going away
          const int m = std::min(chunk, count - i);
          const float* xi = c.x.data() + static_cast<size_t>(i) * dim;
          float* out = c.out.data.data() + static_cast<size_t>(i) * dim;
          if (m == 1) {
            if (phase == 0)
              model::attention_partial(*be, w, layer, xi, c.pos0 + i, *kv, *scr, out);
            else
              model::ffn_partial(*be, w, layer, xi, *scr, out);
          } else if (phase == 0) {
            model::attention_partial_batch(*be, w, layer, xi, c.pos0 + i, m, *kv, *scr, out);
          } else {
            model::ffn_partial_batch(*be, w, layer, xi, m, *scr, out);
          }
        }
        if (c.partial) continue;  // a TP slice's partial: the reduce adds it
        // A shard alone in its group: x += the half's output (as the reduce
        // of a group of one would), so a step costs one hand-off, not 2 per layer.
        const float* p = c.out.data.data();
        for (size_t i = 0; i < n; ++i) c.x[i] += p[i];
      }
    c.ns = since_ns(t0);
    if (auto to = caf::actor_cast<caf::actor>(me)) caf::anon_send(to, std::move(c));
  });
}

/// Posts the classifier of this shard's vocabulary rows for the step's last
/// position (on the worker, after the step's last compute: FIFO; the
/// classifier of a 32000-token vocabulary is a matvec as long as a layer).
void post_classify(shard_actor* self, session_state& ss) {
  auto& st = self->state;
  const auto& w = *st.init.weights;
  const int dim = w.cfg().dim;
  const auto first = ss.x.begin() + static_cast<std::ptrdiff_t>(ss.id.count - 1) * dim;
  std::vector<float> last(first, first + dim);
  classified c;
  c.id = ss.id;
  c.vocab_begin = w.spec().vocab_first();
  st.classifying.insert({ss.id.session, ss.id.pos0});
  c.compute_ns = ss.compute_ns;
  c.reply_to = ss.reply_to;
  auto weights = st.init.weights;
  const kernels::backend* be = st.init.backend;
  caf::actor_addr me = self->address();
  std::shared_ptr<kernels::pool> kpool = st.init.node ? st.init.node->kernel_pool : nullptr;
  st.worker->post([c = std::move(c), last = std::move(last), weights, be, kpool,
                   me](const std::atomic<bool>& cancelled) mutable {
    if (cancelled) return;
    kernels::pool::scope use_pool(kpool.get());
    const auto t0 = clock_type::now();
    c.logits.data.resize(weights->spec().vocab_rows(weights->cfg().vocab_size));
    model::classify(*be, *weights, last.data(), c.logits.data.data());
    c.ns = since_ns(t0);
    if (auto to = caf::actor_cast<caf::actor>(me)) caf::anon_send(to, std::move(c));
  });
}

/// Received reduce messages are keyed (session, epoch, pos0, layer, phase):
/// phase 0 / 1 the partials of the attention / FFN half (direct: whole
/// vectors; scatter_gather: this rank's chunk of each), phase 2 / 3
/// scatter_gather's finished chunks of that half (the all-gather). The
/// partial_sum message carries the same phase numbers.
constexpr int32_t gather_phase = 2;

/// direct_rank_order: the own partial to every other peer; once all T are
/// here, x += p_0 + p_1 + ... + p_{T-1} (summed in peers' order). True when done.
bool reduce_direct(shard_actor* self, uint64_t session, session_state& ss, int me, int T, int layer, int phase) {
  auto& st = self->state;
  const auto& op = st.program[ss.pc];
  const size_t n = static_cast<size_t>(ss.id.count) * st.init.weights->cfg().dim;
  auto key = std::make_tuple(session, ss.id.epoch, ss.id.pos0, layer, phase);
  auto& parts = st.partials[key];
  if (parts.size() != static_cast<size_t>(T)) parts.resize(T);
  if (!ss.shared) {
    ss.shared = true;
    partial_sum p{ss.id, layer, phase, me, ss.own};
    for (int r = 0; r < T; ++r) {
      if (r == me) continue;
      caf::actor to;
      int32_t node = 0;
      if (peer_of(st, op.peers[r], to, node)) deliver(self, to, node, p);
    }
    parts[me] = std::move(ss.own);
  }
  for (int r = 0; r < T; ++r)
    if (parts[r].data.size() != n) return false;  // wait for peer r
  if (T == 1) {
    const float* p = parts[0].data.data();
    for (size_t i = 0; i < n; ++i) ss.x[i] += p[i];
  } else {
    std::vector<float> acc = std::move(parts[0].data);
    for (int r = 1; r < T; ++r) {
      const float* p = parts[r].data.data();
      for (size_t i = 0; i < n; ++i) acc[i] += p[i];
    }
    for (size_t i = 0; i < n; ++i) ss.x[i] += acc[i];
  }
  st.partials.erase(key);
  return true;
}

/// Columns [c.begin, c.end) of every row of `v` ([count x dim]), row after row.
std::vector<float> chunk_rows(const std::vector<float>& v, int count, int dim, topologies::range c) {
  std::vector<float> out(static_cast<size_t>(count) * c.size());
  for (int i = 0; i < count; ++i)
    std::copy(v.begin() + static_cast<std::ptrdiff_t>(i) * dim + c.begin,
              v.begin() + static_cast<std::ptrdiff_t>(i) * dim + c.end,
              out.begin() + static_cast<std::ptrdiff_t>(i) * c.size());
  return out;
}

/// scatter_gather (topologies::reduce_algorithm): chunk r of the own partial
/// to rank r; once the T chunks of its own chunk `me` are here, each element
/// is summed p_0 + p_1 + ... + p_{T-1} in rank order and added to x (the
/// same float operations as reduce_direct, so the same bits); the finished
/// chunk goes to every other rank; once theirs are here, x is whole. True
/// when done.
bool reduce_scatter_gather(shard_actor* self, uint64_t session, session_state& ss, int me, int T, int layer,
                           int phase) {
  auto& st = self->state;
  const auto& op = st.program[ss.pc];
  const int dim = st.init.weights->cfg().dim;
  const int count = ss.id.count;
  const auto chunks = topologies::reduce_chunks(dim, T);
  const topologies::range mine = chunks[static_cast<size_t>(me)];
  auto send_peer = [&](int r, partial_sum p) {
    caf::actor to;
    int32_t node = 0;
    if (peer_of(st, op.peers[r], to, node)) deliver(self, to, node, std::move(p));
  };
  auto skey = std::make_tuple(session, ss.id.epoch, ss.id.pos0, layer, phase);
  if (!ss.gathered) {
    auto& parts = st.partials[skey];
    if (parts.size() != static_cast<size_t>(T)) parts.resize(T);
    if (!ss.shared) {  // reduce-scatter: chunk r of the own partial to rank r
      ss.shared = true;
      for (int r = 0; r < T; ++r) {
        if (r == me) continue;
        partial_sum p{ss.id, layer, phase, me, blob{}};
        p.data.data = chunk_rows(ss.own.data, count, dim, chunks[static_cast<size_t>(r)]);
        send_peer(r, std::move(p));
      }
      parts[me].data = chunk_rows(ss.own.data, count, dim, mine);
      ss.own = blob{};
    }
    const size_t m = static_cast<size_t>(mine.size());
    for (int r = 0; r < T; ++r)
      if (parts[r].data.size() != static_cast<size_t>(count) * m) return false;  // wait for rank r's chunk
    for (int i = 0; i < count; ++i) {
      float* x = ss.x.data() + static_cast<size_t>(i) * dim + mine.begin;
      const size_t row = static_cast<size_t>(i) * m;
      for (size_t e = 0; e < m; ++e) {
        float acc = parts[0].data[row + e];
        for (int r = 1; r < T; ++r) acc += parts[r].data[row + e];
        x[e] += acc;
      }
    }
    st.partials.erase(skey);
    // All-gather: the finished chunk to every other rank.
    ss.gathered = true;
    partial_sum fin{ss.id, layer, phase + gather_phase, me, blob{}};
    fin.data.data = chunk_rows(ss.x, count, dim, mine);
    for (int r = 0; r < T; ++r)
      if (r != me) send_peer(r, fin);
  }
  auto gkey = std::make_tuple(session, ss.id.epoch, ss.id.pos0, layer, phase + gather_phase);
  auto& got = st.partials[gkey];
  if (got.size() != static_cast<size_t>(T)) got.resize(T);
  for (int r = 0; r < T; ++r)
    if (r != me && got[r].data.size() != static_cast<size_t>(count) * chunks[static_cast<size_t>(r)].size())
      return false;  // wait for rank r's finished chunk
  for (int r = 0; r < T; ++r) {
    if (r == me) continue;
    const topologies::range c = chunks[static_cast<size_t>(r)];
    for (int i = 0; i < count; ++i)
      std::copy(got[r].data.begin() + static_cast<std::ptrdiff_t>(i) * c.size(),
                got[r].data.begin() + static_cast<std::ptrdiff_t>(i + 1) * c.size(),
                ss.x.begin() + static_cast<std::ptrdiff_t>(i) * dim + c.begin);
  }
  st.partials.erase(gkey);
  return true;
}

/// The reduce op at ss.pc, by its algorithm. True when x holds the reduced
/// sum (the op is done); false while it waits for peers' messages.
bool run_reduce(shard_actor* self, uint64_t session, session_state& ss, const topologies::shard_step& op) {
  auto& st = self->state;
  const int T = static_cast<int>(op.peers.size());
  const int me = static_cast<int>(std::find(op.peers.begin(), op.peers.end(), st.init.index) - op.peers.begin());
  const int layer = op.layers.begin;
  const int phase = op.part == topologies::layer_part::ffn ? 1 : 0;
  const bool done = op.algorithm == topologies::reduce_algorithm::scatter_gather
                        ? reduce_scatter_gather(self, session, ss, me, T, layer, phase)
                        : reduce_direct(self, session, ss, me, T, layer, phase);
  if (done) {
    ss.shared = false;
    ss.gathered = false;
  }
  return done;
}

/// Executes the program of the step in flight from ss.pc as far as it can
/// (issue #15: the placement's steps as data). A compute op goes to the
/// worker (on_computed continues); a reduce waits until every peer's partial
/// is there; forward and classify send the stage's output. At the end the
/// step is done and the next queued one starts.
void run_program(shard_actor* self, uint64_t session, session_state& ss) {
  using topologies::shard_op;
  auto& st = self->state;
  const auto& prog = st.program;
  const bool replay = ss.replay_until >= 0;
  while (ss.busy && ss.pc < prog.size()) {
    const auto& op = prog[ss.pc];
    switch (op.op) {
      case shard_op::embed:  // ran on the tokens (forward_req), before the step
        ++ss.pc;
        break;
      case shard_op::compute:
        if (!ss.posted) post_compute(self, session, ss, op);
        return;  // on_computed goes on
      case shard_op::reduce:
        if (!run_reduce(self, session, ss, op)) return;  // waits for peers (the partial_sum handler resumes)
        ++ss.pc;
        break;
      case shard_op::forward: {
        checkpoint_step(self, ss);
        ++ss.pc;
        if (replay && st.init.stage >= ss.replay_until) break;  // the replay ends here
        activation a;
        a.id = ss.id;
        a.x.data = ss.pc < prog.size() ? ss.x : std::move(ss.x);
        a.compute_ns = ss.compute_ns;
        a.reply_to = ss.reply_to;
        a.replay_until = ss.replay_until;
        ss.sent[a.id.pos0] = a.x.data;  // the replay log
        send_to(self, op.peers, a);
        break;
      }
      case shard_op::classify:
        checkpoint_step(self, ss);
        ++ss.pc;
        if (!replay) post_classify(self, ss);
        break;
      case shard_op::dispatch:
      case shard_op::combine:
      case shard_op::count:
        // Refused when the wiring came (check_program): never reached.
        report(self, ss.reply_to, ss.id,
               "placement index " + std::to_string(st.init.index) + " cannot execute " + to_string(op.op));
        ss.busy = false;
        return;
    }
  }
  if (!ss.busy) return;
  checkpoint_step(self, ss);
  ss.busy = false;
  if (!ss.queued.empty()) {
    activation next = std::move(ss.queued.front());
    ss.queued.pop_front();
    start_step(self, next);
  }
}

/// The worker finished the compute op of a step: go on with the program,
/// unless the step was abandoned meanwhile (then the next queued one starts).
void on_computed(shard_actor* self, computed& c) {
  auto& st = self->state;
  st.compute_ns += c.ns;
  auto it = st.sessions.find(c.session);
  if (it == st.sessions.end()) return;  // closed meanwhile
  auto& ss = it->second;
  ss.computing = false;
  auto deferred = std::move(ss.after_job);
  ss.after_job.clear();
  for (auto& f : deferred) f();
  const bool current =
      ss.busy && ss.posted && ss.id.epoch == c.epoch && ss.id.pos0 == c.pos0 && ss.pc == c.pc;
  if (!current) {
    if (!ss.busy && !ss.queued.empty()) {
      activation next = std::move(ss.queued.front());
      ss.queued.pop_front();
      start_step(self, next);
    }
    return;
  }
  ss.x = std::move(c.x);
  ss.compute_ns += c.ns;
  ss.posted = false;
  if (c.partial) ss.own = std::move(c.out);
  ++ss.pc;
  run_program(self, c.session, ss);
}

void start_step(shard_actor* self, activation& a) {
  auto& st = self->state;
  session_state* ss = session_for(self, a.id, a.reply_to);
  if (!ss) return;
  // A job of this session on the worker holds x and writes the KV cache: a
  // step of a newer epoch waits for it (it returns stale and starts this one).
  if ((ss->busy && a.id.epoch == ss->id.epoch) || ss->computing) {
    ss->queued.push_back(std::move(a));
    return;
  }
  const auto& w = *st.init.weights;
  if (a.x.data.size() != static_cast<size_t>(a.id.count) * w.cfg().dim) {
    report(self, a.reply_to, a.id,
           "activation of " + std::to_string(a.x.data.size()) + " floats at placement index " +
               std::to_string(st.init.index) + ", expected " + std::to_string(a.id.count) + " x " +
               std::to_string(w.cfg().dim));
    return;
  }
  ss->busy = true;
  ss->id = a.id;
  ss->replay_until = a.replay_until;
  ss->x = std::move(a.x.data);
  // The step starts after the embedding (done on the tokens, forward_req).
  ss->pc = !st.program.empty() && st.program.front().op == topologies::shard_op::embed ? 1 : 0;
  ss->posted = false;
  ss->shared = false;
  ss->gathered = false;
  ss->own = blob{};
  ss->checkpointed = false;
  ss->compute_ns = a.compute_ns;
  ss->reply_to = a.reply_to;
  run_program(self, a.id.session, *ss);
}

/// Checks a wiring before the shard takes it: every op known to this build,
/// the program valid for this shard's slice (topologies::check_program), and
/// every placement index it names present in the wiring. Empty when it is fine.
std::string check_wiring(const shard_state& st, const wiring& w, std::vector<topologies::shard_step>& prog) {
  const std::string where = "placement index " + std::to_string(st.init.index) + ": ";
  prog.clear();
  for (const auto& op : w.program) {
    auto s = from_wire(op);
    if (!s) return where + s.message();
    prog.push_back(std::move(s.value()));
  }
  const auto& spec = st.init.weights->spec();
  topologies::shard me;
  me.index = st.init.index;
  me.stage = st.init.stage;
  me.rank = st.init.rank;
  me.group_size = st.init.group_size;
  me.layers = topologies::range{spec.layer_begin, spec.layer_end};
  me.has_embedding = spec.embedding;
  me.has_classifier = spec.classifier;
  if (spec.classifier) {
    const int v0 = spec.vocab_first();
    me.vocab = topologies::range{v0, v0 + spec.vocab_rows(st.init.weights->cfg().vocab_size)};
  }
  if (auto ok = topologies::check_program(me, prog); !ok) return ok.message();
  if (w.group_index.size() != w.group.size() || w.next_index.size() != w.next.size())
    return where + "the wiring's placement indices do not match its actors";
  for (size_t i = 0; i < prog.size(); ++i) {
    for (int idx : prog[i].peers) {
      const bool found = std::count(w.group_index.begin(), w.group_index.end(), idx) > 0 ||
                         std::count(w.next_index.begin(), w.next_index.end(), idx) > 0;
      if (!found)
        return where + "op " + std::to_string(i) + " (" + to_string(prog[i]) + ") names placement index " +
               std::to_string(idx) + ", which the wiring does not give";
    }
    // Partials are kept by rank: a reduce is over the group, in rank order.
    if (prog[i].op == topologies::shard_op::reduce &&
        !std::equal(prog[i].peers.begin(), prog[i].peers.end(), w.group_index.begin(), w.group_index.end()))
      return where + "op " + std::to_string(i) + " (" + to_string(prog[i]) + ") is not over the group in rank order";
  }
  return {};
}

void drop_session(shard_actor* self, uint64_t session) {
  auto& st = self->state;
  auto it = st.sessions.find(session);
  if (it != st.sessions.end()) {
    st.init.node->release(it->second.charged);
    --st.init.node->sessions;
    st.sessions.erase(it);
  }
  for (auto p = st.partials.begin(); p != st.partials.end();) {
    if (std::get<0>(p->first) == session) p = st.partials.erase(p);
    else ++p;
  }
  st.last_due.erase(session);
  st.closed.insert(session);
  if (st.closed.size() > 4096) st.closed.erase(st.closed.begin());
}

/// Applies the fault plan at a normal step; false when the step must not run
/// now (crashed, silenced, or held back by `slow`).
bool faults_allow(shard_actor* self, activation& a) {
  auto& st = self->state;
  if (!st.hooks || a.replay_until >= 0) return true;
  const auto fx = st.hooks->on_step(static_cast<uint64_t>(a.id.pos0),
                                    static_cast<uint64_t>(a.id.pos0 + a.id.count));
  const int64_t now_ns = clock_type::now().time_since_epoch().count();
  for (const auto& f : fx.fired)
    if (st.init.coordinator)
      self->send(st.init.coordinator,
                 fault_report{supervision::to_string(f.kind), st.init.index, st.init.node->index,
                              static_cast<int64_t>(f.step), now_ns, supervision::to_string(f)});
  if (fx.crash || fx.silence) return false;  // the hooks quit or silenced the actor
  st.drop_left += fx.drop;
  st.corrupt_left += fx.corrupt;
  if (fx.delay_count > 0) st.init.node->shaper->add_delay(fx.delay, fx.delay_count);
  if (fx.partition) {
    // Unreachable for a while: nothing in or out, heartbeats included.
    const auto d = fx.partition_for ? caf::timespan(*fx.partition_for) : caf::timespan(std::chrono::hours(24 * 365));
    st.partitioned_until = self->clock().now() + d;
    if (st.init.heartbeat) self->send(st.init.heartbeat, supervision::hb_silence_atom::value, d);
    return false;
  }
  if (fx.slow.count() > 0) {
    st.slowed.push_back(std::move(a));
    self->delayed_send(self, fx.slow, resume_atom::value);
    return false;
  }
  return true;
}

/// A step message that came before the shard's first wiring waits for it
/// (bounded: beyond 4096 the step is dropped, and the session re-sends it).
void hold_until_wired(shard_actor* self, caf::message m) {
  auto& st = self->state;
  if (st.unwired.size() < 4096) st.unwired.push_back(std::move(m));
}

caf::behavior shard_behavior(shard_actor* self, shard_init init) {
  auto& st0 = self->state;
  st0.init = std::move(init);
  st0.worker = std::make_unique<compute_worker>("shard-" + std::to_string(st0.init.index));
  if (st0.init.faults) {
    st0.hooks = std::make_unique<supervision::fault_hooks>(
        self, static_cast<uint32_t>(st0.init.index), st0.init.faults);
    st0.hooks->set_heartbeat_sender(st0.init.heartbeat);
  }
  self->attach_functor([node = st0.init.node, bytes = st0.init.weights->bytes()] {
    node->release(bytes);
  });
  // A silenced shard behaves like a frozen node: it handles nothing.
  auto silent = [self] {
    auto& st = self->state;
    return (st.hooks && st.hooks->silenced()) || self->clock().now() < st.partitioned_until;
  };
  caf::message_handler own{
      [=](wire_atom, wiring w) -> caf::result<void> {
        auto& st = self->state;
        std::vector<topologies::shard_step> prog;
        if (auto why = check_wiring(st, w, prog); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, why);
        st.wires = std::move(w);
        st.program = std::move(prog);
        if (st.wired) return {};
        st.wired = true;
        for (auto& m : st.unwired) self->send(self, std::move(m));
        st.unwired.clear();
        return {};
      },
      // Embedding holder: tokens -> x, broadcast to the stage's group.
      [=](forward_req& req) {
        if (silent()) return;
        auto& st = self->state;
        if (!st.wired) return hold_until_wired(self, caf::make_message(std::move(req)));
        const auto& w = *st.init.weights;
        const int dim = w.cfg().dim;
        activation a;
        a.id = req.id;
        a.reply_to = req.reply_to;
        a.replay_until = req.replay_until;
        a.x.data.resize(static_cast<size_t>(req.tokens.size()) * dim);
        for (size_t i = 0; i < req.tokens.size(); ++i) {
          const int t = req.tokens[i];
          if (t < 0 || t >= w.cfg().vocab_size) {
            report(self, req.reply_to, req.id,
                   "token id " + std::to_string(t) + " outside the vocabulary [0," +
                       std::to_string(w.cfg().vocab_size) + ")");
            return;
          }
          w.embed(t, a.x.data.data() + i * dim);
        }
        // The program's embed op: x to its peers (the stage's group, rank order).
        if (st.program.empty() || st.program.front().op != topologies::shard_op::embed) {
          report(self, req.reply_to, req.id,
                 "tokens sent to placement index " + std::to_string(st.init.index) + ", whose program has no embed op");
          return;
        }
        send_to(self, st.program.front().peers, a);
      },
      [=](activation& a) {
        if (silent()) return;
        auto& st = self->state;
        if (!st.wired) return hold_until_wired(self, caf::make_message(std::move(a)));
        if (self->current_sender() != self->ctrl()) st.bytes_received += payload_bytes(a.x);
        if (!a.x.ok()) {
          report(self, a.reply_to, a.id,
                 "corrupt activation payload (checksum mismatch) received at placement index " +
                     std::to_string(st.init.index),
                 true);
          return;
        }
        if (!faults_allow(self, a)) return;
        start_step(self, a);
      },
      [=](resume_atom) {
        if (silent() || self->state.slowed.empty()) return;
        activation a = std::move(self->state.slowed.front());
        self->state.slowed.erase(self->state.slowed.begin());
        start_step(self, a);
      },
      [=](partial_sum& p) {
        if (silent()) return;
        auto& st = self->state;
        if (!st.wired) return hold_until_wired(self, caf::make_message(std::move(p)));
        st.bytes_received += payload_bytes(p.data);
        if (st.closed.count(p.id.session)) return;
        auto it = st.sessions.find(p.id.session);
        if (it != st.sessions.end() && p.id.epoch < it->second.epoch) return;  // stale
        if (!p.data.ok()) {
          report(self, it != st.sessions.end() ? it->second.reply_to : caf::actor{}, p.id,
                 "corrupt partial sum (checksum mismatch) from rank " + std::to_string(p.rank) +
                     " at placement index " + std::to_string(st.init.index),
                 true);
          return;
        }
        if (p.rank < 0 || p.rank >= st.init.group_size) return;
        auto key = std::make_tuple(p.id.session, p.id.epoch, p.id.pos0, p.layer, p.phase);
        auto& parts = st.partials[key];
        if (parts.size() != static_cast<size_t>(st.init.group_size)) parts.resize(st.init.group_size);
        parts[p.rank] = std::move(p.data);
        // The step waits in the reduce of this (layer, half): it may go on.
        if (it != st.sessions.end() && it->second.busy && it->second.id.epoch == p.id.epoch &&
            it->second.id.pos0 == p.id.pos0 && it->second.pc < st.program.size()) {
          const auto& op = st.program[it->second.pc];
          if (op.op == topologies::shard_op::reduce && op.layers.begin == p.layer &&
              (op.part == topologies::layer_part::ffn ? 1 : 0) == (p.phase & 1))
            run_program(self, p.id.session, it->second);
        }
      },
      // Restarted shard: the session's KV cache from its checkpoint deltas.
      [=](restore_req& r) -> caf::result<restore_atom, int32_t> {
        if (silent()) return caf::make_error(caf::sec::request_timeout);
        auto& st = self->state;
        step_id id{r.session, r.epoch, 0, 0};
        session_state* ss = session_for(self, id, caf::actor{});
        if (!ss) return caf::make_error(caf::sec::invalid_argument, "no memory or session closed");
        auto apply = [](session_state& ss, const restore_req& r) {
          int32_t end = 0;
          for (size_t i = 0; i < r.parts.size(); ++i) {
            if (!r.parts[i].ok()) break;
            const size_t want = static_cast<size_t>(r.ends[i] - r.begins[i]) * 2 *
                                ss.kv->n_layers() * ss.kv->kv_dim();
            if (r.parts[i].data.size() != want || r.begins[i] != end) break;
            ss.kv->restore(r.begins[i], r.ends[i], r.parts[i].data);
            end = r.ends[i];
          }
          ss.ckpt_end = end;
          return end;
        };
        (void)st;
        if (ss->computing) {
          // The job in flight writes this KV cache: restore once it returns.
          auto rp = self->make_response_promise<restore_atom, int32_t>();
          ss->after_job.push_back([ss, apply, r = std::move(r), rp]() mutable {
            rp.deliver(restore_atom::value, apply(*ss, r));
          });
          return rp;
        }
        return {restore_atom::value, apply(*ss, r)};
      },
      // Upstream of a restarted stage: re-send [from, to) from the replay log.
      [=](replay_atom, uint64_t session, uint32_t epoch, int32_t from, int32_t to,
          int32_t until) -> caf::result<bool> {
        if (silent()) return caf::make_error(caf::sec::request_timeout);
        auto& st = self->state;
        auto it = st.sessions.find(session);
        const topologies::shard_step* fwd = forward_op(st);
        if (it == st.sessions.end() || !fwd) return false;
        auto& ss = it->second;
        const int dim = st.init.weights->cfg().dim;
        // Collect rows [from, to) from the logged batches.
        std::vector<float> rows;
        int32_t at = from;
        for (auto e = ss.sent.upper_bound(from); at < to;) {
          if (e == ss.sent.begin()) return false;
          auto b = std::prev(e);
          const int32_t b0 = b->first, bn = static_cast<int32_t>(b->second.size() / dim);
          if (at < b0 || at >= b0 + bn) return false;  // a gap: the log cannot serve it
          const int32_t take = std::min(to, b0 + bn) - at;
          rows.insert(rows.end(), b->second.begin() + static_cast<size_t>(at - b0) * dim,
                      b->second.begin() + static_cast<size_t>(at - b0 + take) * dim);
          at += take;
          e = ss.sent.upper_bound(at);
        }
        if (at != to || rows.empty()) return false;
        activation a;
        a.id = step_id{session, epoch, from, to - from};
        a.x.data = std::move(rows);
        a.reply_to = ss.reply_to;
        a.replay_until = until;
        send_to(self, fwd->peers, a);
        return true;
      },
      [=](trim_atom, uint64_t session, int32_t below) {
        auto it = self->state.sessions.find(session);
        if (it == self->state.sessions.end()) return;
        const int dim = self->state.init.weights->cfg().dim;
        auto& sent = it->second.sent;
        for (auto e = sent.begin(); e != sent.end();) {
          if (e->first + static_cast<int32_t>(e->second.size() / dim) <= below) e = sent.erase(e);
          else ++e;
        }
      },
      // Measure the link to `dest` (on node `dest_node`): a tiny message, then
      // n messages of `bytes` back to back, through this node's shaper.
      [=](probe_atom, caf::actor dest, int32_t dest_node, int32_t n, int32_t bytes, caf::actor reply_to) {
        auto& st = self->state;
        // Seqs 0..tiny-1 are tiny (the smallest transit is the latency), the
        // rest carry `bytes` each (their inter-arrival times give the bandwidth).
        constexpr int32_t tiny = 5;
        for (int32_t seq = 0; seq < n + tiny; ++seq) {
          probe_msg m;
          m.seq = seq;
          m.n = n + tiny - 1;
          m.from_node = st.init.node->index;
          m.payload.data.resize(seq < tiny ? 4 : static_cast<size_t>(bytes) / sizeof(float));
          m.reply_to = reply_to;
          m.sent_ns = clock_type::now().time_since_epoch().count();
          const auto delay = st.init.node->shaper->schedule(dest_node, payload_bytes(m.payload));
          if (delay.count() > 0) self->delayed_send(dest, delay, std::move(m));
          else self->send(dest, std::move(m));
        }
      },
      [=](probe_msg& m) {
        auto& st = self->state;
        constexpr int32_t tiny = 5;
        const int64_t now = clock_type::now().time_since_epoch().count();
        // arr[0] = smallest transit of the tiny messages; then arrival times.
        auto& arr = st.probes[{m.reply_to, m.from_node}];
        if (m.seq == 0) arr.assign(1, now - m.sent_ns);
        else if (m.seq < tiny && !arr.empty()) arr[0] = std::min(arr[0], now - m.sent_ns);
        else if (m.seq >= tiny) arr.push_back(now);
        if (m.seq < m.n) return;
        probe_result r;
        r.from = m.from_node;
        r.to = st.init.node->index;
        r.latency_us = arr.empty() ? 0 : arr[0] / 1000.0;
        const uint64_t msg_bytes = payload_bytes(m.payload);
        if (arr.size() >= 3 && arr.back() > arr[1])  // k - 1 gaps between k arrivals
          r.bandwidth_bps = 8.0 * msg_bytes * (arr.size() - 2) / ((arr.back() - arr[1]) / 1e9);
        r.bytes = msg_bytes * static_cast<uint64_t>(m.n - tiny + 1);
        st.probes.erase({m.reply_to, m.from_node});
        self->send(m.reply_to, r);
      },
      [=](close_atom, uint64_t session) { drop_session(self, session); },
      [=](computed& c) {
        if (silent()) {
          // Frozen or partitioned: the result is lost with everything else,
          // but the session may send again once the partition ends.
          auto it = self->state.sessions.find(c.session);
          if (it != self->state.sessions.end()) {
            it->second.computing = false;
            it->second.after_job.clear();
          }
          return;
        }
        on_computed(self, c);
      },
      [=](classified& c) {
        auto& st = self->state;
        st.compute_ns += c.ns;
        st.classifying.erase({c.id.session, c.id.pos0});
        if (st.closed.count(c.id.session) || silent()) return;
        logits_msg m;
        m.id = c.id;
        m.logits = std::move(c.logits);
        m.compute_ns = c.compute_ns + c.ns;
        m.vocab_begin = c.vocab_begin;
        deliver(self, c.reply_to, front_end_node, std::move(m));
      },
      // Liveness (issue #20): answered at once, even while a step computes on
      // the worker; a silenced or partitioned shard never answers (as a frozen
      // node would not), so the asker's timeout decides.
      [=](alive_atom) -> caf::result<alive_atom, int32_t> {
        if (silent()) return self->make_response_promise<alive_atom, int32_t>();
        return {alive_atom::value, self->state.init.node->index};
      },
      // Step probe (issue #20): is the step at (session, epoch, pos0) being
      // worked on here (computing, queued, held back, classifying: 1) or not
      // (0), and when does this shard's last payload of the session arrive
      // (steady ns; 0 if none)? The session re-sends only when nobody works
      // on its step and nothing is in transit.
      [=](step_query_atom, uint64_t session, uint32_t epoch, int32_t pos0)
          -> caf::result<int32_t, int64_t> {
        if (silent()) return self->make_response_promise<int32_t, int64_t>();
        auto& st = self->state;
        int32_t working = 0;
        auto it = st.sessions.find(session);
        if (it != st.sessions.end()) {
          const auto& ss = it->second;
          auto same = [&](const step_id& id) { return id.epoch == epoch && id.pos0 == pos0; };
          // Computing it on the worker. A rank that only waits for its
          // peers' partial sums is not working: a partial still on its way
          // shows in the peer's due time, a lost one in nothing.
          if (ss.busy && ss.computing && same(ss.id)) working = 1;
          // A queued copy of the step progresses only behind a step that is
          // computing; behind one that waits for a peer's partial sums (the
          // peer dropped that step, e.g. a recovery's replay during a
          // partition) it never starts, and the session must re-send.
          if (ss.computing)
            for (const auto& q : ss.queued)
              if (same(q.id)) working = 1;
        }
        for (const auto& a : st.slowed)
          if (a.id.session == session && a.id.epoch == epoch && a.id.pos0 == pos0) working = 1;
        if (st.classifying.count({session, pos0})) working = 1;
        auto d = st.last_due.find(session);
        return {working, d == st.last_due.end() ? int64_t{0} : d->second};
      },
      // Indirect probe (SWIM): ask `target` for a liveness answer on behalf of
      // the coordinator, over this node's own connection to it.
      [=](probe_peer_atom, caf::actor target, caf::timespan timeout) -> caf::result<bool> {
        if (silent()) return self->make_response_promise<bool>();
        auto rp = self->make_response_promise<bool>();
        self->request(target, timeout, alive_atom::value)
            .then([rp](alive_atom, int32_t) mutable { rp.deliver(true); },
                  [rp](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
      [=](stats_atom) {
        auto& st = self->state;
        shard_stats s;
        s.node = st.init.node->index;
        s.index = st.init.index;
        s.weight_bytes = st.init.weights->bytes();
        for (auto& kv : st.sessions) s.kv_bytes += kv.second.charged;
        s.sessions = static_cast<int32_t>(st.sessions.size());
        s.compute_ns = st.compute_ns;
        s.bytes_sent = st.bytes_sent;
        s.bytes_received = st.bytes_received;
        for (auto& l : st.link_bytes) {
          s.link_to.push_back(l.first);
          s.link_bytes.push_back(l.second);
        }
        return s;
      },
  };
  if (st0.hooks) return own.or_else(st0.hooks->handler());
  return own;
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, shard_init init) {
  // Charged before the actor starts, so the node's figure is right at once;
  // released when the actor terminates.
  init.node->used_bytes += init.weights->bytes();
  return sys.spawn(shard_behavior, std::move(init));
}

}  // namespace cellshard::actors
