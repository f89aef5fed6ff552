// topologies/plan_hardware.cpp: hardware presets of the planner and hw.json.
#include "topologies/plan_hardware.hpp"

#include <nlohmann/json.hpp>

namespace cellshard::topologies {

namespace {

constexpr double hours_per_year = 8766.0;  // 365.25 days

// Llama 3 training (HARDWARE.md "Failures in large fleets", Llama 3 paper via
// glennklockwood.com): 419 unexpected interruptions on 16,384 H100s in 54
// days. Per 8-GPU server: 419 / (16384 / 8) per 54 days = 1.38 per year
// (derived; every cause counted, as every cause stops the server's job).
constexpr double llama3_failures_per_server_year = 419.0 / (16384.0 / 8.0) * (365.25 / 54.0);

// A GPU server as one planner node.
hardware_spec gpu_server(std::string name, double hbm_gb, double hbm_tbs, double price, std::string source) {
  hardware_spec h;
  h.node.name = std::move(name);
  h.node.memory_bytes = static_cast<uint64_t>(8 * hbm_gb * 1e9);
  h.node.mem_bandwidth_gbs = 8 * hbm_tbs * 1000.0;
  // BF16 989 TFLOPS dense per GPU (H100 SXM datasheet via glennklockwood.com;
  // the H200 is the same GH100 compute: derived).
  h.node.gflops = 8 * 989e3;
  // Server network: assumption (no number in HARDWARE.md): one 400 Gbit/s
  // NIC per GPU, 5 us per hop.
  h.node.link = link_spec{8ull * 400000000000ull, 5.0};
  // 8x H200 server: 10 kW (HARDWARE.md assumptions, market estimate); the
  // H100 server draws the same 700 W per GPU (datasheets), so 10 kW too.
  h.node.power_w = 10000.0;
  h.price_usd = price;
  h.failures_per_year = llama3_failures_per_server_year;
  h.source = std::move(source);
  return h;
}

double num(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return fallback;
  return it->get<double>();
}

}  // namespace

const std::vector<std::string>& hardware_preset_names() {
  static const std::vector<std::string> names{"ps3", "ps3-slim", "rpi5", "host", "h100-8x", "h200-8x"};
  return names;
}

result<hardware_spec> find_hardware_preset(std::string_view name) {
  hardware_spec h;
  if (name == "ps3" || name == "ps3-slim") {
    h.node = name == "ps3" ? ps3_profile() : ps3_slim_profile();  // HARDWARE.md Sony PS3 rows (profile.cpp)
    // Slim ~75 W idle (techcrunch 2009-08-27); no idle figure for the launch
    // model: its spares are counted at load power.
    h.idle_power_w = name == "ps3-slim" ? 75.0 : 0.0;
    h.price_usd = 60.0;  // used PS3, $60 (HARDWARE.md assumptions, market estimate)
    // SquareTrade: 10.0% failed within 2 years -> about 5% a year (HARDWARE.md, derived).
    h.failures_per_year = 0.05;
    h.source = "HARDWARE.md: Sony PS3 rows; $60 used (market estimate); 5%/yr failures (SquareTrade, derived)";
    return h;
  }
  if (name == "rpi5") {
    h.node = rpi5_profile();  // HARDWARE.md Raspberry Pi 5 rows (profile.cpp)
    h.idle_power_w = 3.3;     // 2.4-3.3 W idle (Jeff Geerling's measurements)
    h.price_usd = 80.0;       // assumption: no price in HARDWARE.md (8 GB board list price)
    h.failures_per_year = 0.05;  // assumption: no source; the PS3's 5%/yr
    h.source = "HARDWARE.md: Raspberry Pi 5 rows; price and failure rate are assumptions";
    return h;
  }
  if (name == "host") {
    h.node = host_profile();  // bandwidth, FLOP/s, power unknown: the caller measures
    h.source = "this machine (memory from sysconf; bandwidth measured by the caller)";
    return h;
  }
  if (name == "h100-8x") {
    // H100 SXM: 80 GB HBM3 at 3.35 TB/s (NVIDIA datasheet via glennklockwood.com).
    return gpu_server("h100-8x", 80, 3.35, 300000.0,
                      "HARDWARE.md: H100 SXM datasheet x 8; 10 kW; price $300,000 is an assumption");
  }
  if (name == "h200-8x") {
    // H200 SXM: 141 GB HBM3e at 4.8 TB/s (NVIDIA datasheet); $350,000 (market estimate).
    return gpu_server("h200-8x", 141, 4.8, 350000.0,
                      "HARDWARE.md: H200 SXM datasheet x 8; $350,000 and 10 kW (market estimate)");
  }
  std::string valid;
  for (const auto& n : hardware_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error("unknown hardware preset '" + std::string(name) + "' (expected one of: " + valid +
                    ", or a hw.json)");
}

result<hardware_spec> hardware_from_json(const std::string& text, const std::string& name) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return make_error(name + ": not JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) return make_error(name + ": expected a JSON object");
  hardware_spec h;
  if (j.contains("base")) {
    if (!j["base"].is_string()) return make_error(name + ": 'base' must be a preset name");
    auto b = find_hardware_preset(j["base"].get<std::string>());
    if (!b) return make_error(name + ": " + b.message());
    h = *b;
  }
  h.node.name = j.contains("name") && j["name"].is_string() ? j["name"].get<std::string>() : name;
  const double mem = num(j, "memory_bytes", static_cast<double>(h.node.memory_bytes));
  if (mem < 0) return make_error(name + ": 'memory_bytes' must not be negative");
  h.node.memory_bytes = static_cast<uint64_t>(mem);
  h.node.mem_bandwidth_gbs = num(j, "memory_bandwidth_gbs", h.node.mem_bandwidth_gbs);
  h.node.gflops = num(j, "gflops", h.node.gflops);
  if (j.contains("link")) {
    if (!j["link"].is_string()) return make_error(name + ": 'link' must be text like \"1gbit:100us\"");
    auto l = parse_link(j["link"].get<std::string>());
    if (!l) return make_error(name + ": " + l.message());
    h.node.link = *l;
  }
  h.node.link.bandwidth_bps =
      static_cast<uint64_t>(num(j, "link_bandwidth_bps", static_cast<double>(h.node.link.bandwidth_bps)));
  h.node.link.latency_us = num(j, "link_latency_us", h.node.link.latency_us);
  h.node.power_w = num(j, "power_w", h.node.power_w);
  h.idle_power_w = num(j, "idle_power_w", h.idle_power_w);
  h.price_usd = num(j, "price_usd", h.price_usd);
  h.failures_per_year = num(j, "failures_per_year", h.failures_per_year);
  h.parallel_nodes = static_cast<int>(num(j, "parallel_nodes", h.parallel_nodes));
  for (double v : {h.node.mem_bandwidth_gbs, h.node.gflops, h.node.power_w, h.price_usd, h.failures_per_year}) {
    if (v < 0) return make_error(name + ": values must not be negative");
  }
  h.source = name;
  return h;
}

double failures_per_hour_per_node(const hardware_spec& h) { return h.failures_per_year / hours_per_year; }

}  // namespace cellshard::topologies
