// actors/fault_env.hpp: the fault plan around one shard (issue #15: fault
// injection and link shaping as a wrapper around a shard, so that the shard
// itself is compute, KV cache and replay log).
//
// A shard asks its fault_env two things and applies the answers; it decides
// nothing about faults itself:
//   - at every step (and, on an expert node, every expert request): may it
//     run now? admit() fires the plans due at those positions, reports each
//     to the coordinator (fault_report) and applies its effect:
//       crash      the hooks quit the actor (injected_crash): not admitted;
//       silence    the hooks silence the actor and its node's heartbeats: not
//                  admitted, and silent() stays true for the fault's time;
//       partition  nothing in or out for a while, heartbeats included:
//                  silent() until it ends, not admitted;
//       slow       held back for D ms on the actor clock (never a sleep): a
//                  step comes back through resume() after a resume_atom the
//                  env sends to the actor, an expert request is sent to the
//                  actor again marked `held`;
//       drop, corrupt, delay   arm the link wrapper (faulty_links around the
//                  node's shaper, actors/links.hpp) for the next payloads.
//   - per payload to another node: links().send(dest, bytes), the verdict
//     (dropped, corrupted, delay) the shard applies when it sends.
// silent() is what a frozen node is: the shard handles nothing and answers
// nothing while it is true (it checks at the top of its handlers).
//
// Replayed steps (replay_until >= 0) are always admitted: faults fire on
// the positions of normal steps only, so a recovery is never faulted again by
// the plan that caused it.
//
// Without an injector the env admits every step, is never silent, and its
// links are the node's shaper alone (nothing armed).
//
// Lifetime and thread safety: owned by its shard's state, used from its
// handlers only (the actor clock is its clock, so test_coordinator's
// advance_time drives partitions and slow faults). The injector is shared
// and internally locked; the shaper is shared per node and locked.
#pragma once

#include "actors/links.hpp"
#include "actors/messages.hpp"
#include "supervision/fault_hooks.hpp"
#include "supervision/fault_plan.hpp"

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/message_handler.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace cellshard::actors {

class fault_env {
public:
  /// Who the shard is, for fault reports and heartbeats.
  struct identity {
    int32_t index = 0;       // placement index (the plans' `node`)
    int32_t node = 0;        // the node it runs on
    caf::actor heartbeat;    // the node's heartbeat sender (silenced with it); may be invalid
    caf::actor coordinator;  // gets fault_report messages; may be invalid
  };

  /// `injector` may be null (no faults); `shaper` may be null (unshaped links).
  fault_env(caf::event_based_actor* self, identity who, std::shared_ptr<supervision::fault_injector> injector,
            std::shared_ptr<link_shaper> shaper);
  fault_env(const fault_env&) = delete;
  fault_env& operator=(const fault_env&) = delete;

  /// True when a fault plan is attached (the shard then keeps its steps on
  /// the actor: no fused worker jobs).
  bool injects() const { return hooks_ != nullptr; }
  /// Frozen (silence) or unreachable (partition) now, on the actor clock.
  bool silent() const;

  /// The shard's outgoing links (the node's shaper inside the link faults).
  link_env& links() { return *links_; }
  /// Some payload ahead will not pass untouched (a link fault is armed).
  bool links_armed() const { return links_->armed(); }

  /// A step arrives: true when it runs now; false when it must not (see
  /// above), `a` then moved into the env if a slow fault holds it back.
  bool admit(activation& a);
  /// The oldest step held back by a slow fault, once its resume_atom came;
  /// nothing while silent (it stays lost, as with a frozen node).
  std::optional<activation> resume();
  /// Whether a step of (session, epoch, pos0) is being held back here.
  bool holds(uint64_t session, uint32_t epoch, int32_t pos0) const;

  /// An expert node's request arrives (as admit for a step); a held-back
  /// request is sent to the actor again after the delay, marked `held`.
  bool admit(expert_req& r);

  /// The hooks' delayed replies (compose with or_else); only when injects().
  caf::message_handler handler();

private:
  /// Fires the plans due at positions [pos0, pos0 + count); false when the
  /// work must not run, with `slow` set when it is only held back.
  bool at_positions(int32_t pos0, int32_t count, std::chrono::milliseconds& slow);

  caf::event_based_actor* self_;
  identity who_;
  std::unique_ptr<supervision::fault_hooks> hooks_;  // null: no faults
  std::unique_ptr<faulty_links> links_;
  caf::actor_clock::time_point partitioned_until_{};
  std::vector<activation> held_;  // steps held back by `slow`, arrival order
};

}  // namespace cellshard::actors
