#include "actors/fault_ledger.hpp"

namespace cellshard::actors {

namespace {
// A repeated decision for one shard within this window of an unrecovered
// one is the same failure (seen by the coordinator, then the supervisor).
constexpr int64_t same_failure_ns = 10'000'000'000LL;
}  // namespace

bool fault_ledger::restarts_shard(const std::string& kind) {
  return kind == "crash" || kind == "silence" || kind == "partition";
}

void fault_ledger::fired(const std::string& kind, int index, int node, int64_t step, int64_t at_ns) {
  if (kind == "slow")
    for (const auto& r : records_)
      if (r.kind == "slow" && r.index == index && r.step == step) return;
  // The decision may have come first: complete that record.
  if (restarts_shard(kind))
    for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
      auto& r = *it;
      if (r.index == index && r.fired_ns == 0 && r.decided_ns >= at_ns) {
        r.kind = kind;
        r.step = step;
        r.node = node;
        r.fired_ns = at_ns;
        r.detect_ms = (r.decided_ns - at_ns) / 1e6;
        return;
      }
    }
  fault_record r;
  r.kind = kind;
  r.index = index;
  r.node = node;
  r.step = step;
  r.fired_ns = at_ns;
  records_.push_back(r);
}

void fault_ledger::decided(int index, int node, const std::string& observed_kind, int64_t at_ns) {
  // An injected fault that fired and waits for its decision.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    auto& r = *it;
    if (r.index == index && r.decided_ns == 0 && restarts_shard(r.kind)) {
      r.decided_ns = at_ns;
      if (r.fired_ns) r.detect_ms = (at_ns - r.fired_ns) / 1e6;
      return;
    }
  }
  // Decided already and not recovered yet: the same failure.
  for (auto it = records_.rbegin(); it != records_.rend(); ++it)
    if (it->index == index && it->decided_ns != 0 && it->recovered_ns == 0 && at_ns - it->decided_ns < same_failure_ns)
      return;
  // A failure the runtime only observed.
  fault_record r;
  r.kind = observed_kind;
  r.index = index;
  r.node = node;
  r.step = -1;
  r.decided_ns = at_ns;
  records_.push_back(r);
}

void fault_ledger::recovered(int index, int replayed, int64_t at_ns, int node_now) {
  for (auto it = records_.rbegin(); it != records_.rend(); ++it) {
    auto& r = *it;
    if (r.index == index && r.decided_ns != 0 && r.recover_ms < 0) {
      r.recover_ms = (at_ns - r.decided_ns) / 1e6;
      r.recovered_ns = at_ns;
      r.replayed_positions = replayed;
      r.moved_to_node = node_now;
      return;
    }
  }
}

}  // namespace cellshard::actors
