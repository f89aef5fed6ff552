#include "actors/recovery.hpp"

#include "base/parse.hpp"
#include "topologies/replacement.hpp"

#include "supervision/errors.hpp"
#include "supervision/fault_hooks.hpp"
#include "supervision/heartbeat.hpp"
#include "supervision/messages.hpp"
#include "supervision/supervisor.hpp"
#include "topologies/profile.hpp"
#include "topologies/replacement.hpp"

#include <caf/all.hpp>

#include <map>
#include <tuple>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;
using join_atom = caf::atom_constant<caf::atom("cs_join")>;
using leave_atom = caf::atom_constant<caf::atom("cs_leave")>;
using recovered_atom = caf::atom_constant<caf::atom("cs_recov")>;
using reprobe_atom = caf::atom_constant<caf::atom("cs_reprobe")>;
/// (decided, int32 index, int32 node, std::string observed kind, int64 at_ns):
/// a factory decided to restart or move a shard (coordinator's fault ledger).
using decided_atom = caf::atom_constant<caf::atom("cs_decide")>;

int64_t now_ns() { return clock_type::now().time_since_epoch().count(); }

struct coordinator_state {
  std::shared_ptr<runtime_shared> rt;
  std::set<caf::actor> sessions;
  // Restarts whose wiring is being confirmed; announced together when the
  // last confirmation is in (see announce_restarts).
  std::set<int> batch;
  std::map<uint64_t, caf::actor_addr> unconfirmed;  // confirmation id -> shard asked
  uint64_t next_confirmation = 0;
  // Suspicion is not death: probe rounds before any restart (issue #20).
  supervision::suspicion_table suspicions;
  std::map<int, double> suspect_phi;  // phi at the detector's verdict, for the error text
  // Owned here, answered to (fault_atom) as a fault_snapshot.
  fault_ledger faults;
  std::vector<suspicion_info> cleared;  // suspicions that a probe or a heartbeat cleared
  static inline const char* name = "cellshard.coordinator";
};

using coordinator_actor = caf::stateful_actor<coordinator_state>;

int index_of_child(const std::string& child) {
  if (child.rfind("shard-", 0) != 0) return -1;
  return parse_uint<int>(std::string_view(child).substr(6)).value_or(-1);  // base/parse.hpp
}

/// A fault plan's kind and effect are in fault_report; its CLI form lets the
/// front end's injector learn that a copy of it fired inside a daemon.
void mark_fired(runtime_shared& rt, const std::string& spec) {
  if (!rt.opts.faults || spec.empty()) return;
  auto p = supervision::parse_fault_spec(spec);
  if (p) rt.opts.faults->mark_fired(*p);
}

/// Index of the supervision decision to restart or move `stage`'s shard:
/// call with rt.mu held.
int stage_of(const runtime_shared& rt, int index) { return rt.plan.shards[index].stage; }

/// The node placement index `index` runs on (rt.mu held), -1 if none.
int node_of_locked(const runtime_shared& rt, int index) {
  return index >= 0 && index < static_cast<int>(rt.node_of.size()) ? rt.node_of[index] : -1;
}

/// Restarts are announced in batches. A new incarnation enters the wiring
/// only here (the factory leaves actor_of alone on restarts), and the
/// sessions hear of it only once it and the shards that send to it have
/// confirmed their new wiring (a request answered after the wire message was
/// handled: over daemons, nothing orders the wiring from the front end
/// against activations from a neighbour). Restarts that overlap -- two
/// shards of one tensor group crashing together -- join the batch, so the
/// sessions learn of all of them at once, and no session replays through a
/// new incarnation it has not restored first. Each notice carries the number
/// still to come (`remaining`); a session recovers when it reaches 0.
void restart_confirmed(coordinator_actor* self, uint64_t id) {
  auto& st = self->state;
  if (st.unconfirmed.erase(id) == 0 || !st.unconfirmed.empty()) return;  // late, or more to come
  std::vector<shard_restarted> notices;
  {
    std::lock_guard<std::mutex> lock(st.rt->mu);
    const auto& plan = st.rt->plan;
    for (int i : st.batch) {
      shard_restarted msg;
      const int s = plan.shards[i].stage;
      msg.index = i;
      msg.stage = s;
      msg.node = st.rt->node_of[i];
      msg.handle = st.rt->actor_of[i];
      msg.entry = st.rt->actor_of[plan.stages.front().shards.front()];
      if (s > 0) msg.stage_head = st.rt->actor_of[plan.stages[s - 1].shards.front()];
      for (int k : plan.stages[s].shards) msg.stage_group.push_back(st.rt->actor_of[k]);
      notices.push_back(std::move(msg));
    }
  }
  st.batch.clear();
  for (size_t k = 0; k < notices.size(); ++k) notices[k].remaining = static_cast<int32_t>(notices.size() - 1 - k);
  for (auto& s : st.sessions)
    for (const auto& n : notices) self->send(s, n);
}

/// A restarted shard joins the batch; its stage and the one before it get
/// the new wiring, to be confirmed.
void announce_restart(coordinator_actor* self, int i, const caf::actor& handle) {
  auto& st = self->state;
  std::vector<std::pair<caf::actor, wiring>> confirm;
  caf::actor silent_incarnation;  // started on a node suspected since
  caf::actor_addr previous;
  {
    std::lock_guard<std::mutex> lock(st.rt->mu);
    if (st.rt->actor_of[i]) previous = st.rt->actor_of[i].address();
    st.rt->actor_of[i] = handle;
    const auto& plan = st.rt->plan;
    const int s = plan.shards[i].stage;
    for (int stage : {s - 1, s}) {
      if (stage < 0) continue;
      for (int idx : plan.stages[stage].shards)
        if (st.rt->actor_of[idx]) confirm.emplace_back(st.rt->actor_of[idx], wiring_of(*st.rt, idx));
    }
    if (st.rt->unhealthy.count(st.rt->node_of[i])) silent_incarnation = handle;
  }
  st.batch.insert(i);
  // The previous incarnation is gone: a confirmation asked of it (by an
  // overlapping restart) will never come.
  std::vector<uint64_t> moot;
  for (auto& u : st.unconfirmed)
    if (previous && u.second == previous) moot.push_back(u.first);
  const uint64_t self_id = st.next_confirmation++;
  st.unconfirmed[self_id] = caf::actor_addr{};
  // A shard that does not answer within 2 s is on a node the detectors deal
  // with (suspected in ~0.35 s); the batch does not wait for it longer.
  for (auto& c : confirm) {
    const uint64_t id = st.next_confirmation++;
    st.unconfirmed[id] = c.first.address();
    self->request(c.first, std::chrono::milliseconds(2000), wire_atom::value, std::move(c.second))
        .then([self, id] { restart_confirmed(self, id); }, [self, id](caf::error&) { restart_confirmed(self, id); });
  }
  for (auto id : moot) restart_confirmed(self, id);
  restart_confirmed(self, self_id);  // a batch with nothing to confirm still goes out
  if (silent_incarnation) {
    // Its node fell silent between the factory's choice and now: the
    // detector's verdict went to the previous incarnation; repeat it.
    std::lock_guard<std::mutex> lock(st.rt->mu);
    const int s = st.rt->plan.shards[i].stage;
    if (s < static_cast<int>(st.rt->stage_supervisors.size()))
      self->send(st.rt->stage_supervisors[s], supervision::sv_exited_atom::value, "shard-" + std::to_string(i),
                 silent_incarnation,
                 supervision::make_error(supervision::sv_errc::node_silent,
                                         "node " + std::to_string(st.rt->node_of[i]) + " is suspected silent"));
  }
}

/// Every probe of a suspected node failed: take its shards away from it.
void declare_silent(coordinator_actor* self, int node, double phi) {
  auto& rt = *self->state.rt;
  std::vector<std::tuple<caf::actor, std::string, caf::actor>> victims;  // supervisor, child, incarnation
  {
    std::lock_guard<std::mutex> lock(rt.mu);
    if (rt.unhealthy.count(node)) return;
    rt.unhealthy.insert(node);
    for (auto it = rt.spare_nodes.begin(); it != rt.spare_nodes.end(); ++it)
      if (*it == node) {  // a spare went quiet: just stop offering it
        rt.spare_nodes.erase(it);
        break;
      }
    const int64_t now = now_ns();
    for (size_t i = 0; i < rt.node_of.size(); ++i)
      if (rt.node_of[i] == node) {
        self->state.faults.decided(static_cast<int>(i), node, "node-silent", now);
        const int s = stage_of(rt, static_cast<int>(i));
        caf::actor sup = s < static_cast<int>(rt.stage_supervisors.size()) ? rt.stage_supervisors[s] : caf::actor{};
        victims.emplace_back(sup, "shard-" + std::to_string(i), rt.actor_of[i]);
      }
  }
  // The stage supervisor restarts them now (the factory avoids this
  // node); a proxy's own down_msg would wait for the connection timeout.
  for (auto& v : victims) {
    if (std::get<0>(v))
      self->send(std::get<0>(v), supervision::sv_exited_atom::value, std::get<1>(v), std::get<2>(v),
                 supervision::make_error(supervision::sv_errc::node_silent,
                                         "node " + std::to_string(node) + ": heartbeats stopped (phi " +
                                             std::to_string(phi).substr(0, 5) + ")"));
    else if (std::get<2>(v))
      self->send_exit(std::get<2>(v), caf::exit_reason::kill);
  }
}

/// The node's suspicion changed (cleared or ended): publish the cleared list.
void publish_suspicions(coordinator_actor* self) {
  auto& st = self->state;
  std::lock_guard<std::mutex> lock(st.rt->mu);
  const auto& recs = st.suspicions.cleared();
  for (size_t k = st.cleared.size(); k < recs.size(); ++k) {
    suspicion_info s;
    s.node = static_cast<int>(recs[k].peer);
    s.at_ns = recs[k].at.time_since_epoch().count();
    s.cleared_after_ms = recs[k].cleared_after_ms;
    s.cleared_by = recs[k].cleared_by;
    st.cleared.push_back(std::move(s));
  }
}

void on_probe_answer(coordinator_actor* self, int node, uint64_t round, bool ok, const char* how) {
  auto& st = self->state;
  using verdict = supervision::suspicion_table::verdict;
  switch (st.suspicions.answer(static_cast<uint64_t>(node), round, ok, self->clock().now(), how)) {
    case verdict::cleared:
      publish_suspicions(self);
      // Heartbeats still missing: ask again later (a node that answers now
      // but freezes afterwards is still found).
      self->delayed_send(self, st.suspicions.config().reprobe_every, reprobe_atom::value,
                         static_cast<int32_t>(node));
      return;
    case verdict::dead: {
      const double phi = st.suspect_phi.count(node) ? st.suspect_phi[node] : 0.0;
      // Forgotten: if it heartbeats again it may rejoin as a spare and be
      // suspected afresh later.
      st.suspicions.forget(static_cast<uint64_t>(node));
      declare_silent(self, node, phi);
      return;
    }
    case verdict::pending:
    case verdict::stale: return;
  }
}

/// One SWIM probe round for a suspected node: a direct liveness request to
/// one of its shards (they answer even mid-step: compute runs on their
/// worker) or, if it holds none, to its heartbeat sender; and an indirect one
/// through a shard on another healthy node. Any answer clears the node.
void probe_round(coordinator_actor* self, int node) {
  auto& st = self->state;
  caf::actor target, helper, sender;
  {
    std::lock_guard<std::mutex> lock(st.rt->mu);
    auto& rt = *st.rt;
    for (size_t i = 0; i < rt.node_of.size(); ++i) {
      if (!rt.actor_of[i]) continue;
      if (rt.node_of[i] == node && !target) target = rt.actor_of[i];
      if (rt.node_of[i] != node && !rt.unhealthy.count(rt.node_of[i]) && !helper) helper = rt.actor_of[i];
    }
    if (!target && node >= 0 && node < static_cast<int>(rt.heartbeats.size())) sender = rt.heartbeats[node];
  }
  const auto timeout = std::chrono::duration_cast<caf::timespan>(st.suspicions.config().probe_timeout);
  const int probes = (target || sender ? 1 : 0) + (target && helper ? 1 : 0);
  if (probes == 0) {
    on_probe_answer(self, node, st.suspicions.start_round(static_cast<uint64_t>(node), 1), false, "direct");
    return;
  }
  const uint64_t round = st.suspicions.start_round(static_cast<uint64_t>(node), probes);
  if (round == 0) return;
  if (target) {
    self->request(target, timeout, alive_atom::value)
        .then([self, node, round](alive_atom, int32_t) { on_probe_answer(self, node, round, true, "direct"); },
              [self, node, round](caf::error&) { on_probe_answer(self, node, round, false, "direct"); });
    if (helper)
      // The helper's own request times out after `timeout`; ours waits a
      // little longer for its verdict.
      self->request(helper, timeout + timeout / 2, probe_peer_atom::value, target, timeout)
          .then([self, node, round](bool ok) { on_probe_answer(self, node, round, ok, "indirect"); },
                [self, node, round](caf::error&) { on_probe_answer(self, node, round, false, "indirect"); });
  } else {
    self->request(sender, timeout, supervision::hb_probe_atom::value)
        .then([self, node, round](supervision::hb_probe_atom) { on_probe_answer(self, node, round, true, "direct"); },
              [self, node, round](caf::error&) { on_probe_answer(self, node, round, false, "direct"); });
  }
}

caf::behavior coordinator(coordinator_actor* self, std::shared_ptr<runtime_shared> rt) {
  self->state.rt = std::move(rt);
  return {
      [=](join_atom, caf::actor s) { self->state.sessions.insert(s); },
      // Synchronisation point: answered after every message sent before it.
      [=](fault_atom) { return fault_snapshot{self->state.faults.records(), self->state.cleared}; },
      [=](decided_atom, int32_t index, int32_t node, const std::string& kind, int64_t at) {
        self->state.faults.decided(index, node, kind, at);
      },
      [=](leave_atom, caf::actor s) { self->state.sessions.erase(s); },
      [=](fault_report& f) {
        mark_fired(*self->state.rt, f.spec);  // opts.faults: set before start, thread-safe
        self->state.faults.fired(f.kind, f.index, f.node, f.step, f.at_ns);
      },
      [=](recovered_atom, int32_t index, int32_t replayed, int64_t at) {
        auto& rt = *self->state.rt;
        std::lock_guard<std::mutex> lock(rt.mu);
        self->state.faults.recovered(index, replayed, at, rt.node_of[index]);
      },
      // Heartbeats of a node stopped: probe it before anything else.
      [=](supervision::hb_suspect_atom, supervision::suspect_event& e) {
        auto& st = self->state;
        const int node = static_cast<int>(e.peer);
        {
          std::lock_guard<std::mutex> lock(st.rt->mu);
          if (st.rt->unhealthy.count(node)) return;
        }
        if (!st.suspicions.suspect(e.peer, self->clock().now())) return;
        st.suspect_phi[node] = e.phi;
        probe_round(self, node);
      },
      [=](reprobe_atom, int32_t node) {
        if (self->state.suspicions.needs_reprobe(static_cast<uint64_t>(node))) probe_round(self, node);
      },
      // A suspected node heartbeats again (a daemon thawed before its
      // connection timed out): its shards were moved and told to stop; if it
      // holds none and is reachable, it rejoins as a spare.
      [=](supervision::hb_alive_atom, uint64_t peer) {
        self->state.suspicions.alive(peer, self->clock().now());
        publish_suspicions(self);
        auto& rt = *self->state.rt;
        std::lock_guard<std::mutex> lock(rt.mu);
        const int node = static_cast<int>(peer);
        if (!rt.unhealthy.count(node) || !rt.host->reachable(node)) return;
        for (int n : rt.node_of)
          if (n == node) return;
        rt.unhealthy.erase(node);
        rt.spare_nodes.push_back(node);
      },
      [=](supervision::sv_event_atom, supervision::supervisor_event& ev) {
        auto& st = self->state;
        if (ev.kind == supervision::supervisor_event_kind::child_restarted) {
          const int i = index_of_child(ev.child);
          if (i < 0) return;
          announce_restart(self, i, ev.handle);
          return;
        }
        if (ev.kind == supervision::supervisor_event_kind::escalated) {
          std::string text;
          {
            std::lock_guard<std::mutex> lock(st.rt->mu);
            if (st.rt->failed) return;
            st.rt->failed = true;
            const auto& o = st.rt->opts;
            if (!st.rt->last_error.empty())
              text = "recovery impossible: " + ev.supervisor + " could not restart " + ev.child + ": " +
                     st.rt->last_error;
            else
              text = "recovery impossible: " + ev.supervisor + " exceeded its restart intensity (at most " +
                     std::to_string(o.max_restarts) + " restarts in " +
                     std::to_string(o.restart_period.count() / 1000.0).substr(0, 4) + " s); last failure of " +
                     ev.cause + ": " + supervision::describe(ev.reason);
            st.rt->failure = text;
          }
          for (auto& s : st.sessions) self->send(s, cluster_failed{text});
        }
      },
  };
}

/// Where placement index `idx` starts now (rt.mu held): the policy of
/// topologies::choose_node over the runtime's view -- healthy, reachable and
/// tried nodes, spares, current needs -- then its effects applied (spares
/// taken, nodes found unreachable marked unhealthy). -1 with `why` set when
/// there is none. Nodes in `tried` failed already.
int choose_node(runtime_shared& rt, int idx, const std::set<int>& tried, std::string& why) {
  topologies::replacement_input in;
  in.index = idx;
  in.node_of = rt.node_of;
  for (size_t i = 0; i < rt.node_of.size(); ++i) in.need_of.push_back(rt.plan.shards[i].memory.total());
  in.spares.assign(rt.spare_nodes.begin(), rt.spare_nodes.end());
  for (const auto& n : rt.host->nodes())
    in.nodes.push_back(topologies::candidate_node{n.index, n.prof.memory_bytes, rt.unhealthy.count(n.index) == 0,
                                                  rt.host->reachable(n.index), tried.count(n.index) > 0});
  const auto choice = topologies::choose_node(in);
  for (int i = 0; i < choice.spares_taken && !rt.spare_nodes.empty(); ++i) rt.spare_nodes.pop_front();
  for (int n : choice.unreachable) rt.unhealthy.insert(n);
  if (choice.node < 0) why = choice.why;
  return choice.node;
}

/// One start of one placement index: the nodes tried so far and where the
/// result goes (the supervisor's start_done, or the synchronous factory's slot).
struct start_attempt {
  std::shared_ptr<runtime_shared> rt;
  int idx = -1;
  uint64_t incarnation = 0;
  caf::actor_system* sys = nullptr;
  std::set<int> tried;
  std::string errors;  // "node 2: why; node 3: why"
  std::function<void(caf::actor)> done;
};

/// Chooses a node for the attempt and spawns the shard there; on a failed
/// spawn a restart tries the next node (the first start keeps the
/// placement's node and fails). Ends by calling at->done once: the shard,
/// or an invalid handle with rt->last_error set. The spawn runs without
/// rt->mu held; its callback may run on another thread, or before
/// spawn_async returns (in process).
void next_node(const std::shared_ptr<start_attempt>& at) {
  auto& rt = *at->rt;
  const int idx = at->idx;
  std::unique_lock<std::mutex> lock(rt.mu);
  std::string why;
  const int node = choose_node(rt, idx, at->tried, why);
  if (node < 0) {
    rt.last_error = why + (at->errors.empty() ? "" : "; tried: " + at->errors);
    lock.unlock();
    at->done(caf::actor{});
    return;
  }
  rt.node_of[idx] = node;
  const auto& placed = rt.plan.shards[idx];
  topologies::shard moved = placed;
  moved.node = node;
  shard_request req;
  req.placed = &moved;
  req.spec.layer_begin = placed.layers.begin;
  req.spec.layer_end = placed.layers.end;
  req.spec.kv_head_begin = placed.kv_heads.begin;
  req.spec.kv_head_end = placed.kv_heads.end;
  req.spec.ffn_begin = placed.ffn.begin;
  req.spec.ffn_end = placed.ffn.end;
  req.spec.embedding = placed.has_embedding;
  req.spec.classifier = placed.has_classifier;
  req.spec.vocab_begin = placed.vocab.begin;
  req.spec.vocab_end = placed.vocab.end;
  req.spec.routed = placed.routed;
  req.spec.experts = placed.experts;
  req.weights = rt.weights;
  req.matmul = rt.matmul;
  req.ctx = rt.ctx;
  req.kernels = rt.kernels;
  req.checkpoint_every = rt.opts.checkpoint_every;
  req.batch_size = rt.opts.batch_size;
  req.restarted = at->incarnation > 0;
  req.faults = rt.opts.faults;
  req.heartbeat = node < static_cast<int>(rt.heartbeats.size()) ? rt.heartbeats[node] : caf::actor{};
  req.coordinator = rt.coordinator;
  std::weak_ptr<runtime_shared> weak = at->rt;
  req.abandon = [weak, node] {
    auto r = weak.lock();
    if (!r) return true;
    std::lock_guard<std::mutex> l(r->mu);
    return r->unhealthy.count(node) > 0;
  };
  auto host = rt.host;
  lock.unlock();
  host->spawn_async(*at->sys, req, [at, node](result<caf::actor> a) {
    auto& rt = *at->rt;
    std::unique_lock<std::mutex> lock(rt.mu);
    if (a) {
      // A restart enters the wiring through the coordinator only
      // (announce_restart), never before the sessions can restore it.
      if (at->incarnation == 0) rt.actor_of[at->idx] = *a;
      lock.unlock();
      at->done(*a);
      return;
    }
    at->errors += (at->errors.empty() ? "" : "; ") + std::string("node ") + std::to_string(node) + ": " + a.message();
    at->tried.insert(node);
    if (!rt.host->reachable(node)) rt.unhealthy.insert(node);
    if (at->incarnation == 0) {  // the first start keeps the placement's node
      rt.last_error = "placement index " + std::to_string(at->idx) + " on node " + std::to_string(node) + ": " +
                      a.message();
      lock.unlock();
      at->done(caf::actor{});
      return;
    }
    lock.unlock();
    next_node(at);
  });
}

}  // namespace

wiring wiring_of(const runtime_shared& rt, int index) {
  const auto& plan = rt.plan;
  const auto& sh = plan.shards[static_cast<size_t>(index)];
  wiring w;
  for (int idx : plan.stages[static_cast<size_t>(sh.stage)].shards) {
    w.group.push_back(rt.actor_of[idx]);
    w.group_nodes.push_back(rt.node_of[idx]);
    w.group_index.push_back(idx);
  }
  if (sh.stage + 1 < static_cast<int>(plan.stages.size()))
    for (int idx : plan.stages[static_cast<size_t>(sh.stage + 1)].shards) {
      w.next.push_back(rt.actor_of[idx]);
      w.next_nodes.push_back(rt.node_of[idx]);
      w.next_index.push_back(idx);
    }
  for (const auto& op : sh.program) w.program.push_back(to_wire(op));
  return w;
}

void send_wiring(const runtime_shared& rt, int stage) {
  for (int idx : rt.plan.stages[stage].shards)
    if (rt.actor_of[idx]) caf::anon_send(rt.actor_of[idx], wire_atom::value, wiring_of(rt, idx));
}

void stop_runtime(runtime_shared& rt, const caf::actor& supervisor) {
  if (supervisor) caf::anon_send_exit(supervisor, caf::exit_reason::user_shutdown);
  std::lock_guard<std::mutex> lock(rt.mu);
  for (auto& a : rt.actor_of)
    if (a) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& h : rt.heartbeats)
    if (h) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  if (rt.heartbeat_monitor) caf::anon_send_exit(rt.heartbeat_monitor, caf::exit_reason::user_shutdown);
  if (rt.coordinator) caf::anon_send_exit(rt.coordinator, caf::exit_reason::user_shutdown);
}

result<caf::actor> start_runtime(caf::actor_system& sys, std::shared_ptr<runtime_shared> rt,
                                 std::chrono::milliseconds deadline) {
  const auto& plan = rt->plan;
  rt->node_of.assign(plan.shards.size(), -1);
  rt->actor_of.assign(plan.shards.size(), caf::actor{});
  for (const auto& s : plan.shards) rt->node_of[s.index] = s.node;
  for (const auto& sp : plan.spares) rt->spare_nodes.push_back(sp.node);

  rt->coordinator = sys.spawn(coordinator, rt);
  // Heartbeats travel apart from the data: one sender per node.
  supervision::heartbeat_monitor_config mc;
  mc.detector = rt->opts.detector;
  mc.listeners = {rt->coordinator};
  auto monitor = supervision::spawn_heartbeat_monitor(sys, mc);
  if (!monitor) {
    stop_runtime(*rt, caf::actor{});
    return make_error("heartbeat monitor: " + sys.render(monitor.error()));
  }
  rt->heartbeat_monitor = *monitor;
  int max_node = 0;
  for (const auto& n : rt->host->nodes()) max_node = std::max(max_node, n.index);
  rt->heartbeats.assign(max_node + 1, caf::actor{});
  for (const auto& n : rt->host->nodes()) {
    auto hb = rt->host->start_heartbeat(sys, n.index, *monitor, rt->opts.heartbeat);
    if (!hb) {
      stop_runtime(*rt, caf::actor{});
      return make_error("heartbeats: " + hb.message());
    }
    rt->heartbeats[n.index] = *hb;
  }

  // Stage supervisors over shards, under one cluster supervisor.
  supervision::supervisor_config top;
  top.name = "cluster supervisor";
  top.strategy = supervision::restart_strategy::one_for_one;
  top.intensity.max_restarts = 0;  // a stage that gives up ends the cluster
  top.parent = rt->coordinator;
  top.listeners = {rt->coordinator};
  for (const auto& stage : plan.stages) {
    supervision::supervisor_config sc;
    sc.name = "stage " + std::to_string(stage.index) + " supervisor";
    sc.strategy = supervision::restart_strategy::one_for_one;
    sc.intensity.max_restarts = rt->opts.max_restarts;
    sc.intensity.period = rt->opts.restart_period;
    sc.listeners = {rt->coordinator};
    for (int idx : stage.shards) {
      supervision::child_spec cs;
      cs.id = "shard-" + std::to_string(idx);
      // The first part of a start (what the last incarnation's end means)
      // runs in the factory; the attempts over nodes run in start_attempt.
      auto begin = [rt, idx](const supervision::start_context& ctx) {
        std::lock_guard<std::mutex> lock(rt->mu);
        if (ctx.incarnation > 0) {
          // Detection of a failure the runtime did not inject: a daemon's
          // connection lost shows up as remote_link_unreachable.
          const bool link = ctx.last_reason == caf::exit_reason::remote_link_unreachable;
          const bool stopped = ctx.last_reason == caf::exit_reason::user_shutdown;
          // Recorded by the coordinator: this message is in its mailbox
          // before the supervisor's child_restarted event (which follows
          // this start's result).
          caf::anon_send(rt->coordinator, decided_atom::value, static_cast<int32_t>(idx),
                         static_cast<int32_t>(node_of_locked(*rt, idx)),
                         std::string(link ? "node-down" : stopped ? "node-stopped" : "exit"), now_ns());
          // The connection to its node is gone: do not wait on it again
          // (the owner's monitor may not have flagged it yet).
          if (link) rt->unhealthy.insert(rt->node_of[idx]);
          // An injected crash fired in a daemon: its report may still be on
          // the way, but this incarnation must not get the plan again.
          if (auto step = supervision::fault_hooks::crash_step(ctx.last_reason); step && rt->opts.faults)
            rt->opts.faults->mark_fired_through(static_cast<uint32_t>(idx), supervision::fault_kind::crash, *step);
        }
        auto at = std::make_shared<start_attempt>();
        at->rt = rt;
        at->idx = idx;
        at->incarnation = ctx.incarnation;
        at->sys = &ctx.system;
        return at;
      };
      if (rt->host->spawn_is_async()) {
        // A remote spawn waits for its daemon: as a request whose reply the
        // supervisor handles (start_async), never a wait in the factory.
        cs.start_async = [begin](const supervision::start_context& ctx, supervision::start_done done) {
          auto at = begin(ctx);
          at->done = std::move(done);
          next_node(at);
        };
      } else {
        // In process a spawn returns the shard at once: the callback runs
        // before next_node returns.
        cs.start = [begin](const supervision::start_context& ctx) -> caf::actor {
          auto at = begin(ctx);
          auto out = std::make_shared<caf::actor>();
          at->done = [out](caf::actor h) { *out = std::move(h); };
          next_node(at);
          return *out;
        };
      }
      sc.children.push_back(std::move(cs));
    }
    top.children.push_back(supervision::supervisor_child(sc.name, sc));
  }
  auto sup = supervision::spawn_supervisor(sys, top);
  if (!sup) {
    stop_runtime(*rt, caf::actor{});
    return make_error("supervision tree: " + sys.render(sup.error()));
  }
  // Wait until every shard runs (the supervisors start children on init).
  caf::scoped_actor self{sys};
  const auto until = clock_type::now() + deadline;
  while (true) {
    bool all = true;
    std::string err;
    {
      std::lock_guard<std::mutex> lock(rt->mu);
      for (auto& a : rt->actor_of) all = all && static_cast<bool>(a);
      err = rt->last_error;
    }
    if (all) break;
    if (!err.empty()) {
      stop_runtime(*rt, *sup);
      return make_error(err);
    }
    if (clock_type::now() > until) {
      stop_runtime(*rt, *sup);
      return make_error("shards did not start within " + std::to_string(deadline.count()) + " ms");
    }
    // Ask the top supervisor for its children: answered once it has started them.
    self->request(*sup, std::chrono::milliseconds(200), supervision::sv_children_atom::value)
        .receive([](std::vector<supervision::child_info>&) {}, [](caf::error&) {});
    self->receive(caf::after(std::chrono::milliseconds(1)) >> [] {});
  }
  // The stage supervisors, for verdicts of the heartbeat detector.
  {
    std::vector<caf::actor> stages;
    self->request(*sup, deadline, supervision::sv_children_atom::value)
        .receive(
            [&](std::vector<supervision::child_info>& kids) {
              for (auto& k : kids) stages.push_back(k.handle);
            },
            [](caf::error&) {});
    if (stages.size() != plan.stages.size()) {
      stop_runtime(*rt, *sup);
      return make_error("the supervision tree did not report its " + std::to_string(plan.stages.size()) +
                        " stage supervisors");
    }
    std::lock_guard<std::mutex> lock(rt->mu);
    rt->stage_supervisors = std::move(stages);
  }
  // Every shard has its wiring before the first step: over daemons a step
  // could otherwise overtake it (different senders, no order between them).
  // A request to the void handler is answered once the wiring is applied.
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    for (int idx : plan.stages[s].shards) {
      std::string err;
      self->request(rt->actor_of[idx], deadline, wire_atom::value, wiring_of(*rt, idx))
          .receive([] {}, [&](caf::error& e) { err = to_string(e); });
      if (!err.empty()) {
        stop_runtime(*rt, *sup);
        return make_error("placement index " + std::to_string(idx) + " did not take its wiring: " + err);
      }
    }
  }
  return *sup;
}

}  // namespace cellshard::actors
