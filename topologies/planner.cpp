// topologies/planner.cpp: the layout, the cost model and the six checks of
// `cellshard plan`. Formulas and their sources: planner.hpp and
// docs/planner.md.
#include "topologies/planner.hpp"

#include "topologies/program.hpp"
#include "topologies/split.hpp"
#include "base/parse.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

namespace cellshard::topologies {

namespace {

constexpr double hours_per_year = 8766.0;
constexpr double inf = std::numeric_limits<double>::infinity();

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

int ceil_div(int a, int b) { return b <= 0 ? 0 : (a + b - 1) / b; }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// The hardware as rates.
struct rates {
  double mem_Bps = 0;   // bytes/s of memory (peak)
  double flops = 0;     // FLOP/s (peak)
  double link_Bps = 0;  // payload bytes/s of the link; 0 = unlimited
  double lat_s = 0;     // one-way latency per hop
  int parallel = 0;     // nodes computing at once on a shared host (0 = own machines)
};

rates rates_of(const plan_request& r) {
  rates x;
  x.mem_Bps = r.hw.node.mem_bandwidth_gbs * 1e9;
  x.flops = r.hw.node.gflops * 1e9;
  // Link payload rate: line rate x TCP efficiency (941 of 1000 Mbit/s on GbE,
  // HARDWARE.md "Gigabit Ethernet", itecnotes).
  x.link_Bps = r.hw.node.link.bandwidth_bps == 0
                   ? 0
                   : static_cast<double>(r.hw.node.link.bandwidth_bps) * r.assume.link_efficiency / 8.0;
  x.lat_s = r.hw.node.link.latency_us * 1e-6;
  x.parallel = r.hw.parallel_nodes;
  return x;
}

// A node's time for one step: the larger of reading its bytes and doing its
// FLOPs (roofline), at peak; the assumption's efficiency divides later.
double node_time(const rates& x, double read_bytes, double flops) {
  const double t_mem = x.mem_Bps > 0 ? read_bytes / x.mem_Bps : 0;
  const double t_flop = x.flops > 0 ? flops / x.flops : 0;
  return std::max(t_mem, t_flop);
}

// `n` messages sent back to back by one node, `bytes` in all: one latency,
// the bytes at the link's payload rate. On an unshaped in-process link
// (bandwidth 0) messages are moved between actors, not serialised
// (docs/performance.md), so no per-byte cost applies there.
cost_terms message(const rates& x, double n, double bytes) {
  cost_terms c;
  if (n <= 0) return c;
  c.transfer_s = x.link_Bps > 0 ? bytes / x.link_Bps : 0;
  c.wire_s = x.lat_s + c.transfer_s;
  c.messages = n;
  c.bytes = x.link_Bps > 0 ? bytes : 0;
  c.hops = 1;
  return c;
}

// `n` expert dispatch (or combine) messages: as message(), counted apart
// (cost_terms::expert_messages, plan_assumptions::expert_message_overhead_s).
cost_terms expert_message(const rates& x, double n, double bytes) {
  cost_terms c = message(x, n, bytes);
  c.expert_messages = c.messages;
  c.messages = 0;
  return c;
}

int tp_limit(const model_spec& m) {
  bool all_gqa = true;
  for (int l = 0; l < m.n_layers; ++l) all_gqa = all_gqa && m.attention_of(l) == attention_kind::gqa;
  // The runtime's rule for GQA: a TP group has at most as many shards as KV
  // heads (DESIGN.md "Limits of a split"); MLA/KDA heads split by query head.
  int lim = all_gqa ? m.n_kv_heads : std::max(m.n_heads, m.kda_heads);
  if (m.ffn_hidden > 0) lim = std::min(lim, m.ffn_hidden);
  if (m.is_moe()) lim = std::min(lim, m.expert_ffn);
  return std::max(lim, 1);
}

// Parameters of `layer` on rank 0 of a TP group of T (the busiest rank: split_even
// gives the first ranks one item more). GQA attention and dense FFNs are
// sliced exactly as the runtime slices them (placement.hpp); MLA, KDA and the
// MoE dense part are divided evenly.
double rank_layer_params(const model_spec& m, int layer, int T) {
  const double d = m.dim;
  double attn;
  if (m.attention_of(layer) == attention_kind::gqa) {
    const int kv0 = ceil_div(m.n_kv_heads, T);
    const double hw = m.head_width();
    const double q_rows = static_cast<double>(kv0) * (m.n_heads / std::max(m.n_kv_heads, 1)) * hw;
    const double kv_rows = kv0 * hw;
    attn = q_rows * d + 2 * kv_rows * d + d * q_rows + 2 * d;
  } else {
    attn = (attention_params(m, layer) - 2 * d) / T + 2 * d;
  }
  const double ffn = m.moe_layer(layer) ? moe_dense_params(m) / T : 3.0 * d * ceil_div(m.ffn_hidden, T);
  return attn + ffn;
}

// KV cache + state that `seqs` sequences keep on rank 0 of a TP group of T
// in `layer`. GQA: the rank's KV heads; KDA: the rank's heads of the state;
// MLA: the latent vector is shared by all heads, so rather than every rank
// keeping it whole, the sequences are spread over the ranks (data-parallel
// attention, as DeepSeek-V3-style serving does): ceil(seqs / T) sequences each.
double rank_cache_bytes(const model_spec& m, int layer, int T, int context, int seqs) {
  switch (m.attention_of(layer)) {
    case attention_kind::gqa:
      return static_cast<double>(seqs) * 2.0 * ceil_div(m.n_kv_heads, T) * m.head_width() * m.kv_bytes * context;
    case attention_kind::mla:
      return static_cast<double>(ceil_div(seqs, T)) * kv_bytes_per_position(m, layer) * context;
    case attention_kind::kda:
      return static_cast<double>(seqs) * state_bytes(m, layer) / T;
    case attention_kind::count: break;
  }
  return 0;
}

// Bytes rank 0 reads from its cache/state in `layer` for a step of b
// sequences: the whole KV cache at `context`; a KDA state is read and written.
double rank_cache_read(const model_spec& m, int layer, int T, int context, int b) {
  const double c = rank_cache_bytes(m, layer, T, context, b);
  return m.attention_of(layer) == attention_kind::kda ? 2 * c : c;
}

// Heads on rank 0 (for attention-score buffers) and the query width.
int rank_heads(const model_spec& m, int layer, int T) {
  if (m.attention_of(layer) == attention_kind::gqa) {
    return ceil_div(m.n_kv_heads, T) * (m.n_heads / std::max(m.n_kv_heads, 1));
  }
  return ceil_div(m.attention_of(layer) == attention_kind::kda ? m.kda_heads : m.n_heads, T);
}

// Buffers of rank 0 for B sequences, following the runtime's count
// (placement.hpp: 5 dim + q + k + v + scores + 2 FFN slice + vocab if classifier, f32).
double rank_buffer_bytes(const model_spec& m, int first, int end, int T, int B, int context, bool classifier) {
  double worst = 0;
  for (int l = first; l < end; ++l) {
    const double hw = m.attention_of(l) == attention_kind::gqa ? m.head_width()
                      : m.attention_of(l) == attention_kind::kda ? m.kda_head_dim
                                                                 : m.qk_nope_head_dim + m.qk_rope_head_dim;
    const int h0 = rank_heads(m, l, T);
    const int kv0 = m.attention_of(l) == attention_kind::gqa ? ceil_div(m.n_kv_heads, T) : h0;
    const double scores = m.attention_of(l) == attention_kind::kda ? 0.0 : static_cast<double>(h0) * context;
    const double f = m.moe_layer(l) ? std::max(1, m.n_shared_experts) * ceil_div(m.expert_ffn, T)
                                    : ceil_div(m.ffn_hidden, T);
    const double floats = 5.0 * m.dim + h0 * hw + 2.0 * kv0 * hw + scores + 2 * f;
    worst = std::max(worst, floats);
  }
  if (classifier) worst += ceil_div(m.vocab, T);  // its slice of the logits
  return static_cast<double>(B) * worst * 4;
}

plan_group layer_group(const model_spec& m, int first, int end, int T, int B, int context, bool embedding,
                       bool classifier, bool experts_inside) {
  plan_group g;
  g.first_layer = first;
  g.end_layer = end;
  g.tp = T;
  g.embedding = embedding;
  g.classifier = classifier;
  g.experts_inside = experts_inside;
  char buf[96];
  if (T > 1) std::snprintf(buf, sizeof buf, "layers [%d,%d) TP %d", first, end, T);
  else std::snprintf(buf, sizeof buf, "layers [%d,%d)", first, end);
  g.role = buf;
  for (int l = first; l < end; ++l) {
    g.weight_bytes += rank_layer_params(m, l, T) * m.weight_bytes;
    if (experts_inside) g.weight_bytes += layer_routed_params(m, l) / T * m.expert_weight_bytes;
    g.cache_bytes += rank_cache_bytes(m, l, T, context, B);
  }
  const double table = embedding_params(m) * m.weight_bytes;
  if (embedding) g.weight_bytes += table;
  // The classifier's rows are split over the last stage's ranks (rank 0,
  // the busiest, holds ceil(vocab / T): its program's classify slice); with
  // a shared classifier the holder of the embedding reads them from the table.
  const double cls_rows = ceil_div(m.vocab, T);
  if (classifier)
    g.weight_bytes += m.dim * m.weight_bytes + ((m.shared_classifier && embedding) ? 0 : cls_rows * m.dim * m.weight_bytes);
  g.buffer_bytes = rank_buffer_bytes(m, first, end, T, B, context, classifier);
  return g;
}

// A vocabulary pool: `n` nodes share the table's rows (embedding lookups, or
// the classifier's rows with the final norm).
plan_group vocab_pool(const model_spec& m, int n, int B, bool classifier) {
  plan_group g;
  g.tp = n;
  g.embedding = !classifier;
  g.classifier = classifier;
  g.role = classifier ? "classifier pool (" + std::to_string(n) + " nodes)"
                      : "embedding pool (" + std::to_string(n) + " nodes)";
  const double rows = ceil_div(m.vocab, n);
  g.weight_bytes = rows * m.dim * m.weight_bytes + (classifier ? m.dim * m.weight_bytes : 0);
  g.buffer_bytes = static_cast<double>(B) * (m.dim + (classifier ? rows : 0)) * 4;
  g.first_layer = g.end_layer = classifier ? m.n_layers : 0;
  return g;
}

int pool_size(const model_spec& m, double budget, int B, bool classifier) {
  for (int n = 1; n <= m.vocab; n = n < 8 ? n + 1 : n + std::max(1, n / 16)) {
    if (vocab_pool(m, n, B, classifier).total_bytes() <= budget) return n;
  }
  return -1;
}

double expert_node_bytes(const model_spec& m, int experts_per_node, int B) {
  // Weights of its experts + activations of up to B tokens (latent in/out and
  // the FFN hidden, f32).
  const double buffers = static_cast<double>(B) * (2.0 * m.routed_dim() + 2.0 * m.expert_ffn) * 4;
  return experts_per_node * expert_bytes(m) + buffers;
}

// Expert topology for a given layers-per-group g and TP width T; false when
// the node count cannot hold it.
bool expert_layout(const plan_request& r, int g, int T, int Te, int Tc, plan_layout& out) {
  const model_spec& m = r.model;
  const int P = ceil_div(m.n_layers, g);
  const long dense_nodes = static_cast<long>(P) * T + Te + Tc;
  const long expert_nodes = r.nodes - dense_nodes;
  if (expert_nodes < 1) return false;
  const long total_experts = static_cast<long>(m.moe_layers()) * m.n_experts;
  plan_layout l;
  l.topology = plan_topology{plan_kind::expert, P, T};
  l.layers_per_group = g;
  l.groups.push_back(vocab_pool(m, Te, r.batch, false));
  auto split = split_even(m.n_layers, P);
  for (const range& rg : split) {
    l.groups.push_back(layer_group(m, rg.begin, rg.end, T, r.batch, r.context, false, false, false));
  }
  l.groups.push_back(vocab_pool(m, Tc, r.batch, true));
  const long copies = std::max(1L, expert_nodes / std::max(total_experts, 1L));
  const long epn = (total_experts * copies + expert_nodes - 1) / expert_nodes;
  l.expert_copies = static_cast<int>(copies);
  l.experts_per_node = static_cast<int>(epn);
  const long used_expert_nodes = std::min(expert_nodes, (total_experts * copies + epn - 1) / std::max(epn, 1L));
  l.expert_nodes = static_cast<int>(used_expert_nodes);
  l.expert_node_bytes = expert_node_bytes(m, l.experts_per_node, r.batch);
  l.used_nodes = static_cast<int>(dense_nodes + used_expert_nodes);
  l.spare_nodes = r.nodes - l.used_nodes;
  out = std::move(l);
  return true;
}

bool layout_fits(const plan_layout& l, double budget) {
  for (const auto& g : l.groups) {
    if (g.total_bytes() > budget) return false;
  }
  return l.expert_nodes == 0 || l.expert_node_bytes <= budget;
}

}  // namespace

// ---------------------------------------------------------------------------

namespace {
double comm_seconds(const cost_terms& c, const plan_assumptions& a) {
  return c.wire_s + c.transfer_s * a.transfer_excess + c.messages * a.message_overhead_s +
         c.expert_messages * a.expert_message_overhead_s + c.syncs * a.sync_overhead_s +
         c.sync_messages * a.sync_message_overhead_s + c.bytes * a.byte_overhead_s;
}
}  // namespace

double cost_terms::seconds(const plan_assumptions& a) const {
  const double eff = a.compute_efficiency > 0 ? a.compute_efficiency : 1.0;
  return compute_s / eff + throttle_s + comm_seconds(*this, a);
}

double cost_terms::busy_seconds(const plan_assumptions& a) const {
  const double eff = concurrent && a.batch_compute_efficiency > 0 ? a.batch_compute_efficiency
                     : a.compute_efficiency > 0                    ? a.compute_efficiency
                                                                   : 1.0;
  const double q = quota > 0 && quota < 1 ? quota : 1.0;
  const double cpu = compute_s / (eff * q) + handled * a.message_cpu_s + sync_handled * a.sync_message_cpu_s +
                     syncs * a.sync_cpu_s + bytes * a.byte_overhead_s;
  // One sequence per step (the runtime): the station interleaves the steps of
  // its sessions, so one session's waits (latency, transfers, all-reduce
  // rounds) overlap another's work and only the CPU bounds its throughput.
  if (a.one_sequence_per_step) return cpu;
  return cpu + comm_seconds(*this, a) - bytes * a.byte_overhead_s;
}

cost_terms& cost_terms::operator+=(const cost_terms& o) {
  compute_s += o.compute_s;
  throttle_s += o.throttle_s;
  quota = std::min(quota, o.quota);
  wire_s += o.wire_s;
  transfer_s += o.transfer_s;
  messages += o.messages;
  expert_messages += o.expert_messages;
  syncs += o.syncs;
  sync_messages += o.sync_messages;
  bytes += o.bytes;
  hops += o.hops;
  handled += o.handled;
  sync_handled += o.sync_handled;
  concurrent = concurrent || o.concurrent;
  return *this;
}

double quota_step_seconds(double work_s, double share, double period_s) {
  if (!(work_s > 0)) return 0;
  if (!(share > 0) || share >= 1 || !(period_s > 0)) return work_s;
  const double q = share * period_s;
  constexpr int phases = 64;
  double total = 0;
  for (int i = 0; i < phases; ++i) {
    double phase = period_s * (i + 0.5) / phases;  // where in its period the step starts
    double left = work_s, quota = q, t = 0;
    // Whole periods of quota once the first partial period is over.
    for (int guard = 0; left > 0 && guard < 1000000; ++guard) {
      const double run = std::min({left, quota, period_s - phase});
      left -= run;
      t += run;
      phase += run;
      quota -= run;
      if (left <= 0) break;
      if (quota <= 1e-15) t += period_s - phase;  // throttled until the period ends
      phase = 0;
      quota = q;
      if (left > q) {  // whole periods at once: q of work each
        const double whole = std::floor(left / q);
        const double n = left - whole * q > 0 ? whole : whole - 1;
        t += n * period_s;
        left -= n * q;
      }
    }
    total += t;
  }
  return total / phases;
}

double distinct_experts(int experts, int k, int b) {
  if (experts <= 0 || k <= 0 || b <= 0) return 0;
  return experts * (1.0 - std::pow(1.0 - static_cast<double>(k) / experts, b));
}

result<plan_topology> parse_plan_topology(std::string_view text_in) {
  const std::string text = lower(text_in);
  const std::string what = "--topology '" + std::string(text_in) + "'";
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : text.substr(colon + 1);
  plan_topology t;
  if (const auto comma = text.find(','); comma != std::string::npos) {
    // "pipeline[:P],expert:E": the runtime's expert placement.
    const std::string first = text.substr(0, comma), second = text.substr(comma + 1);
    int e = 0;
    if (second.rfind("expert:", 0) != 0 || !parse_count(second.substr(7), e) ||
        (first != "pipeline" && first.rfind("pipeline:", 0) != 0))
      return make_error(what + ": expected pipeline[:P],expert:E");
    if (first != "pipeline" && !parse_count(first.substr(9), t.stages))
      return make_error(what + ": expected pipeline:P,expert:E with P >= 1");
    t.kind = plan_kind::pipeline;
    t.tp = 1;
    t.experts = e;
    return t;
  }
  if (head == "pipeline" || head == "tensor" || head == "expert") {
    t.kind = head == "pipeline" ? plan_kind::pipeline : head == "tensor" ? plan_kind::tensor : plan_kind::expert;
    if (!arg.empty()) {
      int v = 0;
      if (!parse_count(arg, v)) return make_error(what + ": expected " + head + ":N with N >= 1");
      (t.kind == plan_kind::pipeline ? t.stages : t.tp) = v;
    }
    if (t.kind == plan_kind::pipeline && t.stages == 0) t.tp = 1;
    if (t.kind == plan_kind::pipeline) t.tp = 1;
    if (t.kind == plan_kind::tensor) t.stages = 1;
    return t;
  }
  if (head == "hybrid") {
    const auto x = arg.find('x');
    int p = 0, q = 0;
    if (x == std::string::npos || !parse_count(arg.substr(0, x), p) || !parse_count(arg.substr(x + 1), q)) {
      return make_error(what + ": expected hybrid:PxT, e.g. hybrid:2x2");
    }
    t.kind = plan_kind::hybrid;
    t.stages = p;
    t.tp = q;
    return t;
  }
  return make_error(what + ": expected pipeline, tensor, hybrid:PxT or expert");
}

std::string to_string(const plan_topology& t) {
  switch (t.kind) {
    case plan_kind::pipeline:
      return (t.stages > 0 ? "pipeline:" + std::to_string(t.stages) : std::string("pipeline")) +
             (t.experts > 0 ? ",expert:" + std::to_string(t.experts) : std::string());
    case plan_kind::tensor: return t.tp > 0 ? "tensor:" + std::to_string(t.tp) : "tensor";
    case plan_kind::hybrid: return "hybrid:" + std::to_string(t.stages) + "x" + std::to_string(t.tp);
    case plan_kind::expert: return t.tp > 0 ? "expert:" + std::to_string(t.tp) : "expert";
    case plan_kind::count: break;
  }
  return "?";
}

// Placement index of rank 0 of station gi (stage-major numbering, as place()).
int station_first(const plan_layout& l, int gi) {
  int first = 0;
  for (int k = 0; k < gi; ++k) first += l.groups[static_cast<size_t>(k)].tp + l.topology.experts;
  return first;
}

// The program place() gives the shard at `rank` of station gi of a pipeline,
// tensor or hybrid layout, from the model's shape alone (program.hpp).
std::vector<shard_step> station_program(const plan_request& r, const plan_layout& l, int gi, int rank) {
  const model_spec& m = r.model;
  const int n = static_cast<int>(l.groups.size());
  const plan_group& g = l.groups[static_cast<size_t>(gi)];
  const int first = station_first(l, gi);
  const int E = l.topology.experts, R = l.topology.expert_replicas;
  shard_role role;
  role.index = first + rank;
  role.layers = range{g.first_layer, g.end_layer};
  for (int k = 0; k < g.tp; ++k) role.group.push_back(first + k);
  if (E > 0) {
    // The stage shard, then its expert nodes first+1..first+E; replica j of
    // expert e on node (e + j) mod E (assign_experts on equal nodes).
    std::vector<std::vector<int>> holders(static_cast<size_t>(m.n_experts));
    for (int e = 0; e < m.n_experts; ++e)
      for (int j = 0; j < R; ++j) holders[static_cast<size_t>(e)].push_back(first + 1 + (e + j) % E);
    if (rank > 0) {
      role.expert_node = true;
      for (int e = 0; e < m.n_experts; ++e) {
        const auto& h = holders[static_cast<size_t>(e)];
        if (std::find(h.begin(), h.end(), role.index) != h.end()) role.experts.push_back(e);
      }
      return program_of(role);
    }
    for (int k = 1; k <= E; ++k) role.expert_nodes.push_back(first + k);
    role.holders = std::move(holders);
  }
  role.rank = rank;
  role.has_embedding = gi == 0 && rank == 0;
  role.has_classifier = gi + 1 == n;
  if (role.has_classifier) role.vocab = split_even(m.vocab, g.tp)[static_cast<size_t>(rank)];
  if (gi + 1 < n)
    for (int k = 0; k < l.groups[static_cast<size_t>(gi + 1)].tp; ++k)
      role.next_group.push_back(first + g.tp + E + k);
  role.reduce = r.assume.scatter_gather ? reduce_algorithm::scatter_gather : reduce_algorithm::direct_rank_order;
  return program_of(role);
}

chain_costs chain_cost(const plan_request& r, const plan_layout& l, int b) {
  const model_spec& m = r.model;
  const rates x = rates_of(r);
  const int L = r.context;
  const bool expert_topo = l.topology.kind == plan_kind::expert;
  const double act = m.act_bytes;
  const double xbytes = static_cast<double>(b) * m.dim * act;  // one dim-vector per sequence
  chain_costs out;
  double busiest_s = -1;
  const int n_groups = static_cast<int>(l.groups.size());
  // Pipeline, tensor, hybrid: what each station's rank 0 does per position
  // is read off its program, the list place() would give it (program.hpp).
  std::vector<std::vector<shard_step>> progs;
  std::vector<program_counts> counts;
  if (!expert_topo)
    for (int gi = 0; gi < n_groups; ++gi) {
      progs.push_back(station_program(r, l, gi, 0));
      counts.push_back(count_program(progs.back(), station_first(l, gi), m.dim));
    }
  for (int gi = 0; gi < n_groups; ++gi) {
    const plan_group& g = l.groups[static_cast<size_t>(gi)];
    const int T = g.tp;
    const double share = x.parallel > 0 ? std::ceil(static_cast<double>(T) / x.parallel) : 1.0;
    const bool pool = expert_topo && (gi == 0 || gi == n_groups - 1);
    // The hop into the group.
    cost_terms hop;
    if (!expert_topo) {
      if (gi == 0) {
        hop += message(x, 1, 4.0 * b);  // the token ids from the session
        const program_counts& c = counts.front();  // the embed op: x to the rest of the group
        if (c.embed_messages > 0) hop += message(x, c.embed_messages, static_cast<double>(c.embed_floats) * b * act);
      } else {
        const program_counts& prev = counts[static_cast<size_t>(gi - 1)];  // its forward op
        double to = prev.forward_messages, floats = static_cast<double>(prev.forward_floats);
        if (r.assume.peer_forwarding && l.groups[static_cast<size_t>(gi - 1)].tp == T) {
          to = 1;  // what-if: rank i -> rank i, in parallel
          floats = m.dim;
        }
        hop += message(x, to, floats * b * act);
      }
    } else if (gi == 0) {
      hop += message(x, 1, 4.0 * b);  // the token ids from the session
      if (!pool && T > 1) hop += message(x, T - 1, (T - 1) * xbytes);  // rank 0 broadcasts x
    } else {
      const int copies = pool ? 1 : T;  // a pool: the rows' owner gets x (classifier: every rank)
      int to = (pool && g.classifier) ? T : copies;
      const plan_group& prev = l.groups[static_cast<size_t>(gi - 1)];
      const bool prev_pool = gi - 1 == 0;
      if (r.assume.peer_forwarding && !pool && !prev_pool && prev.tp == T) to = 1;  // rank i -> rank i, in parallel
      hop += message(x, to, to * xbytes);
    }
    // The group's work for one step of b sequences.
    cost_terms work;
    double read_busiest = 0;
    if (pool) {
      const double rows = g.classifier ? ceil_div(m.vocab, T) : 0;
      const double read = g.classifier ? rows * m.dim * m.weight_bytes : b * m.dim * m.weight_bytes;
      const double flops = g.classifier ? 2.0 * b * rows * m.dim : 0;
      work.compute_s += node_time(x, read, flops);
      read_busiest += read;
    } else {
      std::vector<int> layers;  // the station's layers: its program's (expert topology: the group's)
      if (!expert_topo) layers = counts[static_cast<size_t>(gi)].layers;
      else
        for (int layer = g.first_layer; layer < g.end_layer; ++layer) layers.push_back(layer);
      for (int layer : layers) {
        const double dense_p = rank_layer_params(m, layer, T);
        double read = dense_p * m.weight_bytes + rank_cache_read(m, layer, T, L, b);
        double flops = b * (2.0 * dense_p + attention_flops(m, layer, L) / T);
        if (g.experts_inside && m.moe_layer(layer)) {
          read += distinct_experts(m.n_experts, m.n_active_experts, b) * expert_bytes(m) / T;
          flops += b * 2.0 * m.n_active_experts * expert_params(m) / T;
        }
        work.compute_s += node_time(x, read, flops) * share;
        read_busiest += read;
        if (expert_topo && T > 1) {
          // Two all-reduces (after attention, after the FFN): each rank sends
          // its partial to the T-1 others (the runtime's direct exchange), or
          // 1/T of it to each, then its finished 1/T to each (scatter_gather).
          for (int k = 0; k < 2; ++k)
            for (int round = 0; round < (r.assume.scatter_gather ? 2 : 1); ++round) {
              cost_terms ar = message(x, (T - 1) * share,
                                      (T - 1) * xbytes / (r.assume.scatter_gather ? T : 1));
              ar.syncs = 1;
              ar.sync_messages = ar.messages;  // a round's messages, not a hop's
              ar.messages = 0;
              ar.sync_handled = 2.0 * (T - 1);  // the busiest rank sends T-1 and receives T-1
              work += ar;
            }
        }
        if (expert_topo && m.moe_layer(layer)) {
          // Dispatch the latent vectors to the chosen experts, run them, combine.
          const double distinct = distinct_experts(m.n_experts, m.n_active_experts, b);
          const double lat_bytes = static_cast<double>(b) * m.n_active_experts * m.routed_dim() * act / T;
          const double msgs = std::ceil(distinct / T);
          work += expert_message(x, msgs, lat_bytes);
          work.handled += 2 * msgs;  // dispatched and combined back
          const int epn = std::max(1, std::min(l.experts_per_node, m.n_experts));
          const double hits = std::max(1.0, std::min<double>(epn, distinct_experts(m.n_experts, m.n_active_experts, b) *
                                                                      epn / m.n_experts));
          const double tokens = std::max(1.0, static_cast<double>(b) * m.n_active_experts * epn /
                                                  (static_cast<double>(m.n_experts) * std::max(1, l.expert_copies)));
          const double e_read = hits * expert_bytes(m);
          work.compute_s += node_time(x, e_read, tokens * 2.0 * expert_params(m));
          out.read_bytes_busiest = std::max(out.read_bytes_busiest, e_read);
          work += expert_message(x, msgs, lat_bytes);
        }
      }
      if (!expert_topo) {
        // The program's reduce ops, round by round: each rank sends its
        // partial to the T-1 others (direct), or a reduce-scatter and an
        // all-gather round (scatter_gather; program.hpp reduce_rounds).
        for (const reduce_round& rd : counts[static_cast<size_t>(gi)].rounds) {
          cost_terms ar = message(x, rd.messages * share, static_cast<double>(rd.floats) * b * act);
          ar.syncs = 1;
          ar.sync_messages = ar.messages;  // a round's messages, not a hop's
          ar.messages = 0;
          ar.sync_handled = 2.0 * rd.messages;  // the busiest rank sends T-1 and receives T-1
          work += ar;
        }
        // The runtime's expert placement: per MoE layer the program's
        // dispatch sends xb to the expert nodes its positions chose
        // (expected under uniform routing, program.hpp expected_dispatch),
        // they compute, and the combine gets every chosen expert's output.
        for (const shard_step& st : progs[static_cast<size_t>(gi)]) {
          if (st.op != shard_op::dispatch || !m.moe_layer(st.layers.begin)) continue;
          const dispatch_traffic dt = expected_dispatch(st, m.n_experts, m.n_active_experts, b);
          const double vec = static_cast<double>(m.routed_dim()) * act;
          work += expert_message(x, dt.messages, dt.vectors_out * vec);
          const double e_read = std::max(1.0, dt.busiest_experts) * expert_bytes(m);
          work.compute_s += node_time(x, e_read, std::max(1.0, dt.busiest_pairs) * 2.0 * expert_params(m));
          out.read_bytes_busiest = std::max(out.read_bytes_busiest, e_read);
          work += expert_message(x, dt.messages, dt.vectors_back * vec);
          work.handled += 2 * dt.messages;  // dispatched and combined back
        }
      }
      const bool embeds = expert_topo ? g.embedding : counts[static_cast<size_t>(gi)].embedding_rows > 0;
      // Classifier rows of the busiest rank: its program's vocabulary slice.
      const double rows = expert_topo ? (g.classifier ? m.vocab : 0) : counts[static_cast<size_t>(gi)].classifier_rows;
      if (embeds) {
        const double read = b * m.dim * m.weight_bytes;
        work.compute_s += node_time(x, read, 0);
        read_busiest += read;
      }
      if (rows > 0) {
        const double read = rows * m.dim * m.weight_bytes;
        work.compute_s += node_time(x, read, 2.0 * b * rows * m.dim);
        read_busiest += read;
      }
    }
    out.read_bytes_busiest = std::max(out.read_bytes_busiest, read_busiest);
    out.read_bytes_chain += read_busiest;
    // Messages the station's busiest rank handles besides its all-reduces:
    // the hop in (received; rank 0 of the first group also sends the T-1
    // copies of x), and the hop out (the previous station sends `to`).
    work.handled += 1;
    if (gi == 0 && !pool && T > 1) work.handled += T - 1;
    if (r.hw.cpu_quota > 0 && r.hw.cpu_quota < 1) {
      // A quota node: the station's step on the chain is throttled once it
      // has spent the period's quota; a busy station sustains the quota.
      const double eff = r.assume.compute_efficiency > 0 ? r.assume.compute_efficiency : 1.0;
      const double w = work.compute_s / eff;
      work.throttle_s = quota_step_seconds(w, r.hw.cpu_quota, r.hw.cpu_quota_period_s) - w;
      work.quota = r.hw.cpu_quota;
    }
    work.concurrent = r.batch > 1;  // several sequences' steps interleave on the station
    if (gi > 0) out.station_work.back().handled += hop.messages;
    out.station_hop.push_back(hop);
    out.station_work.push_back(work);
    out.chain += hop;
    out.chain += work;
  }
  // Back to the session: the logits (vocab f32 per sequence), from every
  // classifier node, received on the session's link; or a token id.
  // Pipeline, tensor, hybrid: every rank of the last stage whose program
  // classifies sends its slice.
  const plan_group& last = l.groups.back();
  int senders = expert_topo ? last.tp : 0;
  if (!expert_topo)
    for (int k = 0; k < last.tp; ++k)
      senders += count_program(station_program(r, l, n_groups - 1, k), station_first(l, n_groups - 1) + k, m.dim)
                     .logits_messages;
  out.return_hop = r.assume.logits_to_session ? message(x, senders, 4.0 * b * m.vocab) : message(x, 1, 4.0 * b);
  out.chain += out.return_hop;
  out.station_work.back().handled += out.return_hop.messages;
  for (const auto& w : out.station_work) {
    const double s = w.busy_seconds(r.assume);
    if (s > busiest_s) {
      busiest_s = s;
      out.busiest = w;
    }
  }
  return out;
}

result<plan_layout> lay_out(const plan_request& r) {
  const model_spec& m = r.model;
  if (m.n_layers <= 0 || m.dim <= 0 || m.vocab <= 0) return make_error("model '" + m.name + "' has no shape");
  if (r.nodes < 1) return make_error("--nodes must be at least 1");
  if (r.batch < 1) return make_error("--batch must be at least 1");
  if (r.context < 1) return make_error("--context must be at least 1");
  const double budget = static_cast<double>(r.hw.node.memory_bytes);
  const int limit = tp_limit(m);
  plan_topology t = r.topology;
  plan_layout l;

  if (t.kind == plan_kind::expert) {
    if (!m.is_moe()) return make_error("--topology expert: model '" + m.name + "' has no experts");
    if (t.tp > limit) {
      return make_error("--topology " + to_string(t) + ": a TP group of " + std::to_string(t.tp) +
                        " exceeds the model's limit of " + std::to_string(limit));
    }
    int Te = pool_size(m, budget, r.batch, false);
    int Tc = pool_size(m, budget, r.batch, true);
    const bool pools_fit = Te > 0 && Tc > 0;
    if (!pools_fit) Te = Tc = std::max(1, std::min(limit, r.nodes / 4));
    // Search layers per group g and TP width T for the lowest time per token
    // among the layouts that fit (T fixed when given).
    bool found = false;
    double best = inf;
    plan_request probe = r;
    for (int g = 1; g <= m.n_layers; ++g) {
      if (g > 1 && ceil_div(m.n_layers, g) == ceil_div(m.n_layers, g - 1)) continue;
      const int t_lo = t.tp > 0 ? t.tp : 1;
      const int t_hi = t.tp > 0 ? t.tp : limit;
      for (int T = t_lo; T <= t_hi; ++T) {
        plan_layout cand;
        if (!expert_layout(r, g, T, Te, Tc, cand)) continue;
        if (!pools_fit || !layout_fits(cand, budget)) continue;
        // Objective: time per token per sequence at the requested batch.
        const int b = std::max(1, ceil_div(r.batch, static_cast<int>(cand.groups.size())));
        const chain_costs cc = chain_cost(probe, cand, b);
        const double s = std::max(cc.chain.seconds(r.assume), r.batch / static_cast<double>(b) *
                                                                  cc.busiest.busy_seconds(r.assume));
        if (s < best) {
          best = s;
          l = std::move(cand);
          found = true;
        }
      }
    }
    if (!found) {
      // Nothing fits: the layout that needs the least memory per node, so
      // check 1 can say by how much it misses.
      bool any = false;
      double least = inf;
      for (int g = 1; g <= m.n_layers && !any; ++g) {
        for (int T = t.tp > 0 ? t.tp : limit; T >= 1; --T) {
          plan_layout cand;
          if (!expert_layout(r, g, T, Te, Tc, cand)) continue;
          double worst = cand.expert_node_bytes;
          for (const auto& gr : cand.groups) worst = std::max(worst, gr.total_bytes());
          if (worst < least) {
            least = worst;
            l = std::move(cand);
            any = true;
          }
        }
      }
      if (!any) {
        return make_error("--topology expert: " + std::to_string(r.nodes) + " nodes cannot hold " +
                          std::to_string(m.n_layers) + " layer groups, the vocabulary pools and an expert node");
      }
    }
    return l;
  }

  int P = 1, T = 1;
  switch (t.kind) {
    case plan_kind::pipeline:
      P = t.stages > 0 ? t.stages : std::min(m.n_layers, r.nodes / (1 + std::max(t.experts, 0)));
      P = std::max(P, 1);
      T = 1;
      break;
    case plan_kind::tensor:
      T = t.tp > 0 ? t.tp : std::min(limit, r.nodes);
      P = 1;
      break;
    case plan_kind::hybrid:
      P = t.stages;
      T = t.tp;
      break;
    default: break;
  }
  if (P > m.n_layers) {
    return make_error("--topology " + to_string(t) + ": " + std::to_string(P) + " stages but the model has " +
                      std::to_string(m.n_layers) + " layers");
  }
  if (T > limit) {
    return make_error("--topology " + to_string(t) + ": a TP group of " + std::to_string(T) +
                      " exceeds the model's limit of " + std::to_string(limit) + " (KV heads / heads / FFN units)");
  }
  const int E = t.kind == plan_kind::pipeline ? std::max(t.experts, 0) : 0, R = t.expert_replicas;
  if (E > 0) {
    if (!m.is_moe()) return make_error("--topology " + to_string(t) + ": model '" + m.name + "' has no experts");
    if (E > m.n_experts)
      return make_error("--topology " + to_string(t) + ": " + std::to_string(E) + " expert nodes per stage for " +
                        std::to_string(m.n_experts) + " experts per layer");
    if (R < 1 || R > E)
      return make_error("--expert-replicas " + std::to_string(R) + ": expected 1.." + std::to_string(E));
  }
  if (static_cast<long>(P) * (T + E) > r.nodes) {
    return make_error("--topology " + to_string(t) + " needs " + std::to_string(P * (T + E)) +
                      " nodes, --nodes is " + std::to_string(r.nodes));
  }
  // Layer counts as the runtime splits them (placement.hpp): equal nodes,
  // extra layers first to middle stages (tie cost 1 on the first and last).
  std::vector<double> weight(static_cast<size_t>(P), 1.0), tie(static_cast<size_t>(P), 0.0);
  if (P > 1) tie.front() = tie.back() = 1.0;
  auto split = split_weighted(m.n_layers, weight, {}, tie);
  if (!split) return make_error("--topology " + to_string(t) + ": " + split.message());
  l.topology = plan_topology{t.kind, P, T, E, E > 0 ? R : 1};
  l.layers_per_group = ceil_div(m.n_layers, P);
  int most_moe = 0;  // MoE layers of the longest stage
  for (int s = 0; s < P; ++s) {
    const range& rg = (*split)[static_cast<size_t>(s)];
    // With expert nodes the stage shard holds no routed expert.
    l.groups.push_back(
        layer_group(m, rg.begin, rg.end, T, r.batch, r.context, s == 0, s == P - 1, m.is_moe() && E == 0));
    int moe = 0;
    for (int k = rg.begin; k < rg.end; ++k) moe += m.moe_layer(k) ? 1 : 0;
    most_moe = std::max(most_moe, moe);
  }
  l.used_nodes = P * T;
  if (E > 0) {
    // Expert nodes hold whole experts of every MoE layer of their stage: the
    // fullest ceil(n x R / E) per layer (placement.cpp place_expert).
    l.expert_nodes = P * E;
    l.expert_copies = R;
    l.experts_per_node = most_moe * ceil_div(m.n_experts * R, E);
    l.expert_node_bytes = expert_node_bytes(m, l.experts_per_node, r.batch);
    l.used_nodes += P * E;
  }
  l.spare_nodes = r.nodes - l.used_nodes;
  return l;
}

namespace {

std::string bytes_text(double b) {
  if (b >= 1e12) return fmt("%.2f TB", b / 1e12);
  if (b >= 1e9) return fmt("%.2f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}

std::string mib_text(double b) { return fmt("%.1f MiB", b / 1048576.0); }

std::string rate_text(double tps) {
  if (!std::isfinite(tps)) return "unbounded";
  if (tps >= 100) return fmt("%.0f tokens/s", tps);
  if (tps >= 1) return fmt("%.2f tokens/s", tps);
  return fmt("%.3g tokens/s", tps);
}

}  // namespace

std::string human_seconds(double s) {
  if (!std::isfinite(s)) return "never";
  if (std::fabs(s) < 5e-8) return "0 us";
  if (s >= 86400 * 365.25 * 2) return fmt("%.1f years", s / (86400 * 365.25));
  if (s >= 86400 * 2) return fmt("%.1f days", s / 86400);
  if (s >= 7200) return fmt("%.1f h", s / 3600);
  if (s >= 120) return fmt("%.1f min", s / 60);
  if (s >= 1) return fmt("%.2f s", s);
  if (s >= 1e-3) return fmt("%.2f ms", s * 1e3);
  return fmt("%.1f us", s * 1e6);
}

std::string human_si(double v, const std::string& unit) {
  const double a = std::fabs(v);
  if (a >= 1e9) return fmt("%.2f G", v / 1e9) + unit;
  if (a >= 1e6) return fmt("%.2f M", v / 1e6) + unit;
  if (a >= 1e3) return fmt("%.2f k", v / 1e3) + unit;
  return fmt("%.3g ", v) + unit;
}

result<plan_result> plan(const plan_request& r) {
  auto lay = lay_out(r);
  if (!lay) return lay.err();
  plan_result p;
  p.request = r;
  p.layout = *lay;
  const plan_layout& l = p.layout;
  const model_spec& m = r.model;
  const plan_assumptions& a = r.assume;
  const rates x = rates_of(r);
  const double eff = a.compute_efficiency > 0 ? a.compute_efficiency : 1.0;

  // 1. Memory: the busiest node against the budget.
  p.memory_budget_bytes = static_cast<double>(r.hw.node.memory_bytes);
  for (const auto& g : l.groups) {
    if (g.total_bytes() > p.memory_per_node_bytes) {
      p.memory_per_node_bytes = g.total_bytes();
      p.memory_busiest = g.role;
    }
  }
  if (l.expert_nodes > 0 && l.expert_node_bytes > p.memory_per_node_bytes) {
    p.memory_per_node_bytes = l.expert_node_bytes;
    p.memory_busiest = "expert node (" + std::to_string(l.experts_per_node) + " experts)";
  }
  p.memory_fit = p.memory_per_node_bytes <= p.memory_budget_bytes;
  p.model_bytes = weight_bytes_total(m);
  p.cluster_memory_bytes = static_cast<double>(r.nodes) * p.memory_budget_bytes;

  // 2-4. Chain at batch 1 and at the micro-batch of the requested batch.
  const chain_costs c1 = chain_cost(r, l, 1);
  const int stations = static_cast<int>(l.groups.size());
  p.micro_batch = r.assume.one_sequence_per_step ? 1 : std::max(1, ceil_div(r.batch, stations));
  const chain_costs cb = chain_cost(r, l, p.micro_batch);

  p.read_bytes_per_token = c1.read_bytes_busiest;
  p.bandwidth_bound_tokens_per_s = x.mem_Bps > 0 && p.read_bytes_per_token > 0
                                       ? x.mem_Bps * eff / p.read_bytes_per_token
                                       : inf;
  p.bandwidth_bound_sequence_tokens_per_s =
      x.mem_Bps > 0 && c1.read_bytes_chain > 0 ? x.mem_Bps * eff / c1.read_bytes_chain : inf;

  // 3. Links, at batch 1: every node's sent and received bytes per token.
  {
    const double act = m.act_bytes, xv = m.dim * act;
    double worst = 0;
    std::string who;
    auto consider = [&](double sent, double received, const std::string& role) {
      const double v = std::max(sent, received);
      if (v > worst) {
        worst = v;
        who = role;
      }
    };
    const bool expert_topo = l.topology.kind == plan_kind::expert;
    double wire = 0;
    double expert_node_in = 0, expert_node_out = 0;  // the runtime's busiest expert node, per token (vectors)
    for (size_t gi = 0; gi < l.groups.size(); ++gi) {
      const plan_group& g = l.groups[gi];
      const bool pool = expert_topo && (gi == 0 || gi + 1 == l.groups.size());
      double next_copies = gi + 1 < l.groups.size() ? l.groups[gi + 1].tp : 0;
      if (a.peer_forwarding && gi + 1 < l.groups.size() && l.groups[gi + 1].tp == g.tp && !pool &&
          !(expert_topo && gi + 2 == l.groups.size())) {
        next_copies = 1;
      }
      double sent = 0, recv = 0;
      if (!expert_topo) {
        // Rank 0's traffic from its program (program.hpp): embed, reduces,
        // forward (or the what-if's one copy), its logits slice; it receives
        // the token or x, and as much in its reduces as it sends.
        const int gii = static_cast<int>(gi);
        const auto prog = station_program(r, l, gii, 0);
        const program_counts c = count_program(prog, station_first(l, gii), m.dim);
        // Expert placement: expected vectors per token to and from the
        // stage's expert nodes, and those of its busiest one (the same node
        // in every layer: the holders are the stage's).
        double disp_out = 0, disp_back = 0, node_in = 0, node_out = 0;
        for (const shard_step& st : prog)
          if (st.op == shard_op::dispatch && m.moe_layer(st.layers.begin)) {
            const dispatch_traffic dt = expected_dispatch(st, m.n_experts, m.n_active_experts, 1);
            disp_out += dt.vectors_out;
            disp_back += dt.vectors_back;
            node_in += dt.busiest_in;
            node_out += dt.busiest_pairs;
          }
        expert_node_in = std::max(expert_node_in, node_in);
        expert_node_out = std::max(expert_node_out, node_out);
        const double sync = static_cast<double>(c.reduce_floats) * act + disp_out * m.routed_dim() * act;
        const double fwd = next_copies == 1 && c.forward_messages > 1 ? xv : static_cast<double>(c.forward_floats) * act;
        recv = (gi == 0 ? 4 : xv) + static_cast<double>(c.reduce_floats) * act + disp_back * m.routed_dim() * act;
        sent = sync + static_cast<double>(c.embed_floats) * act + fwd;
        wire += disp_back * m.routed_dim() * act;  // the expert nodes' outputs back
        if (gi + 1 == l.groups.size()) sent += a.logits_to_session ? 4.0 * static_cast<double>(c.logits_floats) : 4;
        consider(sent, recv, g.role + (g.tp > 1 ? ", rank 0" : ""));
        wire += sent;
        // The other ranks: their reduces (rank 0's reduce ops name the whole
        // group) and, on the last stage, their logits slices.
        for (int k = 1; k < g.tp; ++k) {
          for (const shard_step& st : prog)
            for (const reduce_round& rd : reduce_rounds(st, k, m.dim)) wire += static_cast<double>(rd.floats) * act;
          if (gi + 1 == l.groups.size() && a.logits_to_session)
            wire += 4.0 * count_program(station_program(r, l, gii, k), station_first(l, gii) + k, m.dim).logits_floats;
        }
        continue;
      }
      if (pool) {
        recv = g.classifier ? xv : 4;
        sent = g.classifier ? (a.logits_to_session ? 4.0 * ceil_div(m.vocab, g.tp) : 4) : next_copies * xv;
      } else {
        const int layers = g.end_layer - g.first_layer;
        int moe = 0;
        for (int k = g.first_layer; k < g.end_layer; ++k) moe += m.moe_layer(k) ? 1 : 0;
        // Per rank and all-reduce: T-1 vectors direct, 2(T-1)/T scattered.
        const double per_reduce = g.tp > 1 ? (a.scatter_gather ? 2.0 * (g.tp - 1) / g.tp : g.tp - 1.0) * xv : 0;
        const double sync = 2.0 * layers * per_reduce;
        const double disp = expert_topo ? moe * std::ceil(static_cast<double>(m.n_active_experts) / g.tp) *
                                              m.routed_dim() * act
                                        : 0;
        recv = (gi == 0 ? 4 : xv) + sync + disp;
        sent = sync + disp + (gi == 0 && g.tp > 1 ? (g.tp - 1) * xv : 0);
        if (gi + 1 < l.groups.size()) sent += next_copies * xv;
        else sent += a.logits_to_session ? 4.0 * m.vocab : 4;
      }
      consider(sent, recv, g.role + (g.tp > 1 && !pool ? ", rank 0" : ""));
      wire += sent;  // rank 0's traffic; the other ranks' all-reduce traffic below
      if (!pool && g.tp > 1) {
        const int layers = g.end_layer - g.first_layer;
        wire += (g.tp - 1) * 2.0 * layers * (a.scatter_gather ? 2.0 * (g.tp - 1) / g.tp : g.tp - 1.0) * xv;
      }
    }
    if (!expert_topo && l.expert_nodes > 0) {
      // The runtime's expert nodes (their traffic is in `wire` above, with
      // the stage shards'): the busiest receives xb with probability p_i per
      // MoE layer and returns its share of the pairs.
      consider(expert_node_out * m.routed_dim() * act, expert_node_in * m.routed_dim() * act, "expert node");
    } else if (l.expert_nodes > 0) {
      // Expert nodes: a token reaches a given expert node at most once per MoE
      // layer; the busiest holds experts of one layer.
      consider(m.routed_dim() * act, m.routed_dim() * act, "expert node");
      wire += 2.0 * m.moe_layers() * m.n_active_experts * m.routed_dim() * act;
    }
    consider(4, a.logits_to_session ? 4.0 * m.vocab : 4, "session");
    p.link_bytes_per_token = worst;
    p.link_busiest = who;
    p.wire_bytes_per_token = wire;
    p.link_bound_tokens_per_s = x.link_Bps > 0 && worst > 0 ? x.link_Bps / worst : inf;
  }

  // 4. The serial chain.
  p.hops = static_cast<int>(std::lround(c1.chain.hops));
  p.chain_latency_s = c1.chain.hops * x.lat_s;
  p.chain_transfer_s = c1.chain.wire_s - p.chain_latency_s;
  p.chain_compute_s = c1.chain.compute_s / eff + c1.chain.throttle_s;  // a throttled step is compute time too
  for (const auto& w : c1.station_work) p.chain_busy_compute_s += w.compute_s / (eff * (w.quota > 0 ? w.quota : 1.0));
  p.chain_s = c1.chain.seconds(a);
  p.chain_overhead_s = p.chain_s - p.chain_latency_s - p.chain_transfer_s - p.chain_compute_s;
  {
    // B sequences form m = ceil(B / b) micro-batches (the last one holds the
    // remainder); every micro-batch passes every station once per token, so
    // a token round takes max(chain(b), max over stations of the sum of its
    // work on the m micro-batches).
    const int m_batches = ceil_div(r.batch, p.micro_batch);
    const int rest = r.batch - (m_batches - 1) * p.micro_batch;
    const chain_costs cr = rest == p.micro_batch ? cb : chain_cost(r, l, rest);
    double station_round = 0;
    for (size_t s = 0; s < cb.station_work.size(); ++s) {
      station_round = std::max(station_round, (m_batches - 1) * cb.station_work[s].busy_seconds(a) +
                                                  cr.station_work[s].busy_seconds(a));
    }
    const double by_chain = r.batch / cb.chain.seconds(a);
    const double by_station = r.batch / std::max(station_round, 1e-300);
    p.tokens_per_s = std::min({by_chain, by_station, p.link_bound_tokens_per_s});
    p.throughput_limit = p.tokens_per_s == by_chain     ? "serial chain"
                         : p.tokens_per_s == by_station ? "busiest station"
                                                        : "links";
    p.per_token_latency_s = r.batch / p.tokens_per_s;
  }

  // 5. Failures: lambda = used nodes x failures per node-hour; a request of
  // T tokens lasts T x per-token time; P(meets one) = 1 - exp(-lambda t)
  // (exponential failure times). Goodput = throughput x (1 - lambda x
  // downtime), downtime = detect + recover + reload + replay.
  {
    const double per_node_h = r.hw.failures_per_year / hours_per_year;
    p.failures_per_hour = l.used_nodes * per_node_h;
    p.request_seconds = a.request_tokens * p.per_token_latency_s;
    p.request_failure_probability = 1.0 - std::exp(-p.failures_per_hour / 3600.0 * p.request_seconds);
    double reload_sum = 0, weight_nodes = 0;
    for (const auto& g : l.groups) {
      reload_sum += g.tp * g.weight_bytes;
      weight_nodes += g.tp;
    }
    if (l.expert_nodes > 0) {
      reload_sum += l.expert_nodes * l.experts_per_node * expert_bytes(m);
      weight_nodes += l.expert_nodes;
    }
    const double mean_weights = weight_nodes > 0 ? reload_sum / weight_nodes : 0;
    const double reload = a.reload_over_link && x.link_Bps > 0 ? mean_weights / x.link_Bps : 0;
    // Replay: on average half a checkpoint interval of positions through the
    // failed station (DESIGN.md recovery step 3).
    const double replay = 0.5 * a.checkpoint_every * c1.busiest.seconds(a);
    p.downtime_per_failure_s = a.detect_s + a.recover_s + reload + replay;
    const double lost = std::min(1.0, p.failures_per_hour / 3600.0 * p.downtime_per_failure_s);
    p.goodput_tokens_per_s = p.tokens_per_s * (1.0 - lost);
    p.spares_last_hours = p.failures_per_hour > 0 ? l.spare_nodes / p.failures_per_hour : inf;
  }

  // 6. Cost: used nodes at load power, spares at idle power; energy per token
  // = power / goodput; cost/hour = kW x $/kWh + price x nodes / (years x 8766 h).
  {
    p.power_w = l.used_nodes * r.hw.node.power_w + l.spare_nodes * r.hw.spare_power_w();
    const double tps = p.goodput_tokens_per_s;
    p.energy_per_token_j = tps > 0 ? p.power_w / tps : inf;
    p.hardware_usd = r.nodes * r.hw.price_usd;
    p.usd_per_hour = p.power_w / 1000.0 * a.electricity_usd_per_kwh +
                     (a.amortisation_years > 0 ? p.hardware_usd / (a.amortisation_years * hours_per_year) : 0);
    p.cost_per_million_tokens_usd = tps > 0 ? p.usd_per_hour / (tps * 3600.0) * 1e6 : inf;
  }

  // Verdicts.
  {
    plan_check c;
    c.number = 1;
    c.name = "memory";
    c.value = mib_text(p.memory_per_node_bytes) + " of " + mib_text(p.memory_budget_bytes);
    c.verdict = p.memory_fit ? "fits" : "does not fit";
    c.detail = "busiest node: " + p.memory_busiest + "; model weights " + bytes_text(p.model_bytes) + " in " +
               bytes_text(p.cluster_memory_bytes) + " of cluster memory";
    for (const auto& g : l.groups) {
      if (g.role == p.memory_busiest) {
        c.detail += " (weights " + mib_text(g.weight_bytes) + " + KV/state " + mib_text(g.cache_bytes) +
                    " + buffers " + mib_text(g.buffer_bytes) + ")";
        break;
      }
    }
    p.checks.push_back(c);
  }
  {
    plan_check c;
    c.number = 2;
    c.name = "bandwidth";
    c.value = rate_text(p.bandwidth_bound_tokens_per_s) + " per node";
    c.verdict = p.tokens_per_s >= 0.8 * p.bandwidth_bound_tokens_per_s ? "bottleneck" : "ok";
    c.detail = "busiest node reads " + bytes_text(p.read_bytes_per_token) + " per token at " +
               fmt("%.4g GB/s", r.hw.node.mem_bandwidth_gbs * eff) + "; one sequence through the chain: " +
               rate_text(p.bandwidth_bound_sequence_tokens_per_s);
    p.checks.push_back(c);
  }
  {
    plan_check c;
    c.number = 3;
    c.name = "links";
    c.value = bytes_text(p.link_bytes_per_token) + " per token";
    c.verdict = p.link_bound_tokens_per_s <= 1.25 * p.tokens_per_s ? "bottleneck" : "ok";
    c.detail = "busiest link: " + p.link_busiest + " -> at most " + rate_text(p.link_bound_tokens_per_s) + " on " +
               to_string(r.hw.node.link) + fmt(" (x %.3g payload)", a.link_efficiency) + "; all links carry " +
               bytes_text(p.wire_bytes_per_token) + " per token";
    p.checks.push_back(c);
  }
  {
    plan_check c;
    c.number = 4;
    c.name = "serial chain";
    c.value = human_seconds(p.chain_s) + " per token";
    c.verdict = p.throughput_limit == "serial chain" ? "bottleneck" : "ok";
    c.detail = std::to_string(p.hops) + " hops x " + human_seconds(x.lat_s) + " = " +
               human_seconds(p.chain_latency_s) + " latency + " + human_seconds(p.chain_transfer_s) +
               " transfer + " + human_seconds(p.chain_compute_s) + " compute + " +
               human_seconds(p.chain_overhead_s) + " software overhead; batch " + std::to_string(r.batch) +
               " (micro-batches of " + std::to_string(p.micro_batch) + "): " + rate_text(p.tokens_per_s) + ", " +
               human_seconds(p.per_token_latency_s) + " per token per sequence, limited by the " +
               p.throughput_limit;
    p.checks.push_back(c);
  }
  {
    plan_check c;
    c.number = 5;
    c.name = "failures";
    c.value = fmt("%.3g per hour", p.failures_per_hour);
    const double kept = p.tokens_per_s > 0 ? p.goodput_tokens_per_s / p.tokens_per_s : 1;
    c.verdict = kept >= 0.99 ? "ok" : kept >= 0.9 ? "warning" : "bottleneck";
    c.detail = std::to_string(l.used_nodes) + " nodes x " + fmt("%.3g", r.hw.failures_per_year) +
               "/yr; a request of " + std::to_string(a.request_tokens) + " tokens (" +
               human_seconds(p.request_seconds) + ") meets one with p = " +
               fmt("%.3g", p.request_failure_probability) + "; each costs " +
               human_seconds(p.downtime_per_failure_s) + " (detect " + human_seconds(a.detect_s) +
               " + recover + reload + replay); goodput " + rate_text(p.goodput_tokens_per_s) + fmt(" (%.4g%%)", kept * 100) +
               "; " + (l.spare_nodes > 0 ? std::to_string(l.spare_nodes) + " spares last " +
                                               human_seconds(p.spares_last_hours * 3600)
                                         : std::string("no spares"));
    p.checks.push_back(c);
  }
  {
    plan_check c;
    c.number = 6;
    c.name = "cost";
    c.value = "$" + fmt("%.4g", p.cost_per_million_tokens_usd) + " per million tokens";
    c.verdict = "ok";
    c.detail = human_si(p.power_w, "W") + ", " + human_si(p.energy_per_token_j, "J") + " per token; $" +
               fmt("%.4g", p.usd_per_hour) + "/h = electricity at $" + fmt("%.3g", a.electricity_usd_per_kwh) +
               "/kWh + $" + fmt("%.4g", p.hardware_usd) + " of hardware over " +
               fmt("%.3g", a.amortisation_years) + " years";
    p.checks.push_back(c);
  }

  // Notes: cross-checks and what the layout is.
  {
    const double tot = total_params(m), act = active_params(m);
    std::string n = m.name + ": " + fmt("%.4g", tot / 1e9) + "B weights (" + fmt("%.4g", act / 1e9) +
                    "B active per token), " + bytes_text(p.model_bytes) + " as " + m.format;
    if (m.stated_total_params > 0) {
      n += "; stated " + fmt("%.4g", m.stated_total_params / 1e9) + "B / " +
           fmt("%.4g", m.stated_active_params / 1e9) + "B";
    }
    p.notes.push_back(n);
    if (m.context > 0 && r.context > m.context)
      p.notes.push_back("context " + std::to_string(r.context) + " is beyond " + m.name + "'s maximum of " +
                        std::to_string(m.context) + " positions; the KV cache is sized for " +
                        std::to_string(r.context) + " (--context " + std::to_string(m.context) +
                        " plans what the model can use)");
    std::string lay = "layout " + to_string(l.topology) + ": " + std::to_string(l.groups.size()) + " stations";
    if (l.topology.kind == plan_kind::expert) {
      lay += " (" + std::to_string(l.topology.stages) + " layer groups of " + std::to_string(l.layers_per_group) +
             " x TP " + std::to_string(l.topology.tp) + ", embedding pool " + std::to_string(l.groups.front().tp) +
             ", classifier pool " + std::to_string(l.groups.back().tp) + "), " + std::to_string(l.expert_nodes) +
             " expert nodes x " + std::to_string(l.experts_per_node) + " experts (" +
             std::to_string(l.expert_copies) + (l.expert_copies == 1 ? " copy" : " copies") + ")";
    } else if (l.expert_nodes > 0) {
      lay += " (stage shards), " + std::to_string(l.expert_nodes) + " expert nodes (" +
             std::to_string(l.topology.experts) + " per stage, each expert on " +
             std::to_string(l.expert_copies) + "; the fullest holds " + std::to_string(l.experts_per_node) +
             " layer-experts)";
    }
    lay += "; " + std::to_string(l.used_nodes) + " nodes used, " + std::to_string(l.spare_nodes) + " spare";
    p.notes.push_back(lay);
  }
  return p;
}

result<plan_result> plan_baseline(const plan_request& r, const hardware_spec& hw, int max_servers) {
  plan_request b;
  b.model = r.model;
  b.hw = hw;
  b.batch = r.batch;
  b.context = r.context;
  b.assume.electricity_usd_per_kwh = r.assume.electricity_usd_per_kwh;
  b.assume.amortisation_years = r.assume.amortisation_years;
  b.assume.request_tokens = r.assume.request_tokens;
  b.assume.logits_to_session = r.assume.logits_to_session;
  const int most = std::min(max_servers, r.model.n_layers);
  result<plan_result> last = make_error("no baseline");
  for (int s = 1; s <= most; ++s) {
    b.nodes = s;
    b.topology = plan_topology{plan_kind::pipeline, s, 1};
    last = plan(b);
    if (!last) return last;
    if (last->memory_fit) return last;
  }
  return last;
}

std::string to_text(const plan_result& p, const plan_result* base) {
  const plan_request& r = p.request;
  std::string out = "cellshard plan: " + r.model.name + " on " + std::to_string(r.nodes) + " x " + r.hw.node.name +
                    ", topology " + to_string(p.layout.topology) + ", batch " + std::to_string(r.batch) +
                    ", context " + std::to_string(r.context) + "\n";
  for (const auto& c : p.checks) {
    char head[160];
    std::snprintf(head, sizeof head, "%d. %-13s %-34s %s\n", c.number, c.name.c_str(), c.value.c_str(),
                  c.verdict.c_str());
    out += head;
    out += "   " + c.detail + "\n";
  }
  if (base) {
    out += "baseline: " + std::to_string(base->request.nodes) + " x " + base->request.hw.node.name + " (" +
           to_string(base->layout.topology) + "): " + (base->memory_fit ? "fits" : "does not fit") + ", " +
           human_seconds(base->chain_s) + " per token at batch 1, " + rate_text(base->tokens_per_s) +
           " at batch " + std::to_string(base->request.batch) + ", " + human_si(base->power_w, "W") + ", $" +
           fmt("%.4g", base->cost_per_million_tokens_usd) + " per million tokens";
    if (base->cost_per_million_tokens_usd > 0 && std::isfinite(p.cost_per_million_tokens_usd)) {
      out += fmt(" (this plan costs %.3g x as much)", p.cost_per_million_tokens_usd / base->cost_per_million_tokens_usd);
    }
    out += "\n";
  }
  for (const auto& n : p.notes) out += "note: " + n + "\n";
  return out;
}

std::string to_json(const plan_result& p, int indent) {
  auto num = [](double v) -> nlohmann::json {
    if (std::isfinite(v)) return v;
    return nullptr;  // unbounded / unknown
  };
  nlohmann::json j;
  const plan_request& r = p.request;
  j["model"] = r.model.name;
  j["hardware"] = r.hw.node.name;
  j["nodes"] = r.nodes;
  j["topology"] = to_string(p.layout.topology);
  j["batch"] = r.batch;
  j["context"] = r.context;
  j["hardware_detail"] = {{"memory_bytes", r.hw.node.memory_bytes},
                          {"mem_bandwidth_gbs", r.hw.node.mem_bandwidth_gbs},
                          {"gflops", r.hw.node.gflops},
                          {"link_bandwidth_bps", r.hw.node.link.bandwidth_bps},
                          {"link_latency_us", r.hw.node.link.latency_us},
                          {"power_w", r.hw.node.power_w},
                          {"price_usd", r.hw.price_usd},
                          {"failures_per_year", r.hw.failures_per_year},
                          {"parallel_nodes", r.hw.parallel_nodes},
                          {"source", r.hw.source}};
  j["memory_fit"] = p.memory_fit;
  j["memory_per_node_bytes"] = num(p.memory_per_node_bytes);
  j["memory_budget_bytes"] = num(p.memory_budget_bytes);
  j["bandwidth_bound_tokens_per_s"] = num(p.bandwidth_bound_tokens_per_s);
  j["bandwidth_bound_sequence_tokens_per_s"] = num(p.bandwidth_bound_sequence_tokens_per_s);
  j["link_bytes_per_token"] = num(p.link_bytes_per_token);
  j["link_bound_tokens_per_s"] = num(p.link_bound_tokens_per_s);
  j["per_token_latency_s"] = num(p.per_token_latency_s);
  j["chain_s"] = num(p.chain_s);
  j["hops"] = p.hops;
  j["tokens_per_s"] = num(p.tokens_per_s);
  j["failures_per_hour"] = num(p.failures_per_hour);
  j["request_failure_probability"] = num(p.request_failure_probability);
  j["goodput_tokens_per_s"] = num(p.goodput_tokens_per_s);
  j["energy_per_token_j"] = num(p.energy_per_token_j);
  j["cost_per_million_tokens_usd"] = num(p.cost_per_million_tokens_usd);
  j["power_w"] = num(p.power_w);
  j["used_nodes"] = p.layout.used_nodes;
  j["spare_nodes"] = p.layout.spare_nodes;
  j["model_bytes"] = num(p.model_bytes);
  j["total_params"] = total_params(r.model);
  j["active_params"] = active_params(r.model);
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& c : p.checks) {
    checks.push_back({{"number", c.number}, {"name", c.name}, {"value", c.value}, {"verdict", c.verdict},
                      {"detail", c.detail}});
  }
  j["checks"] = checks;
  j["notes"] = p.notes;
  const plan_assumptions& a = r.assume;
  j["assumptions"] = {{"compute_efficiency", a.compute_efficiency},
                      {"message_overhead_s", a.message_overhead_s},
                      {"expert_message_overhead_s", a.expert_message_overhead_s},
                      {"sync_overhead_s", a.sync_overhead_s},
                      {"sync_message_overhead_s", a.sync_message_overhead_s},
                      {"transfer_excess", a.transfer_excess},
                      {"message_cpu_s", a.message_cpu_s},
                      {"sync_message_cpu_s", a.sync_message_cpu_s},
                      {"batch_compute_efficiency", a.batch_compute_efficiency},
                      {"byte_overhead_s", a.byte_overhead_s},
                      {"link_efficiency", a.link_efficiency},
                      {"detect_s", a.detect_s},
                      {"recover_s", a.recover_s},
                      {"request_tokens", a.request_tokens},
                      {"electricity_usd_per_kwh", a.electricity_usd_per_kwh},
                      {"amortisation_years", a.amortisation_years},
                      {"logits_to_session", a.logits_to_session},
                      {"peer_forwarding", a.peer_forwarding}};
  return j.dump(indent);
}

}  // namespace cellshard::topologies
