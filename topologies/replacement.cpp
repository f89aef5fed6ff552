#include "topologies/replacement.hpp"

#include "topologies/profile.hpp"

#include <algorithm>
#include <map>

namespace cellshard::topologies {

replacement choose_node(const replacement_input& in) {
  replacement out;
  const int idx = in.index;
  if (idx < 0 || idx >= static_cast<int>(in.node_of.size()) || in.need_of.size() != in.node_of.size()) {
    out.why = "placement index " + std::to_string(idx) + " outside the runtime's " +
              std::to_string(in.node_of.size()) + " placement indices (with " + std::to_string(in.need_of.size()) +
              " memory needs)";
    return out;
  }
  auto find = [&](int n) -> const candidate_node* {
    for (const auto& c : in.nodes)
      if (c.index == n) return &c;
    return nullptr;
  };
  // As the runtime asks: a node's reachability is looked at only when it is
  // healthy and not tried; an unreachable one is reported once.
  auto usable = [&](int n) {
    const candidate_node* c = find(n);
    if (!c || c->tried || !c->healthy) return false;
    if (!c->reachable) {
      if (std::find(out.unreachable.begin(), out.unreachable.end(), n) == out.unreachable.end())
        out.unreachable.push_back(n);
      return false;
    }
    return true;
  };
  const int own = in.node_of[static_cast<size_t>(idx)];
  if (usable(own)) {
    out.node = own;
    return out;
  }
  for (int n : in.spares) {
    ++out.spares_taken;
    if (usable(n)) {
      out.node = n;
      return out;
    }
  }
  // Re-placement over the survivors.
  const uint64_t need = in.need_of[static_cast<size_t>(idx)];
  std::map<int, uint64_t> used;  // by node: what the placement puts there now
  for (size_t i = 0; i < in.node_of.size(); ++i)
    if (static_cast<int>(i) != idx) used[in.node_of[i]] += in.need_of[i];
  uint64_t best_free = 0;
  std::string room;
  for (const auto& n : in.nodes) {
    if (!usable(n.index)) continue;
    const uint64_t budget = n.budget_bytes;
    const uint64_t u = used.count(n.index) ? used[n.index] : 0;
    const uint64_t free = budget == 0 ? UINT64_MAX : (budget > u ? budget - u : 0);
    room += (room.empty() ? "" : ", ") + std::string("node ") + std::to_string(n.index) + " has " +
            (budget == 0 ? std::string("no limit") : format_bytes(free) + " free of " + format_bytes(budget));
    if (free >= need && (out.node < 0 || free > best_free)) {
      out.node = n.index;
      best_free = free;
    }
  }
  if (out.node < 0) {
    const candidate_node* o = find(own);
    const bool own_reachable = o && o->reachable;
    out.why = "no spare node left for placement index " + std::to_string(idx) + " (node " + std::to_string(own) +
              (own_reachable ? " answered no liveness probe" : " is unreachable") +
              "), and no surviving node has room for it (needs " + format_bytes(need) +
              "): " + (room.empty() ? "no healthy node left" : room);
  }
  return out;
}

}  // namespace cellshard::topologies
