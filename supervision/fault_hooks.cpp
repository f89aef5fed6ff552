#include "supervision/fault_hooks.hpp"

#include "base/parse.hpp"

#include <string_view>

namespace cellshard::supervision {

fault_hooks::fault_hooks(caf::event_based_actor* self, std::uint32_t node,
                         std::shared_ptr<fault_injector> injector)
    : self_(self), node_(node), injector_(std::move(injector)) {}

caf::error fault_hooks::crash_reason(std::uint32_t node, std::uint64_t step) {
  return make_error(sv_errc::injected_crash, "node " + std::to_string(node) +
                                                 ": injected crash at step " +
                                                 std::to_string(step));
}

std::optional<std::uint64_t> fault_hooks::crash_step(const caf::error& reason) {
  if (!is(reason, sv_errc::injected_crash)) return std::nullopt;
  const std::string text = describe(reason);
  const std::string key = "injected crash at step ";
  const auto at = text.rfind(key);
  if (at == std::string::npos) return std::nullopt;
  // The digits after the key (the rendering of the error may go on after them).
  const std::string_view rest = std::string_view(text).substr(at + key.size());
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') ++digits;
  return parse_uint<std::uint64_t>(rest.substr(0, digits));  // base/parse.hpp
}

fault_effects fault_hooks::on_step(std::uint64_t first, std::uint64_t last) {
  if (!injector_) return {};
  auto fx = injector_->at(node_, first, last);
  if (fx.crash) {
    std::uint64_t step = first;
    for (auto& p : fx.fired)
      if (p.kind == fault_kind::crash) step = std::max(first, p.step);
    self_->quit(crash_reason(node_, step));
    return fx;
  }
  if (fx.silence) {
    auto now = self_->clock().now();
    silent_until_ = fx.silence_for ? now + *fx.silence_for : caf::actor_clock::time_point::max();
    if (heartbeat_)
      self_->send(heartbeat_, hb_silence_atom::value,
                  fx.silence_for ? caf::timespan{*fx.silence_for} : caf::timespan::zero());
  }
  return fx;
}

bool fault_hooks::silenced() const { return self_->clock().now() < silent_until_; }

caf::message_handler fault_hooks::handler() {
  return {[this](flt_deliver_atom, std::uint64_t token) {
    auto it = pending_.find(token);
    if (it == pending_.end()) return;
    auto f = std::move(it->second);
    pending_.erase(it);
    f();
  }};
}

}  // namespace cellshard::supervision
