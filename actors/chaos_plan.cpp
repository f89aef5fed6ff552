#include "actors/chaos_plan.hpp"

#include <algorithm>

namespace cellshard::actors {

std::string to_string(const external_fault& f) {
  std::string s = f.kind + ":node=" + std::to_string(f.index) + ":step=" + std::to_string(f.at);
  if (f.ms > 0) s += ":ms=" + std::to_string(f.ms);
  return s;
}

std::string drawn_fault::text() const { return external ? to_string(ext) : supervision::to_string(plan); }

std::vector<std::string> default_fault_kinds(bool processes) {
  std::vector<std::string> kinds;
  for (int k = 0; k < static_cast<int>(supervision::fault_kind::count); ++k)
    kinds.push_back(supervision::to_string(static_cast<supervision::fault_kind>(k)));
  if (processes) kinds.insert(kinds.end(), {"kill", "stop"});
  return kinds;
}

result<void> check_fault_kinds(const std::vector<std::string>& kinds, bool processes) {
  for (const auto& k : kinds) {
    if (k == "kill" || k == "stop") {
      if (!processes)
        return make_error("--kinds " + k + ": external faults need daemons started by chaos (--processes N)");
    } else if (auto p = supervision::parse_fault_kind(k); !p) {
      return make_error("--kinds: " + p.message() + ", kill or stop");
    }
  }
  return {};
}

drawn_fault draw_fault(std::mt19937_64& rng, const std::vector<std::string>& kinds, int shards, int positions) {
  using K = supervision::fault_kind;
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  drawn_fault d;
  const std::string& kind = kinds[static_cast<size_t>(uni(0, static_cast<int>(kinds.size()) - 1))];
  if (kind == "kill" || kind == "stop") {
    d.external = true;
    d.ext.kind = kind;
    d.ext.index = uni(0, shards - 1);
    d.ext.at = uni(1, std::max(1, positions - 2));
    if (kind == "stop" && uni(0, 1)) d.ext.ms = uni(100, 2000);
    return d;
  }
  auto& f = d.plan;
  f.kind = supervision::parse_fault_kind(kind).value();
  f.node = static_cast<uint32_t>(uni(0, shards - 1));
  f.step = static_cast<uint64_t>(uni(0, std::max(0, positions - 2)));
  switch (f.kind) {
    case K::crash: break;
    case K::silence:
      if (uni(0, 1)) f.duration_ms = static_cast<uint64_t>(uni(100, 2000));
      break;
    case K::slow:
      f.duration_ms = static_cast<uint64_t>(uni(1, 10));
      f.count = static_cast<uint32_t>(uni(1, 20));
      break;
    case K::drop: f.count = static_cast<uint32_t>(uni(1, 2)); break;
    case K::delay:
      f.duration_ms = static_cast<uint64_t>(uni(1, 50));
      f.count = static_cast<uint32_t>(uni(1, 3));
      break;
    case K::corrupt: f.count = static_cast<uint32_t>(uni(1, 2)); break;
    case K::partition: f.duration_ms = static_cast<uint64_t>(uni(50, 1500)); break;
    default: break;
  }
  return d;
}

run_plan draw_run_plan(std::mt19937_64& rng, const std::vector<std::string>& kinds, int shards, int positions,
                       int faults) {
  run_plan p;
  int64_t last_step = -1, last_at = -1;  // of the previous injected / external fault of this run
  for (int k = 0; k < faults; ++k) {
    auto f = draw_fault(rng, kinds, shards, positions);
    if (k > 0 && std::uniform_int_distribution<int>(0, 3)(rng) == 0) {
      if (!f.external && last_step >= 0) f.plan.step = static_cast<uint64_t>(last_step);
      if (f.external && last_at >= 0) f.ext.at = static_cast<int>(last_at);
    }
    if (f.external) {
      last_at = f.ext.at;
      p.external.push_back(f.ext);
    } else {
      last_step = static_cast<int64_t>(f.plan.step);
      p.injected.push_back(f.plan);
    }
    p.texts.push_back(f.text());
  }
  return p;
}

}  // namespace cellshard::actors
