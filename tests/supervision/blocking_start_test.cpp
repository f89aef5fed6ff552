// Starts that may block (child_spec::start_may_block, issue #15): the factory
// runs on a helper's own thread and the supervisor handles its result as a
// message. These run on CAF's real scheduler (a detached helper has a thread
// of its own, which the test_coordinator does not drive). Nothing sleeps:
// the factory waits on a gate the test opens, and every wait of the test has
// a deadline whose expiry fails the test.
#include "supervision/supervisor.hpp"

#include <future>
#include <set>
#include <memory>

#include <caf/all.hpp>

#include <catch2/catch.hpp>

using namespace cellshard::supervision;
using namespace std::chrono_literals;

namespace {

using get_atom = caf::atom_constant<caf::atom("t_get")>;

caf::actor spawn_worker(caf::actor_system& sys, std::uint64_t incarnation) {
  return sys.spawn([incarnation](caf::event_based_actor*) -> caf::behavior {
    return {[incarnation](get_atom) { return incarnation; }};
  });
}

// Incarnations listed in `gated` wait for `gate` (at most 20 s) before they
// spawn; the spawned handle of each incarnation is published in `spawned`.
struct gated_factory {
  std::shared_future<void> gate;
  std::set<std::uint64_t> gated;
  std::shared_ptr<std::vector<std::promise<caf::actor>>> spawned =
      std::make_shared<std::vector<std::promise<caf::actor>>>(4);
  bool fail_first = false;

  child_factory make() const {
    auto self = *this;
    return [self](const start_context& ctx) -> caf::actor {
      if (self.gated.count(ctx.incarnation) && self.gate.wait_for(20s) != std::future_status::ready)
        return caf::actor{};
      if (self.fail_first && ctx.incarnation == 0) return caf::actor{};
      auto h = spawn_worker(ctx.system, ctx.incarnation);
      if (ctx.incarnation < self.spawned->size()) (*self.spawned)[ctx.incarnation].set_value(h);
      return h;
    };
  }
};

supervisor_config one_child(const gated_factory& f, caf::actor listener) {
  supervisor_config cfg;
  cfg.name = "blocking";
  child_spec c;
  c.id = "remote";
  c.start = f.make();
  c.start_may_block = true;
  cfg.children.push_back(c);
  cfg.listeners.push_back(std::move(listener));
  return cfg;
}

std::vector<child_info> children_of(caf::scoped_actor& self, const caf::actor& sup) {
  std::vector<child_info> out;
  bool answered = false;
  self->request(sup, 5s, sv_children_atom::value)
      .receive(
          [&](std::vector<child_info>& kids) {
            out = std::move(kids);
            answered = true;
          },
          [](caf::error&) {});
  REQUIRE(answered);
  return out;
}

caf::actor await(std::promise<caf::actor>& p) {
  auto f = p.get_future();
  REQUIRE(f.wait_for(20s) == std::future_status::ready);
  return f.get();
}

// One actor system, a listener/test actor, and a gated factory.
struct blocking_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  std::promise<void> open;
  gated_factory f;

  blocking_fixture() { f.gate = open.get_future().share(); }

  caf::actor start() {
    auto sup = spawn_supervisor(sys, one_child(f, self));
    REQUIRE(sup);
    return *sup;
  }
};

}  // namespace

TEST_CASE("a restart that blocks leaves the supervisor answering, and its result restarts the child",
          "[supervisor][blocking]") {
  blocking_fixture fx;
  auto& self = fx.self;
  auto& f = fx.f;
  f.gated = {1};
  auto sup = fx.start();
  auto first = await((*f.spawned)[0]);
  // The first start completed through sv_started: the child is listed.
  bool listed = false;
  for (int k = 0; k < 50 && !listed; ++k) {  // bounded: the result is one message away
    auto kids = children_of(self, sup);
    REQUIRE(kids.size() == 1);
    listed = kids[0].handle == first;
  }
  REQUIRE(listed);
  caf::anon_send_exit(first, caf::exit_reason::kill);
  // The factory of incarnation 1 is now blocked on the gate; the supervisor
  // still answers, and lists the child without a handle (starting).
  bool starting = false;
  for (int k = 0; k < 50 && !starting; ++k) starting = !children_of(self, sup)[0].handle;
  REQUIRE(starting);
  fx.open.set_value();
  supervisor_event ev;
  bool restarted = false;
  self->receive([&](sv_event_atom, supervisor_event& e) {
                  ev = e;
                  restarted = true;
                },
                caf::after(20s) >> [] {});
  REQUIRE(restarted);
  CHECK(ev.kind == supervisor_event_kind::child_restarted);
  CHECK(ev.child == "remote");
  CHECK(ev.incarnation == 1);
  REQUIRE(ev.handle);
  CHECK(ev.handle == await((*f.spawned)[1]));
  std::uint64_t inc = 99;
  self->request(ev.handle, 5s, get_atom::value).receive([&](std::uint64_t i) { inc = i; }, [](caf::error&) {});
  CHECK(inc == 1);
  anon_send_exit(sup, caf::exit_reason::user_shutdown);
}

TEST_CASE("a blocking first start that fails escalates with child_start_failed", "[supervisor][blocking]") {
  blocking_fixture fx;
  auto& self = fx.self;
  fx.f.fail_first = true;
  auto sup = fx.start();
  self->monitor(sup);
  caf::error reason;
  bool down = false, escalated = false;
  for (int k = 0; k < 2; ++k)
    self->receive([&](sv_event_atom, supervisor_event& e) { escalated = e.kind == supervisor_event_kind::escalated; },
                  [&](caf::down_msg& dm) {
                    reason = dm.reason;
                    down = true;
                  },
                  caf::after(20s) >> [] {});
  REQUIRE(down);
  CHECK(escalated);
  CHECK(is(reason, sv_errc::child_start_failed));
}

TEST_CASE("a blocking start that completes after sv_stop is refused and its actor killed",
          "[supervisor][blocking]") {
  blocking_fixture fx;
  auto& self = fx.self;
  auto& f = fx.f;
  f.gated = {0};
  auto sup = fx.start();
  self->monitor(sup);
  self->send(sup, sv_stop_atom::value);
  bool stopped = false;
  self->receive([&](caf::down_msg&) { stopped = true; }, caf::after(20s) >> [] {});
  REQUIRE(stopped);
  fx.open.set_value();  // the factory spawns now, for a supervisor that is gone
  auto orphan = await((*f.spawned)[0]);
  self->monitor(orphan);
  caf::error reason;
  bool killed = false;
  self->receive(
      [&](caf::down_msg& dm) {
        reason = dm.reason;
        killed = true;
      },
      caf::after(20s) >> [] {});
  REQUIRE(killed);
  CHECK(reason == caf::exit_reason::kill);
}
