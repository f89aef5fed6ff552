#include "actors/recovery.hpp"

#include "supervision/errors.hpp"
#include "supervision/heartbeat.hpp"
#include "supervision/messages.hpp"
#include "supervision/supervisor.hpp"

#include <caf/all.hpp>

namespace cellshard::actors {

namespace {

using clock_type = std::chrono::steady_clock;
using join_atom = caf::atom_constant<caf::atom("cs_join")>;
using leave_atom = caf::atom_constant<caf::atom("cs_leave")>;
using recovered_atom = caf::atom_constant<caf::atom("cs_recov")>;

int64_t now_ns() { return clock_type::now().time_since_epoch().count(); }

struct coordinator_state {
  std::shared_ptr<runtime_shared> rt;
  std::set<caf::actor> sessions;
  std::vector<int64_t> fired_ns;     // per fault record
  std::vector<int64_t> decided_ns;
  static inline const char* name = "cellshard.coordinator";
};

using coordinator_actor = caf::stateful_actor<coordinator_state>;

int index_of_child(const std::string& child) {
  if (child.rfind("shard-", 0) != 0) return -1;
  return std::stoi(child.substr(6));
}

/// The open fault record of placement index i (fired, not yet decided), or -1.
int open_record(coordinator_actor* self, int index) {
  auto& rt = *self->state.rt;
  for (int k = static_cast<int>(rt.faults.size()) - 1; k >= 0; --k)
    if (rt.faults[k].index == index && self->state.decided_ns[k] == 0) return k;
  return -1;
}

void decide(coordinator_actor* self, int index) {
  const int k = open_record(self, index);
  if (k < 0) return;
  auto& st = self->state;
  st.decided_ns[k] = now_ns();
  st.rt->faults[k].detect_ms = (st.decided_ns[k] - st.fired_ns[k]) / 1e6;
}

caf::behavior coordinator(coordinator_actor* self, std::shared_ptr<runtime_shared> rt) {
  self->state.rt = std::move(rt);
  return {
      [=](join_atom, caf::actor s) { self->state.sessions.insert(s); },
      // Synchronisation point: answered after every message sent before it.
      [=](fault_atom) { return true; },
      [=](leave_atom, caf::actor s) { self->state.sessions.erase(s); },
      [=](fault_report& f) {
        auto& st = self->state;
        std::lock_guard<std::mutex> lock(st.rt->mu);
        fault_record r;
        r.kind = f.kind;
        r.index = f.index;
        r.node = f.node;
        r.step = f.step;
        st.rt->faults.push_back(r);
        st.fired_ns.push_back(f.at_ns);
        st.decided_ns.push_back(0);
      },
      [=](recovered_atom, int32_t index, int32_t replayed, int64_t at) {
        auto& st = self->state;
        std::lock_guard<std::mutex> lock(st.rt->mu);
        for (int k = static_cast<int>(st.rt->faults.size()) - 1; k >= 0; --k) {
          auto& r = st.rt->faults[k];
          if (r.index == index && st.decided_ns[k] != 0 && r.recover_ms < 0) {
            r.recover_ms = (at - st.decided_ns[k]) / 1e6;
            r.replayed_positions = replayed;
            r.moved_to_node = st.rt->node_of[index];
            break;
          }
        }
      },
      // Heartbeats of a node stopped: take its shards away from it.
      [=](supervision::hb_suspect_atom, supervision::suspect_event& e) {
        auto& st = self->state;
        std::vector<caf::actor> victims;
        {
          std::lock_guard<std::mutex> lock(st.rt->mu);
          const int node = static_cast<int>(e.peer);
          if (st.rt->unhealthy.count(node)) return;
          bool hosts = false;
          for (size_t i = 0; i < st.rt->node_of.size(); ++i)
            if (st.rt->node_of[i] == node) hosts = true;
          if (!hosts) {  // a spare went quiet: just stop offering it
            st.rt->unhealthy.insert(node);
            for (auto it = st.rt->spare_nodes.begin(); it != st.rt->spare_nodes.end(); ++it)
              if (*it == node) {
                st.rt->spare_nodes.erase(it);
                break;
              }
            return;
          }
          st.rt->unhealthy.insert(node);
          for (size_t i = 0; i < st.rt->node_of.size(); ++i)
            if (st.rt->node_of[i] == node) {
              decide(self, static_cast<int>(i));
              victims.push_back(st.rt->actor_of[i]);
            }
        }
        // Killed shards are restarted by their stage supervisor; the factory
        // places them on a spare because this node is unhealthy.
        for (auto& v : victims) self->send_exit(v, caf::exit_reason::kill);
      },
      [=](supervision::hb_alive_atom, uint64_t) {},
      [=](supervision::sv_event_atom, supervision::supervisor_event& ev) {
        auto& st = self->state;
        if (ev.kind == supervision::supervisor_event_kind::child_restarted) {
          const int i = index_of_child(ev.child);
          if (i < 0) return;
          shard_restarted msg;
          {
            std::lock_guard<std::mutex> lock(st.rt->mu);
            st.rt->actor_of[i] = ev.handle;
            decide(self, i);
            const auto& plan = st.rt->plan;
            const int s = plan.shards[i].stage;
            send_wiring(*st.rt, s);
            if (s > 0) send_wiring(*st.rt, s - 1);
            msg.index = i;
            msg.stage = s;
            msg.node = st.rt->node_of[i];
            msg.handle = ev.handle;
            msg.entry = st.rt->actor_of[plan.stages.front().shards.front()];
            if (s > 0) msg.stage_head = st.rt->actor_of[plan.stages[s - 1].shards.front()];
            for (int k : plan.stages[s].shards) msg.stage_group.push_back(st.rt->actor_of[k]);
          }
          for (auto& s : st.sessions) self->send(s, msg);
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

}  // namespace

wiring wiring_of(const runtime_shared& rt, int stage) {
  const auto& plan = rt.plan;
  wiring w;
  for (int idx : plan.stages[stage].shards) {
    w.group.push_back(rt.actor_of[idx]);
    w.group_nodes.push_back(rt.node_of[idx]);
  }
  if (stage + 1 < static_cast<int>(plan.stages.size()))
    for (int idx : plan.stages[stage + 1].shards) {
      w.next.push_back(rt.actor_of[idx]);
      w.next_nodes.push_back(rt.node_of[idx]);
    }
  return w;
}

void send_wiring(const runtime_shared& rt, int stage) {
  const wiring w = wiring_of(rt, stage);
  for (int idx : rt.plan.stages[stage].shards)
    if (rt.actor_of[idx]) caf::anon_send(rt.actor_of[idx], wire_atom::value, w);
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
    supervision::heartbeat_sender_config hc;
    hc.monitor = *monitor;
    hc.peer = static_cast<uint64_t>(n.index);
    hc.interval = rt->opts.heartbeat;
    rt->heartbeats[n.index] = supervision::spawn_heartbeat_sender(sys, hc);
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
      cs.start = [rt, idx](const supervision::start_context& ctx) -> caf::actor {
        std::lock_guard<std::mutex> lock(rt->mu);
        const auto& placed = rt->plan.shards[idx];
        int node = rt->node_of[idx];
        if (rt->unhealthy.count(node)) {
          if (rt->spare_nodes.empty()) {
            rt->last_error = "no spare node left for placement index " + std::to_string(idx) +
                             " (node " + std::to_string(node) + " is silent)";
            return caf::actor{};
          }
          node = rt->spare_nodes.front();
          rt->spare_nodes.pop_front();
          rt->node_of[idx] = node;
        }
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
        req.weights = rt->weights;
        req.kernels = rt->kernels;
        req.checkpoint_every = rt->opts.checkpoint_every;
        req.faults = rt->opts.faults;
        req.heartbeat = node < static_cast<int>(rt->heartbeats.size()) ? rt->heartbeats[node] : caf::actor{};
        req.coordinator = rt->coordinator;
        auto a = rt->host->spawn(ctx.system, req);
        if (!a) {
          rt->last_error = "placement index " + std::to_string(idx) + " on node " +
                           std::to_string(node) + ": " + a.message();
          return caf::actor{};
        }
        rt->actor_of[idx] = *a;
        return *a;
      };
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
  // Every shard has its wiring before the first step: over daemons a step
  // could otherwise overtake it (different senders, no order between them).
  // A request to the void handler is answered once the wiring is applied.
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const wiring w = wiring_of(*rt, static_cast<int>(s));
    for (int idx : plan.stages[s].shards) {
      std::string err;
      self->request(rt->actor_of[idx], deadline, wire_atom::value, w)
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
