// tests/supervision/caf_fixture.hpp: a deterministic CAF 0.17 actor system for
// Catch2 tests (CAF-0.17.md section 5, option A): the test_coordinator
// scheduler runs messages only when the test says so, and time moves only by
// advance(), so there are no sleeps and no timing-dependent outcomes.
//
// Pitfalls this fixture handles (measured):
// - actor_system's destructor drains the test clock; an actor that re-arms a
//   timer on every tick makes that loop forever. Actors with timers must be
//   track()ed: the destructor kills them first.
// - an actor without any handle left is destroyed even if it monitors others:
//   recorders are kept in `tracked`.
// - a request whose receiver quit holding its response promise is never
//   answered (CAF 0.17 bounces only messages still in the mailbox): the
//   requester lives until its timeout, and ~actor_system waits for it. The
//   destructor fires all pending timeouts first.
// - the test clock starts at epoch + 1 ns; we move it to + 1 h like CAF's own
//   fixture so "now - period" never underflows.
#pragma once

#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include "supervision/errors.hpp"
#include "supervision/messages.hpp"

namespace cellshard::test {

namespace sv = cellshard::supervision;

inline caf::actor_system_config& testing_config(caf::actor_system_config& cfg) {
  cfg.set("scheduler.policy", caf::atom("testing"));
  sv::add_supervision_types(cfg);
  return cfg;
}

/// Everything a recorder actor saw, in arrival order.
struct event_log {
  std::vector<sv::supervisor_event> sv_events;
  std::vector<sv::suspect_event> suspects;
  std::vector<std::uint64_t> alive;
  std::vector<caf::actor_addr> down_sources;
  std::vector<caf::error> down_reasons;

  std::size_t count(sv::supervisor_event_kind k) const {
    std::size_t n = 0;
    for (auto& e : sv_events) n += e.kind == k;
    return n;
  }
};

struct caf_fixture {
  caf::actor_system_config cfg;
  caf::actor_system sys;
  caf::scheduler::test_coordinator& sched;
  std::vector<caf::actor> tracked;

  caf_fixture()
      : sys(testing_config(cfg)),
        sched(dynamic_cast<caf::scheduler::test_coordinator&>(sys.scheduler())) {
    sched.clock().current_time += std::chrono::hours(1);
  }

  ~caf_fixture() {
    for (auto& a : tracked) caf::anon_send_exit(a, caf::exit_reason::kill);
    sched.run();
    tracked.clear();
    // Requests still waiting (e.g. to an actor that quit holding a promise)
    // keep their requester alive until their timeout fires; the system's
    // destructor would wait for them for ever. Fire every pending timeout.
    for (int i = 0; i < 1000 && sched.has_pending_timeout(); ++i) {
      sched.trigger_timeouts();
      sched.run();
    }
  }

  caf::actor track(caf::actor a) {
    tracked.push_back(a);
    return a;
  }

  caf::actor_clock::time_point now() const { return sched.clock().now(); }

  /// Runs every pending message.
  std::size_t run() { return sched.run(); }

  /// Moves the clock by `total` in steps of `step`, running all messages and
  /// timers due after each step (timers re-armed in handlers start from the
  /// new now, so small steps simulate continuous time).
  void advance(caf::timespan total, caf::timespan step = std::chrono::milliseconds(1)) {
    sched.run();
    for (caf::timespan t{0}; t < total; t += step) {
      sched.advance_time(step);
      sched.run();
    }
  }

  /// Spawns an actor that records supervisor events, suspicions, recoveries
  /// and the down_msgs of `watch`.
  /// The fixture keeps a handle: an actor nobody references is destroyed and
  /// would silently stop recording.
  caf::actor recorder(std::shared_ptr<event_log> log, std::vector<caf::actor> watch = {}) {
    return track(sys.spawn([log, watch](caf::event_based_actor* self) -> caf::behavior {
      for (auto& w : watch) self->monitor(w);
      self->set_down_handler([log](caf::down_msg& dm) {
        log->down_sources.push_back(dm.source);
        log->down_reasons.push_back(dm.reason);
      });
      return {
          [log](sv::sv_event_atom, const sv::supervisor_event& e) { log->sv_events.push_back(e); },
          [log](sv::hb_suspect_atom, const sv::suspect_event& e) { log->suspects.push_back(e); },
          [log](sv::hb_alive_atom, std::uint64_t peer) { log->alive.push_back(peer); },
      };
    }));
  }

  /// Sends a request from a fresh actor and runs the system; the reply (or
  /// nullopt plus *err set on an error reply).
  template <class T, class... Ts>
  std::optional<T> ask(const caf::actor& dest, caf::error* err, Ts... xs) {
    auto out = std::make_shared<std::optional<T>>();
    auto e = std::make_shared<caf::error>();
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(dest, std::chrono::seconds(10), xs...)
          .then([=](T& x) { *out = std::move(x); }, [=](caf::error& x) { *e = std::move(x); });
    });
    sched.run();
    if (err) *err = *e;
    return *out;
  }

  /// As ask() for requests whose reply is empty; returns the error (none = ok).
  template <class... Ts>
  caf::error ask_void(const caf::actor& dest, Ts... xs) {
    auto e = std::make_shared<caf::error>();
    auto done = std::make_shared<bool>(false);
    sys.spawn([=](caf::event_based_actor* self) {
      self->request(dest, std::chrono::seconds(10), xs...)
          .then([=]() { *done = true; }, [=](caf::error& x) { *e = std::move(x); });
    });
    sched.run();
    if (!*done && !*e) return caf::make_error(caf::sec::request_timeout);
    return *e;
  }
};

}  // namespace cellshard::test
