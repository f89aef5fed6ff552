#include "actors/chaos_run.hpp"

#include <algorithm>
#include <set>

namespace cellshard::actors {

std::vector<thaw_at> fire_due(std::vector<fired_external>& ext, int delivered, const std::vector<int>& nodes,
                              const external_sender& send) {
  std::vector<thaw_at> thaws;
  for (auto& e : ext) {
    if (e.f.at != delivered || e.fired_ns != 0) continue;
    if (e.f.index < 0 || e.f.index >= static_cast<int>(nodes.size())) {
      e.note = "no placement index " + std::to_string(e.f.index);
      continue;
    }
    e.daemon = nodes[static_cast<size_t>(e.f.index)];
    auto r = send(e.daemon, e.f.kind == "kill");
    if (!r) {
      e.note = r.message();
      continue;
    }
    e.fired_ns = *r;
    if (e.f.kind == "stop" && e.f.ms > 0) thaws.push_back({e.daemon, e.fired_ns + int64_t(e.f.ms) * 1000000});
  }
  return thaws;
}

std::vector<int> match_external_records(const std::vector<fired_external>& ext,
                                        const std::vector<fault_record>& records) {
  std::vector<int> out(ext.size(), -1);
  std::set<size_t> used;
  for (size_t i = 0; i < ext.size(); ++i) {
    const auto& e = ext[i];
    if (e.fired_ns == 0) continue;
    for (size_t k = 0; k < records.size(); ++k) {
      const auto& f = records[k];
      if (used.count(k) || f.node != e.daemon || f.decided_ns < e.fired_ns || f.fired_ns != 0) continue;
      used.insert(k);
      out[i] = static_cast<int>(k);
      break;
    }
  }
  return out;
}

double external_detect_ms(const fired_external& e, const fault_record& record) {
  return static_cast<double>(record.decided_ns - e.fired_ns) / 1e6;
}

double external_recover_ms(const fault_record& record) {
  return record.recovered_ns > 0 ? static_cast<double>(record.recovered_ns - record.decided_ns) / 1e6
                                 : record.recover_ms;
}

nlohmann::json external_json(const fired_external& e, const fault_record* record) {
  nlohmann::json j = {{"kind", e.f.kind},  {"node", e.f.index},     {"step", e.f.at},
                      {"daemon", e.daemon}, {"detect_ms", -1},      {"recover_ms", -1},
                      {"replayed_positions", 0}};
  if (e.fired_ns == 0) {
    j["note"] = e.note.empty() ? "not sent: the run ended first" : e.note;
    return j;
  }
  if (!record) return j;
  j["record"] = record->kind;
  j["detect_ms"] = external_detect_ms(e, *record);
  j["recover_ms"] = external_recover_ms(*record);
  j["replayed_positions"] = record->replayed_positions;
  j["moved_to_node"] = record->moved_to_node;
  return j;
}

size_t first_difference(const std::vector<int>& want, const std::vector<int>& got) {
  size_t d = 0;
  while (d < want.size() && d < got.size() && want[d] == got[d]) ++d;
  return d;
}

std::vector<int> daemons_to_replace(int n_daemons, const std::function<bool(int)>& alive,
                                    const std::vector<fired_external>& ext, bool teardown_all) {
  std::vector<int> out;
  for (int i = 0; i < n_daemons; ++i) {
    bool replace = teardown_all || !alive(i);
    for (const auto& e : ext)
      if (e.daemon == i && e.fired_ns != 0) replace = true;
    if (replace) out.push_back(i);
  }
  return out;
}

}  // namespace cellshard::actors
