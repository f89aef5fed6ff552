// A detached heartbeat sender (heartbeat_sender_config::detached) keeps
// sending while the scheduler's only thread is blocked: what a node daemon
// needs while it reads a slice on its CAF thread. On CAF's real scheduler
// (one worker thread); nothing sleeps: the blocker waits on a gate the test
// opens, and every wait has a deadline whose expiry fails the test.
#include "supervision/heartbeat.hpp"

#include <future>

#include <caf/all.hpp>

#include <catch2/catch.hpp>

using namespace cellshard::supervision;
using namespace std::chrono_literals;

namespace {

using block_atom = caf::atom_constant<caf::atom("t_block")>;

struct one_thread_config : caf::actor_system_config {
  one_thread_config() { set("scheduler.max-threads", size_t{1}); }
};

/// Heartbeats the scoped actor `rx` receives within `deadline` each, up to `want`.
int heartbeats(caf::scoped_actor& rx, int want, caf::timespan deadline) {
  int got = 0;
  bool timed_out = false;
  while (got < want && !timed_out) {
    rx->receive([&](hb_atom, std::uint64_t peer) { got += peer == 7 ? 1 : 0; },
                caf::after(deadline) >> [&] { timed_out = true; });
  }
  return got;
}

/// Runs the case with a sender spawned detached or not; returns the heartbeats
/// `rx` got while the only worker thread was blocked (at most 3 are waited for).
int beats_while_blocked(bool detached) {
  one_thread_config cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor rx{sys};
  std::promise<void> gate;
  auto opened = gate.get_future().share();
  std::promise<void> entered;
  auto blocked = entered.get_future();
  // A scheduled actor that holds the only worker thread until the gate opens (at most 20 s).
  auto blocker = sys.spawn([opened, &entered](caf::event_based_actor*) -> caf::behavior {
    return {[opened, &entered](block_atom) {
      entered.set_value();
      opened.wait_for(20s);
    }};
  });
  heartbeat_sender_config hc;
  hc.monitor = caf::actor_cast<caf::actor>(rx);
  hc.peer = 7;
  hc.interval = 20ms;
  hc.detached = detached;
  auto snd = spawn_heartbeat_sender(sys, hc);
  // Running first: a heartbeat arrives before anything is blocked.
  REQUIRE(heartbeats(rx, 1, 10s) == 1);
  caf::anon_send(blocker, block_atom::value);
  REQUIRE(blocked.wait_for(20s) == std::future_status::ready);
  // Drop what was sent before the block, then count 3 more, 2 s for each.
  rx->receive([](hb_atom, std::uint64_t) {}, caf::after(caf::timespan{0}) >> [] {});
  const int got = heartbeats(rx, 3, 2s);
  gate.set_value();
  caf::anon_send_exit(snd, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(blocker, caf::exit_reason::user_shutdown);
  return got;
}

}  // namespace

TEST_CASE("a detached heartbeat sender keeps beating while the only scheduler thread is blocked",
          "[heartbeat][detached]") {
  CHECK(beats_while_blocked(true) == 3);
}

TEST_CASE("a scheduled heartbeat sender stops while the only scheduler thread is blocked (why daemons detach it)",
          "[heartbeat][detached]") {
  // The counterpart: the same sender on the scheduler sends nothing while
  // its one thread is held (the 2 s deadline expires once, then the gate opens).
  CHECK(beats_while_blocked(false) == 0);
}
