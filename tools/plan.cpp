// `cellshard plan`: the inference bottleneck checklist (topologies/planner.hpp),
// its calibration on a measured sweep (plan_calibrate.hpp), the at-scale
// simulation (plan_sim.hpp) and the generated report of issue #10
// (--report, e.g. docs/kimi-k3-on-100k-ps3.md). CLI.md is the contract.
#include "topologies/plan_calibrate.hpp"
#include "topologies/plan_sim.hpp"
#include "topologies/planner.hpp"
#include "tools/commands.hpp"
#include "tools/common.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <thread>
#include <vector>

namespace cellshard::tools {

namespace {

using namespace cellshard::topologies;

struct plan_opts {
  std::string model, hardware = "ps3", topology, calibrate, json, report, baseline = "h200-8x";
  std::string memory, link, weights = "native", wire;
  std::string calibrate_hardware = "host";
  std::string holdout;  // --holdout RULE (with --calibrate)
  std::string calibrate_model;  // --calibrate-model: the rows' model when it is not a preset
  int nodes = 0, batch = 1, context = 4096, calibrate_context = 64;
  int expert_replicas = 1;  // --expert-replicas (with pipeline[:P],expert:E)
  // Assumption overrides (< 0: keep the default).
  double electricity = -1, amortisation = -1, price = -1, failures = -1, detect_ms = -1, recover_ms = -1;
  double efficiency = -1, link_efficiency = -1;
  int request_tokens = -1, checkpoint_every = -1;
  bool no_reload = false, sample_last = false, peer_forwarding = false;
  std::string reduce = "direct";  // --reduce: the runtime's all-reduce (direct | scatter)
  // Simulation.
  bool simulate = false;
  double sim_hours = 1, sim_rate = 0, sim_failure_scale = 1;
  uint64_t seed = 1;
};

bool is_file(const std::string& s) {
  std::ifstream f(s);
  return f.good() && s.find(".json") != std::string::npos;
}

// Single-thread read bandwidth of this machine: the best of 5 passes summing
// 128 MiB as 64-bit integers (integer sums vectorise without reordering
// concerns; a "host" preset is measured on the spot, issue #10).
double measure_host_gbs() {
  const size_t n = (128u << 20) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n);
  for (size_t i = 0; i < n; ++i) buf[i] = i * 2654435761u;
  double best = 0;
  volatile uint64_t sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    uint64_t acc = 0;
    for (size_t i = 0; i < n; ++i) acc += buf[i];
    sink = sink + acc;
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  return best;
}

hardware_spec load_hardware(const std::string& what, bool measure_host) {
  result<hardware_spec> h = is_file(what) ? hardware_from_json(read_text(what), what) : find_hardware_preset(what);
  if (!h) throw cli_error("--hardware: " + h.message(), 2);
  if (h->node.name == "host" && measure_host) {
    if (h->node.mem_bandwidth_gbs <= 0) h->node.mem_bandwidth_gbs = measure_host_gbs();
    if (h->parallel_nodes <= 0) h->parallel_nodes = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    h->source += "; measured " + std::to_string(h->node.mem_bandwidth_gbs) + " GB/s single-thread read";
  }
  return *h;
}

/// A file given as --model: Hugging Face config.json text (it starts with
/// '{'), else a model file the runtime runs (GGUF, llama2.c, CSQ8), whose
/// shape and tensor types the plan then uses.
result<model_spec> spec_from_path(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char head[256] = {};
  in.read(head, sizeof head);
  const std::string start(head, static_cast<size_t>(std::max<std::streamsize>(0, in.gcount())));
  const size_t first = start.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && start[first] == '{') return spec_from_hf_json(read_text(path), path);
  return spec_from_model_file(path);
}

model_spec load_model(const plan_opts& o) {
  // A preset's name wins over a file of that name in the working folder.
  result<model_spec> m = find_model_preset(o.model);
  if (is_file(o.model) || (!m && std::ifstream(o.model).good())) m = spec_from_path(o.model);
  if (!m) throw cli_error("--model: " + m.message(), 2);
  auto w = with_weight_format(*m, o.weights);
  if (!w) throw cli_error(w.message(), 2);
  model_spec spec = *w;
  if (!o.wire.empty()) {
    if (o.wire == "f32") spec.act_bytes = 4;
    else if (o.wire == "bf16" || o.wire == "f16") spec.act_bytes = 2;
    else if (o.wire == "fp8") spec.act_bytes = 1;
    else throw cli_error("--wire '" + o.wire + "': expected f32, bf16 or fp8", 2);
  }
  return spec;
}

plan_request build_request(const plan_opts& o) {
  plan_request r;
  r.model = load_model(o);
  r.hw = load_hardware(o.hardware, true);
  if (!o.memory.empty()) {
    auto m = parse_memory(o.memory);
    if (!m) throw cli_error(m.message(), 2);
    r.hw.node.memory_bytes = *m;
  }
  if (!o.link.empty()) {
    auto l = parse_link(o.link);
    if (!l) throw cli_error(l.message(), 2);
    r.hw.node.link = *l;
  }
  if (o.price >= 0) r.hw.price_usd = o.price;
  if (o.failures >= 0) r.hw.failures_per_year = o.failures;
  r.nodes = o.nodes;
  const std::string topo = o.topology.empty() ? (r.model.is_moe() ? "expert" : "pipeline") : o.topology;
  auto t = parse_plan_topology(topo);
  if (!t) throw cli_error(t.message(), 2);
  r.topology = *t;
  r.topology.expert_replicas = o.expert_replicas;
  r.batch = o.batch;
  r.context = o.context;
  plan_assumptions& a = r.assume;
  if (o.electricity >= 0) a.electricity_usd_per_kwh = o.electricity;
  if (o.amortisation >= 0) a.amortisation_years = o.amortisation;
  if (o.detect_ms >= 0) a.detect_s = o.detect_ms / 1000;
  if (o.recover_ms >= 0) a.recover_s = o.recover_ms / 1000;
  if (o.efficiency > 0) a.compute_efficiency = o.efficiency;
  if (o.link_efficiency > 0) a.link_efficiency = o.link_efficiency;
  if (o.request_tokens > 0) a.request_tokens = o.request_tokens;
  if (o.checkpoint_every > 0) a.checkpoint_every = o.checkpoint_every;
  a.reload_over_link = !o.no_reload;
  a.logits_to_session = !o.sample_last;
  a.peer_forwarding = o.peer_forwarding;
  a.scatter_gather = o.reduce == "scatter";
  return r;
}

std::string f(const char* fmt, double v) {
  char buf[96];
  std::snprintf(buf, sizeof buf, fmt, v);
  return buf;
}

std::string money(double v) {
  if (!std::isfinite(v)) return "-";
  if (v >= 1e6) return "$" + f("%.3g", v / 1e6) + "M";
  if (v >= 1e3) return "$" + f("%.3g", v / 1e3) + "k";
  if (v >= 1) return "$" + f("%.3g", v);
  return "$" + f("%.2g", v);
}

std::string rate(double v) {
  if (!std::isfinite(v)) return "unbounded";
  return v >= 100 ? f("%.0f", v) : v >= 1 ? f("%.2f", v) : f("%.3g", v);
}

nlohmann::json sim_json(const sim_result& s, double wall_s) {
  return {{"nodes", s.nodes},
          {"used_nodes", s.used_nodes},
          {"stations", s.stations},
          {"simulated_s", s.simulated_s},
          {"wall_s", wall_s},
          {"events", s.events},
          {"stopped_early", s.stopped_early},
          {"tokens", s.tokens},
          {"requests_done", s.requests_done},
          {"tokens_per_s", s.tokens_per_s},
          {"goodput_tokens_per_s", s.tokens_per_s},
          {"token_latency_p50_s", s.token_latency_p50_s},
          {"token_latency_p90_s", s.token_latency_p90_s},
          {"token_latency_p99_s", s.token_latency_p99_s},
          {"token_latency_max_s", s.token_latency_max_s},
          {"request_latency_p50_s", s.request_latency_p50_s},
          {"request_latency_p99_s", s.request_latency_p99_s},
          {"failures", s.failures},
          {"downtime_s", s.downtime_s},
          {"request_failure_fraction", s.request_failure_fraction},
          {"spares_left", s.spares_left}};
}

std::string command_line(const plan_opts& o) {
  std::string c = "cellshard plan --model " + o.model + " --hardware " + o.hardware + " --nodes " +
                  std::to_string(o.nodes);
  if (!o.topology.empty()) c += " --topology " + o.topology;
  if (o.expert_replicas != 1) c += " --expert-replicas " + std::to_string(o.expert_replicas);
  if (o.batch != 1) c += " --batch " + std::to_string(o.batch);
  if (o.context != 4096) c += " --context " + std::to_string(o.context);
  if (!o.memory.empty()) c += " --memory " + o.memory;
  if (!o.link.empty()) c += " --link " + o.link;
  if (o.weights != "native") c += " --weights " + o.weights;
  if (!o.wire.empty()) c += " --wire " + o.wire;
  if (!o.calibrate.empty()) c += " --calibrate " + o.calibrate;
  if (!o.calibrate.empty() && !o.calibrate_model.empty()) c += " --calibrate-model " + o.calibrate_model;
  if (!o.calibrate.empty() && o.calibrate_hardware != "host") c += " --calibrate-hardware " + o.calibrate_hardware;
  if (!o.calibrate.empty() && o.calibrate_context != 64) c += " --calibrate-context " + std::to_string(o.calibrate_context);
  if (!o.holdout.empty()) c += " --holdout " + o.holdout;
  if (o.simulate) c += " --simulate" + (o.sim_hours != 1 ? " --sim-hours " + f("%g", o.sim_hours) : std::string());
  if (!o.report.empty()) c += " --report " + o.report;
  return c;
}

// One row of a table: the plan of `r`, or why there is none.
struct row_result {
  bool ok = false;
  plan_result p;
  std::string why;
};
row_result try_plan(const plan_request& r) {
  row_result out;
  auto p = plan(r);
  if (!p) {
    out.why = p.message();
    return out;
  }
  out.ok = true;
  out.p = *p;
  return out;
}

/// The fitted constants into the plan's assumptions: an efficiency above 1
/// (the sweep's model sat in cache) becomes 1; `--efficiency` overrides.
/// (The lab's CPU quota is a property of the sweep's hardware, not of the
/// planned node.)
void apply_fit(plan_assumptions& a, const plan_assumptions& fit, double efficiency_override) {
  a.compute_efficiency = efficiency_override > 0 ? efficiency_override : std::min(1.0, fit.compute_efficiency);
  a.message_overhead_s = fit.message_overhead_s;
  a.expert_message_overhead_s = fit.expert_message_overhead_s;
  a.sync_overhead_s = fit.sync_overhead_s;
  a.sync_message_overhead_s = fit.sync_message_overhead_s;
  a.byte_overhead_s = fit.byte_overhead_s;
  a.transfer_excess = fit.transfer_excess;
  a.message_cpu_s = fit.message_cpu_s;
  a.sync_message_cpu_s = fit.sync_message_cpu_s;
  a.sync_cpu_s = fit.sync_cpu_s;
  a.batch_compute_efficiency = efficiency_override > 0 ? efficiency_override
                               : fit.batch_compute_efficiency > 0 ? std::min(1.0, fit.batch_compute_efficiency)
                                                                  : 0;
}

nlohmann::json constants_json(const plan_assumptions& a) {
  return {{"compute_efficiency", a.compute_efficiency},
          {"message_overhead_s", a.message_overhead_s},
          {"expert_message_overhead_s", a.expert_message_overhead_s},
          {"sync_overhead_s", a.sync_overhead_s},
          {"sync_message_overhead_s", a.sync_message_overhead_s},
          {"byte_overhead_s", a.byte_overhead_s},
          {"transfer_excess", a.transfer_excess},
          {"message_cpu_s", a.message_cpu_s},
          {"sync_message_cpu_s", a.sync_message_cpu_s},
          {"batch_compute_efficiency", a.batch_compute_efficiency},
          {"sync_cpu_s", a.sync_cpu_s}};
}

/// "efficiency 0.53, 120 us per hop message, ...".
std::string constants_text(const plan_assumptions& a) {
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "efficiency %.3g, %.3g us per hop message, %.3g us per expert dispatch/combine message, "
                "%.3g us per all-reduce round, "
                "%.3g us per all-reduce message, %.3g ns per byte, transfers +%.0f%%, %.3g us CPU per message, "
                "%.3g us CPU per all-reduce message, %.3g us CPU per all-reduce round, batch efficiency %.3g",
                a.compute_efficiency, a.message_overhead_s * 1e6, a.expert_message_overhead_s * 1e6,
                a.sync_overhead_s * 1e6,
                a.sync_message_overhead_s * 1e6, a.byte_overhead_s * 1e9, a.transfer_excess * 100,
                a.message_cpu_s * 1e6, a.sync_message_cpu_s * 1e6, a.sync_cpu_s * 1e6,
                a.batch_compute_efficiency > 0 ? a.batch_compute_efficiency : a.compute_efficiency);
  return buf;
}

/// The report's table of calibration points: TPOT is the decode's mean
/// (plan_calibrate.hpp measured_tpot_ms), the first session's p50 beside it.
const char* const point_table_header =
    "| line | model | topology | nodes | link | batch | measured TPOT ms (decode mean) | predicted ms | error | "
    "TPOT p50 ms / error | tokens/s measured / predicted | error | comm share measured / predicted |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";

double max_p50_error(const std::vector<calibration_point>& pts) {
  double m = 0;
  for (const auto& pt : pts) m = std::max(m, std::fabs(pt.p50_error));
  return m;
}

std::string point_table_row(const calibration_point& pt) {
  return "| " + std::to_string(pt.line) + " | " + pt.model + " | " + pt.topology + " | " + std::to_string(pt.nodes) +
         " | " + pt.link + " | " + std::to_string(pt.batch) + " | " + f("%.4g", pt.measured_tpot_ms) + " | " +
         f("%.4g", pt.predicted_tpot_ms) + " | " + f("%+.1f%%", pt.error * 100) + " | " +
         f("%.4g", pt.measured_tpot_p50_ms) + " / " + f("%+.1f%%", pt.p50_error * 100) + " | " +
         f("%.4g", pt.measured_tokens_per_s) + " / " + f("%.4g", pt.predicted_tokens_per_s) + " | " +
         f("%+.1f%%", pt.tokens_per_s_error * 100) + " | " + f("%.2f", pt.measured_comm_share) + " / " +
         f("%.2f", pt.predicted_comm_share) + " |\n";
}

/// The headline numbers re-planned with each leave-one-out refit of the
/// calibration (plan_calibrate.hpp leave_one_out): their lowest and highest.
struct plan_band {
  int fits = 0;  // refits the plan was made with
  double latency_lo = 0, latency_hi = 0;  // s between a sequence's tokens
  double tokens_lo = 0, tokens_hi = 0;    // tokens/s
  double cost_lo = 0, cost_hi = 0;        // USD per million tokens
  double chain_lo = 0, chain_hi = 0;      // s per token for one sequence
  double goodput_lo = 0, goodput_hi = 0;  // tokens/s after failures
  double energy_lo = 0, energy_hi = 0;    // J per token
};

std::string report_text(const plan_opts& o, const plan_result& p, const plan_result* base,
                        const calibration* cal, const validation* val, const plan_band* band, const sim_result* sim, double sim_wall, const sim_result* stress,
                        double stress_wall) {
  const plan_request& r = p.request;
  std::ostringstream md;
  const double mw = p.power_w / 1e6;
  md << "# " << r.model.name << " on " << r.nodes << " x " << r.hw.node.name << "\n\n"
     << "Generated by one command (rerun it to regenerate this page; the numbers below are the tool's):\n\n"
     << "    " << command_line(o) << "\n\n"
     << "The planner and its formulas: [planner.md](planner.md). Facts and their sources: "
     << "../shared/docs/HARDWARE.md. Topology " << to_string(p.layout.topology) << ", batch " << r.batch
     << ", context " << r.context << ".\n\n";

  md << "## The answer\n\n| question | answer |\n|---|---|\n";
  md << "| does it fit? | " << (p.memory_fit ? "yes" : "**no**") << ": busiest node "
     << f("%.1f", p.memory_per_node_bytes / 1048576.0) << " MiB of " << f("%.0f", p.memory_budget_bytes / 1048576.0)
     << " MiB (" << p.memory_busiest << "); weights " << f("%.3g", p.model_bytes / 1e12) << " TB in "
     << f("%.3g", p.cluster_memory_bytes / 1e12) << " TB of cluster memory |\n";
  md << "| bandwidth bound | " << rate(p.bandwidth_bound_tokens_per_s)
     << " tokens/s per node (busiest node reads " << f("%.3g", p.read_bytes_per_token / 1e6)
     << " MB per token); one sequence through the whole chain: " << rate(p.bandwidth_bound_sequence_tokens_per_s)
     << " tokens/s |\n";
  md << "| time per token | " << human_seconds(p.chain_s) << " for one sequence (" << p.hops << " hops: "
     << human_seconds(p.chain_latency_s) << " latency + " << human_seconds(p.chain_transfer_s) << " transfer + "
     << human_seconds(p.chain_compute_s) << " compute + " << human_seconds(p.chain_overhead_s) << " overhead)"
     << (band ? "; band " + human_seconds(band->chain_lo) + " - " + human_seconds(band->chain_hi) : std::string())
     << " |\n";
  md << "| throughput | " << rate(p.tokens_per_s) << " tokens/s at batch " << r.batch << " ("
     << human_seconds(p.per_token_latency_s) << " between a sequence's tokens), limited by the "
     << p.throughput_limit
     << (band ? "; band " + rate(band->tokens_lo) + " - " + rate(band->tokens_hi) + " tokens/s" : std::string())
     << " |\n";
  md << "| links | busiest link carries " << f("%.3g", p.link_bytes_per_token / 1e6) << " MB per token ("
     << p.link_busiest << "): at most " << rate(p.link_bound_tokens_per_s) << " tokens/s |\n";
  md << "| failures | " << f("%.3g", p.failures_per_hour) << " per hour over " << p.layout.used_nodes
     << " used nodes; a request of " << r.assume.request_tokens << " tokens (" << human_seconds(p.request_seconds)
     << ") meets one with p = " << f("%.3g", p.request_failure_probability) << "; goodput "
     << rate(p.goodput_tokens_per_s) << " tokens/s"
     << (band ? " (band " + rate(band->goodput_lo) + " - " + rate(band->goodput_hi) + ")" : std::string()) << " |\n";
  md << "| power | " << f("%.3g", mw) << " MW (" << r.nodes << " x " << f("%.0f", r.hw.node.power_w) << " W) |\n";
  md << "| energy per token | " << human_si(p.energy_per_token_j, "J")
     << (band ? "; band " + human_si(band->energy_lo, "J") + " - " + human_si(band->energy_hi, "J") : std::string())
     << " |\n";
  md << "| cost | " << money(p.cost_per_million_tokens_usd) << " per million tokens ("
     << money(p.cost_per_million_tokens_usd / 1e6) << " per token; " << money(p.usd_per_hour)
     << "/h: electricity at $" << f("%.3g", r.assume.electricity_usd_per_kwh) << "/kWh + "
     << money(p.hardware_usd) << " of hardware over " << f("%g", r.assume.amortisation_years) << " years)"
     << (band ? "; band " + money(band->cost_lo) + " - " + money(band->cost_hi) : std::string()) << " |\n";
  if (band) {
    md << "| uncertainty | with each of the " << band->fits
       << " leave-one-out refits of the calibration: " << human_seconds(band->latency_lo) << " - "
       << human_seconds(band->latency_hi) << " between a sequence's tokens, " << rate(band->tokens_lo) << " - "
       << rate(band->tokens_hi) << " tokens/s, " << money(band->cost_lo) << " - " << money(band->cost_hi)
       << " per million tokens (memory, links and power use no fitted constant) |\n";
  }
  if (base) {
    md << "| the same on " << base->request.nodes << " x " << base->request.hw.node.name << " | "
       << (base->memory_fit ? "fits" : "does not fit") << "; " << human_seconds(base->chain_s) << " per token, "
       << rate(base->tokens_per_s) << " tokens/s at batch " << base->request.batch << ", "
       << f("%.3g", base->power_w / 1e3) << " kW, " << money(base->cost_per_million_tokens_usd)
       << " per million tokens: the PS3s cost " << f("%.3g", p.cost_per_million_tokens_usd / base->cost_per_million_tokens_usd)
       << " x as much per token and draw " << f("%.0f", p.power_w / base->power_w) << " x the power |\n";
  }
  md << "\n## The six checks\n\n```\n" << to_text(p, base) << "```\n\n";

  // The curve against node count.
  md << "## Latency and cost against node count\n\n"
     << "Same model, node type, topology, batch and context; the layout is re-planned at every size.\n\n"
     << "| nodes | fits | memory/node MiB | time per token (1 seq) | tokens/s at batch " << r.batch
     << " | power | $ per million tokens |\n|---|---|---|---|---|---|---|\n";
  std::vector<int> sizes{8, 64, 512, 2048, 4096, 6000, 8192, 12000, 16384, 32768, 65536, 100000};
  if (std::find(sizes.begin(), sizes.end(), r.nodes) == sizes.end()) sizes.push_back(r.nodes);
  std::sort(sizes.begin(), sizes.end());
  for (int n : sizes) {
    plan_request q = r;
    q.nodes = n;
    const row_result x = try_plan(q);
    if (!x.ok) {
      md << "| " << n << " | no | - | - | - | - | - (" << x.why << ") |\n";
      continue;
    }
    md << "| " << n << " | " << (x.p.memory_fit ? "yes" : "no") << " | "
       << f("%.0f", x.p.memory_per_node_bytes / 1048576.0) << " | " << human_seconds(x.p.chain_s) << " | "
       << rate(x.p.tokens_per_s) << " | " << human_si(x.p.power_w, "W") << " | "
       << (x.p.memory_fit ? money(x.p.cost_per_million_tokens_usd) : "-") << " |\n";
  }
  md << "\nBelow the size where the weights fit, no layout holds the model (the rows say by how much the busiest "
        "node overflows). Above it, more nodes do not make one sequence faster: the chain is as long as the "
        "model is deep; extra nodes become spares.\n\n";

  // Batch.
  md << "## Batching at " << r.nodes << " nodes\n\n| batch | fits | time between a sequence's tokens | tokens/s | "
        "limited by | $ per million tokens |\n|---|---|---|---|---|---|\n";
  for (int b : {1, 16, 64, 128, 256, 512}) {
    plan_request q = r;
    q.batch = b;
    const row_result x = try_plan(q);
    if (!x.ok) {
      md << "| " << b << " | - | - | - | " << x.why << " | - |\n";
      continue;
    }
    md << "| " << b << " | " << (x.p.memory_fit ? "yes" : "no") << " | " << human_seconds(x.p.per_token_latency_s)
       << " | " << rate(x.p.tokens_per_s) << " | " << x.p.throughput_limit << " | "
       << (x.p.memory_fit ? money(x.p.cost_per_million_tokens_usd) : "-") << " |\n";
  }
  md << "\nKV cache and KDA state grow with the batch, so larger batches need wider TP groups; a station "
        "processes its micro-batch with one read of its weights.\n\n";

  // Issue #25: the public "ps3-cluster" design (ANCHORS.md: Kimi K3 on
  // ~82,500 PS3s, one expert per console, ~1,572 active per token, subclusters
  // of 22 with replicas) beside this plan's layout, with the same constants.
  if (r.model.name == "kimi-k3" && p.layout.topology.kind == plan_kind::expert) {
    const model_spec& m = r.model;
    auto column = [&](int nodes) {
      plan_request q = r;
      q.nodes = nodes;
      q.batch = 1;
      return try_plan(q);
    };
    const row_result ours = column(r.nodes), theirs = column(82500);
    // Consoles a token visits: every dense station and pool (all on the
    // chain) plus, per MoE layer, the expert consoles its k experts are on
    // (expected under uniform routing; epn experts of a layer per console).
    auto active = [&](const plan_layout& l) {
      const double epn = std::max(1, l.experts_per_node), per_layer = m.n_experts / epn;
      const double hit = per_layer * (1 - std::pow(1 - 1 / per_layer, m.n_active_experts));
      return static_cast<double>(l.used_nodes - l.expert_nodes) + m.moe_layers() * hit;
    };
    md << "## Beside the public \"ps3-cluster\" design\n\n"
       << "ANCHORS.md cites a design that puts Kimi K3 on about 82,500 PS3s, one routed expert per console, about "
          "1,572 consoles active per token, subclusters of 22 with replicas. The same preset and constants as above, "
          "at batch 1:\n\n"
       << "| | ps3-cluster design | this plan, " << r.nodes << " nodes | this plan, 82500 nodes |\n|---|---|---|---|\n";
    auto cell = [&](const row_result& x, const std::function<std::string(const plan_result&)>& g) {
      return x.ok ? g(x.p) : "- (" + x.why + ")";
    };
    auto row = [&](const std::string& name, const std::string& design,
                   const std::function<std::string(const plan_result&)>& g) {
      md << "| " << name << " | " << design << " | " << cell(ours, g) << " | " << cell(theirs, g) << " |\n";
    };
    row("routed experts per console", "1", [](const plan_result& x) {
      return std::to_string(x.layout.experts_per_node) + " (" + std::to_string(x.layout.expert_nodes) +
             " expert consoles, " + std::to_string(x.layout.expert_copies) + " copy)";
    });
    row("consoles for everything else", "~68 (82,500 minus the experts)", [](const plan_result& x) {
      return std::to_string(x.layout.used_nodes - x.layout.expert_nodes) + " (" +
             std::to_string(x.layout.groups.size()) + " stations: layer groups and vocabulary pools)";
    });
    row("consoles used / spare", "~82,500 / not stated", [](const plan_result& x) {
      return std::to_string(x.layout.used_nodes) + " / " + std::to_string(x.layout.spare_nodes);
    });
    row("consoles active per token", "~1,572",
        [&](const plan_result& x) { return f("%.0f", active(x.layout)) + " (expected, uniform routing)"; });
    row("fits in 256 MiB per console", "assumed", [](const plan_result& x) {
      return std::string(x.memory_fit ? "yes" : "no") + " (busiest " + f("%.1f", x.memory_per_node_bytes / 1048576.0) +
             " MiB)";
    });
    row("time per token, one sequence", "not stated", [](const plan_result& x) { return human_seconds(x.chain_s); });
    row("power, all consoles on", "not stated", [](const plan_result& x) { return f("%.3g", x.power_w / 1e6) + " MW"; });
    md << "\nWhat each assumes: the design counts routed experts (" << m.moe_layers() << " MoE layers x "
       << m.n_experts << ") and gives the rest of the model the remaining consoles; this plan lays out the "
          "attention, shared experts, router, embedding and classifier too, each station within a console's "
          "memory, which takes the consoles in the second row. Subclusters with replicas, the design's unit of "
          "fault tolerance, are not modelled (the planner counts spares; the sensitivity table below has a row with "
          "every expert copied).\n\n";
  }

  if (base) {
    md << "## The same model on GPU servers\n\n```\n" << to_text(*base) << "```\n\n";
  }

  if (sim) {
    md << "## At scale: the discrete-event simulation\n\n"
       << "`--simulate`: " << sim->nodes << " nodes (" << sim->used_nodes << " used), " << sim->stations
       << " stations, " << f("%.3g", sim->simulated_s / 3600) << " simulated hours, " << sim->events << " events, "
       << f("%.2f", sim_wall) << " s of wall time on this machine"
       << (sim->stopped_early ? " (stopped at the event bound)" : "") << ".\n\n"
       << "| measure | simulated | closed form |\n|---|---|---|\n"
       << "| tokens/s (goodput) | " << rate(sim->tokens_per_s) << " | " << rate(p.goodput_tokens_per_s) << " |\n"
       << "| time between tokens p50 / p90 / p99 / max | " << human_seconds(sim->token_latency_p50_s) << " / "
       << human_seconds(sim->token_latency_p90_s) << " / " << human_seconds(sim->token_latency_p99_s) << " / "
       << human_seconds(sim->token_latency_max_s) << " | " << human_seconds(p.per_token_latency_s) << " |\n"
       << "| request latency p50 / p99 | " << human_seconds(sim->request_latency_p50_s) << " / "
       << human_seconds(sim->request_latency_p99_s) << " | " << human_seconds(p.request_seconds) << " |\n"
       << "| failures | " << sim->failures << " | " << f("%.3g", p.failures_per_hour * sim->simulated_s / 3600)
       << " expected |\n"
       << "| requests that met a failure | " << f("%.3g", sim->request_failure_fraction) << " of "
       << sim->requests_done << " | p = " << f("%.3g", p.request_failure_probability) << " |\n\n";
  }
  if (stress) {
    // The closed form at 100x the failure rate, for comparison.
    plan_request q = r;
    q.hw.failures_per_year *= 100;
    const row_result x = try_plan(q);
    md << "The same simulation with every node failing 100 times as often (" << f("%.3g", r.hw.failures_per_year * 100)
       << " per node-year; " << f("%.3g", stress->simulated_s / 3600) << " simulated hours, " << stress->events
       << " events, " << f("%.2f", stress_wall) << " s):\n\n"
       << "| measure | simulated | closed form |\n|---|---|---|\n"
       << "| failures | " << stress->failures << " | "
       << (x.ok ? f("%.3g", x.p.failures_per_hour * stress->simulated_s / 3600) : std::string("-")) << " expected |\n"
       << "| tokens/s (goodput) | " << rate(stress->tokens_per_s) << " | "
       << (x.ok ? rate(x.p.goodput_tokens_per_s) : std::string("-")) << " |\n"
       << "| time between tokens p50 / p99 / max | " << human_seconds(stress->token_latency_p50_s) << " / "
       << human_seconds(stress->token_latency_p99_s) << " / " << human_seconds(stress->token_latency_max_s) << " | "
       << (x.ok ? human_seconds(x.p.per_token_latency_s) : std::string("-")) << " |\n"
       << "| requests that met a failure | " << f("%.3g", stress->request_failure_fraction) << " of "
       << stress->requests_done << " | p = " << (x.ok ? f("%.3g", x.p.request_failure_probability) : std::string("-"))
       << " |\n\n";
  }

  if (cal) {
    // The sweep's own description (its '#' lines): where, when and how the
    // rows were measured, so the report names the runs it was fitted on.
    {
      std::istringstream in(read_text(o.calibrate));
      std::string line, notes;
      while (std::getline(in, line))
        if (!line.empty() && line[0] == '#') notes += "    " + line + "\n";
      if (!notes.empty()) md << "## The measured runs\n\nThe calibration sweep describes itself:\n\n" << notes << "\n";
    }
    md << "## Calibration\n\n`--calibrate " << o.calibrate << "` fitted " << cal->free.size()
       << " constants (" << constants_text(cal->fitted) << ") to " << cal->points.size()
       << " measured points; the plan above uses them"
       << (cal->fitted.compute_efficiency > 1 ? " (efficiency capped at 1: above 1 means the sweep's model ran "
                                                "from cache, which a model that streams from memory cannot)"
                                              : "")
       << ".\n\n"
       << "| constant | value | source rows (CSV lines) | of which chain / busy station |\n|---|---|---|---|\n";
    for (const auto& k : cal->constants) {
      std::string lines;
      for (int ln : k.lines) lines += (lines.empty() ? "" : " ") + std::to_string(ln);
      md << "| " << k.name << " | " << f("%.4g", k.value) << " | "
         << (k.fitted                                  ? lines
             : k.name == "expert_message_overhead_s" ? std::string("none: message_overhead_s's value")
             : k.name == "sync_message_cpu_s"        ? std::string("none: message_cpu_s's value")
             : k.name == "batch_compute_efficiency"  ? std::string("none: compute_efficiency's value")
                                                     : std::string("none: the base value"))
         << " | " << k.chain_rows << " / "
         << k.busy_rows << " |\n";
    }
    md << "\nTokens/s and comm share are the decode's when the CSV has them (sweep's decode_tokens_per_s "
          "and decode_comm_share: planner.md \"Held-out validation\"), as the planner predicts them.\n\n"
       << point_table_header;
    for (const auto& pt : cal->points) {
      md << point_table_row(pt);
    }
    md << "\nLargest error " << f("%.1f%%", cal->max_abs_error * 100) << ", rms " << f("%.1f%%", cal->rms_error * 100)
       << ".\n\n";
  }
  if (val) {
    md << "## Held-out validation\n\n`--holdout " << to_string(val->rule) << "`: the constants refitted on "
       << val->fit.points.size() << " points (" << constants_text(val->fit.fitted) << ") predict the "
       << val->held_out.size()
       << " held-out points:\n\n"
       << point_table_header;
    for (const auto& pt : val->held_out) {
      md << point_table_row(pt);
    }
    // The line covers both relative goals: TPOT and tokens/s.
    md << "\nLargest held-out error: "
       << f("%.1f", std::max(val->max_abs_error, val->max_abs_tokens_per_s_error) * 100) << "%\n\n"
       << "(the larger of TPOT " << f("%.1f%%", val->max_abs_error * 100) << " and tokens/s "
       << f("%.1f%%", val->max_abs_tokens_per_s_error * 100) << "; comm share: "
       << f("%.3f", val->max_abs_comm_share_error) << " absolute; goal: 20% and 0.05. TPOT is the decode's mean "
       << "time between a sequence's tokens; against the p50 of the first session's steps the largest held-out "
       << "error is " << f("%.1f%%", max_p50_error(val->held_out) * 100) << ".)\n\n";
  }

  // Sensitivity: one assumption at a time.
  md << "## Which assumptions dominate\n\nEach row changes one assumption of the plan above and re-plans "
        "(layout included).\n\n| change | fits | time per token (1 seq) | tokens/s at batch "
     << r.batch << " | $ per million tokens | x cost |\n|---|---|---|---|---|---|\n";
  struct variant {
    std::string name;
    std::function<void(plan_request&)> apply;
  };
  std::vector<variant> vs{
      {"none (the plan above)", [](plan_request&) {}},
      {"200 MiB per node (Linux keeps 56 MiB)", [](plan_request& q) { q.hw.node.memory_bytes = 200ull << 20; }},
      {"activations sent as bf16", [](plan_request& q) { q.model.act_bytes = 2; }},
      {"rank-to-rank forwarding between TP groups (a runtime change)",
       [](plan_request& q) { q.assume.peer_forwarding = true; }},
      {"bf16 activations + rank-to-rank forwarding", [](plan_request& q) {
         q.model.act_bytes = 2;
         q.assume.peer_forwarding = true;
       }},
      {"all-reduces as reduce-scatter + all-gather (--reduce scatter)",
       [](plan_request& q) { q.assume.scatter_gather = true; }},
      {"sample on the last stage (no logits to the session)",
       [](plan_request& q) { q.assume.logits_to_session = false; }},
      {"1 ms per hop instead of 100 us", [](plan_request& q) { q.hw.node.link.latency_us = 1000; }},
      {"10 Gbit/s links", [](plan_request& q) { q.hw.node.link.bandwidth_bps = 10000000000ull; }},
      {"half the compute efficiency", [](plan_request& q) {
         q.assume.compute_efficiency *= 0.5;
         q.assume.batch_compute_efficiency *= 0.5;
       }},
      {"0.55 failures per node-year (Google machines, Jeff Dean)",
       [](plan_request& q) { q.hw.failures_per_year = 0.55; }},
      {"10 s to detect a failure", [](plan_request& q) { q.assume.detect_s = 10; }},
      {"PS3 Slim power (96 W)", [](plan_request& q) {
         q.hw.node.power_w = 96;
         q.hw.idle_power_w = 75;
       }},
      {"electricity at $0.30/kWh", [](plan_request& q) { q.assume.electricity_usd_per_kwh = 0.30; }},
      {"context 32,768", [](plan_request& q) { q.context = 32768; }},
  };
  // Expert replicas (issue #25): the planner's expert layout copies every
  // routed expert as often as the expert nodes allow, so a second copy of
  // each takes twice the nodes; the runtime's expert placement takes --expert-replicas.
  if (p.layout.topology.kind == plan_kind::expert && p.layout.expert_nodes > 0) {
    const int twice = 2 * r.nodes;
    vs.push_back({"expert replicas: twice the nodes (" + std::to_string(twice) + "), every expert on as many as they allow",
                  [twice](plan_request& q) { q.nodes = twice; }});
  } else if (p.layout.topology.kind == plan_kind::pipeline && p.layout.topology.experts >= 2 &&
             p.layout.topology.expert_replicas < 2) {
    vs.push_back({"2 replicas of every expert (--expert-replicas 2)",
                  [](plan_request& q) { q.topology.expert_replicas = 2; }});
  }
  struct scored {
    std::string name;
    double ratio;
  };
  std::vector<scored> impact;
  for (const auto& v : vs) {
    plan_request q = r;
    v.apply(q);
    const row_result x = try_plan(q);
    if (!x.ok) {
      md << "| " << v.name << " | - | - | - | - (" << x.why << ") | - |\n";
      continue;
    }
    const double ratio = x.p.memory_fit ? x.p.cost_per_million_tokens_usd / p.cost_per_million_tokens_usd : NAN;
    md << "| " << v.name << " | " << (x.p.memory_fit ? "yes" : "no") << " | " << human_seconds(x.p.chain_s) << " | "
       << rate(x.p.tokens_per_s) << " | " << (x.p.memory_fit ? money(x.p.cost_per_million_tokens_usd) : "-")
       << " | " << (std::isfinite(ratio) ? f("%.3g", ratio) : "-") << " |\n";
    if (std::isfinite(ratio) && v.name.rfind("none", 0) != 0) impact.push_back({v.name, ratio});
  }
  std::sort(impact.begin(), impact.end(),
            [](const scored& a, const scored& b) { return std::fabs(std::log(a.ratio)) > std::fabs(std::log(b.ratio)); });
  md << "\nOrdered by how far they move the cost per token:";
  for (size_t i = 0; i < impact.size() && i < 5; ++i) {
    md << (i ? ";" : "") << " " << impact[i].name << " (x" << f("%.3g", impact[i].ratio) << ")";
  }
  md << ".\n\n";
  // What sets the time per token and the cost, from the plan's own numbers.
  const double chain_wire = p.chain_latency_s + p.chain_transfer_s;
  md << "In this plan the time per token is " << f("%.0f%%", 100 * chain_wire / p.chain_s)
     << " latency and transfers on the serial chain and " << f("%.0f%%", 100 * p.chain_compute_s / p.chain_s)
     << " compute; the throughput is limited by the " << p.throughput_limit << ". Of the cost, "
     << f("%.0f%%", 100 * (p.power_w / 1000 * r.assume.electricity_usd_per_kwh) / p.usd_per_hour)
     << " is electricity for " << f("%.3g", mw) << " MW and the rest hardware amortisation. ";
  double failure_effect = 0;
  for (const auto& x : impact) {
    if (x.name.find("fail") != std::string::npos) failure_effect = std::max(failure_effect, std::fabs(std::log(x.ratio)));
  }
  md << (failure_effect < 0.05
             ? "Failures barely matter: detection and recovery take seconds and failures come far apart, so "
               "goodput is " + f("%.4g%%", 100 * p.goodput_tokens_per_s / p.tokens_per_s) + " of throughput.\n"
             : "Failures matter: a different failure rate or detection time moves the cost by up to " +
                   f("%.0f%%", 100 * (std::exp(failure_effect) - 1)) + ".\n");
  return md.str();
}

}  // namespace

void add_plan(CLI::App& app, int& status) {
  auto o = std::make_shared<plan_opts>();
  auto* cmd = app.add_subcommand("plan", "the bottleneck checklist and the at-scale simulation");
  cmd->add_option("-m,--model", o->model,
                  "model preset (stories260k, stories15m, stories42m, stories110m, llama2-7b, llama3-8b, "
                  "llama3-70b, kimi-k2, kimi-k3), a Hugging Face config.json, or a model file (GGUF, llama2.c .bin: "
                  "its shape and tensor types)")
      ->required();
  cmd->add_option("--hardware", o->hardware, "ps3, ps3-slim, rpi5, host, h100-8x, h200-8x, or a hw.json")
      ->capture_default_str();
  cmd->add_option("--nodes", o->nodes, "node count")->required()->check(CLI::PositiveNumber);
  cmd->add_option("--topology", o->topology,
                  "pipeline[:S]|tensor[:T]|hybrid:PxT|expert[:T]|pipeline[:P],expert:E (default: expert for a "
                  "mixture of experts, else pipeline)");
  cmd->add_option("--expert-replicas", o->expert_replicas,
                  "with pipeline[:P],expert:E: expert nodes holding each expert (the runtime's --expert-replicas)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--batch", o->batch, "concurrent sequences")->capture_default_str()->check(CLI::PositiveNumber);
  cmd->add_option("--context", o->context, "positions of KV cache per sequence")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--calibrate", o->calibrate, "fit the constants to a sweep CSV (CLI.md sweep columns)");
  cmd->add_option("--calibrate-model", o->calibrate_model,
                  "with --calibrate: the sweep's model (preset or config.json) for rows whose model is not a preset "
                  "and has no STEM.config.json beside the CSV (default: --model)");
  cmd->add_option("--holdout", o->holdout,
                  "with --calibrate: also fit without the rows RULE holds out (every:K[:J], nodes:N or last:N) and report "
                  "the error of predicting them");
  cmd->add_option("--calibrate-hardware", o->calibrate_hardware, "where the sweep ran (host: measured here)")
      ->capture_default_str();
  cmd->add_option("--calibrate-context", o->calibrate_context,
                  "mean attended positions of the sweep's runs (half of 128 tokens)")
      ->capture_default_str();
  cmd->add_option("--json", o->json, "machine-readable result to FILE (- = stdout)");
  cmd->add_option("--report", o->report, "write the Markdown report (answer, curves, sensitivity) to FILE");
  cmd->add_option("--baseline", o->baseline, "GPU server preset to compare with, or none")->capture_default_str();
  cmd->add_option("--memory", o->memory, "per-node memory budget, e.g. 200MiB (overrides the hardware)");
  cmd->add_option("--link", o->link, "BANDWIDTH:LATENCY, e.g. 10gbit:50us (overrides the hardware)");
  cmd->add_option("--weights", o->weights, "native|f32|bf16|f16|q8_0|mxfp4")->capture_default_str();
  cmd->add_option("--wire", o->wire, "activations on the wire: f32 (the runtime), bf16 or fp8");
  auto* g = cmd->add_option_group("Assumptions (defaults in docs/planner.md)");
  g->add_option("--electricity", o->electricity, "USD per kWh (0.12)");
  g->add_option("--amortisation-years", o->amortisation, "hardware amortisation (3)");
  g->add_option("--price", o->price, "USD per node (hardware preset)");
  g->add_option("--failures-per-year", o->failures, "failures per node-year (hardware preset)");
  g->add_option("--detect-ms", o->detect_ms, "time to detect a failed (silent) node (745, measured)");
  g->add_option("--recover-ms", o->recover_ms, "runtime recovery besides reload and replay (1.2, measured)");
  g->add_option("--efficiency", o->efficiency, "fraction of peak bandwidth/FLOP/s (1, or calibrated)");
  g->add_option("--link-efficiency", o->link_efficiency, "payload / line rate (0.941)");
  g->add_option("--request-tokens", o->request_tokens, "tokens per request (256)");
  g->add_option("--checkpoint-every", o->checkpoint_every, "positions between KV checkpoints (16)");
  g->add_flag("--no-reload", o->no_reload, "spares already hold the weights they take over");
  g->add_flag("--sample-on-last-stage", o->sample_last, "return a token id, not the logits");
  g->add_flag("--peer-forwarding", o->peer_forwarding,
              "rank i of a TP group forwards x to rank i of the next (the runtime: rank 0 sends to all)");
  g->add_option("--reduce", o->reduce,
                "all-reduce of TP groups as the runtime's --reduce: direct (T-1 vectors per rank) or scatter "
                "(reduce-scatter + all-gather, 2(T-1)/T of a vector in two rounds)")
      ->check(CLI::IsMember({"direct", "scatter"}))
      ->capture_default_str();
  auto* s = cmd->add_option_group("Simulation");
  s->add_flag("--simulate", o->simulate, "run the discrete-event simulation of the plan");
  s->add_option("--sim-hours", o->sim_hours, "simulated hours (1)");
  s->add_option("--sim-rate", o->sim_rate, "requests per second (0: a closed loop of --batch sessions)");
  s->add_option("--sim-failure-scale", o->sim_failure_scale, "multiply node failure rates (1)");
  s->add_option("-s,--seed", o->seed, "simulation seed (1)");

  cmd->callback([o, &status] {
    plan_request r = build_request(*o);
    std::unique_ptr<calibration> cal;
    std::unique_ptr<validation> val;
    std::vector<plan_assumptions> loo;  // leave-one-out refits (uncertainty band)
    if (!o->holdout.empty() && o->calibrate.empty()) throw cli_error("--holdout needs --calibrate", 2);
    if (!o->calibrate.empty()) {
      auto rows = parse_sweep_csv(read_text(o->calibrate), o->calibrate);
      if (!rows) throw cli_error(rows.message());
      plan_request base = r;
      const std::string text = read_text(o->calibrate);
      double gbs = 0;
      int cores = 0;
      // A sweep measured here says the host's bandwidth and cores in its first
      // line ("# host: 21.8 GB/s, 2 cores"); use them rather than a new
      // measurement on a machine that may be busy now.
      if (o->calibrate_hardware == "host" && std::sscanf(text.c_str(), "# host: %lf GB/s, %d cores", &gbs, &cores) == 2) {
        base.hw = load_hardware("host", false);
        base.hw.node.mem_bandwidth_gbs = gbs;
        base.hw.parallel_nodes = cores;
        // A lab sweep says its daemons' CPU quota in a comment ("each capped
        // at 25% of a core"; scripts/lab.sh: 10 ms CFS periods): the first
        // line's bandwidth is the capped node's, quota x the full core's.
        const auto at = text.find("capped at ");
        double pct = 0;
        if (at != std::string::npos && std::sscanf(text.c_str() + at, "capped at %lf%% of a core", &pct) == 1 &&
            pct > 0 && pct < 100) {
          base.hw.cpu_quota = pct / 100.0;
          base.hw.cpu_quota_period_s = 0.01;
          base.hw.node.mem_bandwidth_gbs = gbs / base.hw.cpu_quota;
        }
      } else {
        base.hw = load_hardware(o->calibrate_hardware, true);
      }
      base.context = o->calibrate_context;
      base.assume = r.assume;
      model_spec rows_model = r.model;
      if (!o->calibrate_model.empty()) {
        auto m = is_file(o->calibrate_model) ? spec_from_hf_json(read_text(o->calibrate_model), o->calibrate_model)
                                             : find_model_preset(o->calibrate_model);
        if (!m) throw cli_error("--calibrate-model: " + m.message(), 2);
        rows_model = *m;
      }
      // A row whose model is a file (lab8.bin, labmoe8.gguf) is planned with
      // the shape beside the CSV, STEM.config.json, when there is one (the
      // lab sweeps two models); else a preset, else --calibrate-model.
      const model_resolver presets = preset_resolver(&rows_model);
      const std::string csv_dir =
          o->calibrate.find('/') == std::string::npos ? "." : o->calibrate.substr(0, o->calibrate.rfind('/'));
      auto shapes = std::make_shared<std::map<std::string, model_spec>>();
      const model_resolver resolve = [presets, csv_dir, shapes](const std::string& row_model) -> result<model_spec> {
        std::string stem = row_model.substr(row_model.find_last_of('/') == std::string::npos
                                                ? 0
                                                : row_model.find_last_of('/') + 1);
        if (stem.find('.') != std::string::npos) stem = stem.substr(0, stem.find('.'));
        const std::string path = csv_dir + "/" + stem + ".config.json";
        if (stem.empty() || !is_file(path)) return presets(row_model);
        auto it = shapes->find(path);
        if (it == shapes->end()) {
          auto m = spec_from_hf_json(read_text(path), path);
          if (!m) return m.err();
          it = shapes->emplace(path, *m).first;
        }
        return it->second;
      };
      auto c = calibrate(*rows, base, resolve);
      if (!c) throw cli_error("--calibrate " + o->calibrate + ": " + c.message());
      cal = std::make_unique<calibration>(*c);
      if (auto l = leave_one_out(*rows, base, resolve)) loo = *l;
      if (!o->holdout.empty()) {
        auto rule = parse_holdout(o->holdout);
        if (!rule) throw cli_error(rule.message(), 2);
        auto v = validate(*rows, base, resolve, *rule);
        if (!v) throw cli_error("--calibrate " + o->calibrate + " --holdout " + o->holdout + ": " + v.message());
        val = std::make_unique<validation>(*v);
      }
      // An efficiency above 1 says the sweep's model sat in cache; the
      // planned model streams from memory, so the plan uses at most 1.
      apply_fit(r.assume, c->fitted, o->efficiency);
    }
    auto p = plan(r);
    if (!p) throw cli_error(p.message(), 2);
    // The spread of the answer over the calibration's leave-one-out refits.
    std::unique_ptr<plan_band> band;
    if (cal && !loo.empty()) {
      band = std::make_unique<plan_band>();
      band->latency_lo = band->tokens_lo = band->cost_lo = std::numeric_limits<double>::infinity();
      band->chain_lo = band->goodput_lo = band->energy_lo = std::numeric_limits<double>::infinity();
      for (const auto& a : loo) {
        plan_request q = r;
        apply_fit(q.assume, a, o->efficiency);
        auto pq = plan(q);
        if (!pq) continue;
        ++band->fits;
        band->latency_lo = std::min(band->latency_lo, pq->per_token_latency_s);
        band->latency_hi = std::max(band->latency_hi, pq->per_token_latency_s);
        band->tokens_lo = std::min(band->tokens_lo, pq->tokens_per_s);
        band->tokens_hi = std::max(band->tokens_hi, pq->tokens_per_s);
        band->cost_lo = std::min(band->cost_lo, pq->cost_per_million_tokens_usd);
        band->cost_hi = std::max(band->cost_hi, pq->cost_per_million_tokens_usd);
        band->chain_lo = std::min(band->chain_lo, pq->chain_s);
        band->chain_hi = std::max(band->chain_hi, pq->chain_s);
        band->goodput_lo = std::min(band->goodput_lo, pq->goodput_tokens_per_s);
        band->goodput_hi = std::max(band->goodput_hi, pq->goodput_tokens_per_s);
        band->energy_lo = std::min(band->energy_lo, pq->energy_per_token_j);
        band->energy_hi = std::max(band->energy_hi, pq->energy_per_token_j);
      }
      if (band->fits == 0) band.reset();
    }
    std::unique_ptr<plan_result> base;
    if (o->baseline != "none" && !o->baseline.empty()) {
      const hardware_spec bhw = load_hardware(o->baseline, false);
      auto b = plan_baseline(r, bhw);
      if (!b) throw cli_error("--baseline: " + b.message());
      base = std::make_unique<plan_result>(*b);
    }
    std::unique_ptr<sim_result> sim;
    double sim_wall = 0;
    if (o->simulate) {
      sim_options so;
      so.duration_s = o->sim_hours * 3600;
      so.arrival_rate = o->sim_rate;
      so.failure_scale = o->sim_failure_scale;
      so.seed = o->seed;
      const auto t0 = std::chrono::steady_clock::now();
      auto sr = simulate(*p, so);
      sim_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!sr) throw cli_error(sr.message());
      sim = std::make_unique<sim_result>(*sr);
    }
    std::unique_ptr<sim_result> stress;
    double stress_wall = 0;
    if (o->simulate && !o->report.empty()) {
      // For the report: the same run with failures 100 x as frequent, one hour.
      sim_options so;
      so.duration_s = 3600;
      so.arrival_rate = o->sim_rate;
      so.failure_scale = 100 * o->sim_failure_scale;
      so.seed = o->seed + 1;
      const auto t0 = std::chrono::steady_clock::now();
      auto sr = simulate(*p, so);
      stress_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (sr) stress = std::make_unique<sim_result>(*sr);
    }

    const bool json_to_stdout = o->json == "-";
    if (!json_to_stdout) {
      std::printf("%s", to_text(*p, base.get()).c_str());
      if (cal) {
        std::printf("calibration (%zu points, largest error %.1f%%): %s\n", cal->points.size(),
                    cal->max_abs_error * 100, constants_text(cal->fitted).c_str());
        for (const auto& pt : cal->points) {
          std::printf("  %-12s %-12s nodes %d batch %d: measured %.4g ms, predicted %.4g ms (%+.1f%%)\n",
                      pt.model.c_str(), pt.topology.c_str(), pt.nodes, pt.batch, pt.measured_tpot_ms,
                      pt.predicted_tpot_ms, pt.error * 100);
        }
      }
      if (band) {
        std::printf("uncertainty (%d leave-one-out refits of the calibration): %s - %s between a sequence's tokens, "
                    "%s - %s tokens/s, %s - %s per million tokens\n",
                    band->fits, human_seconds(band->latency_lo).c_str(), human_seconds(band->latency_hi).c_str(),
                    rate(band->tokens_lo).c_str(), rate(band->tokens_hi).c_str(), money(band->cost_lo).c_str(),
                    money(band->cost_hi).c_str());
      }
      if (val) {
        std::printf("held-out validation (%s): fitted on %zu points, predicted %zu; largest held-out error %.1f%% "
                    "(tokens/s %.1f%%, comm share %.3f absolute)\n",
                    to_string(val->rule).c_str(), val->fit.points.size(), val->held_out.size(),
                    val->max_abs_error * 100, val->max_abs_tokens_per_s_error * 100, val->max_abs_comm_share_error);
        for (const auto& pt : val->held_out) {
          std::printf("  line %d %-12s %-12s nodes %d link %s batch %d: tpot measured %.4g ms, predicted %.4g ms "
                      "(%+.1f%%); tokens/s %.4g vs %.4g (%+.1f%%); comm share %.2f vs %.2f\n",
                      pt.line, pt.model.c_str(), pt.topology.c_str(), pt.nodes, pt.link.c_str(), pt.batch,
                      pt.measured_tpot_ms, pt.predicted_tpot_ms, pt.error * 100, pt.measured_tokens_per_s,
                      pt.predicted_tokens_per_s, pt.tokens_per_s_error * 100, pt.measured_comm_share,
                      pt.predicted_comm_share);
        }
      }
      if (sim) {
        std::printf("simulation: %d nodes, %.3g h, %llu events in %.2f s: %s tokens/s (closed form %s), time "
                    "between tokens p50 %s p99 %s, %llu failures, %.3g of %llu requests met one\n",
                    sim->nodes, sim->simulated_s / 3600, static_cast<unsigned long long>(sim->events), sim_wall,
                    rate(sim->tokens_per_s).c_str(), rate(p->goodput_tokens_per_s).c_str(),
                    human_seconds(sim->token_latency_p50_s).c_str(), human_seconds(sim->token_latency_p99_s).c_str(),
                    static_cast<unsigned long long>(sim->failures), sim->request_failure_fraction,
                    static_cast<unsigned long long>(sim->requests_done));
      }
    }
    if (!o->json.empty()) {
      nlohmann::json j = nlohmann::json::parse(to_json(*p));
      if (base) j["baseline"] = nlohmann::json::parse(to_json(*base));
      if (cal) {
        nlohmann::json pts = nlohmann::json::array();
        for (const auto& pt : cal->points) {
          pts.push_back({{"nodes", pt.nodes},
                         {"topology", pt.topology},
                         {"model", pt.model},
                         {"batch", pt.batch},
                         {"measured_tpot_ms", pt.measured_tpot_ms},
                         {"predicted_tpot_ms", pt.predicted_tpot_ms},
                         {"error", pt.error},
                         {"measured_tpot_p50_ms", pt.measured_tpot_p50_ms},
                         {"p50_error", pt.p50_error}});
        }
        j["calibration"] = pts;
        j["calibration_fit"] = constants_json(cal->fitted);
        j["calibration_fit"]["max_abs_error"] = cal->max_abs_error;
        j["calibration_fit"]["rms_error"] = cal->rms_error;
        nlohmann::json srcs = nlohmann::json::object();
        for (const auto& k : cal->constants)
          srcs[k.name] = {{"value", k.value}, {"fitted", k.fitted}, {"lines", k.lines},
                          {"chain_rows", k.chain_rows}, {"busy_rows", k.busy_rows}};
        j["calibration_fit"]["sources"] = srcs;
      }
      if (band) {
        j["uncertainty"] = {{"refits", band->fits},
                            {"per_token_latency_s", {band->latency_lo, band->latency_hi}},
                            {"tokens_per_s", {band->tokens_lo, band->tokens_hi}},
                            {"cost_per_million_tokens_usd", {band->cost_lo, band->cost_hi}},
                            {"chain_s", {band->chain_lo, band->chain_hi}},
                            {"goodput_tokens_per_s", {band->goodput_lo, band->goodput_hi}},
                            {"energy_per_token_j", {band->energy_lo, band->energy_hi}}};
      }
      if (val) {
        nlohmann::json pts = nlohmann::json::array();
        for (const auto& pt : val->held_out) {
          pts.push_back({{"line", pt.line},
                         {"nodes", pt.nodes},
                         {"topology", pt.topology},
                         {"model", pt.model},
                         {"link", pt.link},
                         {"batch", pt.batch},
                         {"measured_tpot_ms", pt.measured_tpot_ms},
                         {"predicted_tpot_ms", pt.predicted_tpot_ms},
                         {"error", pt.error},
                         {"measured_tpot_p50_ms", pt.measured_tpot_p50_ms},
                         {"p50_error", pt.p50_error},
                         {"measured_tokens_per_s", pt.measured_tokens_per_s},
                         {"predicted_tokens_per_s", pt.predicted_tokens_per_s},
                         {"tokens_per_s_error", pt.tokens_per_s_error},
                         {"measured_comm_share", pt.measured_comm_share},
                         {"predicted_comm_share", pt.predicted_comm_share}});
        }
        j["validation"] = {{"holdout", to_string(val->rule)},
                           {"fitted_points", val->fit.points.size()},
                           {"fit", constants_json(val->fit.fitted)},
                           {"held_out", pts},
                           {"max_abs_error", val->max_abs_error},
                           {"max_abs_tokens_per_s_error", val->max_abs_tokens_per_s_error},
                           {"max_abs_comm_share_error", val->max_abs_comm_share_error},
                           {"skipped_rows", val->skipped}};
      }
      if (sim) j["simulation"] = sim_json(*sim, sim_wall);
      write_text(o->json, j.dump(2) + "\n");
    }
    if (!o->report.empty()) {
      write_text(o->report,
                 report_text(*o, *p, base.get(), cal.get(), val.get(), band.get(), sim.get(), sim_wall, stress.get(), stress_wall));
      if (!json_to_stdout) std::printf("wrote %s\n", o->report.c_str());
    }
    status = 0;
  });
}

}  // namespace cellshard::tools
