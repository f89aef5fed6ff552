#include "actors/shard.hpp"
#include "actors/shard_state.hpp"

#include "actors/data_plane.hpp"
#include "actors/fault_env.hpp"
#include "actors/links.hpp"
#include "actors/worker.hpp"
#include "kernels/backend.hpp"
#include "model/moe.hpp"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

namespace cellshard::actors {

namespace {

using shard_detail::classified;
using shard_detail::computed;
using shard_detail::expert_done;
using shard_detail::fused_inbox;
using shard_detail::routed;
using shard_detail::fused_router;
using shard_detail::payload_bytes;
using shard_detail::session_state;
using shard_detail::shard_state;
using clock_type = std::chrono::steady_clock;
/// A stage shard's expert request was not answered in time:
/// (moe_tmo, session, epoch, pos0, layer, seq). Self-sent only.
using moe_tmo_atom = caf::atom_constant<caf::atom("cs_moetmo")>;
/// How long an expert request may go unanswered before the stage shard
/// re-dispatches it to another holder (a live replica; the same node again
/// when it has none: a lost message), doubled per attempt; and the attempts
/// before the step is given back to the session (shard_error with retry).
/// Shorter than the heartbeat detector's verdict on a silent node (~0.4-0.8 s
/// here), so a replica takes over first; an answer that was only late is
/// harmless (the first of identical outputs counts).
constexpr std::chrono::milliseconds expert_timeout{300};
constexpr int expert_max_attempts = 6;

int64_t since_ns(clock_type::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
}

using shard_actor = caf::stateful_actor<shard_state>;


/// `--sync q8_0`: rounds a partial sum (or a reduced chunk) onto the q8_0
/// grid before its sender uses or sends it (topologies::sync_format).
void to_sync_format(blob& b, topologies::sync_format f) {
  if (f != topologies::sync_format::q8_0) return;
  kernels::round_to_q8(b.data.data(), b.data.size());
  b.q8 = true;
}

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
blob* payload_of(expert_req& m) { return &m.xb; }
blob* payload_of(expert_out& m) { return &m.y; }
uint64_t session_of(const expert_req& m) { return m.id.session; }
uint64_t session_of(const expert_out& m) { return m.id.session; }
uint64_t session_of(const activation& m) { return m.id.session; }
uint64_t session_of(const partial_sum& m) { return m.id.session; }
uint64_t session_of(const logits_msg& m) { return m.id.session; }
uint64_t session_of(const kv_delta& m) { return m.session; }

/// Other payloads than partial sums and activations always take CAF.
template <class T>
bool send_data(shard_actor*, const caf::actor&, const T&) {
  return false;
}

/// The data plane's name for `to`'s process (actors/data_plane.hpp).
const std::string& dp_peer(shard_actor* self, const caf::actor& to) {
  auto& names = self->state.peer_names;
  auto it = names.find(to.node());
  if (it == names.end()) it = names.emplace(to.node(), caf::to_string(to.node())).first;
  return it->second;
}

/// Asks `to` for its daemon's data-plane endpoint when the plane wants it
/// (once per peer without a link); the link comes up in the background.
void ask_link(shard_actor* self, const caf::actor& to, const std::shared_ptr<data_plane>& dp,
              const std::string& peer) {
  if (dp->should_ask(peer))
    self->request(to, std::chrono::seconds(2), dp_addr_atom::value)
        .then([dp, peer](std::string& host, uint16_t port, uint64_t key) { dp->dial(peer, {host, port, key}); },
              [dp, peer](caf::error&) { dp->ask_failed(peer); });
}

/// A partial sum to a shard of another daemon over the data plane
/// (actors/data_plane.hpp) when its link is up; false: send it through CAF.
/// The first one to a daemon asks its endpoint (a CAF request to that shard)
/// and the link comes up in the background.
bool send_data(shard_actor* self, const caf::actor& to, const partial_sum& m) {
  const auto& dp = self->state.init.node->data;
  if (!dp || !to || to.node() == self->node()) return false;
  const std::string& peer = dp_peer(self, to);
  if (dp->send(peer, to.id(), m)) return true;
  ask_link(self, to, dp, peer);
  return false;
}

/// An activation to a shard of another daemon: as a data-plane frame (no
/// reply_to) when the link is up and an activation of the same (session,
/// epoch) already went to that shard through CAF; otherwise false (the
/// caller sends it through CAF, with reply_to, and the receiver remembers
/// reply_to for the frames of that epoch). Per destination: a broadcast (the
/// embedding holder to a tensor group) sends each rank its own first one.
bool send_data(shard_actor* self, const caf::actor& to, const activation& m) {
  auto& st = self->state;
  const auto& dp = st.init.node->data;
  if (!dp || !to || to.node() == self->node()) return false;
  const std::string& peer = dp_peer(self, to);
  const uint64_t mark = uint64_t{m.id.epoch} + 1;
  auto& last = st.act_via_caf[std::make_tuple(to.node(), to.id(), m.id.session)];
  if (last == mark && dp->send(peer, to.id(), m)) return true;
  last = mark;  // this one goes through CAF, carrying reply_to
  ask_link(self, to, dp, peer);
  return false;
}

/// Sends a data message over this node's link to `node`: counted, then as
/// the shard's link environment says (actors/links.hpp): dropped, corrupted,
/// delivered after the delay of the shaper and of a `delay` fault.
template <class T>
void deliver(shard_actor* self, const caf::actor& to, int32_t node, T msg) {
  auto& st = self->state;
  const uint64_t bytes = payload_bytes(*payload_of(msg));
  count_sent(self, node, bytes);
  if (node == st.init.node->index) {  // same node: no link
    self->send(to, std::move(msg));
    return;
  }
  const auto verdict = st.faults->links().send(node, bytes);
  if (verdict.drop) return;
  if (verdict.corrupt) corrupt_payload(*payload_of(msg));
  const auto delay = verdict.delay;
  // When the last payload of this session reaches its receiver: a step
  // probe (step_query) reports it, so a message still crossing a slow link
  // is not taken for a lost one.
  auto& due = st.last_due[session_of(msg)];
  due = std::max<int64_t>(due, (clock_type::now() + delay).time_since_epoch().count());
  if (delay.count() > 0) self->delayed_send(to, delay, std::move(msg));
  else if (!send_data(self, to, msg)) self->send(to, std::move(msg));
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
      st.fused->abort(id.session);  // a fused job of the older epoch stops waiting
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

bool compute_layers(const model::shard_weights& w, const kernels::backend* be, model::kv_cache& kv,
                    model::scratch& scr, int l0, int l1, bool attention, bool ffn, bool partial, int count,
                    int chunk, int32_t pos0, std::vector<float>& x, std::vector<float>& outv,
                    const std::atomic<bool>& cancelled);

/// Marks `ss` as computing the step at `pc` and starts its `computed` result
/// (the session's step id and activations, moved out of `ss`): what every job
/// posted to the worker begins with (post_compute, post_fused).
computed start_job(uint64_t session, session_state& ss, size_t pc) {
  ss.computing = true;
  ss.posted = true;
  computed c;
  c.session = session;
  c.epoch = ss.id.epoch;
  c.pos0 = ss.id.pos0;
  c.pc = pc;
  c.x = std::move(ss.x);
  return c;
}

/// Posts the compute op `op` (at ss.pc) to the worker; its result comes back
/// as a `computed` message (on_computed).
void post_compute(shard_actor* self, uint64_t session, session_state& ss, const topologies::shard_step& op) {
  auto& st = self->state;
  computed c = start_job(session, ss, ss.pc);
  c.partial = op.partial;
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
    const auto t0 = clock_type::now();
    if (!compute_layers(*weights, be, *kv, *scr, l0, l1, attention, ffn, c.partial, count, chunk, c.pos0, c.x,
                        c.out.data, cancelled))
      return;  // the shard is going away
    c.ns = since_ns(t0);
    if (auto to = caf::actor_cast<caf::actor>(me)) caf::anon_send(to, std::move(c));
  });
}

/// A compute op's kernels on the worker: layers [l0, l1), their attention
/// and/or FFN halves, over `count` positions from pos0 of x ([count x dim]).
/// out gets the last half's output; unless `partial`, each half's output is
/// added to x. False when `cancelled` became true (the shard is going away).
bool compute_layers(const model::shard_weights& w, const kernels::backend* be, model::kv_cache& kv,
                    model::scratch& scr, int l0, int l1, bool attention, bool ffn, bool partial, int count,
                    int chunk, int32_t pos0, std::vector<float>& x, std::vector<float>& outv,
                    const std::atomic<bool>& cancelled) {
  const int dim = w.cfg().dim;
  const size_t n = static_cast<size_t>(count) * dim;
  outv.resize(n);
  for (int layer = l0; layer < l1; ++layer)
    for (int phase = 0; phase < 2; ++phase) {
      if ((phase == 0 && !attention) || (phase == 1 && !ffn)) continue;
      // One position alone as before; more in chunks of `chunk` positions
      // (bit-identical: model::*_partial_batch).
      for (int i = 0; i < count; i += chunk) {
        if (cancelled) return false;
        const int m = std::min(chunk, count - i);
        const float* xi = x.data() + static_cast<size_t>(i) * dim;
        float* out = outv.data() + static_cast<size_t>(i) * dim;
        if (m == 1) {
          if (phase == 0)
            model::attention_partial(*be, w, layer, xi, pos0 + i, kv, scr, out);
          else
            model::ffn_partial(*be, w, layer, xi, scr, out);
        } else if (phase == 0) {
          model::attention_partial_batch(*be, w, layer, xi, pos0 + i, m, kv, scr, out);
        } else {
          model::ffn_partial_batch(*be, w, layer, xi, m, scr, out);
        }
      }
      if (partial) continue;  // a TP slice's partial: the reduce adds it
      // A shard alone in its group: x += the half's output (as the reduce
      // of a group of one would), so a step costs one hand-off, not 2 per layer.
      const float* p = outv.data();
      for (size_t i = 0; i < n; ++i) x[i] += p[i];
    }
  return true;
}

/// One (compute, reduce) pair of a fused job.
struct fused_op {
  int l0 = 0, l1 = 0;
  bool attention = true, ffn = true;
  int32_t layer = 0, phase = 0;  // the reduce's key
  topologies::sync_format sync = topologies::sync_format::f32;
};

/// A peer a fused job sends its partials to.
struct fused_target {
  std::string peer;  // data plane key
  caf::actor to;     // CAF fallback (a link that broke meanwhile)
  int32_t node = 0;
};

/// How long a fused job waits for its peers' partials of one reduction before
/// it gives the step back to the actor (whose reduce then waits as before: a
/// dead or frozen peer is the session's business). Well above a loaded host's
/// scheduling delays; a longer compute (a prefill) waits in proportion.
constexpr std::chrono::milliseconds fused_wait{250};
/// How long a fused job waits for its peers' partials, beyond its own
/// compute's time, before it lets another queued job run (run_fused).
constexpr std::chrono::milliseconds fused_yield{25};

/// A fused job (post_fused) and where it is: op `at`, and whether that op's
/// own partial was already computed and sent (a job that yielded the worker
/// resumes at the wait).
struct fused_job {
  computed c;
  std::vector<fused_op> ops;
  std::vector<fused_target> targets;
  int count = 0, chunk = 1, T = 0, me = 0;
  step_id id;
  std::shared_ptr<const model::shard_weights> weights;
  const kernels::backend* be = nullptr;
  std::shared_ptr<model::kv_cache> kv;
  std::shared_ptr<model::scratch> scr;
  caf::actor_addr self_addr;
  std::shared_ptr<kernels::pool> kpool;
  std::shared_ptr<data_plane> plane;
  std::shared_ptr<fused_router> router;
  compute_worker* worker = nullptr;
  size_t at = 0;
  bool waiting = false;  // ops[at]'s partial is out; `own` holds it
  blob own;
  std::map<int32_t, uint64_t> sent;
  // The reduction's deadline (fused_wait + 4 x the compute), kept across yields.
  clock_type::time_point until{};
};

/// Runs (or resumes) a fused job on the worker. While it waits for its
/// peers' partials with another job queued behind it on the worker (another
/// session's step), it yields: after its own compute's time and fused_yield
/// more it lets the first queued job run, then resumes (compute_worker::
/// post_next). Going to the back of the queue instead made convoys: every
/// yield reordered the rank's sessions again, and 1-3 s stalls followed. Two ranks that took
/// two sessions in opposite orders (the activations of a previous stage, or
/// of 8 concurrent sessions, arrive at a group's ranks in any order) would
/// otherwise each wait for the other until fused_wait ran out, at every
/// reduction: the 2026-12-07 lab (daemons at 12% of a core, batch 8) took
/// 7-22 s to a first token and, in 2 of 3 hybrid:2x4 runs, 7.9-8.2 s per
/// token instead of ~0.2. Giving the step back to the actor instead (whose
/// reduce does not hold the worker) cured that but ran 2.4-2.7x slower.
void run_fused(const std::shared_ptr<fused_job>& job, const std::atomic<bool>& cancelled) {
  fused_job& j = *job;
  computed& c = j.c;
  kernels::pool::scope use_pool(j.kpool.get());
  const size_t n = static_cast<size_t>(j.count) * j.weights->cfg().dim;
  auto& router = j.router;
  // Unless CELLSHARD_DATA_PLANE=nolend: this thread reads the inbound links itself
  // while the job runs (one wake-up per partial's arrival instead of a
  // reader thread's and then this one's); otherwise, or while another
  // shard's job holds them, it waits on the router's cv.
  struct lent_reading {
    data_plane* p;
    bool on;
    ~lent_reading() {
      if (on) p->give_back();
    }
  } lent{j.plane.get(), router->lend && j.plane->lend()};
  for (; j.at < j.ops.size(); ++j.at) {
    const auto& f = j.ops[j.at];
    {
      std::lock_guard<std::mutex> g(router->mu);
      if (c.inbox->abort) break;  // the step was abandoned: the actor starts the next
    }
    int64_t ns = 0;
    if (!j.waiting) {
      const auto t0 = clock_type::now();
      j.own = blob{};
      if (!compute_layers(*j.weights, j.be, *j.kv, *j.scr, f.l0, f.l1, f.attention, f.ffn, true, j.count, j.chunk,
                          j.id.pos0, c.x, j.own.data, cancelled))
        return;  // the shard is going away
      ns = since_ns(t0);
      c.ns += ns;
      to_sync_format(j.own, f.sync);
      const partial_sum p{j.id, f.layer, f.phase, j.me, j.own};
      const uint64_t bytes = payload_bytes(j.own);
      for (const auto& t : j.targets) {
        j.sent[t.node] += bytes;
        if (!j.plane->send(t.peer, t.to.id(), p)) caf::anon_send(t.to, p);
      }
      j.waiting = true;
      j.until = clock_type::now() + fused_wait + std::chrono::nanoseconds(4 * ns);
    }
    std::vector<blob> parts;
    {
      std::unique_lock<std::mutex> lk(router->mu);
      const auto key = std::make_pair(f.layer, f.phase);
      auto ready = [&] {
        auto it = c.inbox->parts.find(key);
        if (it == c.inbox->parts.end() || it->second.size() != static_cast<size_t>(j.T)) return false;
        for (int r = 0; r < j.T; ++r)
          if (r != j.me && it->second[static_cast<size_t>(r)].data.size() != n) return false;
        return true;
      };
      // Partials usually come within a peer's compute of this one's; a peer
      // on a capped node may take several CPU-quota periods longer.
      const auto yield_at = clock_type::now() + std::chrono::nanoseconds(ns) + fused_yield;
      while (!ready() && !c.inbox->abort && !cancelled && clock_type::now() < j.until) {
        if (clock_type::now() >= yield_at && j.worker->pending() > 1) {
          // Another job is queued: let it run, then resume right after it.
          lk.unlock();
          auto self = job;
          j.worker->post_next([self](const std::atomic<bool>& cancelled_again) { run_fused(self, cancelled_again); });
          return;
        }
        if (!lent.on) {
          router->cv.wait_for(lk, std::chrono::milliseconds(10));
          continue;
        }
        lk.unlock();  // the frames pump() reads go through the sink, which takes router->mu
        j.plane->pump(std::chrono::milliseconds(10));
        lk.lock();
      }
      if (!ready()) {  // the actor's reduce waits for the rest
        c.shared = true;
        c.out = std::move(j.own);
        break;
      }
      auto it = c.inbox->parts.find(key);
      parts = std::move(it->second);
      c.inbox->parts.erase(it);
    }
    j.waiting = false;
    // x += p_0 + p_1 + ... + p_{T-1}, as reduce_direct sums them.
    parts[static_cast<size_t>(j.me)] = std::move(j.own);
    std::vector<float> acc = std::move(parts[0].data);
    for (int r = 1; r < j.T; ++r) {
      const float* p = parts[static_cast<size_t>(r)].data.data();
      for (size_t i = 0; i < n; ++i) acc[i] += p[i];
    }
    for (size_t i = 0; i < n; ++i) c.x[i] += acc[i];
  }
  c.next_pc = c.pc + 2 * j.at + (c.shared ? 1 : 0);
  c.sent.assign(j.sent.begin(), j.sent.end());
  if (auto to = caf::actor_cast<caf::actor>(j.self_addr)) caf::anon_send(to, std::move(c));
}

/// The tensor group's hot loop without hand-offs (issue #19): when the op at
/// ss.pc starts a run of (compute partial, reduce direct_rank_order) pairs
/// over peers of other daemons whose data-plane links are up, and nothing on
/// this shard injects faults or shapes links, the whole run goes to the worker
/// as one job. The job computes a layer half, sends its partial to every peer
/// over the data plane from its own thread, waits for theirs in the step's
/// inbox (fused_router: the data plane's reader threads put them there), adds
/// them in rank order exactly as reduce_direct does (the same float
/// operations: the same bits), and goes on with the next layer half. Before,
/// each reduction cost three hand-offs between threads per rank (the worker's
/// result to the actor, each peer's partial to the actor, the next compute to
/// the worker); measured on 4 daemons on 2 cores, context switches were the
/// largest cost (docs/distributed.md). False when the op does not qualify:
/// post_compute then runs it as before.
bool post_fused(shard_actor* self, uint64_t session, session_state& ss) {
  using topologies::shard_op;
  auto& st = self->state;
  const auto& prog = st.program;
  if (!st.init.node) return false;
  const auto& dp = st.init.node->data;
  if (!dp || !st.fused->enabled || st.faults->injects() || st.faults->links_armed() || !st.init.node->shaper ||
      st.init.node->shaper->shaped())
    return false;
  std::vector<fused_op> ops;
  const size_t pc0 = ss.pc;
  for (size_t pc = pc0; pc + 1 < prog.size(); pc += 2) {
    const auto& c = prog[pc];
    const auto& r = prog[pc + 1];
    if (c.op != shard_op::compute || !c.partial || r.op != shard_op::reduce ||
        r.algorithm != topologies::reduce_algorithm::direct_rank_order || r.peers != prog[pc0 + 1].peers)
      break;
    fused_op f;
    f.l0 = c.layers.begin;
    f.l1 = c.layers.end;
    f.attention = c.part != topologies::layer_part::ffn;
    f.ffn = c.part != topologies::layer_part::attention;
    f.layer = r.layers.begin;
    f.phase = r.part == topologies::layer_part::ffn ? 1 : 0;
    f.sync = r.sync;
    ops.push_back(f);
  }
  if (ops.empty()) return false;
  const auto& peers = prog[pc0 + 1].peers;
  const int T = static_cast<int>(peers.size());
  const int me = static_cast<int>(std::find(peers.begin(), peers.end(), st.init.index) - peers.begin());
  if (T < 2 || me >= T || T != st.fused->group_size) return false;
  std::vector<fused_target> targets;
  for (int r = 0; r < T; ++r) {
    if (r == me) continue;
    fused_target t;
    if (!peer_of(st, peers[static_cast<size_t>(r)], t.to, t.node) || !t.to || t.to.node() == self->node() ||
        t.node == st.init.node->index)
      return false;
    auto it = st.peer_names.find(t.to.node());
    if (it == st.peer_names.end()) return false;  // no partial sent there yet: send_data asks for the link
    t.peer = it->second;
    if (!dp->link_up(t.peer)) return false;
    targets.push_back(std::move(t));
  }
  // The step's inbox, with what already came for it.
  auto inbox = std::make_shared<fused_inbox>();
  inbox->epoch = ss.id.epoch;
  inbox->pos0 = ss.id.pos0;
  for (const auto& f : ops) {
    auto it = st.partials.find(std::make_tuple(session, ss.id.epoch, ss.id.pos0, f.layer, f.phase));
    if (it == st.partials.end()) continue;
    inbox->parts[{f.layer, f.phase}] = std::move(it->second);
    st.partials.erase(it);
  }
  auto router = st.fused;
  {
    std::lock_guard<std::mutex> g(router->mu);
    router->by_session[session] = inbox;
  }
  computed c = start_job(session, ss, pc0);
  c.fused = true;
  c.inbox = inbox;
  const int count = ss.id.count;
  const int chunk = std::max(1, st.init.batch_size);
  const step_id id = ss.id;
  auto weights = st.init.weights;
  const kernels::backend* be = st.init.backend;
  auto kv = ss.kv;
  auto scr = ss.s;
  caf::actor_addr self_addr = self->address();
  std::shared_ptr<kernels::pool> kpool = st.init.node->kernel_pool;
  std::shared_ptr<data_plane> plane = dp;
  auto job = std::make_shared<fused_job>();
  job->c = std::move(c);
  job->ops = std::move(ops);
  job->targets = std::move(targets);
  job->count = count;
  job->chunk = chunk;
  job->id = id;
  job->T = T;
  job->me = me;
  job->weights = std::move(weights);
  job->be = be;
  job->kv = std::move(kv);
  job->scr = std::move(scr);
  job->self_addr = self_addr;
  job->kpool = std::move(kpool);
  job->plane = std::move(plane);
  job->router = std::move(router);
  job->worker = st.worker.get();  // outlives its jobs: its destructor joins the thread
  st.worker->post([job](const std::atomic<bool>& cancelled) { run_fused(job, cancelled); });
  return true;
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
    to_sync_format(ss.own, op.sync);
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
        to_sync_format(p.data, op.sync);
        send_peer(r, std::move(p));
      }
      parts[me].data = chunk_rows(ss.own.data, count, dim, mine);
      to_sync_format(parts[me], op.sync);
      ss.own = blob{};
    }
    const size_t m = static_cast<size_t>(mine.size());
    for (int r = 0; r < T; ++r)
      if (parts[r].data.size() != static_cast<size_t>(count) * m) return false;  // wait for rank r's chunk
    ss.gathered = true;
    partial_sum fin{ss.id, layer, phase + gather_phase, me, blob{}};
    if (op.sync == topologies::sync_format::f32) {
      for (int i = 0; i < count; ++i) {
        float* x = ss.x.data() + static_cast<size_t>(i) * dim + mine.begin;
        const size_t row = static_cast<size_t>(i) * m;
        for (size_t e = 0; e < m; ++e) {
          float acc = parts[0].data[row + e];
          for (int r = 1; r < T; ++r) acc += parts[r].data[row + e];
          x[e] += acc;
        }
      }
      // All-gather: the finished chunk to every other rank.
      fin.data.data = chunk_rows(ss.x, count, dim, mine);
    } else {
      // q8_0: the chunk's sum (rank order), rounded, is what every rank adds
      // to its x, this one too (x itself is never rounded).
      std::vector<float> sum(static_cast<size_t>(count) * m);
      for (size_t e = 0; e < sum.size(); ++e) {
        float acc = parts[0].data[e];
        for (int r = 1; r < T; ++r) acc += parts[r].data[e];
        sum[e] = acc;
      }
      fin.data.data = std::move(sum);
      to_sync_format(fin.data, op.sync);
      for (int i = 0; i < count; ++i) {
        float* x = ss.x.data() + static_cast<size_t>(i) * dim + mine.begin;
        const float* a = fin.data.data.data() + static_cast<size_t>(i) * m;
        for (size_t e = 0; e < m; ++e) x[e] += a[e];
      }
    }
    st.partials.erase(skey);
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
    for (int i = 0; i < count; ++i) {
      const float* from = got[r].data.data() + static_cast<size_t>(i) * c.size();
      float* x = ss.x.data() + static_cast<size_t>(i) * dim + c.begin;
      if (op.sync == topologies::sync_format::f32)
        std::copy(from, from + c.size(), x);  // the finished chunk
      else
        for (int e = 0; e < c.size(); ++e) x[e] += from[e];  // q8_0: the chunk's sum
    }
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

// ---------------------------------------------------------------------------
// Expert placement (issue #23; topologies/placement.hpp "what runs where").

/// The expert node to ask for expert e on row `row`: its holders from a start
/// that rotates with the position (spreading load over replicas), the first
/// not taken for dead; all of them down: the first in that order (the request
/// waits there until the node is rewired, then goes again).
int choose_holder(const shard_state& st, const topologies::shard_step& op, int e, int32_t pos, int avoid = -1) {
  const auto& h = op.holders[static_cast<size_t>(e)];
  const int R = static_cast<int>(h.size());
  const int start = static_cast<int>(static_cast<uint32_t>(pos) % static_cast<uint32_t>(R));
  for (int j = 0; j < R; ++j) {
    const int idx = h[static_cast<size_t>((start + j) % R)];
    if (!st.expert_down.count(idx) && !st.expert_suspect.count(idx) && idx != avoid) return idx;
  }
  for (int j = 0; j < R; ++j) {  // only suspected or avoided ones are up: one of them again
    const int idx = h[static_cast<size_t>((start + j) % R)];
    if (!st.expert_down.count(idx)) return idx;
  }
  return h[static_cast<size_t>(start)];
}

/// Sends (or re-sends) request `seq` of the session's MoE layer to its
/// expert node, and arms its timeout.
void send_expert_request(shard_actor* self, session_state& ss, uint32_t seq) {
  auto& st = self->state;
  auto it = ss.moe_out.find(seq);
  if (it == ss.moe_out.end()) return;
  const auto& rq = it->second;
  const int dim = st.init.weights->cfg().dim;
  const int k = st.init.weights->cfg().n_experts_used;
  expert_req r;
  r.id = ss.id;
  r.layer = ss.moe_layer;
  r.seq = seq;
  std::vector<int> rows;  // distinct rows, first-use order
  for (int slot : rq.slots) {
    const int row = slot / k;
    auto at = std::find(rows.begin(), rows.end(), row);
    if (at == rows.end()) {
      rows.push_back(row);
      at = rows.end() - 1;
    }
    r.pair_row.push_back(static_cast<int32_t>(at - rows.begin()));
    r.pair_expert.push_back(ss.moe_ids[static_cast<size_t>(slot)]);
  }
  r.xb.data.resize(rows.size() * static_cast<size_t>(dim));
  for (size_t i = 0; i < rows.size(); ++i)
    std::copy_n(ss.moe_xb.begin() + static_cast<std::ptrdiff_t>(rows[i]) * dim, dim,
                r.xb.data.begin() + static_cast<std::ptrdiff_t>(i) * dim);
  r.reply_to = caf::actor_cast<caf::actor>(self);
  r.reply_node = st.init.node->index;
  r.session = ss.reply_to;
  const auto wait = expert_timeout * (1 << std::min(rq.attempts, 4));
  self->delayed_send(self, wait, moe_tmo_atom::value, ss.id.session, ss.id.epoch, ss.id.pos0,
                     static_cast<int32_t>(ss.moe_layer), seq);
  caf::actor to;
  int32_t node = 0;
  if (peer_of(st, rq.index, to, node) && to) deliver(self, to, node, std::move(r));
}

/// Sends every slot still missing of `slots` to a holder chosen afresh
/// (grouped per expert node, one request each).
void dispatch_slots(shard_actor* self, session_state& ss, const topologies::shard_step& op,
                    const std::vector<int>& slots, int attempts, int avoid = -1) {
  auto& st = self->state;
  const int k = st.init.weights->cfg().n_experts_used;
  std::map<int, std::vector<int>> by_node;
  for (int slot : slots) {
    if (ss.moe_have[static_cast<size_t>(slot)]) continue;
    const int e = ss.moe_ids[static_cast<size_t>(slot)];
    by_node[choose_holder(st, op, e, ss.id.pos0 + slot / k, avoid)].push_back(slot);
  }
  for (auto& g : by_node) {
    const uint32_t seq = st.next_seq++;
    auto& rq = ss.moe_out[seq];
    rq.index = g.first;
    rq.slots = std::move(g.second);
    rq.attempts = attempts;
    send_expert_request(self, ss, seq);
  }
}

/// Request `seq` went unanswered (`avoid` = the node asked) or its node went
/// down: its slots go to holders chosen afresh (a live replica when there is
/// one).
void redispatch(shard_actor* self, session_state& ss, uint32_t seq, int avoid = -1) {
  auto& st = self->state;
  auto it = ss.moe_out.find(seq);
  if (it == ss.moe_out.end() || ss.pc >= st.program.size()) return;
  const auto& op = st.program[ss.pc];
  if (op.op != topologies::shard_op::combine) return;
  auto rq = std::move(it->second);
  ss.moe_out.erase(it);
  const int k = st.init.weights->cfg().n_experts_used;
  bool moved = false;
  for (int slot : rq.slots)
    moved = moved ||
            choose_holder(st, op, ss.moe_ids[static_cast<size_t>(slot)], ss.id.pos0 + slot / k, avoid) != rq.index;
  if (moved) ++st.redispatched;
  dispatch_slots(self, ss, op, rq.slots, rq.attempts + 1, avoid);
}

/// Posts the dispatch op's preparation (rmsnorm, router, top-k, shared
/// expert of every position) to the worker; on_routed sends the requests.
void post_route(shard_actor* self, uint64_t session, session_state& ss, const topologies::shard_step& op) {
  auto& st = self->state;
  ss.computing = true;
  ss.posted = true;
  routed r;
  r.session = session;
  r.epoch = ss.id.epoch;
  r.pos0 = ss.id.pos0;
  r.pc = ss.pc;
  r.x = std::move(ss.x);
  const int count = ss.id.count, layer = op.layers.begin;
  auto weights = st.init.weights;
  const kernels::backend* be = st.init.backend;
  auto scr = ss.s;
  caf::actor_addr me = self->address();
  std::shared_ptr<kernels::pool> kpool = st.init.node ? st.init.node->kernel_pool : nullptr;
  st.worker->post([r = std::move(r), count, layer, weights, be, scr, me, kpool](const std::atomic<bool>& cancelled) mutable {
    if (cancelled) return;
    kernels::pool::scope use_pool(kpool.get());
    const auto& w = *weights;
    const auto& c = w.cfg();
    const int dim = c.dim, k = c.n_experts_used;
    const auto t0 = clock_type::now();
    r.xb.resize(static_cast<size_t>(count) * dim);
    r.ids.resize(static_cast<size_t>(count) * k);
    r.wts.resize(static_cast<size_t>(count) * k);
    r.shared_g.assign(static_cast<size_t>(count), 0.0f);
    std::vector<float> y(static_cast<size_t>(dim));
    for (int i = 0; i < count; ++i) {
      float* xb = r.xb.data() + static_cast<size_t>(i) * dim;
      model::ffn_input(*be, w, layer, r.x.data() + static_cast<size_t>(i) * dim, xb);
      model::moe_route(*be, w, layer, xb, *scr);
      for (int j = 0; j < k; ++j) {
        r.ids[static_cast<size_t>(i) * k + j] = scr->route_ids[static_cast<size_t>(j)];
        r.wts[static_cast<size_t>(i) * k + j] = scr->route_w[static_cast<size_t>(j)];
      }
      float g = 0.0f;
      if (model::moe_shared(*be, w, layer, xb, *scr, y.data(), &g)) {
        if (r.shared_y.empty()) r.shared_y.resize(static_cast<size_t>(count) * dim);
        std::copy(y.begin(), y.end(), r.shared_y.begin() + static_cast<std::ptrdiff_t>(i) * dim);
        r.shared_g[static_cast<size_t>(i)] = g;
      }
    }
    r.ns = since_ns(t0);
    if (auto to = caf::actor_cast<caf::actor>(me)) caf::anon_send(to, std::move(r));
  });
}

/// The combine op: per position, x += (w_0 y_0 + ... + w_{k-1} y_{k-1}, in
/// the router's order, then + g * shared), summed exactly as model::moe_ffn
/// sums on one node (the same model::moe_accumulate from a zero vector).
void combine_moe(shard_actor* self, session_state& ss) {
  auto& st = self->state;
  const auto& c = st.init.weights->cfg();
  const int dim = c.dim, k = c.n_experts_used;
  std::vector<float> partial(static_cast<size_t>(dim));
  for (int i = 0; i < ss.id.count; ++i) {
    std::fill(partial.begin(), partial.end(), 0.0f);
    for (int r = 0; r < k; ++r) {
      const size_t slot = static_cast<size_t>(i) * k + r;
      model::moe_accumulate(partial.data(), ss.moe_wts[slot], ss.moe_y.data() + slot * dim, dim);
    }
    if (!ss.moe_shared_y.empty())
      model::moe_accumulate(partial.data(), ss.moe_shared_g[static_cast<size_t>(i)],
                            ss.moe_shared_y.data() + static_cast<size_t>(i) * dim, dim);
    float* x = ss.x.data() + static_cast<size_t>(i) * dim;
    for (int j = 0; j < dim; ++j) x[j] += partial[static_cast<size_t>(j)];
  }
  st.moe_wait_ns += clock_type::now().time_since_epoch().count() - ss.moe_since;
  ss.moe_layer = -1;
  ss.moe_out.clear();
  ss.moe_y.clear();
  ss.moe_xb.clear();
}

/// Expert node: computes request r's pairs on the worker (model::moe_expert,
/// the same function the one-node block runs); expert_done continues.
void post_expert(shard_actor* self, expert_req r) {
  auto& st = self->state;
  if (!st.expert_scratch) st.expert_scratch = std::make_shared<model::scratch>(*st.init.weights);
  st.expert_jobs.insert(std::make_tuple(r.id.session, r.id.epoch, r.id.pos0));
  auto weights = st.init.weights;
  const kernels::backend* be = st.init.backend;
  auto scr = st.expert_scratch;
  caf::actor_addr me = self->address();
  std::shared_ptr<kernels::pool> kpool = st.init.node ? st.init.node->kernel_pool : nullptr;
  st.worker->post([r = std::move(r), weights, be, scr, me, kpool](const std::atomic<bool>& cancelled) mutable {
    if (cancelled) return;
    kernels::pool::scope use_pool(kpool.get());
    const int dim = weights->cfg().dim;
    const auto t0 = clock_type::now();
    expert_done d;
    d.y.data.resize(r.pair_row.size() * static_cast<size_t>(dim));
    for (size_t p = 0; p < r.pair_row.size(); ++p)
      model::moe_expert(*be, *weights, r.layer, r.pair_expert[p],
                        r.xb.data.data() + static_cast<size_t>(r.pair_row[p]) * dim, *scr,
                        d.y.data.data() + p * dim);
    d.ns = since_ns(t0);
    r.xb.data.clear();
    d.req = std::move(r);
    if (auto to = caf::actor_cast<caf::actor>(me)) caf::anon_send(to, std::move(d));
  });
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
        if (!ss.posted && !post_fused(self, session, ss)) post_compute(self, session, ss, op);
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
        if (!ss.posted) post_route(self, session, ss, op);
        return;  // on_routed sends the requests and goes on
      case shard_op::combine:
        if (ss.moe_missing > 0) return;  // the expert_out handler resumes
        combine_moe(self, ss);
        ++ss.pc;
        break;
      case shard_op::expert:
      case shard_op::count:
        // An expert node's op serves requests, never a step (check_program).
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
/// A worker job of session `session` ended (the compute or routing of op
/// `pc` of step (epoch, pos0)): runs what waited for the worker and returns
/// the session when that step is still the current one; otherwise (closed,
/// or the step abandoned meanwhile) starts the next queued step if the
/// session is idle and returns null.
session_state* job_ended(shard_actor* self, uint64_t session, uint32_t epoch, int32_t pos0, size_t pc) {
  auto& st = self->state;
  auto it = st.sessions.find(session);
  if (it == st.sessions.end()) return nullptr;  // closed meanwhile
  auto& ss = it->second;
  ss.computing = false;
  auto deferred = std::move(ss.after_job);
  ss.after_job.clear();
  for (auto& f : deferred) f();
  if (ss.busy && ss.posted && ss.id.epoch == epoch && ss.id.pos0 == pos0 && ss.pc == pc) return &ss;
  if (!ss.busy && !ss.queued.empty()) {
    activation next = std::move(ss.queued.front());
    ss.queued.pop_front();
    start_step(self, next);
  }
  return nullptr;
}

void on_computed(shard_actor* self, computed& c) {
  auto& st = self->state;
  st.compute_ns += c.ns;
  session_state* cur = job_ended(self, c.session, c.epoch, c.pos0, c.pc);
  if (!cur) return;
  auto& ss = *cur;
  ss.x = std::move(c.x);
  ss.compute_ns += c.ns;
  ss.posted = false;
  if (c.partial) ss.own = std::move(c.out);
  ++ss.pc;
  run_program(self, c.session, ss);
}

/// The fused job's inbox leaves the router; what it still holds (partials of
/// later reductions, or of the one it stopped in) is returned.
std::map<std::pair<int32_t, int32_t>, std::vector<blob>> disarm_fused(shard_actor* self, computed& c,
                                                                      uint64_t& bytes) {
  auto& router = *self->state.fused;
  std::lock_guard<std::mutex> g(router.mu);
  auto it = router.by_session.find(c.session);
  if (it != router.by_session.end() && it->second == c.inbox) router.by_session.erase(it);
  bytes = c.inbox->bytes;
  return std::move(c.inbox->parts);
}

/// A fused job (post_fused) ended: its traffic is counted, the partials it
/// did not use go where the actor's reduce looks for them, and the program
/// goes on at next_pc (in the reduce it stopped in, with its partial shared,
/// or after its last reduction).
void on_fused(shard_actor* self, computed& c) {
  auto& st = self->state;
  uint64_t received = 0;
  auto left = disarm_fused(self, c, received);
  st.bytes_received += received;
  for (const auto& s : c.sent) count_sent(self, s.first, s.second);
  if (!c.sent.empty()) {
    auto& due = st.last_due[c.session];
    due = std::max<int64_t>(due, clock_type::now().time_since_epoch().count());
  }
  st.compute_ns += c.ns;
  session_state* cur = job_ended(self, c.session, c.epoch, c.pos0, c.pc);
  if (!cur) return;
  auto& ss = *cur;
  const size_t G = static_cast<size_t>(st.init.group_size);
  for (auto& kv : left) {
    auto& parts = st.partials[std::make_tuple(c.session, c.epoch, c.pos0, kv.first.first, kv.first.second)];
    if (parts.size() != G) parts.resize(G);
    for (size_t r = 0; r < kv.second.size() && r < G; ++r)
      if (!kv.second[r].data.empty()) parts[r] = std::move(kv.second[r]);
  }
  ss.x = std::move(c.x);
  ss.compute_ns += c.ns;
  ss.posted = false;
  ss.pc = c.next_pc;
  if (c.shared && ss.pc < st.program.size()) {
    const auto& op = st.program[ss.pc];
    const int me =
        static_cast<int>(std::find(op.peers.begin(), op.peers.end(), st.init.index) - op.peers.begin());
    auto& parts = st.partials[std::make_tuple(c.session, c.epoch, c.pos0, op.layers.begin,
                                              op.part == topologies::layer_part::ffn ? 1 : 0)];
    if (parts.size() != G) parts.resize(G);
    if (static_cast<size_t>(me) < G) parts[static_cast<size_t>(me)] = std::move(c.out);
    ss.shared = true;
  }
  run_program(self, c.session, ss);
}

/// The worker prepared the dispatch op: send each chosen (position, expert)
/// to a holder, then wait in the combine op for the outputs.
void on_routed(shard_actor* self, routed& r) {
  auto& st = self->state;
  st.compute_ns += r.ns;
  session_state* cur = job_ended(self, r.session, r.epoch, r.pos0, r.pc);
  if (!cur) return;
  auto& ss = *cur;
  ss.x = std::move(r.x);
  ss.compute_ns += r.ns;
  ss.posted = false;
  const auto& op = st.program[ss.pc];
  const auto& c = st.init.weights->cfg();
  const int k = c.n_experts_used, n = ss.id.count * k;
  ss.moe_layer = op.layers.begin;
  ss.moe_xb = std::move(r.xb);
  ss.moe_ids = std::move(r.ids);
  ss.moe_wts = std::move(r.wts);
  ss.moe_shared_y = std::move(r.shared_y);
  ss.moe_shared_g = std::move(r.shared_g);
  ss.moe_y.assign(static_cast<size_t>(n) * c.dim, 0.0f);
  ss.moe_have.assign(static_cast<size_t>(n), 0);
  ss.moe_missing = n;
  ss.moe_out.clear();
  ss.moe_since = clock_type::now().time_since_epoch().count();
  if (st.expert_load.size() < static_cast<size_t>(c.n_experts)) st.expert_load.resize(c.n_experts, 0);
  for (int32_t e : ss.moe_ids)
    if (e >= 0 && e < c.n_experts && ss.replay_until < 0) ++st.expert_load[static_cast<size_t>(e)];
  ++ss.pc;  // to the combine: its peers and holders are the dispatch's (check_program)
  std::vector<int> slots(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) slots[static_cast<size_t>(i)] = i;
  dispatch_slots(self, ss, op, slots, 0);
  run_program(self, r.session, ss);
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
  ss->moe_layer = -1;
  ss->moe_out.clear();
  ss->moe_missing = 0;
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
  me.routed = spec.routed;
  me.expert_node = spec.expert_only();
  me.experts = spec.experts;
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
  st.fused->abort(session);
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
  st.act_reply.erase(session);
  for (auto a = st.act_via_caf.begin(); a != st.act_via_caf.end();) {
    if (std::get<2>(a->first) == session) a = st.act_via_caf.erase(a);
    else ++a;
  }
  for (auto h = st.act_held.begin(); h != st.act_held.end();) {
    if (h->id.session != session) {
      ++h;
      continue;
    }
    st.act_held_bytes -= payload_bytes(h->x);
    ++st.init.node->activations_held_dropped;
    h = st.act_held.erase(h);
  }
  st.closed.insert(session);
  if (st.closed.size() > 4096) st.closed.erase(st.closed.begin());
}

/// A step message that came before the shard's first wiring waits for it
/// (bounded: beyond 4096 the step is dropped, and the session re-sends it).
void hold_until_wired(shard_actor* self, caf::message m) {
  auto& st = self->state;
  if (st.unwired.size() < 4096) st.unwired.push_back(std::move(m));
}

/// A stage shard's new wiring (issue #23): watch the expert nodes its
/// dispatch names; one that runs as a new incarnation is live again and gets
/// the requests that were waiting for it (the step in flight only: expert
/// nodes hold no session state).
void rewire_experts(shard_actor* self, const wiring& before) {
  auto& st = self->state;
  std::set<int> experts;
  for (const auto& op : st.program)
    if (op.op == topologies::shard_op::dispatch) experts.insert(op.peers.begin(), op.peers.end());
  if (experts.empty()) return;
  std::set<int> renewed;
  for (size_t i = 0; i < st.wires.group_index.size() && i < st.wires.group.size(); ++i) {
    const int idx = st.wires.group_index[i];
    const auto& a = st.wires.group[i];
    if (!experts.count(idx) || !a) continue;
    bool same = false;
    for (size_t j = 0; j < before.group_index.size() && j < before.group.size(); ++j)
      if (before.group_index[j] == idx && before.group[j] == a) same = true;
    if (same) continue;
    renewed.insert(idx);
    st.expert_down.erase(idx);
    st.expert_suspect.erase(idx);
    // The previous incarnation (taken away from a silent node) is no longer
    // this index: its death later says nothing about the new one.
    for (auto it = st.expert_watch.begin(); it != st.expert_watch.end();)
      it = it->second == idx ? st.expert_watch.erase(it) : std::next(it);
    st.expert_watch[a.address()] = idx;
    self->monitor(a);
  }
  if (renewed.empty()) return;
  for (auto& kv : st.sessions) {
    auto& ss = kv.second;
    if (!ss.busy || ss.moe_out.empty()) continue;
    std::vector<uint32_t> again;
    for (auto& r : ss.moe_out)
      if (renewed.count(r.second.index)) again.push_back(r.first);
    for (uint32_t seq : again) {
      ++ss.moe_out[seq].attempts;
      send_expert_request(self, ss, seq);
    }
  }
}

/// An expert node went down (crash, lost connection): its requests in flight
/// go to live replicas now; without one they wait for its restart's wiring.
void expert_down(shard_actor* self, const caf::down_msg& dm) {
  auto& st = self->state;
  auto w = st.expert_watch.find(dm.source);
  if (w == st.expert_watch.end()) return;
  const int idx = w->second;
  st.expert_watch.erase(w);
  st.expert_down.insert(idx);
  for (auto& kv : st.sessions) {
    auto& ss = kv.second;
    if (!ss.busy || ss.moe_out.empty()) continue;
    std::vector<uint32_t> again;
    for (auto& r : ss.moe_out)
      if (r.second.index == idx) again.push_back(r.first);
    for (uint32_t seq : again) redispatch(self, ss, seq);
  }
}

/// Frames held for their epoch's CAF activation: at most this many, and
/// this many payload bytes, per shard (beyond: dropped and counted; the
/// session's deadline re-sends the step in a new epoch).
constexpr size_t act_hold_max = 64;
constexpr uint64_t act_hold_max_bytes = 64ull << 20;

/// An activation in arrival order (one through CAF, or a data-plane frame
/// given its epoch's reply_to): checked, admitted by the fault plan, started.
void take_activation(shard_actor* self, activation& a) {
  auto& st = self->state;
  if (!a.x.ok()) {
    report(self, a.reply_to, a.id,
           "corrupt activation payload (checksum mismatch) received at placement index " +
               std::to_string(st.init.index),
           true);
    return;
  }
  if (!st.faults->admit(a)) return;
  start_step(self, a);
}

/// A CAF activation's reply_to, for the data-plane frames of its (session,
/// epoch); true when that epoch is the newest of the session seen here.
bool remember_reply(shard_actor* self, const activation& a) {
  auto& st = self->state;
  if (st.closed.count(a.id.session)) return false;
  auto it = st.act_reply.find(a.id.session);
  if (it != st.act_reply.end() && a.id.epoch < it->second.first) return false;
  st.act_reply[a.id.session] = {a.id.epoch, a.reply_to};
  return true;
}

/// After the CAF activation of (session, epoch): the frames of that epoch
/// that overtook it run now, in arrival order; those of older epochs of the
/// session are dropped (stale, as session_for would drop them).
void release_held(shard_actor* self, uint64_t session, uint32_t epoch) {
  auto& st = self->state;
  if (st.act_held.empty()) return;
  const auto reply = st.act_reply.find(session);
  if (reply == st.act_reply.end()) return;
  const caf::actor to = reply->second.second;
  std::deque<activation> ready, keep;
  for (auto& h : st.act_held) {
    if (h.id.session != session || h.id.epoch > epoch) {
      keep.push_back(std::move(h));
      continue;
    }
    st.act_held_bytes -= payload_bytes(h.x);
    if (h.id.epoch == epoch) ready.push_back(std::move(h));
    else ++st.init.node->activations_held_dropped;
  }
  st.act_held.swap(keep);
  for (auto& a : ready) {
    if (st.faults->silent()) {  // a fault of the step before silenced the shard: lost, as on CAF
      ++st.init.node->activations_held_dropped;
      continue;
    }
    a.reply_to = to;
    take_activation(self, a);
  }
}

caf::behavior shard_behavior(shard_actor* self, shard_init init) {
  auto& st0 = self->state;
  st0.init = std::move(init);
  st0.worker = std::make_unique<compute_worker>("shard-" + std::to_string(st0.init.index), 2,
                                                st0.init.compute_inline, st0.init.gate);
  st0.faults = std::make_unique<fault_env>(
      self,
      fault_env::identity{st0.init.index, st0.init.node ? st0.init.node->index : 0, st0.init.heartbeat,
                          st0.init.coordinator},
      st0.init.faults, st0.init.node ? st0.init.node->shaper : nullptr);
  self->attach_functor([node = st0.init.node, bytes = st0.init.weights->bytes()] {
    node->release(bytes);
  });
  st0.prober = spawn_link_prober(*self, st0.init.node ? st0.init.node->index : 0,
                                 st0.init.node ? st0.init.node->shaper : std::make_shared<link_shaper>());
  if (st0.init.node && st0.init.node->data) {  // partial sums from other daemons' sockets
    auto dp = st0.init.node->data;
    st0.fused->group_size = st0.init.group_size;
    st0.fused->enabled = data_plane::fused_by_env();
    st0.fused->plane = dp;
    st0.fused->lend = data_plane::lend_by_env();
    auto router = st0.fused;
    dp->attach(caf::actor_cast<caf::actor>(self), [router](partial_sum& p) { return router->take(p, true); });
    self->attach_functor([dp, id = self->id()] { dp->detach(id); });
  }
  // A silenced or partitioned shard behaves like a frozen node: it handles nothing.
  auto silent = [self] { return self->state.faults->silent(); };
  self->set_down_handler([self](caf::down_msg& dm) { expert_down(self, dm); });
  caf::message_handler own{
      [=](wire_atom, wiring w) -> caf::result<void> {
        auto& st = self->state;
        std::vector<topologies::shard_step> prog;
        if (auto why = check_wiring(st, w, prog); !why.empty())
          return caf::make_error(caf::sec::invalid_argument, why);
        const wiring before = st.wires;
        st.wires = std::move(w);
        st.program = std::move(prog);
        rewire_experts(self, before);
        if (st.wired) return {};
        st.wired = true;
        for (auto& m : st.unwired) self->send(self, std::move(m));
        st.unwired.clear();
        return {};
      },
      // Where partial sums for this process may be sent (actors/data_plane.hpp).
      [=](dp_addr_atom) -> caf::result<std::string, uint16_t, uint64_t> {
        const auto& dp = self->state.init.node ? self->state.init.node->data : nullptr;
        if (!dp) return caf::make_error(caf::sec::invalid_argument, "no data plane");
        const auto ep = dp->endpoint();
        return {ep.host, ep.port, ep.key};
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
        const auto& from = self->current_sender();
        if (from != self->ctrl()) st.bytes_received += payload_bytes(a.x);
        if (from && from->node() != self->node()) ++st.init.node->activations_caf;
        const uint64_t session = a.id.session;
        const uint32_t epoch = a.id.epoch;
        const bool newest = remember_reply(self, a);
        take_activation(self, a);
        if (newest) release_held(self, session, epoch);
      },
      // An activation that came as a data-plane frame (no reply_to): runs
      // with its epoch's reply_to, or waits for the CAF activation that
      // brings it (bounded).
      [=](dp_act_atom, activation& a) {
        if (silent()) return;
        auto& st = self->state;
        if (!st.wired) return hold_until_wired(self, caf::make_message(dp_act_atom::value, std::move(a)));
        if (self->current_sender() != self->ctrl()) {
          st.bytes_received += payload_bytes(a.x);
          ++st.init.node->activations_frames;
        }
        if (st.closed.count(a.id.session)) return;
        auto r = st.act_reply.find(a.id.session);
        if (r != st.act_reply.end() && r->second.first == a.id.epoch) {
          a.reply_to = r->second.second;
          take_activation(self, a);
          return;
        }
        auto ss = st.sessions.find(a.id.session);
        if ((r != st.act_reply.end() && a.id.epoch < r->second.first) ||
            (ss != st.sessions.end() && a.id.epoch < ss->second.epoch))
          return;  // stale
        const uint64_t bytes = payload_bytes(a.x);
        if (st.act_held.size() >= act_hold_max || st.act_held_bytes + bytes > act_hold_max_bytes) {
          ++st.init.node->activations_held_dropped;
          return;
        }
        ++st.init.node->activations_held;
        st.act_held_bytes += bytes;
        st.act_held.push_back(std::move(a));
      },
      // A step a slow fault held back may run now (fault_env::admit).
      [=](resume_atom) {
        if (auto a = self->state.faults->resume()) start_step(self, *a);
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
        if (st.fused->take(p, false)) return;  // its step's fused job waits for it on the worker
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
      // Link probes (cluster::measure_links): the prober sends and receives
      // them (actors/links.hpp).
      [=](probe_atom, caf::actor dest, int32_t dest_node, int32_t n, int32_t bytes, caf::actor reply_to) {
        self->send(self->state.prober, probe_atom::value, std::move(dest), dest_node, n, bytes,
                   std::move(reply_to));
      },
      [=](probe_msg& m) { self->send(self->state.prober, std::move(m)); },
      // Expert node (issue #23): compute the asked (row, expert) pairs.
      [=](expert_req& r) {
        if (silent()) return;
        auto& st = self->state;
        if (!st.wired) return hold_until_wired(self, caf::make_message(std::move(r)));
        if (self->current_sender() != self->ctrl()) st.bytes_received += payload_bytes(r.xb);
        const auto* op = st.program.empty() ? nullptr : &st.program.front();
        if (!op || op->op != topologies::shard_op::expert) return;
        auto answer = [&](int32_t status) {
          expert_out o;
          o.id = r.id;
          o.layer = r.layer;
          o.seq = r.seq;
          o.index = st.init.index;
          o.status = status;
          deliver(self, r.reply_to, r.reply_node, std::move(o));
        };
        if (!r.xb.ok()) return answer(1);  // corrupt on the way: the stage shard re-sends
        const int dim = st.init.weights->cfg().dim;
        std::string why;
        if (r.layer < op->layers.begin || r.layer >= op->layers.end)
          why = "layer " + std::to_string(r.layer) + " outside its layers " + to_string(op->layers);
        else if (r.pair_row.size() != r.pair_expert.size() || r.xb.data.size() % static_cast<size_t>(dim) != 0)
          why = "malformed request (pairs or rows)";
        for (size_t p = 0; why.empty() && p < r.pair_row.size(); ++p) {
          if (!std::binary_search(op->experts.begin(), op->experts.end(), r.pair_expert[p]))
            why = "expert " + std::to_string(r.pair_expert[p]) + " is not held here";
          else if (r.pair_row[p] < 0 || static_cast<size_t>(r.pair_row[p]) * dim >= r.xb.data.size())
            why = "pair row out of range";
        }
        if (!why.empty()) {
          report(self, r.session, r.id,
                 "expert request to placement index " + std::to_string(st.init.index) + ": " + why);
          return;
        }
        if (!st.faults->admit(r)) return;
        st.expert_pairs += r.pair_row.size();
        post_expert(self, std::move(r));
      },
      [=](expert_done& d) {
        auto& st = self->state;
        st.compute_ns += d.ns;
        auto j = st.expert_jobs.find(std::make_tuple(d.req.id.session, d.req.id.epoch, d.req.id.pos0));
        if (j != st.expert_jobs.end()) st.expert_jobs.erase(j);
        if (silent()) return;
        expert_out o;
        o.id = d.req.id;
        o.layer = d.req.layer;
        o.seq = d.req.seq;
        o.index = st.init.index;
        o.y = std::move(d.y);
        o.compute_ns = d.ns;
        deliver(self, d.req.reply_to, d.req.reply_node, std::move(o));
      },
      // Stage shard: an expert node's outputs for the MoE layer in flight.
      [=](expert_out& o) {
        if (silent()) return;
        auto& st = self->state;
        st.bytes_received += payload_bytes(o.y);
        st.expert_suspect.erase(o.index);  // it answers: slow, not dead
        auto it = st.sessions.find(o.id.session);
        if (it == st.sessions.end()) return;
        auto& ss = it->second;
        if (!ss.busy || ss.id.epoch != o.id.epoch || ss.id.pos0 != o.id.pos0 || ss.moe_layer != o.layer) return;
        auto rq = ss.moe_out.find(o.seq);
        if (rq == ss.moe_out.end()) return;  // answered already (a re-sent or re-dispatched request)
        const int dim = st.init.weights->cfg().dim;
        if (o.status != 0 || !o.y.ok()) {  // a payload corrupt on either way: ask again
          ++rq->second.attempts;
          send_expert_request(self, ss, o.seq);
          return;
        }
        const auto& slots = rq->second.slots;
        if (o.y.data.size() != slots.size() * static_cast<size_t>(dim)) {
          report(self, ss.reply_to, ss.id,
                 "expert output of " + std::to_string(o.y.data.size()) + " floats from placement index " +
                     std::to_string(o.index) + ", expected " + std::to_string(slots.size()) + " x " +
                     std::to_string(dim));
          return;
        }
        ss.compute_ns += o.compute_ns;  // counted as if serial: an upper bound of the critical path
        for (size_t p = 0; p < slots.size(); ++p) {
          const size_t slot = static_cast<size_t>(slots[p]);
          if (ss.moe_have[slot]) continue;
          std::copy_n(o.y.data.begin() + static_cast<std::ptrdiff_t>(p) * dim, dim,
                      ss.moe_y.begin() + static_cast<std::ptrdiff_t>(slot) * dim);
          ss.moe_have[slot] = 1;
          --ss.moe_missing;
        }
        ss.moe_out.erase(rq);
        if (ss.moe_missing == 0) run_program(self, o.id.session, ss);
      },
      [=](moe_tmo_atom, uint64_t session, uint32_t epoch, int32_t pos0, int32_t layer, uint32_t seq) {
        if (silent()) return;
        auto& st = self->state;
        auto it = st.sessions.find(session);
        if (it == st.sessions.end()) return;
        auto& ss = it->second;
        if (!ss.busy || ss.id.epoch != epoch || ss.id.pos0 != pos0 || ss.moe_layer != layer) return;
        auto rq = ss.moe_out.find(seq);
        if (rq == ss.moe_out.end()) return;  // answered
        if (rq->second.attempts + 1 >= expert_max_attempts) {
          report(self, ss.reply_to, ss.id,
                 "expert node at placement index " + std::to_string(rq->second.index) + " did not answer layer " +
                     std::to_string(layer) + " after " + std::to_string(expert_max_attempts) + " attempts",
                 true);
          return;
        }
        // Silent past its timeout (or the message was lost): another holder
        // for this request if there is one, else the same node again. The
        // node is not taken for dead: only its down_msg or new wiring says so.
        st.expert_suspect.insert(rq->second.index);
        redispatch(self, ss, seq, rq->second.index);
      },
      [=](routed& r) {
        if (silent()) {
          auto it = self->state.sessions.find(r.session);
          if (it != self->state.sessions.end()) {
            it->second.computing = false;
            it->second.after_job.clear();
          }
          return;
        }
        on_routed(self, r);
      },
      [=](close_atom, uint64_t session) { drop_session(self, session); },
      [=](computed& c) {
        if (c.fused && !silent()) return on_fused(self, c);
        if (c.fused) {
          uint64_t ignored = 0;
          disarm_fused(self, c, ignored);
        }
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
        // A stage shard waiting for its experts (it re-sends and re-dispatches
        // them itself); an expert node computing for the step.
        if (it != st.sessions.end() && it->second.busy && !it->second.moe_out.empty() &&
            it->second.id.epoch == epoch && it->second.id.pos0 == pos0)
          working = 1;
        if (st.expert_jobs.count(std::make_tuple(session, epoch, pos0))) working = 1;
        if (st.faults->holds(session, epoch, pos0)) working = 1;  // held back by a slow fault
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
        s.expert_load = st.expert_load;
        s.moe_wait_ns = st.moe_wait_ns;
        s.expert_redispatched = st.redispatched;
        s.expert_pairs = st.expert_pairs;
        return s;
      },
  };
  if (st0.faults->injects()) return own.or_else(st0.faults->handler());
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
