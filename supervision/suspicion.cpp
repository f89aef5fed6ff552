#include "supervision/suspicion.hpp"

#include <algorithm>

namespace cellshard::supervision {

bool suspicion_table::suspect(std::uint64_t peer, time_point now) {
  auto it = peers_.find(peer);
  if (it != peers_.end()) return false;  // suspected already (probing, cleared) or dead
  entry e;
  e.at = now;
  peers_.emplace(peer, e);
  return true;
}

std::uint64_t suspicion_table::start_round(std::uint64_t peer, int probes) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.ph == phase::dead) return 0;
  auto& e = it->second;
  e.round = next_round_++;
  e.outstanding = std::max(1, probes);
  e.round_done = false;
  ++e.rounds;
  return e.round;
}

suspicion_table::verdict suspicion_table::answer(std::uint64_t peer, std::uint64_t round, bool ok,
                                                 time_point now, const std::string& how) {
  auto it = peers_.find(peer);
  if (it == peers_.end()) return verdict::stale;
  auto& e = it->second;
  if (e.ph == phase::dead || round != e.round || e.round_done) return verdict::stale;
  if (ok) {
    e.round_done = true;
    e.ph = phase::cleared;
    if (!e.recorded) {
      e.recorded = true;
      suspicion_record r;
      r.peer = peer;
      r.at = e.at;
      r.cleared_after_ms = std::chrono::duration<double, std::milli>(now - e.at).count();
      r.cleared_by = how;
      r.rounds = e.rounds;
      cleared_.push_back(std::move(r));
    } else {
      for (auto r = cleared_.rbegin(); r != cleared_.rend(); ++r)
        if (r->peer == peer) {
          r->rounds = e.rounds;
          break;
        }
    }
    return verdict::cleared;
  }
  if (--e.outstanding > 0) return verdict::pending;
  e.round_done = true;
  e.ph = phase::dead;
  return verdict::dead;
}

void suspicion_table::alive(std::uint64_t peer, time_point now) {
  auto it = peers_.find(peer);
  if (it == peers_.end() || it->second.ph == phase::dead) return;
  auto& e = it->second;
  if (!e.recorded) {
    suspicion_record r;
    r.peer = peer;
    r.at = e.at;
    r.cleared_after_ms = std::chrono::duration<double, std::milli>(now - e.at).count();
    r.cleared_by = "heartbeat";
    r.rounds = e.rounds;
    cleared_.push_back(std::move(r));
  }
  peers_.erase(it);
}

bool suspicion_table::suspected(std::uint64_t peer) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && it->second.ph != phase::dead;
}

bool suspicion_table::dead(std::uint64_t peer) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && it->second.ph == phase::dead;
}

bool suspicion_table::needs_reprobe(std::uint64_t peer) const {
  auto it = peers_.find(peer);
  return it != peers_.end() && it->second.ph == phase::cleared && it->second.round_done;
}

}  // namespace cellshard::supervision
