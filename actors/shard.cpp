#include "actors/shard.hpp"

#include <caf/all.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;

int64_t since_ns(clock_type::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(clock_type::now() - t0).count();
}

/// Per-session state of a shard: the KV cache and the step in flight.
struct session_state {
  model::kv_cache kv;
  std::unique_ptr<model::scratch> s;
  uint64_t charged = 0;
  uint32_t epoch = 0;
  // The step in flight:
  bool busy = false;
  step_id id;
  std::vector<float> x;        // [count x dim] residual stream
  int layer = 0, phase = 0;    // next (layer, phase) to reduce
  bool own_done = false;       // own partial of (layer, phase) computed and sent
  int64_t compute_ns = 0;      // critical-path compute so far
  caf::actor reply_to;
};

struct shard_state {
  shard_init init;
  wiring wires;
  std::unordered_map<uint64_t, session_state> sessions;
  std::set<uint64_t> closed;   // sessions ended here: late messages are dropped
  // Partials received before this shard reached that (layer, phase):
  // key (session, epoch, pos0, layer, phase) -> per rank.
  std::map<std::tuple<uint64_t, uint32_t, int32_t, int32_t, int32_t>, std::vector<blob>> partials;
  int64_t compute_ns = 0;
  uint64_t bytes_sent = 0, bytes_received = 0;
  std::map<int32_t, uint64_t> link_bytes;  // by destination node
  static inline const char* name = "cellshard.shard";
};

using shard_actor = caf::stateful_actor<shard_state>;

uint64_t payload_bytes(const blob& b) { return b.data.size() * sizeof(float); }

void report(shard_actor* self, const caf::actor& to, const step_id& id, std::string msg) {
  if (to) self->send(to, shard_error{id, self->state.init.node->index, std::move(msg)});
}

/// Finds or creates the session's state (charging its KV cache to the node).
session_state* session_for(shard_actor* self, const step_id& id, const caf::actor& reply_to) {
  auto& st = self->state;
  if (st.closed.count(id.session)) return nullptr;
  auto it = st.sessions.find(id.session);
  if (it != st.sessions.end()) {
    if (id.epoch < it->second.epoch) return nullptr;  // a stale message
    it->second.epoch = id.epoch;
    return &it->second;
  }
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
  ss.kv = model::kv_cache(w.spec().n_layers(), w.cfg().seq_len, kv_dim);
  ss.s = std::make_unique<model::scratch>(w);
  ss.charged = need;
  ss.epoch = id.epoch;
  return &ss;
}

/// Counts a payload sent to `node` (self-sends on the same node are free).
void count_sent(shard_actor* self, int32_t node, uint64_t bytes) {
  auto& st = self->state;
  if (node == st.init.node->index) return;
  st.bytes_sent += bytes;
  st.link_bytes[node] += bytes;
}

/// Finishes a stage: forward x to the next stage, or the logits to the session.
void finish_stage(shard_actor* self, session_state& ss) {
  auto& st = self->state;
  ss.busy = false;
  if (st.init.rank != 0) return;
  const auto& w = *st.init.weights;
  const int dim = w.cfg().dim;
  if (!st.wires.next.empty()) {
    activation a;
    a.id = ss.id;
    a.x.data = std::move(ss.x);
    a.compute_ns = ss.compute_ns;
    a.reply_to = ss.reply_to;
    for (size_t i = 0; i < st.wires.next.size(); ++i) {
      count_sent(self, st.wires.next_nodes[i], payload_bytes(a.x));
      self->send(st.wires.next[i], a);
    }
    return;
  }
  if (w.spec().classifier) {
    const auto t0 = clock_type::now();
    float* last = ss.x.data() + static_cast<size_t>(ss.id.count - 1) * dim;
    logits_msg m;
    m.id = ss.id;
    m.logits.data.resize(w.cfg().vocab_size);
    model::classify(*st.init.backend, w, last, m.logits.data.data());
    const int64_t ns = since_ns(t0);
    st.compute_ns += ns;
    m.compute_ns = ss.compute_ns + ns;
    count_sent(self, front_end_node, payload_bytes(m.logits));
    self->send(ss.reply_to, std::move(m));
  }
}

/// Runs the step of `ss` as far as it can: computes own partials, and adds
/// each (layer, phase) reduction once every rank's partial is there.
void advance(shard_actor* self, uint64_t session, session_state& ss) {
  auto& st = self->state;
  const auto& w = *st.init.weights;
  const auto& be = *st.init.backend;
  const int dim = w.cfg().dim;
  const int T = st.init.group_size;
  const size_t n = static_cast<size_t>(ss.id.count) * dim;
  while (ss.layer < w.spec().layer_end) {
    auto key = std::make_tuple(session, ss.id.epoch, ss.id.pos0, ss.layer, ss.phase);
    auto& parts = st.partials[key];
    if (parts.size() != static_cast<size_t>(T)) parts.resize(T);
    if (!ss.own_done) {
      const auto t0 = clock_type::now();
      blob mine;
      mine.data.resize(n);
      for (int i = 0; i < ss.id.count; ++i) {
        const float* xi = ss.x.data() + static_cast<size_t>(i) * dim;
        float* out = mine.data.data() + static_cast<size_t>(i) * dim;
        if (ss.phase == 0)
          model::attention_partial(be, w, ss.layer, xi, ss.id.pos0 + i, ss.kv, *ss.s, out);
        else
          model::ffn_partial(be, w, ss.layer, xi, *ss.s, out);
      }
      const int64_t ns = since_ns(t0);
      st.compute_ns += ns;
      ss.compute_ns += ns;
      ss.own_done = true;
      if (T > 1) {
        partial_sum p{ss.id, ss.layer, ss.phase, st.init.rank, mine};
        for (int r = 0; r < T; ++r)
          if (r != st.init.rank) {
            count_sent(self, st.wires.group_nodes[r], payload_bytes(mine));
            self->send(st.wires.group[r], p);
          }
      }
      parts[st.init.rank] = std::move(mine);
    }
    for (int r = 0; r < T; ++r)
      if (parts[r].data.size() != n) return;  // wait for rank r
    // x += p_0 + p_1 + ... + p_{T-1}, summed in rank order (deterministic).
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
    ss.own_done = false;
    if (ss.phase == 0) {
      ss.phase = 1;
    } else {
      ss.phase = 0;
      ++ss.layer;
    }
  }
  finish_stage(self, ss);
}

void drop_session(shard_actor* self, uint64_t session) {
  auto& st = self->state;
  auto it = st.sessions.find(session);
  if (it != st.sessions.end()) {
    st.init.node->release(it->second.charged);
    st.sessions.erase(it);
  }
  for (auto p = st.partials.begin(); p != st.partials.end();) {
    if (std::get<0>(p->first) == session) p = st.partials.erase(p);
    else ++p;
  }
  st.closed.insert(session);
  if (st.closed.size() > 4096) st.closed.erase(st.closed.begin());
}

caf::behavior shard_behavior(shard_actor* self, shard_init init) {
  self->state.init = std::move(init);
  self->attach_functor([node = self->state.init.node, bytes = self->state.init.weights->bytes()] {
    node->release(bytes);
  });
  return {
      [=](wire_atom, wiring w) { self->state.wires = std::move(w); },
      // Embedding holder: tokens -> x, broadcast to the stage's group.
      [=](forward_req& req) {
        auto& st = self->state;
        const auto& w = *st.init.weights;
        const int dim = w.cfg().dim;
        activation a;
        a.id = req.id;
        a.reply_to = req.reply_to;
        a.x.data.resize(static_cast<size_t>(req.tokens.size()) * dim);
        for (size_t i = 0; i < req.tokens.size(); ++i) {
          const int t = req.tokens[i];
          if (t < 0 || t >= w.cfg().vocab_size) {
            report(self, req.reply_to, req.id,
                   "token id " + std::to_string(t) + " outside the vocabulary [0," +
                       std::to_string(w.cfg().vocab_size) + ")");
            return;
          }
          std::memcpy(a.x.data.data() + i * dim, w.embedding() + static_cast<size_t>(t) * dim,
                      dim * sizeof(float));
        }
        for (size_t i = 0; i < st.wires.group.size(); ++i) {
          count_sent(self, st.wires.group_nodes[i], payload_bytes(a.x));
          self->send(st.wires.group[i], a);
        }
      },
      [=](activation& a) {
        auto& st = self->state;
        if (self->current_sender() != self->ctrl()) st.bytes_received += payload_bytes(a.x);
        if (!a.x.ok()) {
          report(self, a.reply_to, a.id, "corrupt activation payload received at placement index " +
                                             std::to_string(st.init.index));
          return;
        }
        session_state* ss = session_for(self, a.id, a.reply_to);
        if (!ss) return;
        const auto& w = *st.init.weights;
        if (a.x.data.size() != static_cast<size_t>(a.id.count) * w.cfg().dim) {
          report(self, a.reply_to, a.id, "activation of the wrong size");
          return;
        }
        ss->busy = true;
        ss->id = a.id;
        ss->x = std::move(a.x.data);
        ss->layer = w.spec().layer_begin;
        ss->phase = 0;
        ss->own_done = false;
        ss->compute_ns = a.compute_ns;
        ss->reply_to = a.reply_to;
        advance(self, a.id.session, *ss);
      },
      [=](partial_sum& p) {
        auto& st = self->state;
        st.bytes_received += payload_bytes(p.data);
        if (st.closed.count(p.id.session)) return;
        if (!p.data.ok()) {
          auto it = st.sessions.find(p.id.session);
          report(self, it != st.sessions.end() ? it->second.reply_to : caf::actor{}, p.id,
                 "corrupt partial sum from rank " + std::to_string(p.rank));
          return;
        }
        auto key = std::make_tuple(p.id.session, p.id.epoch, p.id.pos0, p.layer, p.phase);
        auto& parts = st.partials[key];
        if (parts.size() != static_cast<size_t>(st.init.group_size)) parts.resize(st.init.group_size);
        if (p.rank < 0 || p.rank >= st.init.group_size) return;
        parts[p.rank] = std::move(p.data);
        auto it = st.sessions.find(p.id.session);
        if (it != st.sessions.end() && it->second.busy && it->second.id.pos0 == p.id.pos0 &&
            it->second.layer == p.layer && it->second.phase == p.phase)
          advance(self, p.id.session, it->second);
      },
      [=](close_atom, uint64_t session) { drop_session(self, session); },
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
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, shard_init init) {
  // Charged before the actor starts, so the node's figure is right at once;
  // released when the actor terminates.
  init.node->used_bytes += init.weights->bytes();
  return sys.spawn(shard_behavior, std::move(init));
}

}  // namespace cellshard::actors
