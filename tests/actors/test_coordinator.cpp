// The runtime's coordinator (actors/recovery.hpp) alone on CAF's
// test_coordinator: the test plays the stage supervisors, the heartbeat
// detector, a session and a host whose shards are stand-ins. Checked: first
// starts on the placement's nodes and the ready answer; a crashed shard
// restarted on its own (healthy) node, entering the wiring only when its
// stage and the stage before it have confirmed theirs, then announced to the
// sessions; a suspected node that answers a probe cleared without a restart;
// a suspected node whose every probe fails taken away (the stage supervisor
// told, the fault recorded) and its shard started on the spare; stop. Probe
// timeouts fire by advancing the test clock, never by waiting.
#include "actors/coordinator.hpp"
#include "actors/host.hpp"
#include "actors/messages.hpp"
#include "actors/recovery.hpp"
#include "model/checkpoint.hpp"
#include "supervision/errors.hpp"
#include "supervision/fault_hooks.hpp"
#include "supervision/messages.hpp"
#include "topologies/placement.hpp"
#include "topologies/profile.hpp"

#include "tests/support.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

using namespace cellshard;
using namespace std::chrono;

namespace {

using ask_ready_atom = caf::atom_constant<caf::atom("t_ready")>;

/// Everything the stand-ins saw.
struct observed {
  struct spawn {
    int idx, node;
    bool restarted;
    bool operator==(const spawn& o) const { return idx == o.idx && node == o.node && restarted == o.restarted; }
  };
  std::vector<spawn> spawns;
  std::map<caf::actor_id, std::vector<actors::wiring>> wirings;  // by shard
  std::set<int> frozen;                                          // nodes whose shards never answer
  std::vector<actors::shard_restarted> restarted;                 // at the session
  std::vector<std::string> ready;
  std::vector<std::pair<int, std::string>> exited;  // (stage, child) told by the coordinator
};

caf::behavior stub_shard(caf::event_based_actor* self, int node, std::shared_ptr<observed> out) {
  return {
      [=](actors::wire_atom, actors::wiring& w) { out->wirings[self->id()].push_back(std::move(w)); },
      [=](actors::alive_atom) -> caf::result<actors::alive_atom, int32_t> {
        if (out->frozen.count(node)) return self->make_response_promise<actors::alive_atom, int32_t>();
        return {actors::alive_atom::value, node};
      },
      [=](actors::probe_peer_atom, caf::actor target, caf::timespan timeout) -> caf::result<bool> {
        auto rp = self->make_response_promise<bool>();
        if (out->frozen.count(node)) return rp;
        self->request(target, timeout, actors::alive_atom::value)
            .then([rp](actors::alive_atom, int32_t) mutable { rp.deliver(true); },
                  [rp](caf::error&) mutable { rp.deliver(false); });
        return rp;
      },
  };
}

/// Shards in this process as stand-ins; every spawn is recorded.
class stub_host final : public actors::shard_host {
public:
  stub_host(std::vector<topologies::node_spec> nodes, std::shared_ptr<observed> out)
      : nodes_(std::move(nodes)), out_(std::move(out)) {}
  std::vector<topologies::node_spec> nodes() const override { return nodes_; }
  result<void> configure(caf::actor_system_config&) override { return {}; }
  result<void> connect(caf::actor_system&, const model::model_file&, const model::tokenizer&) override { return {}; }
  result<caf::actor> spawn(caf::actor_system& sys, const actors::shard_request& req) override {
    out_->spawns.push_back({req.placed->index, req.placed->node, req.restarted});
    return sys.spawn(stub_shard, req.placed->node, out_);
  }

private:
  std::vector<topologies::node_spec> nodes_;
  std::shared_ptr<observed> out_;
};

}  // namespace

TEST_CASE("coordinator on test_coordinator: starts, a crash restarted in place, a suspicion cleared, a silent node "
          "moved to the spare",
          "[coordinator]") {
  const std::string path = test::shared_file("models/stories260K.bin");
  if (path.empty()) return;
  auto file = model::model_file::open(path);
  REQUIRE(file.ok());

  caf::actor_system_config sys_cfg;
  sys_cfg.set("scheduler.policy", caf::atom("testing"));
  caf::actor_system sys{sys_cfg};
  auto& sched = dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler());
  auto out = std::make_shared<observed>();

  // pipeline:2 on nodes 0 and 1, node 2 a spare.
  const auto nodes = topologies::make_nodes(2, topologies::host_profile(), 1);
  auto strat = topologies::parse_strategy("pipeline:2");
  REQUIRE(strat.ok());
  auto plan = topologies::place(file.value()->cfg(), nodes, strat.value());
  REQUIRE(plan.ok());
  REQUIRE(plan.value().shards.size() == 2);
  REQUIRE(plan.value().spares.size() == 1);
  auto cfg = std::make_shared<actors::runtime_config>();
  cfg->plan = plan.value();
  cfg->host = std::make_shared<stub_host>(nodes, out);
  auto board = std::make_shared<actors::runtime_board>();
  auto coord = actors::spawn_coordinator(sys, cfg, board);
  sched.run();
  REQUIRE(board->get());
  CHECK(board->get()->node_of == std::vector<int>{0, 1});

  // The stand-ins around it: heartbeat senders, stage supervisors, a session.
  std::vector<caf::actor> heartbeats, supervisors;
  for (int n = 0; n < 3; ++n)
    heartbeats.push_back(sys.spawn([]() -> caf::behavior { return {[](supervision::hb_probe_atom) {}}; }));
  for (int s = 0; s < 2; ++s)
    supervisors.push_back(sys.spawn([out, s]() -> caf::behavior {
      return {[out, s](supervision::sv_exited_atom, std::string& child, caf::actor&, caf::error&) {
        out->exited.emplace_back(s, child);
      }};
    }));
  auto session = sys.spawn([out, coord](caf::event_based_actor* self) -> caf::behavior {
    return {
        [out](actors::shard_restarted& r) { out->restarted.push_back(std::move(r)); },
        [](actors::cluster_failed&) {},
        [self, out, coord](ask_ready_atom) {
          self->request(coord, seconds(10), actors::coord_msg::ready_atom::value)
              .then([out](std::string& e) { out->ready.push_back(e); });
        },
    };
  });
  caf::anon_send(coord, actors::coord_msg::setup_atom::value, heartbeats);
  sched.run();

  // First starts: each on the placement's node; then ready answers "".
  std::vector<caf::actor> started;
  auto start = [&](int idx, uint64_t incarnation, caf::error reason) {
    actors::coord_msg::start_request r;
    r.idx = idx;
    r.incarnation = incarnation;
    r.last_reason = std::move(reason);
    r.done = [&started](caf::actor a) { started.push_back(std::move(a)); };
    caf::anon_send(coord, std::move(r));
    sched.run();
  };
  start(0, 0, caf::error{});
  caf::anon_send(session, ask_ready_atom::value);
  sched.run();
  CHECK(out->ready.empty());  // shard 1 is not running yet
  start(1, 0, caf::error{});
  REQUIRE(started.size() == 2);
  CHECK(out->spawns == std::vector<observed::spawn>{{0, 0, false}, {1, 1, false}});
  CHECK(out->ready == std::vector<std::string>{""});
  CHECK(board->get()->actor_of == started);
  caf::anon_send(coord, actors::join_atom::value, session);
  caf::anon_send(coord, actors::coord_msg::stages_atom::value, supervisors);
  sched.run();

  // An injected crash of shard 1: restarted on its own node (healthy), as a
  // restart; it enters the wiring only when its supervisor says it runs.
  start(1, 1, supervision::fault_hooks::crash_reason(1, 5));
  REQUIRE(started.size() == 3);
  CHECK(out->spawns.back() == observed::spawn{1, 1, true});
  CHECK(board->get()->actor_of[1] == started[1]);  // not yet the new one
  supervision::supervisor_event ev;
  ev.kind = supervision::supervisor_event_kind::child_restarted;
  ev.supervisor = "stage 1 supervisor";
  ev.child = "shard-1";
  ev.cause = "shard-1";
  ev.handle = started[2];
  ev.incarnation = 1;
  caf::anon_send(coord, supervision::sv_event_atom::value, ev);
  sched.run();
  CHECK(board->get()->actor_of[1] == started[2]);
  // Stage 0 (upstream) and stage 1 got wirings naming the new shard, then
  // the session heard of it: one notice, last of its batch.
  REQUIRE(out->wirings[started[0].id()].size() == 1);
  CHECK(out->wirings[started[0].id()][0].next == std::vector<caf::actor>{started[2]});
  REQUIRE(out->wirings[started[2].id()].size() == 1);
  CHECK(out->wirings[started[2].id()][0].group == std::vector<caf::actor>{started[2]});
  REQUIRE(out->restarted.size() == 1);
  CHECK(out->restarted[0].index == 1);
  CHECK(out->restarted[0].node == 1);
  CHECK(out->restarted[0].handle == started[2]);
  CHECK(out->restarted[0].stage_head == started[0]);
  CHECK(out->restarted[0].entry == started[0]);
  CHECK(out->restarted[0].remaining == 0);
  // The session's next token came after replaying 3 positions.
  caf::anon_send(coord, actors::recovered_atom::value, int32_t{1}, int32_t{3},
                 int64_t{steady_clock::now().time_since_epoch().count()});
  sched.run();

  // Node 0 is suspected but answers the direct probe: cleared, nothing restarted.
  supervision::suspect_event e0;
  e0.peer = 0;
  e0.phi = 9;
  caf::anon_send(coord, supervision::hb_suspect_atom::value, e0);
  sched.run();
  CHECK(out->exited.empty());
  caf::anon_send(coord, supervision::hb_alive_atom::value, uint64_t{0});  // its heartbeats return
  sched.run();

  // Node 1 freezes: the direct probe and the indirect one (through shard 0)
  // both go unanswered until the probe timeout passes on the test clock.
  out->frozen.insert(1);
  supervision::suspect_event e1;
  e1.peer = 1;
  e1.phi = 12;
  caf::anon_send(coord, supervision::hb_suspect_atom::value, e1);
  sched.run();
  CHECK(out->exited.empty());
  sched.advance_time(milliseconds(399));
  sched.run();
  CHECK(out->exited.empty());  // still within the probe timeout
  sched.advance_time(milliseconds(201));  // past both timeouts (400 ms; the indirect one 600 ms)
  sched.run();
  REQUIRE(out->exited.size() == 1);
  CHECK(out->exited[0] == std::pair<int, std::string>{1, "shard-1"});
  // The supervisor restarts it: the node is unhealthy, so the spare takes it.
  start(1, 2, supervision::make_error(supervision::sv_errc::node_silent, "node 1 is suspected silent"));
  REQUIRE(started.size() == 4);
  CHECK(out->spawns.back() == observed::spawn{1, 2, true});
  CHECK(board->get()->node_of == std::vector<int>{0, 2});

  // What the coordinator recorded: the crash's restart and the silent node,
  // and node 0's cleared suspicion.
  auto snapshot = std::make_shared<actors::fault_snapshot>();
  auto asker = sys.spawn([coord, snapshot](caf::event_based_actor* self) {
    self->request(coord, seconds(10), actors::fault_atom::value).then([snapshot](actors::fault_snapshot& s) {
      *snapshot = std::move(s);
    });
  });
  sched.run();
  std::vector<std::string> kinds;
  for (const auto& r : snapshot->faults) kinds.push_back(r.kind + "@" + std::to_string(r.index) + ":" + std::to_string(r.node));
  // (The silent node's restart is the same failure as its verdict: one record.)
  CHECK(kinds == std::vector<std::string>{"exit@1:1", "node-silent@1:1"});
  REQUIRE(snapshot->faults.size() == 2);
  CHECK(snapshot->faults[0].replayed_positions == 3);
  CHECK(snapshot->faults[0].moved_to_node == 1);
  CHECK(snapshot->faults[1].recovered_ns == 0);  // no token since
  REQUIRE(snapshot->suspicions.size() == 1);
  CHECK(snapshot->suspicions[0].node == 0);
  CHECK(snapshot->suspicions[0].cleared_by == "direct");

  // Stop: the shards are told to end, the board keeps node_of and no handle.
  caf::anon_send(coord, actors::coord_msg::stop_atom::value);
  sched.run();
  CHECK(board->get()->node_of == std::vector<int>{0, 2});
  CHECK(board->get()->actor_of == std::vector<caf::actor>{caf::actor{}, caf::actor{}});
  started.clear();
  for (auto& a : heartbeats) caf::anon_send_exit(a, caf::exit_reason::kill);
  for (auto& a : supervisors) caf::anon_send_exit(a, caf::exit_reason::kill);
  caf::anon_send_exit(session, caf::exit_reason::kill);
  caf::anon_send_exit(asker, caf::exit_reason::kill);
  sched.run();
}
