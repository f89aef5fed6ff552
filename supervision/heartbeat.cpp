#include "supervision/heartbeat.hpp"
#include "supervision/listeners.hpp"

#include <algorithm>
#include <map>

#include <caf/stateful_actor.hpp>

namespace cellshard::supervision {

namespace {

struct peer_entry {
  phi_accrual_detector detector;
  bool suspected = false;
};

struct monitor_state {
  static inline const char* name = "cellshard.heartbeat_monitor";
  heartbeat_monitor_config cfg;
  std::map<std::uint64_t, peer_entry> peers;
};

using monitor_actor = caf::stateful_actor<monitor_state>;

caf::behavior monitor_impl(monitor_actor* self, heartbeat_monitor_config cfg) {
  auto& st = self->state;
  st.cfg = std::move(cfg);
  auto now = self->clock().now();
  for (auto p : st.cfg.watch) {
    auto& e = st.peers.emplace(p, peer_entry{phi_accrual_detector{st.cfg.detector}, false})
                  .first->second;
    e.detector.heartbeat(now);
  }
  for (auto& l : st.cfg.listeners)
    if (l) self->monitor(l);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& ls = self->state.cfg.listeners;
    ls.erase(std::remove_if(ls.begin(), ls.end(),
                            [&](const caf::actor& l) { return l.address() == dm.source; }),
             ls.end());
  });
  self->delayed_send(self, st.cfg.tick, hb_tick_atom::value);

  auto beat = [self](std::uint64_t peer) {
    auto& st = self->state;
    auto now = self->clock().now();
    auto it = st.peers.find(peer);
    if (it == st.peers.end())
      it = st.peers.emplace(peer, peer_entry{phi_accrual_detector{st.cfg.detector}, false}).first;
    it->second.detector.heartbeat(now);
    if (it->second.suspected && it->second.detector.is_available(now)) {
      it->second.suspected = false;
      for (auto& l : st.cfg.listeners) self->send(l, hb_alive_atom::value, peer);
    }
  };

  return {
      [beat](hb_atom, std::uint64_t peer) { beat(peer); },
      [beat](hb_watch_atom, std::uint64_t peer) { beat(peer); },
      [self](hb_unwatch_atom, std::uint64_t peer) { self->state.peers.erase(peer); },
      [self](hb_phi_atom, std::uint64_t peer) -> caf::result<double> {
        auto it = self->state.peers.find(peer);
        if (it == self->state.peers.end())
          return make_error(sv_errc::unknown_child,
                            "heartbeat monitor: peer " + std::to_string(peer) + " is not watched");
        return it->second.detector.phi(self->clock().now());
      },
      [self](sv_listen_atom, caf::actor l) { add_listener(self, self->state.cfg.listeners, std::move(l)); },
      [self](sv_unlisten_atom, caf::actor l) { remove_listener(self, self->state.cfg.listeners, l); },
      [self](hb_tick_atom) {
        auto& st = self->state;
        auto now = self->clock().now();
        for (auto& [peer, e] : st.peers) {
          if (e.suspected) continue;
          double phi = e.detector.phi(now);
          if (phi < e.detector.config().threshold) continue;
          e.suspected = true;
          suspect_event ev{peer, phi, now - *e.detector.last_heartbeat()};
          for (auto& l : st.cfg.listeners) self->send(l, hb_suspect_atom::value, ev);
        }
        self->delayed_send(self, st.cfg.tick, hb_tick_atom::value);
      },
  };
}

}  // namespace

caf::expected<caf::actor> spawn_heartbeat_monitor(caf::actor_system& sys,
                                                  heartbeat_monitor_config cfg) {
  if (auto ok = validate(cfg.detector); !ok)
    return make_error(sv_errc::invalid_config, ok.message());
  if (cfg.tick <= caf::timespan::zero())
    return make_error(sv_errc::invalid_config, "heartbeat monitor: tick must be > 0");
  return sys.spawn(monitor_impl, std::move(cfg));
}

caf::behavior heartbeat_sender(caf::event_based_actor* self, heartbeat_sender_config cfg) {
  // silent_until: no heartbeats while now < silent_until (max() = for ever).
  auto silent_until = std::make_shared<caf::actor_clock::time_point>(
      caf::actor_clock::time_point::min());
  auto send_now = [self, cfg, silent_until] {
    if (self->clock().now() >= *silent_until) self->send(cfg.monitor, hb_atom::value, cfg.peer);
  };
  send_now();
  self->delayed_send(self, cfg.interval, hb_tick_atom::value);
  return {
      [self, cfg, send_now](hb_tick_atom) {
        send_now();
        self->delayed_send(self, cfg.interval, hb_tick_atom::value);
      },
      [self, silent_until](hb_silence_atom, caf::timespan d) {
        *silent_until = d <= caf::timespan::zero() ? caf::actor_clock::time_point::max()
                                                   : self->clock().now() + d;
      },
      [silent_until](hb_resume_atom) { *silent_until = caf::actor_clock::time_point::min(); },
      [self, silent_until](hb_probe_atom) -> caf::result<hb_probe_atom> {
        if (self->clock().now() < *silent_until) return self->make_response_promise<hb_probe_atom>();
        return hb_probe_atom::value;
      },
  };
}

caf::actor spawn_heartbeat_sender(caf::actor_system& sys, heartbeat_sender_config cfg) {
  if (cfg.detached) return sys.spawn<caf::detached>(heartbeat_sender, std::move(cfg));
  return sys.spawn(heartbeat_sender, std::move(cfg));
}

}  // namespace cellshard::supervision
