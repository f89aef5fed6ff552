#include "actors/recovery.hpp"

#include "actors/coordinator.hpp"

#include "base/parse.hpp"
#include "topologies/replacement.hpp"

#include "supervision/errors.hpp"
#include "supervision/fault_hooks.hpp"
#include "supervision/heartbeat.hpp"
#include "supervision/messages.hpp"
#include "supervision/supervisor.hpp"
#include "topologies/profile.hpp"

#include <caf/all.hpp>

#include <map>
#include <tuple>

namespace cellshard::actors {

namespace {

using coord_msg::ready_atom;
using coord_msg::setup_atom;
using coord_msg::spawn_outcome;
using coord_msg::stages_atom;
using coord_msg::start_request;
using coord_msg::stop_atom;
using clock_type = std::chrono::steady_clock;
using reprobe_atom = caf::atom_constant<caf::atom("cs_reprobe")>;
/// (quit): the last spawns did not end in time after (stop).
using quit_atom = caf::atom_constant<caf::atom("cs_quit")>;

int64_t now_ns() { return clock_type::now().time_since_epoch().count(); }

/// Nodes suspected silent, as flags a remote spawner can read from its own
/// thread (shard_request::abandon). Written by the coordinator only; sized
/// once.
struct silent_flags {
  explicit silent_flags(size_t n) : flag(n) {}
  bool is_set(int node) const {
    return all.load() ||
           (node >= 0 && static_cast<size_t>(node) < flag.size() && flag[static_cast<size_t>(node)].load());
  }
  void set(int node, bool v) {
    if (node >= 0 && static_cast<size_t>(node) < flag.size()) flag[static_cast<size_t>(node)].store(v);
  }
  std::vector<std::atomic<bool>> flag;
  std::atomic<bool> all{false};  // the runtime stops: abandon every spawn
};

/// One start of one placement index: the nodes tried so far and where the
/// result goes (the supervisor's start_done).
struct start_attempt {
  int idx = -1;
  uint64_t incarnation = 0;
  std::set<int> tried;
  std::string errors;  // "node 2: why; node 3: why"
  supervision::start_done done;
};

struct coordinator_state {
  std::shared_ptr<const runtime_config> cfg;
  std::shared_ptr<runtime_board> board;
  // The placement state: owned here, written only by this actor, published
  // to the board after every change (publish).
  std::vector<int> node_of;           // current node of each placement index
  std::vector<caf::actor> actor_of;   // current actor of each placement index
  std::set<int> unhealthy;            // nodes suspected silent or unreachable
  std::shared_ptr<silent_flags> silent;  // the same, for remote spawners
  std::deque<int> spare_nodes;        // nodes free to take shards
  std::vector<caf::actor> heartbeats; // heartbeat sender by node index
  std::vector<caf::actor> stage_supervisors;  // by stage, once the tree runs
  std::string last_error;             // why the last start failed
  bool failed = false;
  std::string failure;
  bool stopped = false;               // after (stop): publishes nothing more
  // Starts in progress, by attempt id.
  std::map<uint64_t, start_attempt> attempts;
  uint64_t next_attempt = 1;
  std::vector<caf::response_promise> ready;  // start_runtime waiting for every first start
  std::set<caf::actor> sessions;
  // Restarts whose wiring is being confirmed; announced together when the
  // last confirmation is in (see restart_confirmed).
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
void mark_fired(const runtime_config& cfg, const std::string& spec) {
  if (!cfg.opts.faults || spec.empty()) return;
  auto p = supervision::parse_fault_spec(spec);
  if (p) cfg.opts.faults->mark_fired(*p);
}

int stage_of(const coordinator_state& st, int index) { return st.cfg->plan.shards[index].stage; }

int node_of(const coordinator_state& st, int index) {
  return index >= 0 && index < static_cast<int>(st.node_of.size()) ? st.node_of[index] : -1;
}

/// Publishes the placement state as a new immutable snapshot.
void publish(coordinator_actor* self) {
  auto& st = self->state;
  if (st.stopped) return;
  auto v = std::make_shared<runtime_view>();
  v->node_of = st.node_of;
  v->actor_of = st.actor_of;
  if (st.failed) v->failure = st.failure.empty() ? std::string("the runtime failed") : st.failure;
  st.board->publish(std::move(v));
}

void mark_unhealthy(coordinator_state& st, int node) {
  st.unhealthy.insert(node);
  st.silent->set(node, true);
}

/// start_runtime's (ready) requests: answered once every shard runs, or
/// with the error of a first start that failed.
void check_ready(coordinator_actor* self) {
  auto& st = self->state;
  if (st.ready.empty()) return;
  bool all = true;
  for (auto& a : st.actor_of) all = all && static_cast<bool>(a);
  if (!all && st.last_error.empty()) return;
  const std::string answer = all ? std::string() : st.last_error;
  for (auto& rp : st.ready) rp.deliver(answer);
  st.ready.clear();
}

/// Restarts are announced in batches. A new incarnation enters the wiring
/// only here (a start leaves actor_of alone on restarts), and the
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
  const auto& plan = st.cfg->plan;
  for (int i : st.batch) {
    shard_restarted msg;
    const int s = plan.shards[i].stage;
    msg.index = i;
    msg.stage = s;
    msg.node = st.node_of[i];
    msg.handle = st.actor_of[i];
    msg.entry = st.actor_of[plan.stages.front().shards.front()];
    if (s > 0) msg.stage_head = st.actor_of[plan.stages[s - 1].shards.front()];
    for (int k : plan.stages[s].shards) msg.stage_group.push_back(st.actor_of[k]);
    notices.push_back(std::move(msg));
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
  caf::actor_addr previous;
  if (st.actor_of[i]) previous = st.actor_of[i].address();
  st.actor_of[i] = handle;
  publish(self);
  const auto& plan = st.cfg->plan;
  const int s = plan.shards[i].stage;
  for (int stage : {s - 1, s}) {
    if (stage < 0) continue;
    for (int idx : plan.stages[stage].shards)
      if (st.actor_of[idx]) confirm.emplace_back(st.actor_of[idx], wiring_of(plan, st.node_of, st.actor_of, idx));
  }
  // Started on a node suspected since the start chose it.
  const bool silent_incarnation = st.unhealthy.count(st.node_of[i]) > 0;
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
  if (silent_incarnation && s < static_cast<int>(st.stage_supervisors.size()))
    // Its node fell silent between the start's choice and now: the
    // detector's verdict went to the previous incarnation; repeat it.
    self->send(st.stage_supervisors[s], supervision::sv_exited_atom::value, "shard-" + std::to_string(i), handle,
               supervision::make_error(supervision::sv_errc::node_silent,
                                       "node " + std::to_string(st.node_of[i]) + " is suspected silent"));
}

/// Every probe of a suspected node failed: take its shards away from it.
void declare_silent(coordinator_actor* self, int node, double phi) {
  auto& st = self->state;
  if (st.unhealthy.count(node)) return;
  mark_unhealthy(st, node);
  for (auto it = st.spare_nodes.begin(); it != st.spare_nodes.end(); ++it)
    if (*it == node) {  // a spare went quiet: just stop offering it
      st.spare_nodes.erase(it);
      break;
    }
  const int64_t now = now_ns();
  for (size_t i = 0; i < st.node_of.size(); ++i) {
    if (st.node_of[i] != node) continue;
    st.faults.decided(static_cast<int>(i), node, "node-silent", now);
    const int s = stage_of(st, static_cast<int>(i));
    // The stage supervisor restarts it now (a start avoids this node); a
    // proxy's own down_msg would wait for the connection timeout.
    if (s < static_cast<int>(st.stage_supervisors.size()))
      self->send(st.stage_supervisors[s], supervision::sv_exited_atom::value, "shard-" + std::to_string(i),
                 st.actor_of[i],
                 supervision::make_error(supervision::sv_errc::node_silent,
                                         "node " + std::to_string(node) + ": heartbeats stopped (phi " +
                                             std::to_string(phi).substr(0, 5) + ")"));
    else if (st.actor_of[i])
      self->send_exit(st.actor_of[i], caf::exit_reason::kill);
  }
}

/// The node's suspicion changed (cleared or ended): keep the cleared list.
void publish_suspicions(coordinator_actor* self) {
  auto& st = self->state;
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
  for (size_t i = 0; i < st.node_of.size(); ++i) {
    if (!st.actor_of[i]) continue;
    if (st.node_of[i] == node && !target) target = st.actor_of[i];
    if (st.node_of[i] != node && !st.unhealthy.count(st.node_of[i]) && !helper) helper = st.actor_of[i];
  }
  if (!target && node >= 0 && node < static_cast<int>(st.heartbeats.size())) sender = st.heartbeats[node];
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

/// Where placement index `idx` starts now: the policy of
/// topologies::choose_node over the coordinator's view -- healthy,
/// reachable and tried nodes, spares, current needs -- then its effects
/// applied (spares taken, nodes found unreachable marked unhealthy). -1 with
/// `why` set when there is none. Nodes in `tried` failed already.
int choose_node(coordinator_state& st, int idx, const std::set<int>& tried, std::string& why) {
  const auto& cfg = *st.cfg;
  topologies::replacement_input in;
  in.index = idx;
  in.node_of = st.node_of;
  for (size_t i = 0; i < st.node_of.size(); ++i) in.need_of.push_back(cfg.plan.shards[i].memory.total());
  in.spares.assign(st.spare_nodes.begin(), st.spare_nodes.end());
  for (const auto& n : cfg.host->nodes())
    in.nodes.push_back(topologies::candidate_node{n.index, n.prof.memory_bytes, st.unhealthy.count(n.index) == 0,
                                                  cfg.host->reachable(n.index), tried.count(n.index) > 0});
  const auto choice = topologies::choose_node(in);
  for (int i = 0; i < choice.spares_taken && !st.spare_nodes.empty(); ++i) st.spare_nodes.pop_front();
  for (int n : choice.unreachable) mark_unhealthy(st, n);
  if (choice.node < 0) why = choice.why;
  return choice.node;
}

/// Ends attempt `id`: its supervisor gets `shard` (invalid: it failed).
void finish_attempt(coordinator_actor* self, uint64_t id, caf::actor shard) {
  auto& st = self->state;
  auto it = st.attempts.find(id);
  if (it == st.attempts.end()) return;
  auto done = std::move(it->second.done);
  st.attempts.erase(it);
  if (done) done(std::move(shard));
  check_ready(self);
}

/// Chooses a node for attempt `id` and spawns the shard there; the host's
/// result comes back as a spawn_outcome message (handled in the
/// coordinator: a failed restart tries the next node, a failed first start
/// -- which keeps the placement's node -- fails).
void next_node(coordinator_actor* self, uint64_t id) {
  auto& st = self->state;
  auto it = st.attempts.find(id);
  if (it == st.attempts.end()) return;
  auto& at = it->second;
  const auto& cfg = *st.cfg;
  const int idx = at.idx;
  std::string why;
  const int node = choose_node(st, idx, at.tried, why);
  if (node < 0) {
    st.last_error = why + (at.errors.empty() ? "" : "; tried: " + at.errors);
    finish_attempt(self, id, caf::actor{});
    return;
  }
  st.node_of[idx] = node;
  publish(self);
  const auto& placed = cfg.plan.shards[idx];
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
  req.weights = cfg.weights;
  req.matmul = cfg.matmul;
  req.ctx = cfg.ctx;
  req.kernels = cfg.kernels;
  req.checkpoint_every = cfg.opts.checkpoint_every;
  req.batch_size = cfg.opts.batch_size;
  req.restarted = at.incarnation > 0;
  req.faults = cfg.opts.faults;
  req.heartbeat = node < static_cast<int>(st.heartbeats.size()) ? st.heartbeats[node] : caf::actor{};
  req.coordinator = caf::actor_cast<caf::actor>(self);
  // A remote spawner asks from its own thread: the flags, not the state.
  req.abandon = [flags = st.silent, node] { return flags->is_set(node); };
  // The result may come from another thread, or before spawn_async returns
  // (in process): always as a message, handled after this one.
  const caf::actor_addr me = self->address();
  cfg.host->spawn_async(self->system(), req, [me, id, node](result<caf::actor> a) {
    auto coordinator = caf::actor_cast<caf::actor>(me);
    if (!coordinator) {  // stopped meanwhile: nobody will supervise it
      if (a && *a) caf::anon_send_exit(*a, caf::exit_reason::user_shutdown);
      return;
    }
    spawn_outcome o;
    o.attempt = id;
    o.node = node;
    if (a)
      o.shard = *a;
    else
      o.error = a.message();
    caf::anon_send(coordinator, std::move(o));
  });
}

caf::behavior coordinator(coordinator_actor* self, std::shared_ptr<const runtime_config> cfg,
                          std::shared_ptr<runtime_board> board) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  st.board = std::move(board);
  const auto& plan = st.cfg->plan;
  st.node_of.assign(plan.shards.size(), -1);
  st.actor_of.assign(plan.shards.size(), caf::actor{});
  for (const auto& s : plan.shards) st.node_of[s.index] = s.node;
  for (const auto& sp : plan.spares) st.spare_nodes.push_back(sp.node);
  int max_node = 0;
  for (const auto& n : st.cfg->host->nodes()) max_node = std::max(max_node, n.index);
  for (const auto& s : plan.shards) max_node = std::max(max_node, s.node);
  st.silent = std::make_shared<silent_flags>(static_cast<size_t>(max_node) + 1);
  publish(self);
  return {
      [=](setup_atom, std::vector<caf::actor>& heartbeats) { self->state.heartbeats = std::move(heartbeats); },
      [=](stages_atom, std::vector<caf::actor>& stages) { self->state.stage_supervisors = std::move(stages); },
      [=](ready_atom) {
        auto rp = self->make_response_promise();
        self->state.ready.push_back(rp);
        check_ready(self);
        return rp;
      },
      [=](stop_atom) {
        auto& st = self->state;
        if (st.stopped) return;
        for (auto& a : st.actor_of)
          if (a) self->send_exit(a, caf::exit_reason::user_shutdown);
        auto v = std::make_shared<runtime_view>();
        v->node_of = st.node_of;
        v->actor_of.assign(st.actor_of.size(), caf::actor{});
        if (st.failed) v->failure = st.failure.empty() ? std::string("the runtime failed") : st.failure;
        st.board->publish(std::move(v));
        st.stopped = true;
        for (auto& a : st.actor_of) a = nullptr;
        st.heartbeats.clear();
        st.stage_supervisors.clear();
        st.sessions.clear();
        // Spawns still running end as spawn_outcome, whose shard is killed
        // here (an in-process one is already in the mailbox; a remote
        // spawner abandons within its 100 ms tick). Their supervisors are
        // stopping: `done` is not called.
        st.silent->all = true;
        if (st.attempts.empty())
          self->quit(caf::exit_reason::user_shutdown);
        else
          self->delayed_send(self, std::chrono::seconds(10), quit_atom::value);
      },
      [=](quit_atom) { self->quit(caf::exit_reason::user_shutdown); },
      // A stage supervisor's factory: start one incarnation.
      [=](start_request& r) {
        auto& st = self->state;
        const int idx = r.idx;
        if (st.stopped) return;  // its supervisor is stopping too
        if (idx < 0 || idx >= static_cast<int>(st.node_of.size())) {
          if (r.done) r.done(caf::actor{});
          return;
        }
        if (r.incarnation > 0) {
          // Detection of a failure the runtime did not inject: a daemon's
          // connection lost shows up as remote_link_unreachable. Recorded
          // before the supervisor's child_restarted event, which follows
          // this start's result.
          const bool link = r.last_reason == caf::exit_reason::remote_link_unreachable;
          const bool stopped = r.last_reason == caf::exit_reason::user_shutdown;
          st.faults.decided(idx, node_of(st, idx), link ? "node-down" : stopped ? "node-stopped" : "exit",
                            now_ns());
          // The connection to its node is gone: do not wait on it again
          // (the owner's monitor may not have flagged it yet).
          if (link) mark_unhealthy(st, st.node_of[idx]);
          // An injected crash fired in a daemon: its report may still be on
          // the way, but this incarnation must not get the plan again.
          if (auto step = supervision::fault_hooks::crash_step(r.last_reason); step && st.cfg->opts.faults)
            st.cfg->opts.faults->mark_fired_through(static_cast<uint32_t>(idx), supervision::fault_kind::crash,
                                                    *step);
        }
        const uint64_t id = st.next_attempt++;
        auto& at = st.attempts[id];
        at.idx = idx;
        at.incarnation = r.incarnation;
        at.done = std::move(r.done);
        next_node(self, id);
      },
      [=](spawn_outcome& o) {
        auto& st = self->state;
        auto it = st.attempts.find(o.attempt);
        if (it == st.attempts.end() || st.stopped) {  // stopped meanwhile
          if (o.shard) self->send_exit(o.shard, caf::exit_reason::user_shutdown);
          if (it != st.attempts.end()) st.attempts.erase(it);
          if (st.stopped && st.attempts.empty()) self->quit(caf::exit_reason::user_shutdown);
          return;
        }
        auto& at = it->second;
        if (o.shard) {
          // A restart enters the wiring through announce_restart only,
          // never before the sessions can restore it.
          if (at.incarnation == 0) {
            st.actor_of[at.idx] = o.shard;
            publish(self);
          }
          finish_attempt(self, o.attempt, o.shard);
          return;
        }
        at.errors += (at.errors.empty() ? "" : "; ") + std::string("node ") + std::to_string(o.node) + ": " + o.error;
        at.tried.insert(o.node);
        if (!st.cfg->host->reachable(o.node)) mark_unhealthy(st, o.node);
        if (at.incarnation == 0) {  // the first start keeps the placement's node
          st.last_error = "placement index " + std::to_string(at.idx) + " on node " + std::to_string(o.node) + ": " +
                          o.error;
          finish_attempt(self, o.attempt, caf::actor{});
          return;
        }
        next_node(self, o.attempt);
      },
      [=](join_atom, caf::actor s) { self->state.sessions.insert(s); },
      // Synchronisation point: answered after every message sent before it.
      [=](fault_atom) { return fault_snapshot{self->state.faults.records(), self->state.cleared}; },
      [=](leave_atom, caf::actor s) { self->state.sessions.erase(s); },
      [=](fault_report& f) {
        mark_fired(*self->state.cfg, f.spec);
        self->state.faults.fired(f.kind, f.index, f.node, f.step, f.at_ns);
      },
      [=](recovered_atom, int32_t index, int32_t replayed, int64_t at) {
        self->state.faults.recovered(index, replayed, at, node_of(self->state, index));
      },
      // Heartbeats of a node stopped: probe it before anything else.
      [=](supervision::hb_suspect_atom, supervision::suspect_event& e) {
        auto& st = self->state;
        const int node = static_cast<int>(e.peer);
        if (st.stopped || st.unhealthy.count(node)) return;
        if (!st.suspicions.suspect(e.peer, self->clock().now())) return;
        st.suspect_phi[node] = e.phi;
        probe_round(self, node);
      },
      [=](reprobe_atom, int32_t node) {
        if (!self->state.stopped && self->state.suspicions.needs_reprobe(static_cast<uint64_t>(node))) probe_round(self, node);
      },
      // A suspected node heartbeats again (a daemon thawed before its
      // connection timed out): its shards were moved and told to stop; if it
      // holds none and is reachable, it rejoins as a spare.
      [=](supervision::hb_alive_atom, uint64_t peer) {
        auto& st = self->state;
        st.suspicions.alive(peer, self->clock().now());
        publish_suspicions(self);
        const int node = static_cast<int>(peer);
        if (st.stopped || !st.unhealthy.count(node) || !st.cfg->host->reachable(node)) return;
        for (int n : st.node_of)
          if (n == node) return;
        st.unhealthy.erase(node);
        st.silent->set(node, false);
        st.spare_nodes.push_back(node);
      },
      [=](supervision::sv_event_atom, supervision::supervisor_event& ev) {
        auto& st = self->state;
        if (st.stopped) return;
        if (ev.kind == supervision::supervisor_event_kind::child_restarted) {
          const int i = index_of_child(ev.child);
          if (i < 0 || i >= static_cast<int>(st.actor_of.size())) return;
          announce_restart(self, i, ev.handle);
          return;
        }
        if (ev.kind == supervision::supervisor_event_kind::escalated) {
          if (st.failed) return;
          st.failed = true;
          const auto& o = st.cfg->opts;
          std::string text;
          if (!st.last_error.empty())
            text = "recovery impossible: " + ev.supervisor + " could not restart " + ev.child + ": " + st.last_error;
          else
            text = "recovery impossible: " + ev.supervisor + " exceeded its restart intensity (at most " +
                   std::to_string(o.max_restarts) + " restarts in " +
                   std::to_string(o.restart_period.count() / 1000.0).substr(0, 4) + " s); last failure of " +
                   ev.cause + ": " + supervision::describe(ev.reason);
          st.failure = text;
          publish(self);
          for (auto& s : st.sessions) self->send(s, cluster_failed{text});
        }
      },
  };
}

}  // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const runtime_config> cfg,
                             std::shared_ptr<runtime_board> board) {
  return sys.spawn(coordinator, std::move(cfg), std::move(board));
}

wiring wiring_of(const topologies::placement& plan, const std::vector<int>& node_of,
                 const std::vector<caf::actor>& actor_of, int index) {
  const auto& sh = plan.shards[static_cast<size_t>(index)];
  wiring w;
  for (int idx : plan.stages[static_cast<size_t>(sh.stage)].shards) {
    w.group.push_back(actor_of[idx]);
    w.group_nodes.push_back(node_of[idx]);
    w.group_index.push_back(idx);
  }
  if (sh.stage + 1 < static_cast<int>(plan.stages.size()))
    for (int idx : plan.stages[static_cast<size_t>(sh.stage + 1)].shards) {
      w.next.push_back(actor_of[idx]);
      w.next_nodes.push_back(node_of[idx]);
      w.next_index.push_back(idx);
    }
  for (const auto& op : sh.program) w.program.push_back(to_wire(op));
  return w;
}

void stop_runtime(caf::actor_system& sys, runtime& rt) {
  if (rt.supervisor) caf::anon_send_exit(rt.supervisor, caf::exit_reason::user_shutdown);
  if (rt.coordinator) {
    // The coordinator kills the shards it knows, publishes a view without
    // handles and quits; its answer (or its end) means nothing is
    // published any more.
    caf::scoped_actor self{sys};
    self->request(rt.coordinator, std::chrono::seconds(5), stop_atom::value).receive([] {}, [](caf::error&) {});
  }
  // A coordinator that did not answer still published handles: drop them
  // here (no handle may outlive the actor system).
  if (auto v = rt.board->get()) {
    auto copy = std::make_shared<runtime_view>(*v);
    copy->actor_of.assign(copy->actor_of.size(), caf::actor{});
    rt.board->publish(std::move(copy));
  }
  for (auto& h : rt.heartbeats)
    if (h) caf::anon_send_exit(h, caf::exit_reason::user_shutdown);
  if (rt.heartbeat_monitor) caf::anon_send_exit(rt.heartbeat_monitor, caf::exit_reason::user_shutdown);
  rt.supervisor = nullptr;
  rt.coordinator = nullptr;
  rt.heartbeat_monitor = nullptr;
  rt.heartbeats.clear();
}

result<runtime> start_runtime(caf::actor_system& sys, std::shared_ptr<const runtime_config> cfg,
                              std::chrono::milliseconds deadline) {
  const auto& plan = cfg->plan;
  runtime rt;
  rt.coordinator = spawn_coordinator(sys, cfg, rt.board);
  auto fail = [&](std::string why) -> result<runtime> {
    stop_runtime(sys, rt);
    return make_error(std::move(why));
  };
  // Heartbeats travel apart from the data: one sender per node.
  supervision::heartbeat_monitor_config mc;
  mc.detector = cfg->opts.detector;
  mc.listeners = {rt.coordinator};
  auto monitor = supervision::spawn_heartbeat_monitor(sys, mc);
  if (!monitor) return fail("heartbeat monitor: " + sys.render(monitor.error()));
  rt.heartbeat_monitor = *monitor;
  int max_node = 0;
  for (const auto& n : cfg->host->nodes()) max_node = std::max(max_node, n.index);
  rt.heartbeats.assign(max_node + 1, caf::actor{});
  for (const auto& n : cfg->host->nodes()) {
    auto hb = cfg->host->start_heartbeat(sys, n.index, *monitor, cfg->opts.heartbeat);
    if (!hb) return fail("heartbeats: " + hb.message());
    rt.heartbeats[n.index] = *hb;
  }
  caf::scoped_actor self{sys};
  {
    // The coordinator has the senders before any start asks for them.
    std::string err;
    self->request(rt.coordinator, deadline, setup_atom::value, rt.heartbeats)
        .receive([] {}, [&](caf::error& e) { err = sys.render(e); });
    if (!err.empty()) return fail("coordinator: " + err);
  }

  // Stage supervisors over shards, under one cluster supervisor. Every
  // start is an asynchronous one that the coordinator performs: the factory
  // only asks it (start_request).
  supervision::supervisor_config top;
  top.name = "cluster supervisor";
  top.strategy = supervision::restart_strategy::one_for_one;
  top.intensity.max_restarts = 0;  // a stage that gives up ends the cluster
  top.parent = rt.coordinator;
  top.listeners = {rt.coordinator};
  const caf::actor_addr coordinator_addr = rt.coordinator.address();
  for (const auto& stage : plan.stages) {
    supervision::supervisor_config sc;
    sc.name = "stage " + std::to_string(stage.index) + " supervisor";
    sc.strategy = supervision::restart_strategy::one_for_one;
    sc.intensity.max_restarts = cfg->opts.max_restarts;
    sc.intensity.period = cfg->opts.restart_period;
    sc.listeners = {rt.coordinator};
    for (int idx : stage.shards) {
      supervision::child_spec cs;
      cs.id = "shard-" + std::to_string(idx);
      cs.start_async = [coordinator_addr, idx](const supervision::start_context& ctx, supervision::start_done done) {
        auto coordinator = caf::actor_cast<caf::actor>(coordinator_addr);
        if (!coordinator) {
          done(caf::actor{});
          return;
        }
        start_request r;
        r.idx = idx;
        r.incarnation = ctx.incarnation;
        r.last_reason = ctx.last_reason;
        r.done = std::move(done);
        caf::anon_send(coordinator, std::move(r));
      };
      sc.children.push_back(std::move(cs));
    }
    top.children.push_back(supervision::supervisor_child(sc.name, sc));
  }
  auto sup = supervision::spawn_supervisor(sys, top);
  if (!sup) return fail("supervision tree: " + sys.render(sup.error()));
  rt.supervisor = *sup;
  // Wait until every shard runs: the coordinator answers once it does.
  {
    std::string err;
    bool answered = false;
    self->request(rt.coordinator, deadline, ready_atom::value)
        .receive(
            [&](std::string& e) {
              answered = true;
              err = std::move(e);
            },
            [&](caf::error& e) {
              err = e == caf::sec::request_timeout
                        ? "shards did not start within " + std::to_string(deadline.count()) + " ms"
                        : "coordinator: " + sys.render(e);
            });
    if (!err.empty()) return fail(err);
    (void)answered;
  }
  // The stage supervisors, for verdicts of the heartbeat detector.
  std::vector<caf::actor> stages;
  self->request(*sup, deadline, supervision::sv_children_atom::value)
      .receive(
          [&](std::vector<supervision::child_info>& kids) {
            for (auto& k : kids) stages.push_back(k.handle);
          },
          [](caf::error&) {});
  if (stages.size() != plan.stages.size())
    return fail("the supervision tree did not report its " + std::to_string(plan.stages.size()) +
                " stage supervisors");
  self->send(rt.coordinator, stages_atom::value, std::move(stages));
  // Every shard has its wiring before the first step: over daemons a step
  // could otherwise overtake it (different senders, no order between them).
  // A request to the void handler is answered once the wiring is applied.
  auto view = rt.board->get();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    for (int idx : plan.stages[s].shards) {
      std::string err;
      self->request(view->actor_of[idx], deadline, wire_atom::value,
                    wiring_of(plan, view->node_of, view->actor_of, idx))
          .receive([] {}, [&](caf::error& e) { err = to_string(e); });
      if (!err.empty())
        return fail("placement index " + std::to_string(idx) + " did not take its wiring: " + err);
    }
  }
  return rt;
}

}  // namespace cellshard::actors
