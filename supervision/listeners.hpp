// supervision/listeners.hpp: the listener list shared by the supervisor and
// the heartbeat monitor ((sv_listen, actor) / (sv_unlisten, actor)). A
// listener is monitored while listed, so a dead one can be dropped on its
// down_msg. Call from the owning actor's handlers only.
#pragma once

#include <algorithm>
#include <vector>

#include <caf/actor.hpp>
#include <caf/event_based_actor.hpp>

namespace cellshard::supervision {

/// Adds `l` to `ls` (once) and monitors it.
inline void add_listener(caf::event_based_actor* self, std::vector<caf::actor>& ls, caf::actor l) {
  if (l && std::find(ls.begin(), ls.end(), l) == ls.end()) {
    self->monitor(l);
    ls.push_back(std::move(l));
  }
}

/// Removes `l` from `ls` and stops monitoring it.
inline void remove_listener(caf::event_based_actor* self, std::vector<caf::actor>& ls, const caf::actor& l) {
  auto it = std::find(ls.begin(), ls.end(), l);
  if (it != ls.end()) {
    self->demonitor(l);
    ls.erase(it);
  }
}

}  // namespace cellshard::supervision
