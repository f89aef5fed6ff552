// supervision/supervisor.hpp: OTP-style supervisors as CAF 0.17 event-based
// actors. Generic: children are any actors produced by a factory.
//
// Semantics (after Erlang/OTP's supervisor behaviour, "OTP design principles"):
// - Children start in spec order when the supervisor starts. Each child is
//   *monitored* (not linked): its exit arrives as a down_msg, local or remote
//   (remote connection loss shows up as exit_reason::remote_link_unreachable).
// - When a child exits, its restart type decides whether anything happens:
//     permanent: always restarted;
//     transient: restarted unless the exit was normal (none or user_shutdown);
//     temporary: never restarted, and forgotten.
//   If a restart is due, the strategy decides which children restart:
//     one_for_one:  only the exited child;
//     rest_for_one: the exited child and every child after it in spec order;
//     one_for_all:  all children.
//   Siblings that must restart are terminated first, in reverse spec order,
//   with exit_reason::kill (untrappable in CAF 0.17), demonitored, and then
//   started again in spec order. Temporary siblings terminated this way are
//   forgotten (as in OTP). Termination is asynchronous: the old incarnation
//   may still be finishing its current message when the new one starts.
// - One failure = one restart decision, however many children it restarts.
//   down_msgs from incarnations the supervisor already replaced or terminated
//   are ignored, so N children crashing together under one_for_all cause one
//   restart, not N (storm suppression).
// - Restart intensity: if more than `max_restarts` restart decisions fall
//   within `period` (measured on the actor clock, self->clock().now(), so the
//   test_coordinator's advance_time drives it), the supervisor escalates:
//   it terminates all children (kill, reverse order), sends
//   (sv_event_atom, supervisor_event{escalated}) once to its parent and
//   listeners, and quits with make_error(sv_errc::restart_intensity_exceeded,
//   "<supervisor>: <child> ...") -- a down_msg with that reason reaches every
//   monitor, including a supervising parent, which then applies its own strategy.
// - A child factory returning an invalid handle: at the first start the
//   supervisor stops what it started and quits with child_start_failed (also
//   announced as `escalated`); at a restart it counts as one more exit of that
//   child (reason child_start_failed), so the intensity bounds retries.
// - An exit_msg from a non-child (e.g. a linked parent) with a non-normal
//   reason: children are killed and the supervisor quits with that reason.
//   exit_reason::kill itself cannot be trapped; in that case (and in any
//   other termination) the supervisor's state destructor kills the children
//   it still holds, so children never outlive their supervisor.
// - (sv_exited, id, incarnation, reason): a failure detector outside the
//   supervisor (heartbeats) declares that incarnation gone; it is killed,
//   demonitored and handled as an exit with `reason` (the down_msg of a child
//   on a frozen remote node would only come with the connection's timeout).
//   Stale verdicts (another incarnation) are ignored.
// - (sv_stop): children are killed (reverse order), the supervisor quits
//   normally (no escalation). There is no graceful shutdown phase anywhere:
//   state that must survive a child belongs in a checkpoint (checkpoint.hpp).
//
// Defaults: at most 3 restarts in 10 s (cellshard issue #6 brief; OTP's own
// default is 1 in 5 s, HARDWARE.md). The message protocol is listed in
// supervision/messages.hpp.
//
// - Starts that may block (child_spec::start_may_block): the factory runs on
//   a detached helper actor's own thread, never on the supervisor's (a CAF
//   scheduler thread that also carries heartbeats and compute messages).
//   Until its result arrives the child is "starting": it has no handle
//   (sv_children shows none), other children's exits and verdicts are
//   handled as usual, and child_restarted is emitted only when the start
//   succeeds. A failed restart counts as one more exit of that child (as
//   above); a failed first start escalates with child_start_failed. A
//   result that arrives after the child was terminated (a sibling's
//   one_for_all restart, sv_stop, escalation) or after the supervisor died
//   is refused and the helper kills the handle, so no orphan survives.
//   Several children may be starting at once, so with rest_for_one or
//   one_for_all their starts may complete out of spec order. sv_add refuses
//   such children (add them in the config).
// - Asynchronous starts (child_spec::start_async): the factory runs on the
//   supervisor's thread like a plain one but does not return the child; it
//   starts the work (e.g. sends a spawn request from an actor of its own)
//   and hands the child, or an invalid handle on failure, to the `done`
//   callback later, from any thread. Until then the child is "starting",
//   exactly as for a start that may block (above), without a thread of its
//   own: nothing waits anywhere. `done` delivers the result as a request
//   from a small courier actor; a result the supervisor refuses, or that
//   finds it gone, is killed. Calls of `done` after the first are ignored; a
//   `done` that is never called leaves the child starting until the
//   supervisor stops (the factory owns the deadline of its own work).
//
// Thread safety: the supervisor is an actor; talk to it by messages only.
// Factories run inside the supervisor (one at a time, on its thread) unless
// start_may_block is set, and must then not block: spawn and return (or, for
// start_async, start the work and return). A
// blocking factory runs on its helper's thread and may run concurrently with
// other children's blocking factories. The supervisor_config is copied into the actor.
// Errors: spawn_supervisor() validates the config (unique non-empty ids,
// factories set, period > 0) and returns the error instead of an actor.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/allowed_unsafe_message_type.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/timespan.hpp>

#include "supervision/errors.hpp"
#include "supervision/messages.hpp"

namespace cellshard::supervision {

enum class restart_strategy : std::uint8_t { one_for_one, rest_for_one, one_for_all, count };
enum class restart_type : std::uint8_t { permanent, transient, temporary, count };

std::string to_string(restart_strategy s);
std::string to_string(restart_type t);

/// What a factory learns about the start it performs.
struct start_context {
  caf::actor_system& system;
  caf::actor supervisor;        ///< the supervising actor (e.g. parent of a nested supervisor)
  const std::string& id;        ///< child id
  std::uint64_t incarnation;    ///< 0 on the first start, then restarts so far
  const caf::error& last_reason;///< why the previous incarnation ended (none at first start)
};

/// Starts one incarnation of a child. Return an invalid handle on failure.
/// The child is monitored by the supervisor after the factory returns; the
/// factory must not link it to anything the supervisor relies on.
using child_factory = std::function<caf::actor(const start_context&)>;

/// Delivers an asynchronous start's child (invalid: the start failed). Any
/// thread; only the first call counts.
using start_done = std::function<void(caf::actor)>;

/// Starts one incarnation without returning it: see "Asynchronous starts"
/// above. The context's references are valid only during the call.
using child_async_factory = std::function<void(const start_context&, start_done)>;

struct child_spec {
  std::string id;             ///< unique within one supervisor, non-empty
  child_factory start;        ///< required unless start_async is set
  /// When set, used instead of `start` ("Asynchronous starts" above).
  child_async_factory start_async;
  restart_type restart = restart_type::permanent;
  /// The factory may block (e.g. it waits for a remote node daemon's spawn
  /// reply, or ships weights first). The supervisor then runs it on a thread
  /// of its own (a detached helper actor) and handles its result as a
  /// message, staying responsive meanwhile; see "Starts that may block" above.
  bool start_may_block = false;
};

/// At most `max_restarts` restart decisions within any `period`.
struct restart_intensity {
  std::uint32_t max_restarts = 3;
  caf::timespan period = std::chrono::seconds(10);
};

struct supervisor_config {
  std::string name = "supervisor";  ///< appears in events and error texts
  restart_strategy strategy = restart_strategy::one_for_one;
  restart_intensity intensity;
  std::vector<child_spec> children;
  /// Gets (sv_event_atom, supervisor_event{escalated}) when the supervisor
  /// gives up. May be invalid. A supervising parent sees the down_msg anyway.
  caf::actor parent;
  /// Get every event (child_restarted, child_terminated, escalated).
  std::vector<caf::actor> listeners;
};

/// Empty error when valid, else invalid_config naming the problem.
caf::error validate(const supervisor_config& cfg);

/// Spawns a supervisor and starts its children (in the supervisor's first
/// activation). Returns invalid_config for a bad config.
caf::expected<caf::actor> spawn_supervisor(caf::actor_system& sys, supervisor_config cfg);

/// A child spec whose factory spawns a nested supervisor with `cfg`, its
/// parent set to the supervising actor. The nested supervisor's escalation
/// reaches the outer one as a down_msg (reason restart_intensity_exceeded).
child_spec supervisor_child(std::string id, supervisor_config cfg,
                            restart_type restart = restart_type::permanent);

}  // namespace cellshard::supervision

// child_spec holds a std::function: (sv_add_atom, child_spec) works only
// inside one process and is never serialised.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(cellshard::supervision::child_spec)
