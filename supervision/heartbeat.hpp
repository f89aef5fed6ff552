// supervision/heartbeat.hpp: heartbeats on their own actors, apart from the
// data path, judged by a phi accrual detector (phi_accrual.hpp).
//
// heartbeat_monitor: one per watching node. Peers (identified by a uint64 the
//   caller chooses, e.g. a placement index) send (hb_atom, peer). Every `tick`
//   (actor clock, delayed_send to itself) the monitor evaluates each peer's
//   phi; when a peer crosses the threshold it sends its listeners
//   (hb_suspect_atom, suspect_event{peer, phi, silent_for}) -- once per
//   suspicion. When a suspected peer's heartbeat arrives again the listeners
//   get (hb_alive_atom, peer) and the peer may be suspected again later.
//   A heartbeat from an unknown peer starts watching it; (hb_watch, peer)
//   starts watching before any heartbeat and counts "now" as a heartbeat, so a
//   peer frozen before its first heartbeat is still suspected.
//   Detection latency = phi crossing time + up to one tick; with the defaults
//   (100 ms heartbeats, threshold 8, min std-dev 50 ms) phi crosses about
//   361 ms after the last heartbeat, so a silent peer is reported within
//   ~0.39 s (see tests/supervision/heartbeat_test.cpp).
// heartbeat_sender: sends (hb_atom, peer) to a monitor every `interval`
//   (first one at once). (hb_silence_atom, timespan d) stops it for d
//   (d <= 0: for ever); (hb_resume_atom) restarts it. This is the switch the
//   fault hooks use for `silence`.
//
// Defaults: tick 25 ms = a quarter of the 100 ms heartbeat interval (our
// choice: adds at most 25 ms to detection); sender interval 100 ms (issue #6).
// Time comes from self->clock() only: under CAF's test_coordinator,
// sched.advance_time() drives both actors; nothing sleeps.
// Thread safety: actors; message passing only. Errors: (hb_phi, peer) for an
// unwatched peer replies sv_errc::unknown_child; spawn_heartbeat_monitor()
// rejects an invalid detector config or a non-positive tick.
#pragma once

#include <cstdint>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/expected.hpp>
#include <caf/timespan.hpp>

#include "supervision/errors.hpp"
#include "supervision/messages.hpp"
#include "supervision/phi_accrual.hpp"

namespace cellshard::supervision {

struct heartbeat_monitor_config {
  phi_accrual_config detector;
  caf::timespan tick = std::chrono::milliseconds(25);
  std::vector<caf::actor> listeners;   ///< more via (sv_listen_atom, actor)
  std::vector<std::uint64_t> watch;    ///< peers watched from the start
};

caf::expected<caf::actor> spawn_heartbeat_monitor(caf::actor_system& sys,
                                                  heartbeat_monitor_config cfg);

struct heartbeat_sender_config {
  caf::actor monitor;                  ///< may be remote
  std::uint64_t peer = 0;              ///< our id in the monitor
  caf::timespan interval = std::chrono::milliseconds(100);
  /// true: the sender runs on a thread of its own (caf::detached), so
  /// heartbeats and probe answers (hb_probe) keep coming while every thread
  /// of the scheduler is busy or blocked, e.g. a node daemon reading a
  /// slice's weights on its only CAF thread (docs/distributed.md, "The spawn
  /// that gave up"). One thread per sender: meant for one per process (node
  /// daemons); in-process clusters keep the default, false (scheduled).
  bool detached = false;
};

/// The sender's behaviour, for spawning with other options or from an actor.
caf::behavior heartbeat_sender(caf::event_based_actor* self, heartbeat_sender_config cfg);

caf::actor spawn_heartbeat_sender(caf::actor_system& sys, heartbeat_sender_config cfg);

}  // namespace cellshard::supervision
