// Supervisor strategies, restart types, restart intensity on the actor clock,
// escalation, storm suppression, nested supervisors and the query protocol,
// all on CAF's test_coordinator (no threads, no sleeps).
#include "supervision/supervisor.hpp"

#include <map>

#include "tests/supervision/caf_fixture.hpp"

using namespace cellshard::supervision;
using cellshard::test::caf_fixture;
using cellshard::test::event_log;
using namespace std::chrono_literals;

namespace {

using get_atom = caf::atom_constant<caf::atom("t_get")>;
using stop_atom = caf::atom_constant<caf::atom("t_stop")>;

using start_counts = std::map<std::string, int>;

// A worker that answers t_get with its incarnation and quits normally on t_stop.
child_spec worker(const std::string& id, std::shared_ptr<start_counts> starts,
                  restart_type r = restart_type::permanent) {
  child_spec spec;
  spec.id = id;
  spec.restart = r;
  spec.start = [starts](const start_context& ctx) -> caf::actor {
    ++(*starts)[ctx.id];
    auto inc = ctx.incarnation;
    return ctx.system.spawn([inc](caf::event_based_actor* self) -> caf::behavior {
      return {[inc](get_atom) { return inc; }, [self](stop_atom) { self->quit(); }};
    });
  };
  return spec;
}

// A worker that crashes as soon as it runs, on every incarnation.
child_spec crasher(const std::string& id, std::shared_ptr<start_counts> starts) {
  child_spec spec;
  spec.id = id;
  spec.start = [starts](const start_context& ctx) -> caf::actor {
    ++(*starts)[ctx.id];
    return ctx.system.spawn([](caf::event_based_actor* self) -> caf::behavior {
      self->quit(caf::make_error(caf::sec::runtime_error));
      return {[](get_atom) {}};
    });
  };
  return spec;
}

caf::error crash() { return caf::make_error(caf::sec::runtime_error); }

// Makes `h` exit with crash() (anon_send_exit takes only an exit_reason).
void crash(const caf::actor& h) { caf::anon_send(h, caf::exit_msg{h.address(), crash()}); }

struct sup_fixture : caf_fixture {
  std::shared_ptr<start_counts> starts = std::make_shared<start_counts>();
  std::shared_ptr<event_log> events = std::make_shared<event_log>();

  caf::actor spawn(supervisor_config cfg) {
    cfg.listeners.push_back(recorder(events));
    auto s = spawn_supervisor(sys, std::move(cfg));
    REQUIRE(s);
    run();
    return *s;
  }

  std::vector<child_info> children(const caf::actor& sup) {
    auto r = ask<std::vector<child_info>>(sup, nullptr, sv_children_atom::value);
    REQUIRE(r);
    return *r;
  }

  supervisor_stats stats(const caf::actor& sup) {
    auto r = ask<supervisor_stats>(sup, nullptr, sv_stats_atom::value);
    REQUIRE(r);
    return *r;
  }

  // Down reasons of `actors` as seen by a fresh monitor (a dead actor yields
  // its down_msg at once; a live one yields nothing).
  std::vector<caf::error> downs_of(const std::vector<caf::actor>& actors) {
    auto log = std::make_shared<event_log>();
    recorder(log, actors);
    run();
    return log->down_reasons;
  }

  supervisor_config four(restart_strategy s) {
    supervisor_config cfg;
    cfg.name = "stage";
    cfg.strategy = s;
    for (auto id : {"a", "b", "c", "d"}) cfg.children.push_back(worker(id, starts));
    return cfg;
  }
};

std::vector<caf::actor> handles(const std::vector<child_info>& xs) {
  std::vector<caf::actor> out;
  for (auto& x : xs) out.push_back(x.handle);
  return out;
}

}  // namespace

TEST_CASE_METHOD(sup_fixture, "one_for_one restarts only the exited child", "[supervisor]") {
  auto sup = spawn(four(restart_strategy::one_for_one));
  auto before = handles(children(sup));
  REQUIRE(before.size() == 4);
  crash(before[1]);
  run();
  auto after = children(sup);
  CHECK(after[0].handle == before[0]);
  CHECK(after[1].handle != before[1]);
  CHECK(after[1].handle);
  CHECK(after[1].restarts == 1);
  CHECK(after[2].handle == before[2]);
  CHECK(after[3].handle == before[3]);
  CHECK(*starts == start_counts{{"a", 1}, {"b", 2}, {"c", 1}, {"d", 1}});
  // The new incarnation knows it is number 1.
  CHECK(ask<std::uint64_t>(after[1].handle, nullptr, get_atom::value) == 1u);
  REQUIRE(events->sv_events.size() == 1);
  auto& ev = events->sv_events[0];
  CHECK(ev.kind == supervisor_event_kind::child_restarted);
  CHECK(ev.child == "b");
  CHECK(ev.cause == "b");
  CHECK(ev.handle == after[1].handle);
  CHECK(ev.reason == crash());
  auto st = stats(sup);
  CHECK(st.total_restarts == 1);
  CHECK(st.last_child == "b");
  CHECK(st.last_reason == crash());
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "rest_for_one restarts the exited child and those after it",
                 "[supervisor]") {
  auto sup = spawn(four(restart_strategy::rest_for_one));
  auto before = handles(children(sup));
  crash(before[1]);
  run();
  auto after = handles(children(sup));
  CHECK(after[0] == before[0]);
  for (int i = 1; i < 4; ++i) CHECK(after[i] != before[i]);
  CHECK(*starts == start_counts{{"a", 1}, {"b", 2}, {"c", 2}, {"d", 2}});
  // c and d were terminated by the supervisor (kill), b by its crash.
  auto downs = downs_of({before[2], before[3]});
  REQUIRE(downs.size() == 2);
  CHECK(downs[0] == caf::make_error(caf::exit_reason::kill));
  CHECK(downs[1] == caf::make_error(caf::exit_reason::kill));
  CHECK(events->count(supervisor_event_kind::child_restarted) == 3);
  for (auto& e : events->sv_events) CHECK(e.cause == "b");
  CHECK(stats(sup).total_restarts == 1);  // one decision, three children
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "one_for_all restarts every child", "[supervisor]") {
  auto sup = spawn(four(restart_strategy::one_for_all));
  auto before = handles(children(sup));
  crash(before[2]);
  run();
  auto after = handles(children(sup));
  for (int i = 0; i < 4; ++i) CHECK(after[i] != before[i]);
  CHECK(*starts == start_counts{{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}});
  CHECK(events->count(supervisor_event_kind::child_restarted) == 4);
  CHECK(stats(sup).total_restarts == 1);
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "restart types: transient and temporary", "[supervisor]") {
  supervisor_config cfg;
  cfg.children = {worker("p", starts), worker("t", starts, restart_type::transient),
                  worker("x", starts, restart_type::temporary)};
  auto sup = spawn(cfg);
  auto h = handles(children(sup));

  // transient + normal exit: not restarted, kept with no handle.
  caf::anon_send(h[1], stop_atom::value);
  run();
  auto kids = children(sup);
  REQUIRE(kids.size() == 3);
  CHECK_FALSE(kids[1].handle);
  CHECK((*starts)["t"] == 1);
  REQUIRE(events->sv_events.size() == 1);
  CHECK(events->sv_events[0].kind == supervisor_event_kind::child_terminated);
  CHECK(events->sv_events[0].child == "t");

  // temporary + crash: not restarted, forgotten.
  crash(h[2]);
  run();
  kids = children(sup);
  REQUIRE(kids.size() == 2);
  CHECK(kids[0].id == "p");
  CHECK(kids[1].id == "t");
  CHECK((*starts)["x"] == 1);
  CHECK(events->count(supervisor_event_kind::child_terminated) == 2);
  CHECK(stats(sup).total_restarts == 0);

  // permanent + normal exit: restarted anyway.
  caf::anon_send(h[0], stop_atom::value);
  run();
  CHECK((*starts)["p"] == 2);
  CHECK(children(sup)[0].handle != h[0]);
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "a transient child that crashes is restarted", "[supervisor]") {
  supervisor_config cfg;
  cfg.children = {worker("t", starts, restart_type::transient)};
  auto sup = spawn(cfg);
  crash(children(sup)[0].handle);
  run();
  CHECK((*starts)["t"] == 2);
  CHECK(children(sup)[0].handle);
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "one_for_all terminates temporary siblings without restarting them",
                 "[supervisor]") {
  supervisor_config cfg;
  cfg.strategy = restart_strategy::one_for_all;
  cfg.children = {worker("p", starts), worker("x", starts, restart_type::temporary)};
  auto sup = spawn(cfg);
  auto h = handles(children(sup));
  crash(h[0]);
  run();
  auto kids = children(sup);
  REQUIRE(kids.size() == 1);
  CHECK(kids[0].id == "p");
  CHECK(*starts == start_counts{{"p", 2}, {"x", 1}});
  CHECK(downs_of({h[1]}) == std::vector<caf::error>{caf::make_error(caf::exit_reason::kill)});
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "restart intensity: the 4th restart within 10 s escalates once",
                 "[supervisor]") {
  auto parent_log = std::make_shared<event_log>();
  supervisor_config cfg;
  cfg.name = "stage0";
  cfg.parent = recorder(parent_log);
  cfg.children = {worker("a", starts), worker("b", starts)};
  REQUIRE(cfg.intensity.max_restarts == 3);     // the documented defaults
  REQUIRE(cfg.intensity.period == caf::timespan{10s});
  auto sup = spawn(cfg);
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {sup});
  run();

  for (int k = 0; k < 3; ++k) {
    crash(children(sup)[0].handle);
    run();
    advance(1s, 100ms);
  }
  auto st = stats(sup);
  CHECK(st.total_restarts == 3);
  CHECK(st.restarts_in_window == 3);
  CHECK(parent_log->sv_events.empty());
  CHECK(watch_log->down_reasons.empty());

  auto last = handles(children(sup));
  crash(last[0]);  // t = 3 s: 4 restarts within 10 s
  run();
  REQUIRE(parent_log->sv_events.size() == 1);
  auto& ev = parent_log->sv_events[0];
  CHECK(ev.kind == supervisor_event_kind::escalated);
  CHECK(ev.supervisor == "stage0");
  CHECK(ev.child == "a");
  CHECK(ev.reason == crash());
  CHECK(events->count(supervisor_event_kind::escalated) == 1);  // listener too
  REQUIRE(watch_log->down_reasons.size() == 1);
  auto reason = watch_log->down_reasons[0];
  CHECK(is(reason, sv_errc::restart_intensity_exceeded));
  CHECK(describe(reason) ==
        "restart_intensity_exceeded: supervisor 'stage0': child 'a' exited "
        "(runtime_error); 4 restarts within 10000 ms exceed the limit of 3");
  // Its children were stopped: the sibling b was killed.
  CHECK(downs_of({last[1]}) == std::vector<caf::error>{caf::make_error(caf::exit_reason::kill)});
  CHECK(*starts == start_counts{{"a", 4}, {"b", 1}});
}

TEST_CASE_METHOD(sup_fixture, "restarts older than the period no longer count", "[supervisor]") {
  supervisor_config cfg;
  cfg.children = {worker("a", starts)};
  auto sup = spawn(cfg);
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {sup});
  for (int k = 0; k < 3; ++k) {  // t = 0, 1, 2 s
    crash(children(sup)[0].handle);
    run();
    advance(1s, 100ms);
  }
  advance(9500ms, 100ms);        // t = 12.5 s: all three are older than 10 s
  crash(children(sup)[0].handle);
  run();
  CHECK(watch_log->down_reasons.empty());
  auto st = stats(sup);
  CHECK(st.total_restarts == 4);
  CHECK(st.restarts_in_window == 1);
  CHECK((*starts)["a"] == 5);
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "storm: 10 children crashing together cause one restart",
                 "[supervisor][storm]") {
  supervisor_config cfg;
  cfg.strategy = restart_strategy::one_for_all;
  for (int i = 0; i < 10; ++i) cfg.children.push_back(worker("w" + std::to_string(i), starts));
  auto sup = spawn(cfg);
  auto before = handles(children(sup));
  for (auto& h : before) crash(h);  // all ten at once
  run();
  auto after = handles(children(sup));
  REQUIRE(after.size() == 10);
  for (int i = 0; i < 10; ++i) {
    CHECK(after[i]);
    CHECK(after[i] != before[i]);
    CHECK((*starts)["w" + std::to_string(i)] == 2);
  }
  CHECK(stats(sup).total_restarts == 1);
  CHECK(events->count(supervisor_event_kind::child_restarted) == 10);
  CHECK(events->count(supervisor_event_kind::escalated) == 0);
  track(sup);
}

TEST_CASE_METHOD(sup_fixture,
                 "storm: children that always crash give bounded restarts and one escalation",
                 "[supervisor][storm]") {
  auto parent_log = std::make_shared<event_log>();
  supervisor_config cfg;
  cfg.strategy = restart_strategy::one_for_all;
  cfg.parent = recorder(parent_log);
  for (int i = 0; i < 10; ++i) cfg.children.push_back(crasher("w" + std::to_string(i), starts));
  auto s = spawn_supervisor(sys, cfg);
  REQUIRE(s);
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {*s});
  run();
  advance(60s, 1s);  // nothing more may happen afterwards
  int total = 0;
  for (auto& [id, n] : *starts) {
    CHECK(n == 4);  // first start + max_restarts (3)
    total += n;
  }
  CHECK(total == 40);
  CHECK(parent_log->count(supervisor_event_kind::escalated) == 1);
  REQUIRE(watch_log->down_reasons.size() == 1);
  CHECK(is(watch_log->down_reasons[0], sv_errc::restart_intensity_exceeded));
}

TEST_CASE_METHOD(sup_fixture, "a child that cannot be restarted escalates within the intensity",
                 "[supervisor]") {
  auto calls = std::make_shared<int>(0);
  child_spec spec;
  spec.id = "flaky";
  spec.start = [calls](const start_context& ctx) -> caf::actor {
    ++*calls;
    if (ctx.incarnation > 0) return {};  // every restart fails
    return ctx.system.spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](get_atom) {}};
    });
  };
  auto parent_log = std::make_shared<event_log>();
  supervisor_config cfg;
  cfg.parent = recorder(parent_log);
  cfg.children = {spec};
  auto sup = spawn(cfg);
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {sup});
  run();
  crash(children(sup)[0].handle);
  run();
  CHECK(*calls == 4);  // 1 start + 3 failed restarts, then the 4th restart exceeds
  REQUIRE(parent_log->sv_events.size() == 1);
  CHECK(is(parent_log->sv_events[0].reason, sv_errc::child_start_failed));
  REQUIRE(watch_log->down_reasons.size() == 1);
  CHECK(is(watch_log->down_reasons[0], sv_errc::restart_intensity_exceeded));
}

TEST_CASE_METHOD(sup_fixture, "a child that fails its first start stops the supervisor",
                 "[supervisor]") {
  auto started = std::make_shared<std::vector<caf::actor>>();
  supervisor_config cfg;
  cfg.name = "s";
  cfg.children.push_back(worker("ok", starts));
  cfg.children[0].start = [started](const start_context& ctx) -> caf::actor {
    auto h = ctx.system.spawn([](caf::event_based_actor*) -> caf::behavior {
      return {[](get_atom) {}};
    });
    started->push_back(h);
    return h;
  };
  child_spec bad;
  bad.id = "bad";
  bad.start = [](const start_context&) { return caf::actor{}; };
  cfg.children.push_back(bad);
  auto parent_log = std::make_shared<event_log>();
  cfg.parent = recorder(parent_log);
  auto s = spawn_supervisor(sys, cfg);
  REQUIRE(s);
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {*s});
  run();
  REQUIRE(watch_log->down_reasons.size() == 1);
  CHECK(is(watch_log->down_reasons[0], sv_errc::child_start_failed));
  CHECK(describe(watch_log->down_reasons[0]) ==
        "child_start_failed: supervisor 's': child 'bad' could not be started");
  REQUIRE(parent_log->sv_events.size() == 1);
  CHECK(parent_log->sv_events[0].kind == supervisor_event_kind::escalated);
  REQUIRE(started->size() == 1);
  CHECK(downs_of(*started) == std::vector<caf::error>{caf::make_error(caf::exit_reason::kill)});
}

TEST_CASE_METHOD(sup_fixture, "invalid configs are rejected with a message", "[supervisor]") {
  supervisor_config cfg;
  cfg.name = "s";
  cfg.children = {worker("a", starts), worker("a", starts)};
  auto s = spawn_supervisor(sys, cfg);
  REQUIRE_FALSE(s);
  CHECK(describe(s.error()) == "invalid_config: supervisor 's': duplicate child id 'a'");
  cfg.children = {worker("", starts)};
  CHECK(describe(validate(cfg)) == "invalid_config: supervisor 's': child #0 has an empty id");
  cfg.children = {worker("a", starts)};
  cfg.children[0].start = nullptr;
  CHECK(describe(validate(cfg)) == "invalid_config: supervisor 's': child 'a' has no factory");
  cfg.children = {worker("a", starts)};
  cfg.intensity.period = caf::timespan{0};
  CHECK(describe(validate(cfg)) == "invalid_config: supervisor 's': intensity period must be > 0");
}

TEST_CASE_METHOD(sup_fixture, "a nested supervisor's escalation is a crash for its parent",
                 "[supervisor]") {
  supervisor_config inner;
  inner.name = "inner";
  inner.intensity.max_restarts = 0;  // the first crash escalates
  inner.children = {worker("w", starts)};
  supervisor_config outer;
  outer.name = "outer";
  outer.children = {supervisor_child("inner", inner), worker("z", starts)};
  auto sup = spawn(outer);
  auto inner1 = children(sup)[0].handle;
  auto z1 = children(sup)[1].handle;
  auto w1 = children(inner1)[0].handle;
  crash(w1);
  run();
  auto inner2 = children(sup)[0].handle;
  CHECK(inner2);
  CHECK(inner2 != inner1);
  CHECK(children(sup)[1].handle == z1);
  auto w2 = children(inner2)[0].handle;
  CHECK(w2);
  CHECK(w2 != w1);
  CHECK((*starts)["w"] == 2);
  auto st = stats(sup);
  CHECK(st.total_restarts == 1);
  CHECK(st.last_child == "inner");
  CHECK(is(st.last_reason, sv_errc::restart_intensity_exceeded));
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "killing a supervisor kills its children", "[supervisor]") {
  auto sup = spawn(four(restart_strategy::one_for_one));
  auto h = handles(children(sup));
  caf::anon_send_exit(sup, caf::exit_reason::kill);
  run();
  auto downs = downs_of(h);
  REQUIRE(downs.size() == 4);
  for (auto& d : downs) CHECK(d == caf::make_error(caf::exit_reason::kill));
}

TEST_CASE_METHOD(sup_fixture, "an exit from a linked parent stops supervisor and children",
                 "[supervisor]") {
  auto sup = spawn(four(restart_strategy::one_for_one));
  auto h = handles(children(sup));
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {sup});
  caf::anon_send_exit(sup, caf::exit_reason::user_shutdown);
  run();
  REQUIRE(watch_log->down_reasons.size() == 1);
  CHECK(watch_log->down_reasons[0] == caf::make_error(caf::exit_reason::user_shutdown));
  CHECK(downs_of(h).size() == 4);
  CHECK(events->sv_events.empty());
}

TEST_CASE_METHOD(sup_fixture, "sv_stop, sv_add, sv_remove and sv_listen", "[supervisor]") {
  supervisor_config cfg;
  cfg.children = {worker("a", starts)};
  auto sup = spawn(cfg);
  auto late = std::make_shared<event_log>();
  CHECK_FALSE(ask_void(sup, sv_listen_atom::value, recorder(late)));

  caf::error err;
  auto added = ask<caf::actor>(sup, &err, sv_add_atom::value, worker("b", starts));
  REQUIRE(added);
  CHECK(children(sup).size() == 2);
  CHECK(children(sup)[1].handle == *added);
  ask<caf::actor>(sup, &err, sv_add_atom::value, worker("b", starts));
  CHECK(is(err, sv_errc::invalid_config));

  crash(*added);
  run();
  REQUIRE(late->sv_events.size() == 1);
  CHECK(late->sv_events[0].child == "b");

  auto b = children(sup)[1].handle;
  CHECK_FALSE(ask_void(sup, sv_remove_atom::value, std::string("b")));
  CHECK(children(sup).size() == 1);
  CHECK(downs_of({b}).size() == 1);
  CHECK(describe(ask_void(sup, sv_remove_atom::value, std::string("nope"))) ==
        "unknown_child: supervisor 'supervisor' has no child 'nope'");

  auto a = children(sup)[0].handle;
  auto watch_log = std::make_shared<event_log>();
  recorder(watch_log, {sup});
  caf::anon_send(sup, sv_stop_atom::value);
  run();
  REQUIRE(watch_log->down_reasons.size() == 1);
  CHECK_FALSE(watch_log->down_reasons[0]);  // normal exit
  CHECK(downs_of({a}).size() == 1);
  CHECK(events->count(supervisor_event_kind::escalated) == 0);
}

TEST_CASE_METHOD(sup_fixture, "sv_exited: a detector's verdict restarts a live child at once, stale verdicts do nothing",
                 "[supervisor]") {
  auto sup = spawn(four(restart_strategy::one_for_one));
  auto before = handles(children(sup));
  REQUIRE(before.size() == 4);
  // The child is alive (as a shard on a frozen node looks); the verdict kills and replaces it.
  const auto silent = make_error(sv_errc::node_silent, "node 3: heartbeats stopped");
  caf::anon_send(sup, sv_exited_atom::value, std::string("c"), before[2], silent);
  run();
  auto after = children(sup);
  CHECK(after[2].handle != before[2]);
  CHECK(after[2].handle);
  CHECK(after[2].restarts == 1);
  CHECK(after[2].last_reason == silent);
  CHECK(after[1].handle == before[1]);
  // The old incarnation was killed; its down_msg did not cause a second restart.
  auto downs = downs_of({before[2]});
  REQUIRE(downs.size() == 1);
  CHECK(downs[0] == caf::exit_reason::kill);
  REQUIRE(events->sv_events.size() == 1);
  CHECK(events->sv_events[0].child == "c");
  CHECK(events->sv_events[0].reason == silent);
  // A verdict about the replaced incarnation, or an unknown child, is ignored.
  caf::anon_send(sup, sv_exited_atom::value, std::string("c"), before[2], silent);
  caf::anon_send(sup, sv_exited_atom::value, std::string("nope"), before[0], silent);
  run();
  CHECK(children(sup)[2].handle == after[2].handle);
  CHECK(stats(sup).total_restarts == 1);
  CHECK(*starts == start_counts{{"a", 1}, {"b", 1}, {"c", 2}, {"d", 1}});
  track(sup);
}

// -- asynchronous starts (child_spec::start_async, issue #15) -----------------

namespace {

// A start_async factory that keeps every `done` it is given, by incarnation,
// so the test decides when (and with what) each start completes.
struct held_starts {
  std::vector<start_done> done;
  std::vector<std::uint64_t> incarnations;
};

child_spec async_worker(const std::string& id, std::shared_ptr<held_starts> held) {
  child_spec spec;
  spec.id = id;
  spec.start_async = [held](const start_context& ctx, start_done done) {
    held->incarnations.push_back(ctx.incarnation);
    held->done.push_back(std::move(done));
  };
  return spec;
}

caf::actor spawn_getter(caf::actor_system& sys, std::uint64_t inc) {
  return sys.spawn([inc](caf::event_based_actor*) -> caf::behavior { return {[inc](get_atom) { return inc; }}; });
}

}  // namespace

TEST_CASE_METHOD(sup_fixture, "an asynchronous start: starting until done, then supervised as any child",
                 "[supervisor][async_start]") {
  auto held = std::make_shared<held_starts>();
  supervisor_config cfg;
  cfg.name = "s";
  cfg.children = {worker("a", starts), async_worker("r", held)};
  auto sup = spawn(cfg);
  REQUIRE(held->done.size() == 1);
  CHECK(held->incarnations[0] == 0);
  CHECK_FALSE(children(sup)[1].handle);  // starting: no handle yet
  // A sibling's crash is handled while the start is in flight.
  crash(children(sup)[0].handle);
  run();
  CHECK(children(sup)[0].restarts == 1);
  auto h0 = spawn_getter(sys, 0);
  held->done[0](h0);
  held->done[0](spawn_getter(sys, 99));  // a second call is ignored
  run();
  CHECK(children(sup)[1].handle == h0);
  CHECK(events->count(supervisor_event_kind::child_restarted) == 1);  // a's; a first start emits none
  // Its crash restarts it asynchronously: child_restarted only once the start completes.
  crash(h0);
  run();
  REQUIRE(held->done.size() == 2);
  CHECK(held->incarnations[1] == 1);
  CHECK_FALSE(children(sup)[1].handle);
  CHECK(events->count(supervisor_event_kind::child_restarted) == 1);
  auto h1 = spawn_getter(sys, 1);
  held->done[1](h1);
  run();
  auto kids = children(sup);
  CHECK(kids[1].handle == h1);
  CHECK(kids[1].restarts == 1);
  CHECK(events->count(supervisor_event_kind::child_restarted) == 2);
  CHECK(events->sv_events.back().child == "r");
  track(sup);
}

TEST_CASE_METHOD(sup_fixture, "an asynchronous start that fails: the first stops the supervisor, a restart is one more exit",
                 "[supervisor][async_start]") {
  SECTION("first start") {
    auto held = std::make_shared<held_starts>();
    supervisor_config cfg;
    cfg.name = "s";
    cfg.children = {async_worker("r", held)};
    auto sup = spawn(cfg);
    auto watch_log = std::make_shared<event_log>();
    recorder(watch_log, {sup});
    run();
    REQUIRE(held->done.size() == 1);
    held->done[0](caf::actor{});
    run();
    REQUIRE(watch_log->down_reasons.size() == 1);
    CHECK(describe(watch_log->down_reasons[0]) ==
          "child_start_failed: supervisor 's': child 'r' could not be started");
  }
  SECTION("restart") {
    auto held = std::make_shared<held_starts>();
    supervisor_config cfg;
    cfg.name = "s";
    cfg.children = {async_worker("r", held)};
    auto sup = spawn(cfg);
    auto h0 = spawn_getter(sys, 0);
    held->done[0](h0);
    run();
    crash(h0);
    run();
    REQUIRE(held->done.size() == 2);
    held->done[1](caf::actor{});  // the restart fails: counted, and tried again
    run();
    REQUIRE(held->done.size() == 3);
    CHECK(held->incarnations == std::vector<std::uint64_t>{0, 1, 2});
    auto h2 = spawn_getter(sys, 2);
    held->done[2](h2);
    run();
    CHECK(children(sup)[0].handle == h2);
    CHECK(stats(sup).total_restarts == 2);
    track(sup);
  }
}

TEST_CASE_METHOD(sup_fixture, "a late asynchronous result is killed once the supervisor is gone",
                 "[supervisor][async_start]") {
  auto held = std::make_shared<held_starts>();
  supervisor_config cfg;
  cfg.name = "s";
  cfg.children = {async_worker("r", held)};
  auto sup = spawn(cfg);
  REQUIRE(held->done.size() == 1);
  caf::anon_send(sup, sv_stop_atom::value);
  run();
  // The supervisor is gone: the courier's request bounces and the handle is killed.
  auto late = spawn_getter(sys, 0);
  held->done[0](late);
  run();
  CHECK(downs_of({late}) == std::vector<caf::error>{caf::make_error(caf::exit_reason::kill)});
}

TEST_CASE_METHOD(sup_fixture, "a result for an attempt the supervisor no longer waits for is killed",
                 "[supervisor][async_start]") {
  // one_for_all: a sibling's crash terminates the starting child and starts
  // it again; the first attempt's result arrives afterwards.
  auto held = std::make_shared<held_starts>();
  supervisor_config cfg;
  cfg.name = "s";
  cfg.strategy = restart_strategy::one_for_all;
  cfg.children = {worker("a", starts), async_worker("r", held)};
  auto sup = spawn(cfg);
  REQUIRE(held->done.size() == 1);
  crash(children(sup)[0].handle);
  run();
  REQUIRE(held->done.size() == 2);
  auto stale = spawn_getter(sys, 0);
  held->done[0](stale);
  run();
  CHECK(downs_of({stale}) == std::vector<caf::error>{caf::make_error(caf::exit_reason::kill)});
  CHECK_FALSE(children(sup)[1].handle);
  auto fresh = spawn_getter(sys, 1);
  held->done[1](fresh);
  run();
  CHECK(children(sup)[1].handle == fresh);
  track(sup);
}
