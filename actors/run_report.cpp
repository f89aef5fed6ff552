#include "actors/run_report.hpp"

#include "base/percentile.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>

namespace cellshard::actors {

double comm_share(double compute_ms, double duration_ms) {
  if (!(duration_ms > 0)) return 0;
  return std::min(1.0, std::max(0.0, 1.0 - compute_ms / duration_ms));
}

double comm_share(const session_outcome& out) { return comm_share(out.compute_ms, out.result.duration_ms); }

namespace {
// Tokens after the first that session `t` has at time x, linear between
// its tokens' times (0 before the first, size - 1 after the last).
double tokens_by(const std::vector<double>& t, double x) {
  if (x <= t.front()) return 0;
  if (x >= t.back()) return static_cast<double>(t.size() - 1);
  const size_t j = static_cast<size_t>(std::upper_bound(t.begin(), t.end(), x) - t.begin()) - 1;  // t[j] <= x < t[j+1]
  const double span = t[j + 1] - t[j];
  return static_cast<double>(j) + (span > 0 ? (x - t[j]) / span : 1.0);
}
}  // namespace

double decode_tokens_per_s(const std::vector<std::vector<double>>& token_s) {
  double a = -std::numeric_limits<double>::infinity(), b = std::numeric_limits<double>::infinity();
  double lo = b, hi = a, all = 0;
  int used = 0;
  for (const auto& t : token_s) {
    if (t.size() < 2) continue;
    ++used;
    a = std::max(a, t.front());
    b = std::min(b, t.back());
    lo = std::min(lo, t.front());
    hi = std::max(hi, t.back());
    all += static_cast<double>(t.size() - 1);
  }
  if (used == 0) return 0;
  if (b > a) {
    double n = 0;
    for (const auto& t : token_s)
      if (t.size() >= 2) n += tokens_by(t, b) - tokens_by(t, a);
    return n / (b - a);
  }
  return hi > lo ? all / (hi - lo) : 0;
}

double decode_comm_share(const std::vector<double>& decode_compute_ms,
                         const std::vector<std::vector<double>>& token_s) {
  double sum = 0;
  int used = 0;
  for (size_t i = 0; i < token_s.size() && i < decode_compute_ms.size(); ++i) {
    const auto& t = token_s[i];
    if (t.size() < 2) continue;
    sum += comm_share(decode_compute_ms[i], (t.back() - t.front()) * 1000.0);
    ++used;
  }
  return used ? sum / used : 0;
}

std::vector<node_figures> aggregate_nodes(const topologies::placement& plan, const std::vector<shard_stats>& stats,
                                         const std::vector<uint64_t>& node_memory) {
  auto memory_of = [&](int node) {
    return node >= 0 && static_cast<size_t>(node) < node_memory.size() ? node_memory[static_cast<size_t>(node)]
                                                                        : uint64_t{0};
  };
  std::map<int, node_figures> by_node;
  for (const auto& s : stats) {
    if (s.index < 0 || static_cast<size_t>(s.index) >= plan.shards.size()) continue;
    const auto& sh = plan.shards[static_cast<size_t>(s.index)];
    auto it = by_node.find(s.node);
    if (it == by_node.end()) {
      node_figures n;
      n.index = s.node;
      n.memory_bytes = memory_of(s.node);
      it = by_node.emplace(s.node, n).first;
    }
    node_figures& n = it->second;
    const std::string role =
        "stage " + std::to_string(sh.stage) +
        (sh.expert_node ? " expert node " + std::to_string(sh.rank - 1)
                        : (sh.group_size > 1 ? " rank " + std::to_string(sh.rank) : ""));
    n.role = n.role.empty() ? role : n.role + ", " + role;
    n.compute_ms += static_cast<double>(s.compute_ns) / 1e6;
    n.bytes_sent += s.bytes_sent;
    n.bytes_received += s.bytes_received;
  }
  for (const auto& sp : plan.spares)  // a spare that took over a shard is listed by that role above
    if (!by_node.count(sp.node)) {
      node_figures n;
      n.index = sp.node;
      n.role = "spare";
      n.memory_bytes = memory_of(sp.node);
      by_node.emplace(sp.node, n);
    }
  std::vector<node_figures> out;
  out.reserve(by_node.size());
  for (auto& kv : by_node) out.push_back(std::move(kv.second));
  return out;
}

std::vector<link_figures> link_reports(const std::vector<shard_stats>& stats,
                                      const std::vector<cluster::link_measurement>& measured, int tokens) {
  std::map<std::pair<int, int>, cluster::link_measurement> by_pair;
  for (const auto& m : measured) by_pair[{m.from, m.to}] = m;
  std::vector<link_figures> out;
  for (const auto& s : stats)
    for (size_t i = 0; i < s.link_to.size(); ++i) {
      link_figures l;
      l.from = s.node;
      l.to = s.link_to[i] < 0 ? -1 : s.link_to[i];
      const auto it = by_pair.find({s.node, s.link_to[i]});
      if (it != by_pair.end()) l.measured = it->second;
      l.bytes = i < s.link_bytes.size() ? s.link_bytes[i] : 0;
      l.bytes_per_token = static_cast<double>(l.bytes) / std::max(1, tokens);
      out.push_back(l);
    }
  return out;
}

std::string link_warning(const cluster::link_measurement& m) {
  const double bw_err = m.target_bps > 0 ? std::abs(m.measured_bps / m.target_bps - 1) : 0;
  const double lat_err = m.target_latency_us > 0 ? std::abs(m.measured_latency_us / m.target_latency_us - 1) : 0;
  if (!(bw_err > 0.1 || lat_err > 0.1)) return "";
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "link %d -> %d measured %.1f Mbit/s and %.0f us, target %.1f Mbit/s and %.0f us (off by more than 10%%)",
                m.from, m.to, m.measured_bps / 1e6, m.measured_latency_us, m.target_bps / 1e6, m.target_latency_us);
  return buf;
}

double run_report::tpot_p50() const { return percentile(result.step_ms, 0.5); }
double run_report::tpot_p99() const { return percentile(result.step_ms, 0.99); }

result<run_report> make_run_report(cluster& c, const session_outcome& out,
                                   const std::vector<cluster::link_measurement>& measured) {
  run_report r;
  r.ok = out.ok;
  r.error = out.error;
  r.result = out.result;
  r.faults = c.faults();
  r.suspicions = c.suspicions();
  r.skipped = c.skipped_nodes();
  if (!out.ok) return r;
  r.comm_share = comm_share(out);
  auto st = c.stats();
  if (!st) return st.err();
  r.nodes = aggregate_nodes(c.placement(), *st, c.node_memory());
  {
    // Issue #17: weights shipped to each node and cache hits; a recovered
    // shard's reload time is that of its last spawn on the node it moved to.
    const auto loads = c.weight_loads();
    for (auto& n : r.nodes)
      for (const auto& w : loads)
        if (w.node == n.index) {
          n.shipped_bytes += w.shipped_bytes;
          n.cache_hits += w.source == "cache" ? 1 : 0;
        }
    for (auto& f : r.faults)
      for (const auto& w : loads)
        if (w.index == f.index && (f.moved_to_node < 0 || w.node == f.moved_to_node)) f.reload_ms = w.reload_ms;
  }
  const auto& plan = c.placement();
  if (plan.strat.kind == topologies::strategy_kind::expert) {
    r.expert_load.assign(plan.stages.size(), std::vector<uint64_t>(static_cast<size_t>(plan.config.n_experts), 0));
    int64_t wait_ns = 0;
    for (const auto& s : *st) {
      if (s.index < 0 || static_cast<size_t>(s.index) >= plan.shards.size()) continue;
      const auto& sh = plan.shards[static_cast<size_t>(s.index)];
      if (sh.expert_node) {
        r.expert_pairs[s.index] += s.expert_pairs;
        continue;
      }
      auto& load = r.expert_load[static_cast<size_t>(sh.stage)];
      for (size_t e = 0; e < s.expert_load.size() && e < load.size(); ++e) load[e] += s.expert_load[e];
      wait_ns += s.moe_wait_ns;
      r.expert_redispatched += s.expert_redispatched;
    }
    if (out.result.duration_ms > 0) r.moe_wait_share = wait_ns / 1e6 / out.result.duration_ms;
  }
  r.links = link_reports(*st, measured, r.tokens());
  return r;
}

nlohmann::json to_json(const fault_record& f) {
  return {{"kind", f.kind},
          {"node", f.index},
          {"step", f.step},
          {"detect_ms", f.detect_ms},
          {"recover_ms", f.recover_ms},
          {"reload_ms", f.reload_ms},
          {"replayed_positions", f.replayed_positions},
          {"host_node", f.node},
          {"moved_to_node", f.moved_to_node},
          {"fired_ns", f.fired_ns},
          {"decided_ns", f.decided_ns},
          {"recovered_ns", f.recovered_ns}};
}

nlohmann::json to_json(const suspicion_info& s) {
  return {{"node", s.node}, {"at", s.at_ns}, {"cleared_after_ms", s.cleared_after_ms}, {"cleared_by", s.cleared_by}};
}

nlohmann::json to_json(const run_report& r) {
  nlohmann::json faults = nlohmann::json::array(), suspicions = nlohmann::json::array();
  for (const auto& f : r.faults) faults.push_back(to_json(f));
  for (const auto& s : r.suspicions) suspicions.push_back(to_json(s));
  nlohmann::json skipped = nlohmann::json::array();
  for (const auto& k : r.skipped) skipped.push_back({{"index", k.node}, {"node", k.who}, {"reason", k.why}});
  nlohmann::json j;
  j["ok"] = r.ok;
  if (!r.ok) {
    j["error"] = r.error;
    j["tokens"] = r.tokens();
    j["ids"] = r.result.ids;
    j["duration_ms"] = r.result.duration_ms;
    j["faults"] = faults;
    j["suspicions"] = suspicions;
    j["skipped_nodes"] = skipped;
    return j;
  }
  if (!r.model.empty()) j["model"] = r.model;
  if (!r.kernels.empty()) j["kernels"] = r.kernels;
  if (!r.weights.empty()) j["weights"] = r.weights;
  if (!r.matmul.empty()) j["matmul"] = r.matmul;
  j["ttft_ms"] = r.result.ttft_ms;
  j["tpot_ms_p50"] = r.tpot_p50();
  j["tpot_ms_p99"] = r.tpot_p99();
  j["tokens_per_s"] = r.result.tokens_per_s;
  j["comm_share"] = r.comm_share;
  j["tokens"] = r.tokens();
  j["duration_ms"] = r.result.duration_ms;
  nlohmann::json nodes = nlohmann::json::array(), links = nlohmann::json::array();
  for (const auto& n : r.nodes)
    nodes.push_back({{"index", n.index},
                     {"role", n.role},
                     {"memory_bytes", n.memory_bytes},
                     {"compute_ms", n.compute_ms},
                     {"bytes_sent", n.bytes_sent},
                     {"bytes_received", n.bytes_received},
                     {"shipped_bytes", n.shipped_bytes},
                     {"cache_hits", n.cache_hits}});
  for (const auto& l : r.links) {
    const bool have = l.measured.has_value();
    links.push_back({{"from", l.from},
                     {"to", l.to < 0 ? nlohmann::json("front end") : nlohmann::json(l.to)},
                     {"bandwidth_bps", have ? nlohmann::json(l.measured->measured_bps) : nlohmann::json(nullptr)},
                     {"latency_us", have ? nlohmann::json(l.measured->measured_latency_us) : nlohmann::json(nullptr)},
                     {"target_bandwidth_bps", have ? nlohmann::json(l.measured->target_bps) : nlohmann::json(nullptr)},
                     {"target_latency_us",
                      have ? nlohmann::json(l.measured->target_latency_us) : nlohmann::json(nullptr)},
                     {"bytes", l.bytes},
                     {"bytes_per_token", l.bytes_per_token}});
  }
  j["nodes"] = nodes;
  j["links"] = links;
  if (!r.expert_load.empty()) {
    nlohmann::json pairs = nlohmann::json::object();
    for (const auto& p : r.expert_pairs) pairs[std::to_string(p.first)] = p.second;
    j["experts"] = {{"load", r.expert_load},
                    {"pairs_by_node", pairs},
                    {"dispatch_combine_share", r.moe_wait_share},
                    {"redispatched", r.expert_redispatched}};
  }
  j["faults"] = faults;
  j["suspicions"] = suspicions;
  j["skipped_nodes"] = skipped;
  j["ids"] = r.result.ids;
  // When each generated token arrived, ms since the start (for timelines).
  nlohmann::json times = nlohmann::json::array();
  double t = r.result.ttft_ms;
  times.push_back(t);
  for (double d : r.result.step_ms) times.push_back(t += d);
  j["token_times_ms"] = times;
  if (r.diverged) j["diverged"] = *r.diverged;
  return j;
}

std::string summary_line(const run_report& r) {
  std::string mem;
  for (const auto& n : r.nodes)
    mem += (mem.empty() ? "" : ", ") + std::to_string(n.index) + ": " + std::to_string(n.memory_bytes / 1024) + " KiB";
  char head[256];
  std::snprintf(head, sizeof head, "ttft %.2f ms, tpot p50 %.3f ms p99 %.3f ms, %.1f tok/s%s, comm share %.2f; ",
                r.result.ttft_ms, r.tpot_p50(), r.tpot_p99(), r.result.tokens_per_s,
                r.batch_aggregate ? " (aggregate of the batch)" : "", r.comm_share);
  return std::string(head) + "memory per node {" + mem + "}; " + std::to_string(r.faults.size()) + " fault(s)";
}

}  // namespace cellshard::actors
