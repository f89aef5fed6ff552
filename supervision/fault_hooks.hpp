// supervision/fault_hooks.hpp: the actor side of fault injection. An actor
// (e.g. a shard) owns one fault_hooks in its state and calls on_step() at
// every step; the hooks apply what they can themselves and hand back the rest.
//
//   crash     on_step() quits the actor with make_error(sv_errc::injected_crash,
//             "node N: injected crash at step S") and returns effects.crash;
//             the caller must return at once without replying.
//   silence   from now on, for ms (or for ever) silenced() is true: the caller
//             must not reply (use hold() to park the promise so requests time
//             out at the requester) and the attached heartbeat sender is told
//             (hb_silence, ms) so heartbeats stop too.
//   slow      effects.slow > 0: the caller replies through reply_after(), which
//             delivers the response promise after that delay via a delayed
//             message on the actor clock -- never a sleep in a scheduler
//             thread. The actor keeps serving other messages meanwhile.
//   drop / delay / corrupt / partition: returned in the effects; they concern
//             the caller's outgoing links, which the hooks do not know.
//
// Requirements: the actor's behaviour must include handler() (or_else it into
// a message_handler) so delayed replies are delivered; the fault_hooks object must
// live as long as the behaviour (keep it in the actor's state). Time is the
// actor clock (self->clock().now()), so test_coordinator's advance_time drives it.
// Thread safety: owned by one actor, used only from its handlers. The shared
// fault_injector is internally locked.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message_handler.hpp>
#include <caf/response_promise.hpp>
#include <caf/timespan.hpp>

#include "supervision/errors.hpp"
#include "supervision/fault_plan.hpp"
#include "supervision/messages.hpp"

namespace cellshard::supervision {

class fault_hooks {
public:
  /// `injector` may be null (no faults). `node` is this actor's placement index.
  fault_hooks(caf::event_based_actor* self, std::uint32_t node,
              std::shared_ptr<fault_injector> injector);

  fault_hooks(const fault_hooks&) = delete;
  fault_hooks& operator=(const fault_hooks&) = delete;

  /// The heartbeat sender to silence together with the actor (may be invalid).
  void set_heartbeat_sender(caf::actor sender) { heartbeat_ = std::move(sender); }

  /// Asks the injector about positions [first, last) and applies crash and
  /// silence (see above). Returns all effects.
  fault_effects on_step(std::uint64_t first, std::uint64_t last);
  fault_effects on_step(std::uint64_t step) { return on_step(step, step + 1); }

  /// True while a silence is in force (actor clock).
  bool silenced() const;

  /// Parks a promise so its request never gets an answer from us (the
  /// requester's timeout fires). Released when the actor terminates.
  void hold(caf::response_promise rp) { held_.push_back(std::move(rp)); }

  /// Delivers `xs...` through `rp` after `delay` (immediately if <= 0).
  template <class... Ts>
  void reply_after(caf::response_promise rp, caf::timespan delay, Ts... xs) {
    if (delay <= caf::timespan::zero()) {
      rp.deliver(std::move(xs)...);
      return;
    }
    auto token = next_token_++;
    pending_.emplace(token, [rp, xs...]() mutable { rp.deliver(std::move(xs)...); });
    self_->delayed_send(self_, delay, flt_deliver_atom::value, token);
  }

  /// Delayed replies not yet delivered.
  std::size_t pending() const { return pending_.size(); }

  /// Handles (flt_deliver_atom, uint64 token); compose it into the behaviour
  /// (CAF 0.17: or_else lives on message_handler, not on behavior):
  ///   return caf::message_handler{...own handlers...}.or_else(hooks.handler());
  caf::message_handler handler();

  /// The reason used for an injected crash.
  static caf::error crash_reason(std::uint32_t node, std::uint64_t step);
  /// The step of an injected crash from its reason (crash_reason's inverse);
  /// nullopt for any other reason. Lets a supervisor that sees the exit learn
  /// which plans fired even when the fault report travels apart (node daemons).
  static std::optional<std::uint64_t> crash_step(const caf::error& reason);

private:
  caf::event_based_actor* self_;
  std::uint32_t node_;
  std::shared_ptr<fault_injector> injector_;
  caf::actor heartbeat_;
  caf::actor_clock::time_point silent_until_ = caf::actor_clock::time_point::min();
  std::uint64_t next_token_ = 1;
  std::unordered_map<std::uint64_t, std::function<void()>> pending_;
  std::vector<caf::response_promise> held_;
};

}  // namespace cellshard::supervision
