#include "actors/fault_env.hpp"

#include <caf/all.hpp>

#include <utility>

namespace cellshard::actors {

fault_env::fault_env(caf::event_based_actor* self, identity who, std::shared_ptr<supervision::fault_injector> injector,
                     std::shared_ptr<link_shaper> shaper)
    : self_(self), who_(std::move(who)) {
  if (injector) {
    hooks_ = std::make_unique<supervision::fault_hooks>(self_, static_cast<uint32_t>(who_.index), std::move(injector));
    hooks_->set_heartbeat_sender(who_.heartbeat);
  }
  if (!shaper) shaper = std::make_shared<link_shaper>();
  links_ = std::make_unique<faulty_links>(std::make_unique<shaped_links>(std::move(shaper)));
}

bool fault_env::silent() const {
  return (hooks_ && hooks_->silenced()) || self_->clock().now() < partitioned_until_;
}

bool fault_env::at_positions(int32_t pos0, int32_t count, std::chrono::milliseconds& slow) {
  slow = std::chrono::milliseconds{0};
  const auto fx = hooks_->on_step(static_cast<uint64_t>(pos0), static_cast<uint64_t>(pos0 + count));
  const int64_t now_ns = std::chrono::steady_clock::now().time_since_epoch().count();
  for (const auto& f : fx.fired)
    if (who_.coordinator)
      self_->send(who_.coordinator, fault_report{supervision::to_string(f.kind), who_.index, who_.node,
                                                 static_cast<int64_t>(f.step), now_ns, supervision::to_string(f)});
  if (fx.crash || fx.silence) return false;  // the hooks quit or silenced the actor
  if (fx.drop > 0) links_->drop_next(fx.drop);
  if (fx.corrupt > 0) links_->corrupt_next(fx.corrupt);
  if (fx.delay_count > 0) links_->delay_next(fx.delay, fx.delay_count);
  if (fx.partition) {
    // Unreachable for a while: nothing in or out, heartbeats included.
    const auto d = fx.partition_for ? caf::timespan(*fx.partition_for) : caf::timespan(std::chrono::hours(24 * 365));
    partitioned_until_ = self_->clock().now() + d;
    if (who_.heartbeat) self_->send(who_.heartbeat, supervision::hb_silence_atom::value, d);
    return false;
  }
  slow = fx.slow;
  return fx.slow.count() <= 0;
}

bool fault_env::admit(activation& a) {
  if (!hooks_ || a.replay_until >= 0) return true;
  std::chrono::milliseconds slow{0};
  if (at_positions(a.id.pos0, a.id.count, slow)) return true;
  if (slow.count() > 0) {
    held_.push_back(std::move(a));
    self_->delayed_send(self_, slow, resume_atom::value);
  }
  return false;
}

std::optional<activation> fault_env::resume() {
  if (silent() || held_.empty()) return std::nullopt;
  activation a = std::move(held_.front());
  held_.erase(held_.begin());
  return a;
}

bool fault_env::holds(uint64_t session, uint32_t epoch, int32_t pos0) const {
  for (const auto& a : held_)
    if (a.id.session == session && a.id.epoch == epoch && a.id.pos0 == pos0) return true;
  return false;
}

bool fault_env::admit(expert_req& r) {
  if (!hooks_ || r.held) return true;
  std::chrono::milliseconds slow{0};
  if (at_positions(r.id.pos0, r.id.count, slow)) return true;
  if (slow.count() > 0) {
    r.held = true;
    self_->delayed_send(self_, slow, std::move(r));
  }
  return false;
}

caf::message_handler fault_env::handler() { return hooks_ ? hooks_->handler() : caf::message_handler{}; }

}  // namespace cellshard::actors
