// Fault plans: CLI and JSON parsing (good and bad specs with their messages),
// the injector's firing rules, and fault_hooks inside an actor: injected
// crash under a supervisor, silence (no reply, no heartbeats, suspected), and
// slow replies delivered on the actor clock.
#include "supervision/fault_hooks.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/heartbeat.hpp"
#include "supervision/supervisor.hpp"

#include "tests/supervision/caf_fixture.hpp"

using namespace cellshard::supervision;
using cellshard::test::caf_fixture;
using cellshard::test::event_log;
using namespace std::chrono_literals;

TEST_CASE("fault specs parse and print back", "[fault]") {
  struct good {
    const char* spec;
    fault_kind kind;
    std::uint32_t node;
    std::uint64_t step;
    std::optional<std::uint64_t> ms;
    std::optional<std::uint32_t> n;
  };
  for (auto g : {good{"crash:node=2:step=40", fault_kind::crash, 2, 40, {}, {}},
                 good{"silence:node=1:step=5:ms=300", fault_kind::silence, 1, 5, 300, {}},
                 good{"silence:node=0:step=0", fault_kind::silence, 0, 0, {}, {}},
                 good{"slow:node=3:step=7:ms=20", fault_kind::slow, 3, 7, 20, {}},
                 good{"drop:node=1:step=9:n=3", fault_kind::drop, 1, 9, {}, 3},
                 good{"delay:node=1:step=9:ms=50:n=2", fault_kind::delay, 1, 9, 50, 2},
                 good{"corrupt:step=4:node=6", fault_kind::corrupt, 6, 4, {}, {}},
                 good{"partition:node=4:step=12:ms=1000", fault_kind::partition, 4, 12, 1000, {}}}) {
    INFO(g.spec);
    auto p = parse_fault_spec(g.spec);
    REQUIRE(p);
    CHECK(p->kind == g.kind);
    CHECK(p->node == g.node);
    CHECK(p->step == g.step);
    CHECK(p->duration_ms == g.ms);
    CHECK(p->count == g.n);
    auto again = parse_fault_spec(to_string(*p));
    REQUIRE(again);
    CHECK(*again == *p);
  }
  CHECK(parse_fault_spec("drop:node=1:step=9")->effective_count() == 1);
  CHECK(parse_fault_spec("slow:node=1:step=9:ms=5")->effective_count() == 0);
}

TEST_CASE("bad fault specs give clear messages", "[fault]") {
  const std::string fmt = " (format KIND:node=N:step=S[:ms=D][:n=K])";
  auto msg = [](const char* spec) { return parse_fault_spec(spec).message(); };
  CHECK(msg("") == "fault spec '': missing KIND" + fmt);
  CHECK(msg("explode:node=1:step=2") ==
        "fault spec 'explode:node=1:step=2': unknown fault kind 'explode' (expected one of crash, "
        "silence, slow, drop, delay, corrupt, partition)" + fmt);
  CHECK(msg("crash:node=x:step=4") ==
        "fault spec 'crash:node=x:step=4': node: 'x' is not a non-negative integer (32 bit)" + fmt);
  CHECK(msg("crash:node=-1:step=4") ==
        "fault spec 'crash:node=-1:step=4': node: '-1' is not a non-negative integer (32 bit)" + fmt);
  CHECK(msg("crash:node=4294967296:step=4") ==
        "fault spec 'crash:node=4294967296:step=4': node: '4294967296' is not a non-negative "
        "integer (32 bit)" + fmt);
  CHECK(msg("crash:step=4") == "fault spec 'crash:step=4': missing node=N" + fmt);
  CHECK(msg("crash:node=1") == "fault spec 'crash:node=1': missing step=S" + fmt);
  CHECK(msg("crash:node=1:node=2:step=3") ==
        "fault spec 'crash:node=1:node=2:step=3': node given twice" + fmt);
  CHECK(msg("crash:node=1:step=3:color=red") ==
        "fault spec 'crash:node=1:step=3:color=red': unknown key 'color' (expected node, step, ms "
        "or n)" + fmt);
  CHECK(msg("crash:node=1::step=3") == "fault spec 'crash:node=1::step=3': empty field #2" + fmt);
  CHECK(msg("crash:node=1:step") ==
        "fault spec 'crash:node=1:step': field 'step' is not KEY=VALUE" + fmt);
  CHECK(msg("crash:node=1:step=3:ms=5") ==
        "fault spec 'crash:node=1:step=3:ms=5': ms= is not allowed for crash" + fmt);
  CHECK(msg("slow:node=1:step=3") ==
        "fault spec 'slow:node=1:step=3': slow needs ms=D (the added time per step)" + fmt);
  CHECK(msg("drop:node=1:step=3:n=0") ==
        "fault spec 'drop:node=1:step=3:n=0': n= must be at least 1" + fmt);
  CHECK(msg("silence:node=1:step=3:n=2") ==
        "fault spec 'silence:node=1:step=3:n=2': n= is not allowed for silence" + fmt);
  CHECK(msg("delay:node=1:step=3:ms=1.5") ==
        "fault spec 'delay:node=1:step=3:ms=1.5': ms: '1.5' is not a non-negative integer number "
        "of milliseconds" + fmt);
}

TEST_CASE("fault files in JSON", "[fault]") {
  auto ok = parse_fault_json(
      R"({"faults": [{"kind": "crash", "node": 2, "step": 40},
                     {"kind": "silence", "node": 1, "step": 5, "ms": 300},
                     {"kind": "drop", "node": 0, "step": 1, "n": 4}]})");
  REQUIRE(ok);
  REQUIRE(ok->size() == 3);
  CHECK((*ok)[0] == *parse_fault_spec("crash:node=2:step=40"));
  CHECK((*ok)[1] == *parse_fault_spec("silence:node=1:step=5:ms=300"));
  CHECK((*ok)[2] == *parse_fault_spec("drop:node=0:step=1:n=4"));
  CHECK(parse_fault_json(R"({"faults": []})")->empty());

  auto msg = [](const char* text) { return parse_fault_json(text).message(); };
  CHECK(msg("{\"faults\": [").rfind("fault file: invalid JSON: ", 0) == 0);
  CHECK(msg("[1]") == "fault file: expected an object {\"faults\": [...]}");
  // A number too large for a double is nlohmann's out_of_range, not a
  // parse_error; it once escaped as an exception (found by fuzz/faults.cpp).
  CHECK(msg(R"({"faults": [{"kind": "crash", "node": 93939e939, "step": 1}]})")
            .rfind("fault file: invalid JSON: ", 0) == 0);
  CHECK(msg(R"({"faults": 3})") == "fault file: \"faults\" must be an array");
  CHECK(msg(R"({"faults": [3]})") == "faults[0]: expected an object");
  CHECK(msg(R"({"faults": [{"kind": "crash", "node": 1, "step": 1}, {"kind": "crash", "node": 1, "step": -3}]})") ==
        "faults[1].step: expected a non-negative integer");
  CHECK(msg(R"({"faults": [{"kind": "melt", "node": 1, "step": 1}]})") ==
        "faults[0].kind: unknown fault kind 'melt' (expected one of crash, silence, slow, drop, "
        "delay, corrupt, partition)");
  CHECK(msg(R"({"faults": [{"kind": "crash", "step": 1}]})") == "faults[0]: missing \"node\"");
  CHECK(msg(R"({"faults": [{"kind": "crash", "node": 1, "step": 1, "when": 2}]})") ==
        "faults[0]: unknown key 'when' (expected kind, node, step, ms or n)");
  CHECK(msg(R"({"faults": [{"kind": "slow", "node": 1, "step": 1}]})") ==
        "faults[0]: slow needs ms=D (the added time per step)");
  CHECK(msg(R"({"faults": [{"kind": "crash", "node": 1.5, "step": 1}]})") ==
        "faults[0].node: expected a non-negative integer (32 bit)");
}

TEST_CASE("injector copies in other processes: pending plans and what fired there", "[fault]") {
  fault_injector inj;
  inj.add(*parse_fault_spec("crash:node=1:step=30"));
  inj.add(*parse_fault_spec("crash:node=1:step=50"));
  inj.add(*parse_fault_spec("slow:node=1:step=0:ms=20"));
  inj.add(*parse_fault_spec("silence:node=2:step=5"));
  auto names = [](const std::vector<fault_plan>& ps) {
    std::vector<std::string> out;
    for (auto& p : ps) out.push_back(to_string(p));
    return out;
  };
  CHECK(names(inj.pending(1)) ==
        std::vector<std::string>{"crash:node=1:step=30", "crash:node=1:step=50", "slow:node=1:step=0:ms=20"});
  CHECK(names(inj.pending(3)).empty());
  // A daemon's copy fired the crash at step 30 (report or exit reason).
  inj.mark_fired_through(1, fault_kind::crash, 30);
  CHECK(names(inj.pending(1)) == std::vector<std::string>{"crash:node=1:step=50", "slow:node=1:step=0:ms=20"});
  // Its report arrives too: nothing left to mark; slow never fires for good.
  CHECK_FALSE(inj.mark_fired(*parse_fault_spec("crash:node=1:step=30")));
  CHECK_FALSE(inj.mark_fired(*parse_fault_spec("slow:node=1:step=0:ms=20")));
  CHECK(inj.mark_fired(*parse_fault_spec("silence:node=2:step=5")));
  CHECK(inj.pending(2).empty());
  CHECK_FALSE(inj.at(2, 5).silence);  // this copy does not fire it again either
  CHECK(inj.at(1, 50).crash);
}

TEST_CASE("injector firing rules", "[fault]") {
  fault_injector inj;
  inj.add(*parse_fault_spec("crash:node=2:step=40"));
  inj.add(*parse_fault_spec("slow:node=1:step=3:ms=20:n=2"));
  inj.add(*parse_fault_spec("drop:node=1:step=10:n=3"));
  inj.add(*parse_fault_spec("silence:node=0:step=5"));

  CHECK_FALSE(inj.at(2, 39).any());
  CHECK_FALSE(inj.at(5, 40).any());                 // other node
  auto fx = inj.at(2, 32, 48);                      // a batch covering 40
  CHECK(fx.crash);
  REQUIRE(fx.fired.size() == 1);
  CHECK_FALSE(inj.at(2, 40).crash);                 // a replay of 40 does not crash again

  CHECK(inj.at(1, 2).slow == 0ms);
  CHECK(inj.at(1, 3).slow == 20ms);
  CHECK(inj.at(1, 4).slow == 20ms);
  CHECK(inj.at(1, 5).slow == 0ms);                  // n=2 steps only
  auto d = inj.at(1, 11);                           // first query past 10 fires the drop
  CHECK(d.drop == 3);
  CHECK(inj.at(1, 12).drop == 0);

  auto s = inj.at(0, 5);
  CHECK(s.silence);
  CHECK_FALSE(s.silence_for);                       // for ever

  auto plans = inj.plans();
  REQUIRE(plans.size() == 4);
  CHECK(plans[0].second);
  inj.rearm();
  CHECK(inj.at(2, 40).crash);
}

namespace {

using work_atom = caf::atom_constant<caf::atom("t_work")>;

struct shard_state {
  std::unique_ptr<fault_hooks> hooks;
};

// A toy shard: answers (t_work, step) with step * 2, under fault hooks.
caf::behavior toy_shard(caf::stateful_actor<shard_state>* self, std::uint32_t node,
                        std::shared_ptr<fault_injector> inj, caf::actor heartbeat) {
  self->state.hooks = std::make_unique<fault_hooks>(self, node, inj);
  self->state.hooks->set_heartbeat_sender(heartbeat);
  return caf::message_handler{
      [self](work_atom, std::uint64_t step) -> caf::response_promise {
        auto& h = *self->state.hooks;
        auto rp = self->make_response_promise();
        if (h.silenced()) {
          h.hold(rp);
          return rp;
        }
        auto fx = h.on_step(step);
        if (fx.crash) return rp;  // quitting; never answered
        if (h.silenced()) {
          h.hold(rp);
          return rp;
        }
        h.reply_after(rp, fx.slow, step * 2);
        return rp;
      }}
      .or_else(self->state.hooks->handler());
}

struct reply_log {
  std::vector<std::pair<std::uint64_t, caf::actor_clock::time_point>> got;
  std::vector<caf::error> errors;
};

}  // namespace

TEST_CASE_METHOD(caf_fixture, "hooks: injected crash is restarted by a supervisor", "[fault]") {
  auto inj = std::make_shared<fault_injector>(
      std::vector<fault_plan>{*parse_fault_spec("crash:node=2:step=3")});
  auto events = std::make_shared<event_log>();
  supervisor_config cfg;
  cfg.name = "stage";
  cfg.listeners = {recorder(events)};
  child_spec spec;
  spec.id = "shard2";
  spec.start = [inj](const start_context& ctx) {
    return ctx.system.spawn(toy_shard, std::uint32_t{2}, inj, caf::actor{});
  };
  cfg.children = {spec};
  auto sup = spawn_supervisor(sys, cfg);
  REQUIRE(sup);
  track(*sup);
  run();
  auto kids = ask<std::vector<child_info>>(*sup, nullptr, sv_children_atom::value);
  REQUIRE(kids);
  auto shard = (*kids)[0].handle;
  for (std::uint64_t s = 0; s < 3; ++s)
    CHECK(ask<std::uint64_t>(shard, nullptr, work_atom::value, s) == s * 2);
  caf::error err;
  CHECK_FALSE(ask<std::uint64_t>(shard, &err, work_atom::value, std::uint64_t{3}));
  REQUIRE(events->sv_events.size() == 1);
  auto& ev = events->sv_events[0];
  CHECK(ev.kind == supervisor_event_kind::child_restarted);
  CHECK(describe(ev.reason) == "injected_crash: node 2: injected crash at step 3");
  // A supervisor in another process learns the step from the reason alone.
  CHECK(fault_hooks::crash_step(ev.reason) == std::optional<std::uint64_t>{3});
  CHECK(fault_hooks::crash_step(fault_hooks::crash_reason(7, 5000000000ULL)) ==
        std::optional<std::uint64_t>{5000000000ULL});  // beyond 32 bits (base/parse.hpp)
  CHECK_FALSE(fault_hooks::crash_step(make_error(sv_errc::node_silent, "node 2")));
  CHECK_FALSE(fault_hooks::crash_step(caf::error{}));
  // The new incarnation replays step 3 without crashing again.
  CHECK(ask<std::uint64_t>(ev.handle, nullptr, work_atom::value, std::uint64_t{3}) == 6u);
}

TEST_CASE_METHOD(caf_fixture, "hooks: slow replies arrive later on the actor clock", "[fault]") {
  auto inj = std::make_shared<fault_injector>(
      std::vector<fault_plan>{*parse_fault_spec("slow:node=0:step=1:ms=250")});
  auto shard = track(sys.spawn(toy_shard, std::uint32_t{0}, inj, caf::actor{}));
  auto log = std::make_shared<reply_log>();
  auto ask_async = [&](std::uint64_t step) {
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(shard, std::chrono::seconds(10), work_atom::value, step)
          .then([=](std::uint64_t x) { log->got.emplace_back(x, self->clock().now()); },
                [=](caf::error& e) { log->errors.push_back(e); });
    });
  };
  auto t0 = now();
  ask_async(0);
  run();
  REQUIRE(log->got.size() == 1);
  CHECK(log->got[0].second == t0);  // no delay at step 0
  ask_async(1);
  ask_async(2);
  run();
  CHECK(log->got.size() == 1);      // both held back, the actor is not blocked
  advance(249ms, 1ms);
  CHECK(log->got.size() == 1);
  advance(1ms, 1ms);
  REQUIRE(log->got.size() == 3);
  CHECK(log->got[1].first == 2u);
  CHECK(log->got[1].second - t0 == std::chrono::milliseconds(250));
  CHECK(log->got[2].first == 4u);
  CHECK(log->errors.empty());
}

TEST_CASE_METHOD(caf_fixture, "hooks: silence stops replies and heartbeats until it ends",
                 "[fault]") {
  auto inj = std::make_shared<fault_injector>(
      std::vector<fault_plan>{*parse_fault_spec("silence:node=1:step=2:ms=1000")});
  auto events = std::make_shared<event_log>();
  heartbeat_monitor_config mcfg;
  mcfg.listeners = {recorder(events)};
  auto mon = track(*spawn_heartbeat_monitor(sys, mcfg));
  auto hb = track(spawn_heartbeat_sender(sys, {mon, 1, 100ms}));
  auto shard = track(sys.spawn(toy_shard, std::uint32_t{1}, inj, hb));
  advance(1s, 5ms);
  auto log = std::make_shared<reply_log>();
  auto ask_async = [&](std::uint64_t step) {
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(shard, std::chrono::milliseconds(500), work_atom::value, step)
          .then([=](std::uint64_t x) { log->got.emplace_back(x, self->clock().now()); },
                [=](caf::error& e) { log->errors.push_back(e); });
    });
  };
  ask_async(1);
  ask_async(2);  // silence starts here: no answer
  run();
  CHECK(log->got.size() == 1);
  advance(600ms, 5ms);
  REQUIRE(log->errors.size() == 1);
  CHECK(log->errors[0] == caf::make_error(caf::sec::request_timeout));
  REQUIRE(events->suspects.size() == 1);  // heartbeats stopped with the replies
  CHECK(events->suspects[0].peer == 1u);
  advance(500ms, 5ms);                    // the 1 s silence is over
  ask_async(3);
  run();
  REQUIRE(log->got.size() == 2);
  CHECK(log->got[1].first == 6u);
  CHECK(events->alive == std::vector<std::uint64_t>{1});
}
