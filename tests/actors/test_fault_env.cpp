// The fault plan around a shard (actors/fault_env.hpp), on CAF's
// test_coordinator: which steps it admits, when it is silent, what it holds
// back and gives back, what it reports and tells the heartbeat sender, and
// how it arms the shard's links. Time is the test coordinator's clock
// (advance_time), never the wall clock.
#include "actors/fault_env.hpp"
#include "actors/messages.hpp"

#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <utility>
#include <vector>

using namespace cellshard;
using namespace std::chrono;
using actors::activation;
using actors::fault_env;

namespace {

using admit_atom = caf::atom_constant<caf::atom("t_admit")>;

/// What the test observes of the env and of the actors around it.
struct observed {
  std::vector<int32_t> admitted, refused, resumed;  // step positions
  std::vector<bool> silent_after;                   // silent() after each admit
  std::vector<actors::fault_report> reports;        // at the coordinator
  std::vector<caf::timespan> silenced_for;          // at the heartbeat sender
  std::vector<uint32_t> experts_admitted;           // expert request seq
  fault_env* env = nullptr;                         // the host's (valid while it lives)
};

struct host_state {
  std::unique_ptr<fault_env> env;
  static inline const char* name = "test.fault_env_host";
};

/// A stand-in for a shard: admits every step it gets, records the answers.
caf::behavior host(caf::stateful_actor<host_state>* self, std::shared_ptr<observed> out,
                   std::shared_ptr<supervision::fault_injector> injector, caf::actor heartbeat, caf::actor coordinator) {
  self->state.env = std::make_unique<fault_env>(self, fault_env::identity{1, 7, heartbeat, coordinator},
                                                std::move(injector), nullptr);
  out->env = self->state.env.get();
  caf::message_handler own{
      [=](admit_atom, activation& a) {
        auto& env = *self->state.env;
        const int32_t pos = a.id.pos0;
        (env.admit(a) ? out->admitted : out->refused).push_back(pos);
        out->silent_after.push_back(env.silent());
      },
      [=](actors::resume_atom) {
        if (auto a = self->state.env->resume()) out->resumed.push_back(a->id.pos0);
      },
      [=](actors::expert_req& r) {
        if (self->state.env->admit(r)) out->experts_admitted.push_back(r.seq);
      },
  };
  if (self->state.env->injects()) return own.or_else(self->state.env->handler());
  return own;
}

struct env_fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::shared_ptr<observed> out = std::make_shared<observed>();
  caf::actor heartbeat, coordinator, shard;

  explicit env_fixture(std::vector<supervision::fault_plan> plans, bool with_injector = true) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    sys = std::make_unique<caf::actor_system>(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    auto o = out;
    heartbeat = sys->spawn([o]() -> caf::behavior {
      return {[o](supervision::hb_silence_atom, caf::timespan d) { o->silenced_for.push_back(d); }};
    });
    coordinator = sys->spawn([o]() -> caf::behavior {
      return {[o](actors::fault_report& r) { o->reports.push_back(r); }};
    });
    auto injector = with_injector ? std::make_shared<supervision::fault_injector>(std::move(plans)) : nullptr;
    shard = sys->spawn(host, out, injector, heartbeat, coordinator);
    sched->run();
  }
  ~env_fixture() {
    for (auto& a : {heartbeat, coordinator, shard}) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched->run();
  }
  void step(int32_t pos0, int32_t count = 1, int32_t replay_until = -1) {
    activation a;
    a.id = actors::step_id{1, 0, pos0, count};
    a.replay_until = replay_until;
    caf::anon_send(shard, admit_atom::value, std::move(a));
    sched->run();
  }
};

supervision::fault_plan plan(std::string_view spec) {
  auto p = supervision::parse_fault_spec(spec);
  REQUIRE(p.ok());
  return p.value();
}

}  // namespace

TEST_CASE("fault env: without a plan every step runs and the links are the shaper's", "[fault_env]") {
  env_fixture f({}, false);
  f.step(0);
  f.step(1, 8);
  CHECK(f.out->admitted == std::vector<int32_t>{0, 1});
  CHECK(f.out->refused.empty());
  CHECK_FALSE(f.out->env->injects());
  CHECK_FALSE(f.out->env->silent());
  CHECK_FALSE(f.out->env->links_armed());
  const auto v = f.out->env->links().send(2, 1000);
  CHECK_FALSE(v.drop);
  CHECK_FALSE(v.corrupt);
  CHECK(v.delay == nanoseconds(0));  // an unshaped link
}

TEST_CASE("fault env: a partition refuses the step, silences the node for its time, then ends",
          "[fault_env]") {
  env_fixture f({plan("partition:node=1:step=3:ms=200")});
  f.step(2);
  f.step(3);
  CHECK(f.out->admitted == std::vector<int32_t>{2});
  CHECK(f.out->refused == std::vector<int32_t>{3});
  CHECK(f.out->silent_after == std::vector<bool>{false, true});
  REQUIRE(f.out->silenced_for.size() == 1);
  CHECK(f.out->silenced_for[0] == caf::timespan(milliseconds(200)));  // heartbeats stop as long
  REQUIRE(f.out->reports.size() == 1);
  CHECK(f.out->reports[0].kind == "partition");
  CHECK(f.out->reports[0].index == 1);
  CHECK(f.out->reports[0].node == 7);
  CHECK(f.out->reports[0].step == 3);
  CHECK(f.out->reports[0].spec == "partition:node=1:step=3:ms=200");
  f.sched->advance_time(milliseconds(199));
  CHECK(f.out->env->silent());
  f.sched->advance_time(milliseconds(1));
  CHECK_FALSE(f.out->env->silent());
  f.step(4);  // one-shot: it does not fire again
  CHECK(f.out->admitted == std::vector<int32_t>{2, 4});
}

TEST_CASE("fault env: a silence stops the heartbeats, and replayed steps are never faulted", "[fault_env]") {
  env_fixture f({plan("silence:node=1:step=5:ms=300")});
  f.step(0, 5, 5);  // a replay of [0, 5) before the fault's position: admitted, fires nothing
  f.step(5, 1, 9);  // a replay covering the position: admitted, fires nothing
  CHECK(f.out->reports.empty());
  f.step(4, 3);  // a prefill batch covering position 5 fires it
  CHECK(f.out->admitted == std::vector<int32_t>{0, 5});
  CHECK(f.out->refused == std::vector<int32_t>{4});
  CHECK(f.out->silent_after.back());
  REQUIRE(f.out->silenced_for.size() == 1);
  CHECK(f.out->silenced_for[0] == caf::timespan(milliseconds(300)));
  REQUIRE(f.out->reports.size() == 1);
  CHECK(f.out->reports[0].kind == "silence");
  CHECK(f.out->reports[0].step == 5);
  f.sched->advance_time(milliseconds(300));
  CHECK_FALSE(f.out->env->silent());
}

TEST_CASE("fault env: a slow fault holds each step back on the actor clock and gives it back in order",
          "[fault_env]") {
  env_fixture f({plan("slow:node=1:step=2:ms=50:n=2")});
  f.step(1);
  f.step(2);
  f.step(3);
  f.step(4);  // past the plan's two steps
  CHECK(f.out->admitted == std::vector<int32_t>{1, 4});
  CHECK(f.out->refused == std::vector<int32_t>{2, 3});
  CHECK(f.out->env->holds(1, 0, 2));
  CHECK(f.out->env->holds(1, 0, 3));
  CHECK_FALSE(f.out->env->holds(1, 1, 2));  // another epoch
  CHECK_FALSE(f.out->env->silent());       // slow is not silent
  f.sched->advance_time(milliseconds(49));
  f.sched->run();
  CHECK(f.out->resumed.empty());
  f.sched->advance_time(milliseconds(1));
  f.sched->run();
  CHECK(f.out->resumed == std::vector<int32_t>{2, 3});
  CHECK_FALSE(f.out->env->holds(1, 0, 2));
  CHECK(f.out->reports.size() == 2);  // one report per held step
}

TEST_CASE("fault env: link faults arm the wrapper for exactly their count", "[fault_env]") {
  env_fixture f({plan("drop:node=1:step=1:n=2"), plan("corrupt:node=1:step=2"), plan("delay:node=1:step=3:ms=40")});
  f.step(1);
  CHECK(f.out->admitted == std::vector<int32_t>{1});  // link faults never hold the step
  CHECK(f.out->env->links_armed());
  auto& links = f.out->env->links();
  CHECK(links.send(2, 100).drop);
  CHECK(links.send(2, 100).drop);
  CHECK_FALSE(f.out->env->links_armed());
  f.step(2);
  auto c = links.send(2, 100);
  CHECK_FALSE(c.drop);
  CHECK(c.corrupt);
  f.step(3);
  auto d = links.send(2, 100);
  CHECK_FALSE(d.corrupt);
  CHECK(d.delay == milliseconds(40));
  CHECK(links.send(2, 100).delay == nanoseconds(0));
  CHECK(f.out->reports.size() == 3);
}

TEST_CASE("fault env: an expert request held back by a slow fault comes back marked held", "[fault_env]") {
  env_fixture f({plan("slow:node=1:step=0:ms=30:n=1")});
  actors::expert_req r;
  r.id = actors::step_id{1, 0, 0, 1};
  r.seq = 9;
  caf::anon_send(f.shard, std::move(r));
  f.sched->run();
  CHECK(f.out->experts_admitted.empty());
  f.sched->advance_time(milliseconds(30));
  f.sched->run();
  CHECK(f.out->experts_admitted == std::vector<uint32_t>{9});  // admitted once, as held
}

TEST_CASE("fault env: a crash quits the shard with the injected reason", "[fault_env]") {
  env_fixture f({plan("crash:node=1:step=2")});
  auto reason = std::make_shared<caf::error>();
  auto watcher = f.sys->spawn([reason, s = f.shard](caf::event_based_actor* self) -> caf::behavior {
    self->set_down_handler([reason](caf::down_msg& dm) { *reason = dm.reason; });
    self->monitor(s);
    return {[](int32_t) {}};
  });
  f.sched->run();
  f.step(2);
  CHECK(f.out->refused == std::vector<int32_t>{2});
  REQUIRE(*reason);
  CHECK(supervision::fault_hooks::crash_step(*reason) == std::optional<uint64_t>{2});
  REQUIRE(f.out->reports.size() == 1);
  CHECK(f.out->reports[0].kind == "crash");
  caf::anon_send_exit(watcher, caf::exit_reason::kill);
  f.sched->run();
}
