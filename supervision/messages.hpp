// supervision/messages.hpp: the atoms and message structs of the generic
// supervision blocks (supervisor, heartbeat monitor/sender, fault hooks).
//
// Every struct has a CAF 0.17 `inspect` overload; add_supervision_types()
// (errors.hpp) registers them so they can travel between processes. Atoms are
// prefixed sv_ (supervisor), hb_ (heartbeats) and flt_ (fault hooks) and are at
// most 10 characters (CAF 0.17 limit).
//
// Protocol summary (request -> reply):
//   supervisor:  (sv_children)            -> std::vector<child_info>
//                (sv_stats)               -> supervisor_stats
//                (sv_listen, actor)       -> (); listener gets (sv_event, supervisor_event)
//                (sv_unlisten, actor)     -> ()
//                (sv_stop)                -> (); children are killed, supervisor quits normally
//                (sv_add, child_spec)     -> caf::actor   (in-process only)
//                (sv_remove, std::string) -> ()           (terminates and forgets a child)
//                (sv_exited, id, actor, error) one-way: declare that incarnation of
//                                            child `id` gone (see supervisor.hpp)
//   heartbeat monitor: (hb, uint64 peer)  one-way heartbeat; an unknown peer is watched from then on
//                (hb_watch, peer)         -> (); watch from now (now counts as a heartbeat)
//                (hb_unwatch, peer)       -> ()
//                (hb_phi, peer)           -> double (error unknown_child if not watched)
//                (sv_listen, actor)       -> (); listener gets (hb_suspect, suspect_event)
//                                            and (hb_alive, uint64 peer) when a suspect recovers
//   heartbeat sender: (hb_silence, timespan d) stop sending for d (d <= 0: for ever)
//                (hb_resume)              send again from the next tick
//                (hb_probe)               -> (hb_probe) unless silenced (liveness probe)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/timespan.hpp>

namespace cellshard::supervision {

// -- supervisor ---------------------------------------------------------------
using sv_event_atom = caf::atom_constant<caf::atom("sv_event")>;
using sv_children_atom = caf::atom_constant<caf::atom("sv_kids")>;
using sv_stats_atom = caf::atom_constant<caf::atom("sv_stats")>;
using sv_listen_atom = caf::atom_constant<caf::atom("sv_listen")>;
using sv_unlisten_atom = caf::atom_constant<caf::atom("sv_unlist")>;
using sv_stop_atom = caf::atom_constant<caf::atom("sv_stop")>;
using sv_add_atom = caf::atom_constant<caf::atom("sv_add")>;
using sv_remove_atom = caf::atom_constant<caf::atom("sv_remove")>;
/// A failure detector's verdict: (sv_exited, std::string id, caf::actor
/// incarnation, caf::error reason). The supervisor treats that incarnation as
/// exited with `reason` now (it is killed and demonitored), without waiting
/// for its down_msg -- which, for a child on a frozen remote node, arrives
/// only when the middleman gives up on the connection (CAF-0.17.md §4).
/// Ignored when `incarnation` is not the child's current one.
using sv_exited_atom = caf::atom_constant<caf::atom("sv_exited")>;
/// Internal: a child failed to start; handled as a crash of that child.
using sv_retry_atom = caf::atom_constant<caf::atom("sv_retry")>;
/// Internal: the result of a start that ran off the supervisor's thread
/// (child_spec::start_may_block): (sv_started, std::string id, uint64_t
/// attempt, caf::actor handle) -> bool accepted. A result the supervisor no
/// longer waits for (the child was terminated meanwhile, or the supervisor
/// is stopping) is refused, and its starter kills the handle.
using sv_started_atom = caf::atom_constant<caf::atom("sv_started")>;

// -- heartbeats ---------------------------------------------------------------
using hb_atom = caf::atom_constant<caf::atom("hb")>;
using hb_watch_atom = caf::atom_constant<caf::atom("hb_watch")>;
using hb_unwatch_atom = caf::atom_constant<caf::atom("hb_unwatch")>;
using hb_phi_atom = caf::atom_constant<caf::atom("hb_phi")>;
using hb_tick_atom = caf::atom_constant<caf::atom("hb_tick")>;
using hb_silence_atom = caf::atom_constant<caf::atom("hb_silence")>;
using hb_resume_atom = caf::atom_constant<caf::atom("hb_resume")>;
using hb_suspect_atom = caf::atom_constant<caf::atom("hb_suspect")>;
using hb_alive_atom = caf::atom_constant<caf::atom("hb_alive")>;
/// Liveness probe of a heartbeat sender: (hb_probe) -> (hb_probe), not
/// answered while the sender is silenced (it stands for a frozen node).
using hb_probe_atom = caf::atom_constant<caf::atom("hb_probe")>;

// -- fault hooks --------------------------------------------------------------
/// Internal: a delayed reply of fault_hooks is due (payload: token).
using flt_deliver_atom = caf::atom_constant<caf::atom("flt_deliv")>;

/// What a supervisor reports to its listeners (and, for `escalated`, to its parent).
enum class supervisor_event_kind : std::uint8_t {
  /// `child` was started again; `handle` is the new incarnation. Under
  /// one_for_all / rest_for_one every restarted sibling gets its own event,
  /// with `cause` naming the child whose exit triggered the restart.
  child_restarted,
  /// `child` exited and will not be restarted (temporary, or transient with a
  /// normal exit); temporary children are forgotten.
  child_terminated,
  /// Restart intensity exceeded (or a child could not be started at all): the
  /// supervisor stopped all children and quits with reason
  /// restart_intensity_exceeded / child_start_failed. Sent exactly once.
  escalated,
  count
};

std::string to_string(supervisor_event_kind k);

struct supervisor_event {
  supervisor_event_kind kind = supervisor_event_kind::child_restarted;
  std::string supervisor;   ///< supervisor_config::name
  std::string child;        ///< the child this event is about
  std::string cause;        ///< id of the child whose exit started this (== child for one_for_one)
  caf::actor handle;        ///< new incarnation (child_restarted), else invalid
  caf::error reason;        ///< exit reason of `cause`
  std::uint64_t incarnation = 0;        ///< restarts of `child` so far (0 = first start)
  std::uint64_t restarts_in_window = 0; ///< supervisor restarts counted in the last period
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_event& x) {
  return f(caf::meta::type_name("supervisor_event"), x.kind, x.supervisor, x.child, x.cause,
           x.handle, x.reason, x.incarnation, x.restarts_in_window);
}

/// One child as seen by its supervisor.
struct child_info {
  std::string id;
  caf::actor handle;            ///< invalid when the child is not running
  std::uint8_t restart = 0;     ///< restart_type as integer (supervisor.hpp)
  std::uint64_t restarts = 0;   ///< times this child was restarted
  caf::error last_reason;       ///< reason of its last exit (none if it never exited)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, child_info& x) {
  return f(caf::meta::type_name("child_info"), x.id, x.handle, x.restart, x.restarts,
           x.last_reason);
}

/// Restart statistics of one supervisor.
struct supervisor_stats {
  std::string name;
  std::uint64_t total_restarts = 0;      ///< restart decisions (one per failure, not per child)
  std::uint64_t restarts_in_window = 0;  ///< of those, how many fall in the current period
  std::string last_child;                ///< child whose exit caused the last restart
  caf::error last_reason;                ///< and its reason
  std::vector<child_info> children;      ///< in start order
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, supervisor_stats& x) {
  return f(caf::meta::type_name("supervisor_stats"), x.name, x.total_restarts,
           x.restarts_in_window, x.last_child, x.last_reason, x.children);
}

/// Sent once per suspicion by the heartbeat monitor.
struct suspect_event {
  std::uint64_t peer = 0;
  double phi = 0;             ///< phi at the tick that crossed the threshold
  caf::timespan silent_for{0}; ///< time since the peer's last heartbeat (actor clock)
};

template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, suspect_event& x) {
  return f(caf::meta::type_name("suspect_event"), x.peer, x.phi, x.silent_for);
}

}  // namespace cellshard::supervision
