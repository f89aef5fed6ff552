// topologies/plan_hardware.hpp: the hardware the planner prices and times:
// a node profile (topologies/profile.hpp: memory, link, FLOP/s, memory
// bandwidth, power) plus what the runtime does not need: idle power, price,
// failure rate, and, for an in-process run on one host, how many nodes can
// compute at once.
//
// Presets (`plan --hardware`): ps3, ps3-slim, rpi5, host, h100-8x, h200-8x.
// A GPU server is one planner node: its memory, bandwidth and FLOP/s are the
// sums over its 8 GPUs and its link is the server's network; traffic over
// NVLink inside the server is not modelled (in the GPU's favour). Every
// figure cites /work/shared/docs/HARDWARE.md, or is marked "assumption"
// where that file has no number (override with hw.json).
//
// Pure values and functions; thread-safe. Errors are result values.
#pragma once

#include "model/result.hpp"
#include "topologies/profile.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace cellshard::topologies {

struct hardware_spec {
  profile node;                   // memory budget, link, gflops, mem_bandwidth_gbs, power_w (load)
  double idle_power_w = 0;        // a spare's draw; 0 = same as node.power_w
  double price_usd = 0;           // per node
  double failures_per_year = 0;   // per node, failures that take it out
  /// In-process runs: nodes that can compute at the same moment (the host's
  /// cores); 0 = every node is its own machine.
  int parallel_nodes = 0;
  /// A node under a CPU quota (the lab: scripts/lab.sh puts each daemon in a
  /// cgroup with cpu.max "2500 10000", 25% of a core in 10 ms periods): the
  /// share of one core it may use per period, 0 = none (a machine of its
  /// own). node.mem_bandwidth_gbs and gflops are then the rates of a full
  /// core; the node sustains `cpu_quota` of them, and a step after idle time
  /// runs at full speed until the period's quota is spent (planner.hpp
  /// quota_step_seconds).
  double cpu_quota = 0;
  double cpu_quota_period_s = 0.01;  // CFS period (lab.sh: 10 ms)
  std::string source;             // one line: where the numbers come from

  double spare_power_w() const { return idle_power_w > 0 ? idle_power_w : node.power_w; }
};

/// ps3, ps3-slim, rpi5, host, h100-8x, h200-8x.
const std::vector<std::string>& hardware_preset_names();
/// The preset called `name`; "host" has unknown bandwidth/FLOP/s (0) until the
/// caller measures them. Error lists the valid names.
result<hardware_spec> find_hardware_preset(std::string_view name);

/// hw.json: {"base": PRESET (optional), "name", "memory_bytes",
/// "memory_bandwidth_gbs", "gflops", "link_bandwidth_bps", "link_latency_us"
/// (or "link": "1gbit:100us"), "power_w", "idle_power_w", "price_usd",
/// "failures_per_year", "parallel_nodes"}. Missing keys keep the base's values
/// (no base: zeros, which the checks report as unknown). Errors name the key.
result<hardware_spec> hardware_from_json(const std::string& json_text, const std::string& name);

/// failures_per_year / 8766 hours (a year of 365.25 days).
double failures_per_hour_per_node(const hardware_spec& h);

}  // namespace cellshard::topologies
