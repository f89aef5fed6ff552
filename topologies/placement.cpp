// topologies/placement.cpp: place(), the memory model and the placement table.
#include "topologies/placement.hpp"
#include "topologies/program.hpp"
#include "base/parse.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <utility>

namespace cellshard::topologies {

namespace {

/// split_weighted, and when the layers do not fit the capacities, a split
/// anyway (the memory check then names the nodes): first with every stage
/// allowed at least one layer, so that only nodes that cannot hold even that
/// are reported, else ignoring capacities.
result<std::vector<range>> split_or_place_anyway(int n, const std::vector<double>& weights,
                                                 const std::vector<int>& capacity,
                                                 const std::vector<double>& tie_cost) {
  auto split = split_weighted(n, weights, capacity, tie_cost);
  if (split) return split;
  std::vector<int> at_least_one = capacity;
  for (int& c : at_least_one) c = std::max(c, 1);
  split = split_weighted(n, weights, at_least_one, tie_cost);
  if (split) return split;
  return split_weighted(n, weights, {}, tie_cost);
}

// A topology this model or these nodes cannot take (or a malformed one):
// error_code::invalid_argument, which the command line reports as a usage
// error (exit 2), as it does a flag it cannot parse.
error invalid(std::string message) { return make_error(error_code::invalid_argument, std::move(message)); }

std::string plural(int n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

result<void> check_config(const model::config& c) {
  auto bad = [&](const std::string& what) {
    return make_error("model config cannot be placed: " + what);
  };
  if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
      c.vocab_size <= 0 || c.seq_len <= 0) {
    return bad("dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size and seq_len must be positive");
  }
  if (c.dim % c.n_heads != 0) {
    return bad("dim " + std::to_string(c.dim) + " is not a multiple of n_heads " + std::to_string(c.n_heads));
  }
  if (c.n_heads % c.n_kv_heads != 0) {
    return bad("n_heads " + std::to_string(c.n_heads) + " is not a multiple of n_kv_heads " +
               std::to_string(c.n_kv_heads));
  }
  return {};
}

int resolved_context(const model::config& cfg, const placement_options& o) {
  return o.context > 0 ? o.context : cfg.seq_len;
}

// The shard layout of one stage before nodes and memory are attached.
struct slice {
  range kv, heads, ffn;
};

bool typed(const weight_format& w) { return w.kinds.size() == static_cast<size_t>(weight_format::kinds_count); }

// The block width of matrix kind k in a GGUF file's own types (1 otherwise:
// --weights quantizes each slice on its own, so any cut is whole blocks).
int file_block(const weight_format& w, weight_format::matrix_kind k) {
  return typed(w) ? std::max(w.kinds[static_cast<size_t>(k)].block, 1) : 1;
}

// The FFN units of a tensor group. split_even, unless w2 keeps a GGUF file's
// type whose blocks the even split would cut: a rank's w2 columns that do
// not start and end on block boundaries are held dequantized to f32
// (model/transformer.cpp, make_typed cols_of), which for q4_K's 256-wide
// super-blocks is 7x the share in the file's format (4 bytes a weight
// against 144/256). Then the units are dealt out in whole blocks, split_even
// over the blocks (768 units of q4_K over 2 ranks: 512 and 256, not 384 and
// 384), when there are at least as many blocks as ranks; otherwise the even
// split stays and to_string(placement) says which slices are f32 and why.
// Files whose even split already falls on block boundaries (F32, F16,
// Q8_0/Q4_0 at 768 over 2) keep it, and with it their partial sums.
std::vector<range> ffn_split(const model::config& cfg, int t, const weight_format& w) {
  std::vector<range> even = split_even(cfg.hidden_dim, t);
  const int b = file_block(w, weight_format::w2);
  if (b == 1 || cfg.hidden_dim % b != 0 || cfg.hidden_dim / b < t) return even;
  bool aligned = true;
  for (const range& r : even) aligned = aligned && r.begin % b == 0 && r.end % b == 0;
  if (aligned) return even;
  std::vector<range> blocks = split_even(cfg.hidden_dim / b, t);
  for (range& r : blocks) r = range{r.begin * b, r.end * b};
  return blocks;
}

std::vector<slice> tp_slices(const model::config& cfg, int t, const weight_format& w) {
  const auto kv = split_even(cfg.n_kv_heads, t);
  const auto ffn = ffn_split(cfg, t, w);
  std::vector<slice> out;
  for (int r = 0; r < t; ++r) {
    const range k = kv[static_cast<size_t>(r)];
    out.push_back(slice{k, range{k.begin * cfg.kv_mul(), k.end * cfg.kv_mul()}, ffn[static_cast<size_t>(r)]});
  }
  return out;
}

std::string role_of(const shard& s, const strategy& st) {
  if (st.kind == strategy_kind::expert)
    return s.expert_node ? "stage " + std::to_string(s.stage) + " / expert node " + std::to_string(s.rank - 1)
                         : "stage " + std::to_string(s.stage);
  if (st.kind == strategy_kind::tensor) return "tp rank " + std::to_string(s.rank);
  if (st.kind == strategy_kind::pipeline) return "stage " + std::to_string(s.stage);
  return "stage " + std::to_string(s.stage) + " / tp rank " + std::to_string(s.rank);
}

std::string list_of(const std::vector<int>& v) {
  if (v.empty()) return "session";
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "]";
}

std::string set_of(const std::vector<int>& v) {
  std::string s = "{";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s + "}";
}

// "0:[1,2] 1:[2,3] ..." -- expert e: its holders in preference order.
std::string holders_text(const std::vector<std::vector<int>>& h) {
  std::string s;
  for (size_t e = 0; e < h.size(); ++e) s += (e ? " " : "") + std::to_string(e) + ":" + list_of(h[e]);
  return s;
}

byte_unit report_unit(uint64_t bytes) {
  const byte_unit u = natural_unit(bytes);
  return u < byte_unit::mib ? byte_unit::mib : u;
}

std::string need_text(const shard& s) {
  const byte_unit u = report_unit(s.memory.total());
  return format_in(s.memory.total(), u) + " (weights " + format_in(s.memory.weights, u) + " + KV cache " +
         format_in(s.memory.kv_cache, u) + " + buffers " + format_in(s.memory.buffers, u) + ")";
}

// Lays out a column table: every column as wide as its widest cell.
std::string table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width;
  for (const auto& r : rows) {
    if (width.size() < r.size()) width.resize(r.size(), 0);
    for (size_t i = 0; i < r.size(); ++i) width[i] = std::max(width[i], r[i].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line;
    for (size_t i = 0; i < r.size(); ++i) {
      line += r[i];
      if (i + 1 < r.size()) line += std::string(width[i] - r[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

}  // namespace

// ---------------------------------------------------------------------------
// Strategy and formats

result<strategy> parse_strategy(std::string_view text) {
  const std::string t(text);
  const std::string usage = "--topology '" + t +
                            "': expected pipeline, pipeline:S, tensor, tensor:T, hybrid:PxT, expert:E or "
                            "pipeline:P,expert:E";
  // "pipeline[:P],expert:E": expert parallelism over P stages.
  if (const auto comma = text.find(','); comma != std::string_view::npos) {
    const std::string_view first = text.substr(0, comma), second = text.substr(comma + 1);
    if (second.substr(0, 7) != "expert:" || (first != "pipeline" && first.substr(0, 9) != "pipeline:"))
      return invalid(usage + " (only pipeline[:P],expert:E combines two)");
    auto p = parse_strategy(first);
    auto e = parse_strategy(second);
    if (!p) return p.err();
    if (!e) return e.err();
    strategy s = e.value();
    s.stages = p.value().stages;
    return s;
  }
  const auto colon = text.find(':');
  const std::string_view head = text.substr(0, colon);
  const std::string_view arg = colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
  strategy s;
  if (head == "pipeline" || head == "tensor") {
    s.kind = head == "pipeline" ? strategy_kind::pipeline : strategy_kind::tensor;
    if (colon != std::string_view::npos) {
      int n = 0;
      if (!parse_count(arg, n) || n < 1) return invalid(usage + " (S and T at least 1)");
      (s.kind == strategy_kind::pipeline ? s.stages : s.tp) = n;
    }
    (s.kind == strategy_kind::pipeline ? s.tp : s.stages) = 1;
    return s;
  }
  if (head == "hybrid") {
    const auto x = arg.find('x');
    int p = 0, tp = 0;
    if (colon == std::string_view::npos || x == std::string_view::npos || !parse_count(arg.substr(0, x), p) ||
        !parse_count(arg.substr(x + 1), tp) || p < 1 || tp < 1) {
      return invalid(usage + " (hybrid needs P and T, both at least 1, e.g. hybrid:2x2)");
    }
    s.kind = strategy_kind::hybrid;
    s.stages = p;
    s.tp = tp;
    return s;
  }
  if (head == "expert") {
    int e = 0;
    if (colon == std::string_view::npos || !parse_count(arg, e) || e < 1)
      return invalid(usage + " (expert needs E, the expert nodes per stage, at least 1: expert:4)");
    s.kind = strategy_kind::expert;
    s.stages = 1;
    s.tp = 1;
    s.experts = e;
    return s;
  }
  return invalid(usage);
}

std::string to_string(const strategy& s) {
  switch (s.kind) {
    case strategy_kind::pipeline: return s.stages > 0 ? "pipeline:" + std::to_string(s.stages) : "pipeline";
    case strategy_kind::tensor: return s.tp > 0 ? "tensor:" + std::to_string(s.tp) : "tensor";
    case strategy_kind::hybrid: return "hybrid:" + std::to_string(s.stages) + "x" + std::to_string(s.tp);
    case strategy_kind::expert:
      return (s.stages == 1 ? std::string() : (s.stages > 0 ? "pipeline:" + std::to_string(s.stages) : "pipeline") + ",") +
             "expert:" + std::to_string(s.experts);
  }
  return "?";
}

uint64_t weight_format::row_bytes(uint64_t cols) const {
  const uint64_t b = static_cast<uint64_t>(std::max(block, 1));
  const uint64_t padded = (cols + b - 1) / b * b;
  return static_cast<uint64_t>(std::ceil(static_cast<double>(padded) * bytes_per_weight - 1e-9));
}

uint64_t weight_format::row_bytes(matrix_kind k, uint64_t cols) const {
  if (kinds.size() != static_cast<size_t>(kinds_count)) return row_bytes(cols);
  weight_format one;
  one.bytes_per_weight = kinds[k].bytes_per_weight;
  one.block = kinds[k].block;
  return one.row_bytes(cols);
}

result<weight_format> find_weight_format(std::string_view name) {
  if (name == "f32") return weight_format::f32();
  if (name == "q8_0") return weight_format::q8_0();
  if (name == "q4_0") return weight_format::q4_0();
  return make_error("unknown weight format '" + std::string(name) + "' (expected f32, q8_0 or q4_0)");
}

weight_format weight_format_of(const model::model_file& file, weight_format requested) {
  if (!file.has_non_f32()) return requested;
  model::typed_layer_view t = file.typed_layer(0);
  if (file.cfg().moe()) {  // the FFN's matrices are the experts'
    const auto& m = file.moe_layer(0);
    t.w1 = m.w1[0];
    t.w2 = m.w2[0];
    t.w3 = m.w3[0];
  }
  // Indexed by weight_format::matrix_kind.
  const model::tensor_view views[] = {t.wq, t.wk, t.wv, t.wo, t.w1, t.w2, t.w3,
                                      file.typed_embedding(), file.typed_classifier()};
  weight_format w = requested;
  w.name = "gguf";
  w.kinds.clear();
  for (const auto& v : views)
    w.kinds.push_back({static_cast<double>(kernels::block_bytes(v.type)) / kernels::block_elems(v.type),
                       kernels::block_elems(v.type)});
  return w;
}

std::vector<node_spec> make_nodes(int n, const profile& prof, int spares) {
  std::vector<node_spec> out;
  for (int i = 0; i < n + spares; ++i) out.push_back(node_spec{i, prof, i >= n});
  return out;
}

// ---------------------------------------------------------------------------
// Memory

namespace {

// shard_memory for a shard whose wo columns start at q_col0 (its first query
// head x head_size) and whose FFN units start at ffn0: a column slice (wo,
// w2) of a GGUF file's typed matrix that does not start and end on its
// type's block boundaries is held as f32 (model/transformer.cpp, make_typed
// cols_of), so it is counted as dim x its columns x 4 bytes; every other
// matrix is counted in its format, as before.
memory_need shard_memory_at(const model::config& cfg, const placement_options& o, int n_layers, int n_heads,
                            int n_kv_heads, int ffn_units, bool has_embedding, int vocab_rows, int routed_experts,
                            int q_col0, int ffn0) {
  const bool has_classifier = vocab_rows > 0;
  const uint64_t d = static_cast<uint64_t>(cfg.dim);
  const uint64_t hs = static_cast<uint64_t>(cfg.head_size());
  const uint64_t q_rows = static_cast<uint64_t>(n_heads) * hs;     // wq rows, wo cols
  const uint64_t kv_rows = static_cast<uint64_t>(n_kv_heads) * hs;  // wk, wv rows
  const uint64_t f = static_cast<uint64_t>(ffn_units);
  const uint64_t v = static_cast<uint64_t>(cfg.vocab_size);
  const uint64_t ctx = static_cast<uint64_t>(resolved_context(cfg, o));
  const uint64_t sessions = static_cast<uint64_t>(std::max(o.sessions, 1));
  const weight_format& w = o.weights;
  constexpr uint64_t f32 = sizeof(float);

  using K = weight_format;
  // A mixture of experts holds f units of every expert, the f32 router
  // [experts x dim], and (counted on every shard: an upper bound for tensor
  // ranks other than the first) the shared expert, its gate and the biases.
  const uint64_t experts =
      cfg.moe() ? static_cast<uint64_t>(routed_experts >= 0 ? routed_experts : cfg.n_experts) : 1;
  const uint64_t sh = static_cast<uint64_t>(cfg.shared_hidden);
  const uint64_t moe_extra =
      (cfg.moe() ? static_cast<uint64_t>(cfg.n_experts) * d * f32 +
                       (sh ? 2 * sh * w.row_bytes(K::w1, d) + d * w.row_bytes(K::w2, sh) + d * f32 : 0)
                 : 0) +
      (cfg.qkv_bias ? (q_rows + 2 * kv_rows) * f32 : 0);  // Q/K/V biases (qwen2, qwen2moe)
  // [dim x n] columns from c0 of a matrix of kind k (wo, w2).
  auto columns = [&](K::matrix_kind k, uint64_t c0, uint64_t n) -> uint64_t {
    const uint64_t b = static_cast<uint64_t>(file_block(w, k));
    if (c0 % b != 0 || n % b != 0) return d * n * f32;  // held dequantized
    return d * w.row_bytes(k, n);
  };
  const uint64_t per_layer = q_rows * w.row_bytes(K::wq, d)     // wq [q_rows x dim]
                             + kv_rows * w.row_bytes(K::wk, d)  // wk [kv_rows x dim]
                             + kv_rows * w.row_bytes(K::wv, d)  // wv [kv_rows x dim]
                             + columns(K::wo, static_cast<uint64_t>(q_col0), q_rows)  // wo [dim x q_rows]
                             + experts * (f * w.row_bytes(K::w1, d)   // w1 [f x dim]
                                          + f * w.row_bytes(K::w3, d)  // w3 [f x dim]
                                          + columns(K::w2, static_cast<uint64_t>(ffn0), f))  // w2 [dim x f]
                             + moe_extra + 2 * d * f32;         // rms_att, rms_ffn [dim]
  const uint64_t table = v * w.row_bytes(K::embedding, d);      // [vocab x dim]
  const uint64_t cls_rows = static_cast<uint64_t>(std::max(vocab_rows, 0));
  const uint64_t cls_table = cls_rows * w.row_bytes(K::classifier, d);

  memory_need m;
  m.weights = static_cast<uint64_t>(n_layers) * per_layer;
  if (has_embedding) m.weights += table;
  if (has_classifier) m.weights += d * f32 + ((cfg.shared_classifier && has_embedding) ? 0 : cls_table);
  m.kv_cache = sessions * 2 * static_cast<uint64_t>(n_layers) * ctx * kv_rows * f32;
  const uint64_t floats = 3 * d + 2 * d + q_rows + 2 * kv_rows + static_cast<uint64_t>(n_heads) * ctx + 2 * f +
                          cls_rows;
  m.buffers = sessions * floats * f32;
  return m;
}

}  // namespace

memory_need shard_memory(const model::config& cfg, const placement_options& o, int n_layers, int n_heads,
                         int n_kv_heads, int ffn_units, bool has_embedding, int vocab_rows, int routed_experts) {
  return shard_memory_at(cfg, o, n_layers, n_heads, n_kv_heads, ffn_units, has_embedding, vocab_rows,
                         routed_experts, 0, 0);
}

memory_need expert_node_memory(const model::config& cfg, const placement_options& o, int n_layers,
                               int held_experts) {
  using K = weight_format;
  const uint64_t d = static_cast<uint64_t>(cfg.dim), f = static_cast<uint64_t>(cfg.hidden_dim);
  const weight_format& w = o.weights;
  const uint64_t one = f * w.row_bytes(K::w1, d) + f * w.row_bytes(K::w3, d) + d * w.row_bytes(K::w2, f);
  memory_need m;
  m.weights = static_cast<uint64_t>(std::max(n_layers, 0)) * static_cast<uint64_t>(std::max(held_experts, 0)) * one;
  m.buffers = static_cast<uint64_t>(std::max(o.sessions, 1)) * (2 * d + 2 * f) * sizeof(float);
  return m;
}

std::vector<std::vector<int>> assign_experts(int n_experts, int replicas, const std::vector<uint64_t>& budgets,
                                             uint64_t per_expert, uint64_t fixed) {
  const int E = static_cast<int>(budgets.size());
  std::vector<std::vector<int>> holders(static_cast<size_t>(std::max(n_experts, 0)));
  if (E == 0) return holders;
  // Room left per node (may go negative: the memory check reports it).
  std::vector<long double> room(static_cast<size_t>(E));
  for (int i = 0; i < E; ++i)
    room[static_cast<size_t>(i)] = static_cast<long double>(budgets[static_cast<size_t>(i)]) - fixed;
  for (int e = 0; e < n_experts; ++e)
    for (int j = 0; j < std::min(replicas, E); ++j) {
      auto& h = holders[static_cast<size_t>(e)];
      // Round robin: node (e + j) mod E when it still has room for the
      // expert (and does not hold it yet); otherwise the node with the most
      // room left, the first in the order (e + j + 1) mod E, ... on ties.
      int best = (e + j) % E;
      const bool taken = std::find(h.begin(), h.end(), best) != h.end();
      if (taken || room[static_cast<size_t>(best)] < static_cast<long double>(per_expert)) {
        best = -1;
        for (int k = 0; k < E; ++k) {
          const int n = (e + j + k) % E;
          if (std::find(h.begin(), h.end(), n) != h.end()) continue;
          if (best < 0 || room[static_cast<size_t>(n)] > room[static_cast<size_t>(best)]) best = n;
        }
      }
      h.push_back(best);
      room[static_cast<size_t>(best)] -= static_cast<long double>(per_expert);
    }
  return holders;
}

result<void> check_memory(const placement& p) {
  std::string lines;
  int bad = 0;
  for (const shard& s : p.shards) {
    if (s.fits()) continue;
    ++bad;
    lines += "\n  node " + std::to_string(s.node) + " (" + s.profile + ", " + format_bytes(s.budget_bytes) +
             "): shard needs " + need_text(s) + "; placement index " + std::to_string(s.index) + ": " +
             role_of(s, p.strat) + ", layers " + to_string(s.layers) +
             (s.expert_node ? ", " + plural(static_cast<int>(s.experts.size()), "expert", "experts") +
                                  " of each layer"
                            : std::string());
  }
  if (bad == 0) return {};
  return make_error("placement " + to_string(p.strat) + " does not fit in memory (" +
                    plural(bad, "shard", "shards") + " over budget; context " +
                    std::to_string(p.options.context) + " x " + plural(p.options.sessions, "session", "sessions") +
                    ", " + p.options.weights.name + " weights):" + lines);
}

result<int> placement::node_of(int placement_index) const {
  if (placement_index >= 0 && placement_index < static_cast<int>(shards.size())) {
    return shards[static_cast<size_t>(placement_index)].node;
  }
  const int i = placement_index - static_cast<int>(shards.size());
  if (placement_index >= 0 && i < static_cast<int>(spares.size())) return spares[static_cast<size_t>(i)].node;
  return make_error("placement index " + std::to_string(placement_index) + " out of range (placement has " +
                    std::to_string(size()) + ": " + plural(static_cast<int>(shards.size()), "shard", "shards") +
                    ", " + plural(static_cast<int>(spares.size()), "spare", "spares") + ")");
}

bool placement::fits() const {
  return std::all_of(shards.begin(), shards.end(), [](const shard& s) { return s.fits(); });
}


// ---------------------------------------------------------------------------
// Expert placement (issue #23): see placement.hpp.

namespace {

result<placement> place_expert(const model::config& cfg, const std::vector<node_spec>& nodes,
                               const std::vector<const node_spec*>& avail, strategy st,
                               const placement_options& opt) {
  const int n_avail = static_cast<int>(avail.size());
  const int L = cfg.n_layers;
  const std::string name = to_string(st);
  if (!cfg.moe())
    return invalid("--topology " + name +
                   ": expert parallelism needs a mixture-of-experts model; this model is dense (0 experts)");
  const int E = st.experts, R = st.expert_replicas;
  if (E < 1) return invalid("--topology " + name + ": E (expert nodes per stage) must be at least 1");
  if (E > cfg.n_experts)
    return invalid("--topology " + name + ": " + plural(E, "expert node", "expert nodes") +
                   " per stage for a model of " + plural(cfg.n_experts, "expert", "experts") +
                   " per layer (at most " + std::to_string(cfg.n_experts) + ")");
  if (R < 1 || R > E)
    return invalid("--expert-replicas " + std::to_string(R) + ": expected 1.." + std::to_string(E) +
                   " (each expert on R distinct expert nodes of its stage; " + name + " has " +
                   plural(E, "expert node", "expert nodes") + " per stage)");
  if (st.stages > L)
    return invalid(name + ": pipeline of " + plural(st.stages, "stage", "stages") + " exceeds the model's " +
                   plural(L, "layer", "layers"));
  if (st.stages <= 0) st.stages = std::max(1, std::min(L, n_avail / (1 + E)));
  const int P = st.stages;
  st.tp = 1;
  if (P * (1 + E) > n_avail)
    return invalid(name + " needs " + plural(P * (1 + E), "node", "nodes") + " (" +
                   plural(P, "stage shard", "stage shards") + " + " + std::to_string(P) + " x " +
                   plural(E, "expert node", "expert nodes") + "), " + std::to_string(n_avail) + " available");
  auto node_at = [&](int s, int j) -> const node_spec& { return *avail[static_cast<size_t>(s * (1 + E) + j)]; };
  const int held_max = (cfg.n_experts * R + E - 1) / E;  // the fullest expert node on equal nodes

  // Layers per stage: capacity = what both the stage shard and its fullest
  // expert node can hold.
  std::vector<range> layer_ranges;
  if (P == 1) {
    layer_ranges.push_back(range{0, L});
  } else {
    std::vector<double> weight(static_cast<size_t>(P)), tie(static_cast<size_t>(P));
    std::vector<int> capacity(static_cast<size_t>(P));
    const double d = cfg.dim, v = cfg.vocab_size;
    for (int s = 0; s < P; ++s) {
      const bool first = s == 0, last = s == P - 1;
      auto fit = [](uint64_t budget, uint64_t fixed, uint64_t per_layer) {
        return budget > fixed ? static_cast<long long>((budget - fixed) / std::max<uint64_t>(per_layer, 1)) : 0LL;
      };
      const int cls = last ? cfg.vocab_size : 0;
      const memory_need f0 = shard_memory(cfg, opt, 0, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, first, cls, 0);
      const memory_need f1 = shard_memory(cfg, opt, 1, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, first, cls, 0);
      long long cap = std::min<long long>(L, fit(node_at(s, 0).prof.memory_bytes, f0.total(), f1.total() - f0.total()));
      uint64_t min_budget = node_at(s, 0).prof.memory_bytes;
      const memory_need e0 = expert_node_memory(cfg, opt, 0, held_max);
      const memory_need e1 = expert_node_memory(cfg, opt, 1, held_max);
      for (int j = 1; j <= E; ++j) {
        cap = std::min(cap, fit(node_at(s, j).prof.memory_bytes, e0.total(), e1.total() - e0.total()));
        min_budget = std::min(min_budget, node_at(s, j).prof.memory_bytes);
      }
      weight[static_cast<size_t>(s)] = static_cast<double>(min_budget);
      capacity[static_cast<size_t>(s)] = static_cast<int>(cap);
      tie[static_cast<size_t>(s)] = (first ? d : 0.0) + (last ? d + v * d : 0.0);
    }
    auto split = split_or_place_anyway(L, weight, capacity, tie);
    if (!split) return split.err();
    layer_ranges = std::move(split.value());
  }

  placement p;
  p.strat = st;
  p.config = cfg;
  p.options = opt;
  std::vector<bool> used(nodes.size(), false);
  const range all_kv{0, cfg.n_kv_heads}, all_heads{0, cfg.n_heads}, all_ffn{0, cfg.hidden_dim};
  for (int s = 0; s < P; ++s) {
    stage sg;
    sg.index = s;
    sg.layers = layer_ranges[static_cast<size_t>(s)];
    const int nl = sg.layers.size();
    // The stage shard: attention, router, shared expert (+ embedding / classifier).
    {
      const node_spec& n = node_at(s, 0);
      used[static_cast<size_t>(&n - nodes.data())] = true;
      shard sh;
      sh.index = static_cast<int>(p.shards.size());
      sh.node = n.index;
      sh.profile = n.prof.name;
      sh.budget_bytes = n.prof.memory_bytes;
      sh.stage = s;
      sh.layers = sg.layers;
      sh.has_embedding = s == 0;
      sh.has_classifier = s == P - 1;
      if (sh.has_classifier) sh.vocab = range{0, cfg.vocab_size};
      sh.kv_heads = all_kv;
      sh.heads = all_heads;
      sh.ffn = all_ffn;
      sh.routed = false;
      sh.memory = shard_memory(cfg, opt, nl, cfg.n_heads, cfg.n_kv_heads, cfg.hidden_dim, sh.has_embedding,
                               sh.has_classifier ? cfg.vocab_size : 0, 0);
      sg.shards.push_back(sh.index);
      p.shards.push_back(std::move(sh));
    }
    // Its expert nodes and who holds which expert.
    std::vector<uint64_t> budgets;
    for (int j = 1; j <= E; ++j) budgets.push_back(node_at(s, j).prof.memory_bytes);
    const memory_need fixed = expert_node_memory(cfg, opt, nl, 0);
    const uint64_t per_expert = expert_node_memory(cfg, opt, nl, 1).weights;
    const auto holders = assign_experts(cfg.n_experts, R, budgets, per_expert, fixed.total());
    const int first_expert_index = static_cast<int>(p.shards.size());
    for (int j = 1; j <= E; ++j) {
      const node_spec& n = node_at(s, j);
      used[static_cast<size_t>(&n - nodes.data())] = true;
      shard sh;
      sh.index = static_cast<int>(p.shards.size());
      sh.node = n.index;
      sh.profile = n.prof.name;
      sh.budget_bytes = n.prof.memory_bytes;
      sh.stage = s;
      sh.rank = j;
      sh.layers = sg.layers;
      sh.ffn = all_ffn;
      sh.kv_heads = all_kv;  // a slice spec needs them; an expert node loads no attention (model::slice_spec)
      sh.heads = all_heads;
      sh.expert_node = true;
      for (int e = 0; e < cfg.n_experts; ++e) {
        const auto& h = holders[static_cast<size_t>(e)];
        if (std::find(h.begin(), h.end(), j - 1) != h.end()) sh.experts.push_back(e);
      }
      sh.memory = expert_node_memory(cfg, opt, nl, static_cast<int>(sh.experts.size()));
      sg.shards.push_back(sh.index);
      sg.expert_nodes.push_back(sh.index);
      p.shards.push_back(std::move(sh));
    }
    for (const auto& h : holders) {
      std::vector<int> idx;
      for (int j : h) idx.push_back(first_expert_index + j);
      sg.holders.push_back(std::move(idx));
    }
    p.stages.push_back(std::move(sg));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (used[i]) continue;
    p.spares.push_back(spare_node{static_cast<int>(p.shards.size() + p.spares.size()), nodes[i].index,
                                  nodes[i].prof.name, nodes[i].prof.memory_bytes});
  }

  // Exchange steps of one position.
  const uint64_t x_bytes = static_cast<uint64_t>(cfg.dim) * sizeof(float);
  const uint64_t k = static_cast<uint64_t>(cfg.n_experts_used);
  p.steps.push_back(exchange_step{exchange_kind::token_to_embedding, 0, -1, {}, {p.stages.front().shards[0]},
                                  sizeof(int32_t)});
  for (const stage& sg : p.stages) {
    const std::vector<int> head{sg.shards[0]};
    for (int l = sg.layers.begin; l < sg.layers.end; ++l) {
      // Each position's xb to the holder of each of its k experts (at most k
      // messages' worth), and k outputs back.
      p.steps.push_back(exchange_step{exchange_kind::expert_dispatch, sg.index, l, head, sg.expert_nodes, k * x_bytes});
      p.steps.push_back(exchange_step{exchange_kind::expert_combine, sg.index, l, sg.expert_nodes, head, k * x_bytes});
    }
    if (sg.index + 1 < P)
      p.steps.push_back(exchange_step{exchange_kind::send_activations, sg.index, -1, head,
                                      {p.stages[static_cast<size_t>(sg.index + 1)].shards[0]}, x_bytes});
  }
  p.steps.push_back(exchange_step{exchange_kind::logits_to_session, P - 1, -1, {p.stages.back().shards[0]}, {},
                                  static_cast<uint64_t>(cfg.vocab_size) * sizeof(float)});

  for (shard& sh : p.shards) {
    auto prog = shard_program(p, sh.index);
    if (!prog) return prog.err();
    sh.program = std::move(prog.value());
  }
  if (opt.check_memory) {
    if (auto ok = check_memory(p); !ok) return ok.err();
  }
  return p;
}

}  // namespace

// ---------------------------------------------------------------------------
// place()

result<placement> place(const model::config& cfg, const std::vector<node_spec>& nodes, const strategy& strat,
                        const placement_options& options) {
  if (auto ok = check_config(cfg); !ok) return ok.err();
  placement_options opt = options;
  opt.context = resolved_context(cfg, options);
  if (opt.context > cfg.seq_len) {
    return make_error("context of " + std::to_string(opt.context) + " positions exceeds the model's seq_len " +
                      std::to_string(cfg.seq_len));
  }
  if (opt.sessions < 1) return make_error("sessions must be at least 1, not " + std::to_string(opt.sessions));
  if (opt.reduce != reduce_algorithm::direct_rank_order && opt.reduce != reduce_algorithm::scatter_gather)
    return make_error("reduce algorithm " + std::to_string(static_cast<int>(opt.reduce)) + " unknown");
  if (opt.sync != sync_format::f32 && opt.sync != sync_format::q8_0)
    return make_error("sync format " + std::to_string(static_cast<int>(opt.sync)) + " unknown");
  if (!(opt.weights.bytes_per_weight > 0) || opt.weights.block < 1) {
    return make_error("weight format '" + opt.weights.name + "' needs positive bytes per weight and block");
  }

  // Nodes that may hold shards, in spec order.
  std::vector<const node_spec*> avail;
  for (const node_spec& n : nodes) {
    if (n.prof.memory_bytes == 0) {
      return make_error("node " + std::to_string(n.index) + " (" + n.prof.name + ") has a memory budget of 0 bytes");
    }
    if (!n.spare) avail.push_back(&n);
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    for (size_t j = i + 1; j < nodes.size(); ++j) {
      if (nodes[i].index == nodes[j].index) {
        return make_error("node index " + std::to_string(nodes[i].index) + " appears twice in the node list");
      }
    }
  }
  const int n_avail = static_cast<int>(avail.size());
  if (n_avail == 0) {
    return make_error("no node to place the model on (" + plural(static_cast<int>(nodes.size()), "node", "nodes") +
                      ", all spares)");
  }
  const std::string nodes_text = std::to_string(n_avail) + " available";
  if (strat.kind == strategy_kind::expert) return place_expert(cfg, nodes, avail, strat, opt);

  // Resolve P and T and check the limits (DESIGN.md "Limits of a split").
  strategy st = strat;
  const int L = cfg.n_layers, KV = cfg.n_kv_heads;
  auto too_many_stages = [&](int p) {
    return invalid((st.kind == strategy_kind::hybrid ? to_string(st) + ": " : std::string()) + "pipeline of " +
                   plural(p, "stage", "stages") + " exceeds the model's " + plural(L, "layer", "layers"));
  };
  auto too_wide = [&](int t) {
    return invalid((st.kind == strategy_kind::hybrid ? to_string(st) + ": " : std::string()) +
                   "tensor group of " + std::to_string(t) + " exceeds the model's " +
                   plural(KV, "KV head", "KV heads"));
  };
  switch (st.kind) {
    case strategy_kind::pipeline:
      st.tp = 1;
      if (st.stages > L) return too_many_stages(st.stages);
      if (st.stages > n_avail) {
        return invalid("pipeline of " + plural(st.stages, "stage", "stages") + " needs " +
                       plural(st.stages, "node", "nodes") + ", " + nodes_text);
      }
      if (st.stages <= 0) st.stages = std::min(L, n_avail);
      break;
    case strategy_kind::tensor:
      st.stages = 1;
      if (st.tp > KV) return too_wide(st.tp);
      if (st.tp > n_avail) {
        return invalid("tensor group of " + std::to_string(st.tp) + " needs " + plural(st.tp, "node", "nodes") +
                       ", " + nodes_text);
      }
      if (st.tp <= 0) st.tp = std::min(KV, n_avail);
      break;
    case strategy_kind::hybrid:
      if (st.stages < 1 || st.tp < 1) return invalid(to_string(st) + ": P and T must be at least 1");
      if (st.stages > L) return too_many_stages(st.stages);
      if (st.tp > KV) return too_wide(st.tp);
      if (st.stages * st.tp > n_avail) {
        return invalid(to_string(st) + " needs " + plural(st.stages * st.tp, "node", "nodes") + ", " + nodes_text);
      }
      break;
    case strategy_kind::expert:  // place_expert
      break;
  }
  if (st.tp > cfg.hidden_dim) {
    return invalid("tensor group of " + std::to_string(st.tp) + " exceeds the model's " +
                   std::to_string(cfg.hidden_dim) + " FFN hidden units");
  }
  const int P = st.stages, T = st.tp;
  const std::vector<slice> slices = tp_slices(cfg, T, opt.weights);
  const std::vector<range> vocab_slices = split_even(cfg.vocab_size, T);
  auto node_at = [&](int s, int r) -> const node_spec& { return *avail[static_cast<size_t>(s * T + r)]; };

  // Layer ranges per stage: weight = the smallest budget in the stage's group,
  // capacity = the layers every rank of the stage can hold.
  std::vector<range> layer_ranges;
  if (P == 1) {
    layer_ranges.push_back(range{0, L});
  } else {
    std::vector<double> weight(static_cast<size_t>(P)), tie(static_cast<size_t>(P));
    std::vector<int> capacity(static_cast<size_t>(P));
    const double d = cfg.dim, v = cfg.vocab_size;
    for (int s = 0; s < P; ++s) {
      const bool first = s == 0, last = s == P - 1;
      uint64_t min_budget = UINT64_MAX;
      long long cap = L;
      for (int r = 0; r < T; ++r) {
        const node_spec& n = node_at(s, r);
        const slice& sl = slices[static_cast<size_t>(r)];
        const bool emb = first && r == 0;
        const int cls = last ? vocab_slices[static_cast<size_t>(r)].size() : 0;
        const int q0 = sl.heads.begin * cfg.head_size();
        const memory_need fixed =
            shard_memory_at(cfg, opt, 0, sl.heads.size(), sl.kv.size(), sl.ffn.size(), emb, cls, -1, q0, sl.ffn.begin);
        const memory_need one =
            shard_memory_at(cfg, opt, 1, sl.heads.size(), sl.kv.size(), sl.ffn.size(), emb, cls, -1, q0, sl.ffn.begin);
        const uint64_t per_layer = one.total() - fixed.total();
        const uint64_t b = n.prof.memory_bytes;
        const long long fit =
            b > fixed.total() ? static_cast<long long>((b - fixed.total()) / std::max<uint64_t>(per_layer, 1)) : 0;
        cap = std::min(cap, fit);
        min_budget = std::min(min_budget, b);
      }
      weight[static_cast<size_t>(s)] = static_cast<double>(min_budget);
      capacity[static_cast<size_t>(s)] = static_cast<int>(cap);
      // Work per position beyond the layers (floats read): the embedding row
      // on stage 0, final norm + a rank's classifier slice on the last stage.
      tie[static_cast<size_t>(s)] = (first ? d : 0.0) + (last ? d + std::ceil(v / T) * d : 0.0);
    }
    auto split = split_or_place_anyway(L, weight, capacity, tie);
    if (!split) return split.err();
    layer_ranges = std::move(split.value());
  }

  placement p;
  p.strat = st;
  p.config = cfg;
  p.options = opt;
  std::vector<bool> used(nodes.size(), false);
  for (int s = 0; s < P; ++s) {
    stage sg;
    sg.index = s;
    sg.layers = layer_ranges[static_cast<size_t>(s)];
    for (int r = 0; r < T; ++r) {
      const node_spec& n = node_at(s, r);
      used[static_cast<size_t>(&n - nodes.data())] = true;
      const slice& sl = slices[static_cast<size_t>(r)];
      shard sh;
      sh.index = static_cast<int>(p.shards.size());
      sh.node = n.index;
      sh.profile = n.prof.name;
      sh.budget_bytes = n.prof.memory_bytes;
      sh.stage = s;
      sh.rank = r;
      sh.group_size = T;
      sh.layers = sg.layers;
      sh.has_embedding = s == 0 && r == 0;
      sh.has_classifier = s == P - 1;
      if (sh.has_classifier) sh.vocab = vocab_slices[static_cast<size_t>(r)];
      sh.kv_heads = sl.kv;
      sh.heads = sl.heads;
      sh.ffn = sl.ffn;
      sh.memory = shard_memory_at(cfg, opt, sg.layers.size(), sl.heads.size(), sl.kv.size(), sl.ffn.size(),
                                  sh.has_embedding, sh.has_classifier ? sh.vocab.size() : 0, -1,
                                  sl.heads.begin * cfg.head_size(), sl.ffn.begin);
      sg.shards.push_back(sh.index);
      p.shards.push_back(std::move(sh));
    }
    p.stages.push_back(std::move(sg));
  }
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (used[i]) continue;
    p.spares.push_back(spare_node{static_cast<int>(p.shards.size() + p.spares.size()), nodes[i].index,
                                  nodes[i].prof.name, nodes[i].prof.memory_bytes});
  }

  // Exchange steps of one position, in execution order.
  const uint64_t x_bytes = static_cast<uint64_t>(cfg.dim) * sizeof(float);
  const std::vector<int>& first = p.stages.front().shards;
  p.steps.push_back(exchange_step{exchange_kind::token_to_embedding, 0, -1, {}, {first[0]}, sizeof(int32_t)});
  if (T > 1) {
    p.steps.push_back(exchange_step{exchange_kind::broadcast_embedding, 0, -1, {first[0]},
                                    std::vector<int>(first.begin() + 1, first.end()), x_bytes});
  }
  // An all-reduce: its largest message and the busiest rank's bytes.
  uint64_t reduce_message = sync_payload_bytes(opt.sync, static_cast<uint64_t>(cfg.dim)), reduce_rank = 0;
  if (T > 1) {
    const auto chunks = reduce_chunks(cfg.dim, T);
    if (opt.reduce == reduce_algorithm::scatter_gather) {
      reduce_message = 0;
      for (const range& c : chunks)
        reduce_message = std::max(reduce_message, sync_payload_bytes(opt.sync, static_cast<uint64_t>(c.size())));
    }
    for (int r = 0; r < T; ++r) {
      uint64_t sent = 0;
      if (opt.sync == sync_format::f32) {
        sent = reduce_floats_sent(opt.reduce, cfg.dim, T, r) * sizeof(float);
      } else if (opt.reduce == reduce_algorithm::scatter_gather) {  // message by message: blocks round up
        for (int o = 0; o < T; ++o)
          if (o != r) sent += sync_payload_bytes(opt.sync, static_cast<uint64_t>(chunks[static_cast<size_t>(o)].size()));
        sent += static_cast<uint64_t>(T - 1) *
                sync_payload_bytes(opt.sync, static_cast<uint64_t>(chunks[static_cast<size_t>(r)].size()));
      } else {
        sent = static_cast<uint64_t>(T - 1) * sync_payload_bytes(opt.sync, static_cast<uint64_t>(cfg.dim));
      }
      reduce_rank = std::max(reduce_rank, sent);
    }
  }
  for (const stage& sg : p.stages) {
    if (T > 1) {
      for (int l = sg.layers.begin; l < sg.layers.end; ++l)
        for (exchange_kind k : {exchange_kind::all_reduce_attention, exchange_kind::all_reduce_ffn})
          p.steps.push_back(
              exchange_step{k, sg.index, l, sg.shards, sg.shards, reduce_message, reduce_rank, opt.reduce});
    }
    if (sg.index + 1 < P) {
      p.steps.push_back(exchange_step{exchange_kind::send_activations, sg.index, -1, {sg.shards[0]},
                                      p.stages[static_cast<size_t>(sg.index + 1)].shards, x_bytes});
    }
  }
  // Each rank of the last stage sends its slice: the bytes are the largest
  // slice's (the ranks send in parallel).
  p.steps.push_back(exchange_step{exchange_kind::logits_to_session, P - 1, -1, p.stages.back().shards, {},
                                  static_cast<uint64_t>(vocab_slices.front().size()) * sizeof(float)});
  for (exchange_step& s : p.steps)
    if (s.bytes_per_rank == 0) s.bytes_per_rank = s.bytes_per_position;

  for (shard& sh : p.shards) {
    auto prog = shard_program(p, sh.index);
    if (!prog) return prog.err();
    sh.program = std::move(prog.value());
  }

  if (opt.check_memory) {
    if (auto ok = check_memory(p); !ok) return ok.err();
  }
  return p;
}

result<std::vector<shard_step>> shard_program(const placement& p, int index) {
  if (index < 0 || index >= static_cast<int>(p.shards.size()))
    return make_error("placement index " + std::to_string(index) + " names no shard (placement has " +
                      plural(static_cast<int>(p.shards.size()), "shard", "shards") + ")");
  const shard& sh = p.shards[static_cast<size_t>(index)];
  const stage& sg = p.stages[static_cast<size_t>(sh.stage)];
  // The stage's group (TP ranks; the stage shard alone under expert placement).
  auto group_of = [&](const stage& g) {
    std::vector<int> out;
    for (int i : g.shards)
      if (!p.shards[static_cast<size_t>(i)].expert_node) out.push_back(i);
    return out;
  };
  shard_role r;
  r.index = sh.index;
  r.rank = sh.rank;
  r.layers = sh.layers;
  r.has_embedding = sh.has_embedding;
  r.has_classifier = sh.has_classifier;
  r.vocab = sh.vocab;
  r.group = group_of(sg);
  if (sh.stage + 1 < static_cast<int>(p.stages.size()))
    r.next_group = group_of(p.stages[static_cast<size_t>(sh.stage + 1)]);
  r.expert_node = sh.expert_node;
  r.experts = sh.experts;
  r.expert_nodes = sg.expert_nodes;
  r.holders = sg.holders;
  r.reduce = p.options.reduce;
  r.sync = p.options.sync;
  return program_of(r);
}

result<void> check_program(const shard& s, const std::vector<shard_step>& program) {
  auto bad = [&](size_t i, const std::string& what) {
    return make_error("program of placement index " + std::to_string(s.index) + ", op " + std::to_string(i) +
                      " (" + (i < program.size() ? to_string(program[i]) : std::string("end")) + "): " + what);
  };
  if (s.expert_node) {
    if (program.size() != 1 || program[0].op != shard_op::expert)
      return bad(program.empty() ? 0 : (program[0].op != shard_op::expert ? 0 : 1),
                 "an expert node's program is one expert op");
    const shard_step& op = program[0];
    if (op.layers != s.layers)
      return bad(0, "expert layers " + to_string(op.layers) + " differ from the node's " + to_string(s.layers));
    if (op.experts != s.experts || op.experts.empty())
      return bad(0, "the experts served differ from the ones the node holds (or are none)");
    if (op.peers.empty()) return bad(0, "an expert node serves no stage shard");
    return {};
  }
  int next_layer = s.layers.begin;
  bool in_attention_done = false;  // a partial attention half of next_layer is done (its FFN is next)
  bool finished = false;           // forward or classify seen
  // A dispatch (and combine) is well formed: peers, one holder list per
  // expert, each naming peers.
  auto check_holders = [&](size_t i, const shard_step& op) -> std::string {
    if (op.peers.empty() || op.holders.empty()) return "names no expert node or no holders";
    for (size_t e = 0; e < op.holders.size(); ++e) {
      if (op.holders[e].empty()) return "expert " + std::to_string(e) + " has no holder";
      for (int h : op.holders[e])
        if (std::find(op.peers.begin(), op.peers.end(), h) == op.peers.end())
          return "expert " + std::to_string(e) + "'s holder " + std::to_string(h) + " is not among its peers";
    }
    (void)i;
    return {};
  };
  for (size_t i = 0; i < program.size(); ++i) {
    const shard_step& op = program[i];
    if (finished && op.op != shard_op::classify && op.op != shard_op::forward)
      return bad(i, "only forward or classify may follow the stage's output");
    switch (op.op) {
      case shard_op::embed:
        if (i != 0) return bad(i, "embed must be the first op");
        if (!s.has_embedding) return bad(i, "the shard holds no embedding table");
        if (op.peers.empty()) return bad(i, "embed sends x to nobody");
        break;
      case shard_op::compute: {
        if (op.layers.empty() || op.layers.begin != next_layer || op.layers.end > s.layers.end)
          return bad(i, "expected layers from " + std::to_string(next_layer) + " within the shard's " +
                            to_string(s.layers));
        if (!op.partial && op.part == layer_part::attention) {
          // Expert placement: the attention of one layer, then its dispatch and combine.
          if (in_attention_done || op.layers.size() != 1)
            return bad(i, "an attention-only compute covers one whole layer");
          const bool moe_next = i + 2 < program.size() && program[i + 1].op == shard_op::dispatch &&
                                program[i + 2].op == shard_op::combine && program[i + 1].layers == op.layers &&
                                program[i + 2].layers == op.layers;
          if (!moe_next) return bad(i, "an attention-only compute must be followed by the dispatch and combine of its layer");
          in_attention_done = true;
          break;
        }
        if (!op.partial && !s.routed)
          return bad(i, "the shard holds no routed experts: its FFN halves are dispatched, not computed");
        if (!op.partial) {
          if (in_attention_done || op.part != layer_part::both)
            return bad(i, "a whole (not partial) compute covers both halves of whole layers");
          next_layer = op.layers.end;
          break;
        }
        if (op.layers.size() != 1 || op.part == layer_part::both)
          return bad(i, "a partial compute is one half of one layer");
        if ((op.part == layer_part::attention) == in_attention_done)
          return bad(i, in_attention_done ? "expected the FFN half" : "expected the attention half first");
        const bool has_reduce = i + 1 < program.size() && program[i + 1].op == shard_op::reduce &&
                                program[i + 1].layers == op.layers && program[i + 1].part == op.part;
        if (!has_reduce) return bad(i, "a partial compute must be followed by the reduce of the same layer half");
        break;
      }
      case shard_op::reduce: {
        if (i == 0 || program[i - 1].op != shard_op::compute || !program[i - 1].partial)
          return bad(i, "a reduce follows the partial compute of its layer half");
        if (op.algorithm != reduce_algorithm::direct_rank_order && op.algorithm != reduce_algorithm::scatter_gather)
          return bad(i, "unknown reduce algorithm");
        if (op.sync != sync_format::f32 && op.sync != sync_format::q8_0) return bad(i, "unknown sync format");
        if (std::find(op.peers.begin(), op.peers.end(), s.index) == op.peers.end())
          return bad(i, "the reduce's peers do not include the shard itself");
        if (op.peers.size() != static_cast<size_t>(s.group_size))
          return bad(i, "the reduce's peers are not the shard's group of " + std::to_string(s.group_size));
        if (op.part == layer_part::attention) {
          in_attention_done = true;
        } else {
          in_attention_done = false;
          next_layer = op.layers.end;
        }
        break;
      }
      case shard_op::forward:
        if (op.peers.empty()) return bad(i, "forward sends x to nobody");
        finished = true;
        break;
      case shard_op::classify:
        if (!s.has_classifier) return bad(i, "the shard holds no classifier");
        if (op.vocab != s.vocab) return bad(i, "classify rows " + to_string(op.vocab) + " differ from the shard's " +
                                                   to_string(s.vocab));
        finished = true;
        break;
      case shard_op::dispatch: {
        if (i == 0 || program[i - 1].op != shard_op::compute || program[i - 1].partial ||
            program[i - 1].part != layer_part::attention || program[i - 1].layers != op.layers)
          return bad(i, "a dispatch follows the attention-only compute of its layer");
        if (auto why = check_holders(i, op); !why.empty()) return bad(i, why);
        break;
      }
      case shard_op::combine: {
        if (i == 0 || program[i - 1].op != shard_op::dispatch || program[i - 1].layers != op.layers)
          return bad(i, "a combine follows the dispatch of its layer");
        if (op.peers != program[i - 1].peers || op.holders != program[i - 1].holders)
          return bad(i, "a combine gathers from other expert nodes than its dispatch sent to");
        in_attention_done = false;
        next_layer = op.layers.end;
        break;
      }
      case shard_op::expert:
        return bad(i, "only an expert node runs an expert op");
      case shard_op::count:
        return bad(i, "not an op");
    }
  }
  if (in_attention_done || next_layer != s.layers.end)
    return bad(program.size(), "the program ends before the shard's layers " + to_string(s.layers) + " are done (at layer " +
                                   std::to_string(next_layer) + ")");
  return {};
}

// ---------------------------------------------------------------------------
// Text

std::string to_string(shard_op op) {
  switch (op) {
    case shard_op::embed: return "embed";
    case shard_op::compute: return "compute";
    case shard_op::reduce: return "reduce";
    case shard_op::forward: return "forward";
    case shard_op::classify: return "classify";
    case shard_op::dispatch: return "dispatch";
    case shard_op::combine: return "combine";
    case shard_op::expert: return "expert";
    case shard_op::count: break;
  }
  return "?";
}

std::string to_string(layer_part part) {
  switch (part) {
    case layer_part::both: return "attention+ffn";
    case layer_part::attention: return "attention";
    case layer_part::ffn: return "ffn";
  }
  return "?";
}

std::string to_string(reduce_algorithm a) {
  switch (a) {
    case reduce_algorithm::direct_rank_order: return "direct, rank order";
    case reduce_algorithm::scatter_gather: return "scatter+gather, rank order";
    case reduce_algorithm::count: break;
  }
  return "?";
}

result<reduce_algorithm> parse_reduce_algorithm(std::string_view text) {
  if (text == "direct") return reduce_algorithm::direct_rank_order;
  if (text == "scatter") return reduce_algorithm::scatter_gather;
  return make_error("--reduce '" + std::string(text) + "': expected direct or scatter");
}

result<sync_format> parse_sync_format(std::string_view text) {
  if (text == "f32") return sync_format::f32;
  if (text == "q8_0") return sync_format::q8_0;
  return make_error("--sync '" + std::string(text) + "': expected f32 or q8_0");
}

std::string to_string(sync_format f) {
  switch (f) {
    case sync_format::f32: return "f32";
    case sync_format::q8_0: return "q8_0";
    case sync_format::count: break;
  }
  return "?";
}

uint64_t sync_payload_bytes(sync_format f, uint64_t floats) {
  if (f == sync_format::q8_0) return (floats + 31) / 32 * 34;  // ggml block_q8_0: 2-byte scale + 32 int8
  return floats * sizeof(float);
}

std::vector<range> reduce_chunks(int dim, int t) { return split_even(dim, std::max(t, 1)); }

uint64_t reduce_floats_sent(reduce_algorithm a, int dim, int t, int rank) {
  if (t <= 1 || rank < 0 || rank >= t) return 0;
  const uint64_t d = static_cast<uint64_t>(dim), others = static_cast<uint64_t>(t - 1);
  if (a != reduce_algorithm::scatter_gather) return others * d;
  // Every other rank's chunk of the own partial, then the own finished chunk
  // to each of the others.
  const uint64_t own = static_cast<uint64_t>(reduce_chunks(dim, t)[static_cast<size_t>(rank)].size());
  return (d - own) + others * own;
}

std::string to_string(const shard_step& s) {
  std::string out = to_string(s.op);
  switch (s.op) {
    case shard_op::compute:
      out += " layers " + to_string(s.layers) + " " + to_string(s.part) + (s.partial ? " (partial)" : "");
      break;
    case shard_op::reduce:
      out += " layer " + std::to_string(s.layers.begin) + " " + to_string(s.part) + " over " + list_of(s.peers) +
             " (" + to_string(s.algorithm) + (s.sync == sync_format::f32 ? "" : ", " + to_string(s.sync) + " sync") +
             ")";
      break;
    case shard_op::embed:
    case shard_op::forward:
      out += " to " + list_of(s.peers);
      break;
    case shard_op::classify:
      out += " rows " + to_string(s.vocab);
      break;
    case shard_op::dispatch:
    case shard_op::combine:
      out += " layer " + std::to_string(s.layers.begin) + (s.op == shard_op::dispatch ? " to " : " from ") +
             list_of(s.peers) + " (holders " + holders_text(s.holders) + ")";
      break;
    case shard_op::expert:
      out += " layers " + to_string(s.layers) + " experts " + set_of(s.experts) + " for " + list_of(s.peers);
      break;
    default:
      break;
  }
  return out;
}

std::string to_string(exchange_kind k) {
  switch (k) {
    case exchange_kind::token_to_embedding: return "token to embedding";
    case exchange_kind::broadcast_embedding: return "broadcast embedding";
    case exchange_kind::all_reduce_attention: return "all-reduce after attention";
    case exchange_kind::all_reduce_ffn: return "all-reduce after FFN";
    case exchange_kind::send_activations: return "send activations";
    case exchange_kind::logits_to_session: return "logits to session";
    case exchange_kind::expert_dispatch: return "expert dispatch";
    case exchange_kind::expert_combine: return "expert combine";
    case exchange_kind::count: break;
  }
  return "?";
}

std::string to_string(const exchange_step& s) {
  std::string out = to_string(s.kind);
  switch (s.kind) {
    case exchange_kind::all_reduce_attention:
    case exchange_kind::all_reduce_ffn:
      out += ", layer " + std::to_string(s.layer) + ", over " + list_of(s.from);
      break;
    case exchange_kind::expert_dispatch:
    case exchange_kind::expert_combine:
      out += ", layer " + std::to_string(s.layer) + ": " + list_of(s.from) + " -> " + list_of(s.to);
      break;
    case exchange_kind::send_activations:
      out += ", stage " + std::to_string(s.stage) + " -> " + std::to_string(s.stage + 1) + ": " + list_of(s.from) +
             " -> " + list_of(s.to);
      break;
    default:
      out += ": " + list_of(s.from) + " -> " + list_of(s.to);
      break;
  }
  return out + " (" + std::to_string(s.bytes_per_position) + " B)";
}

std::string to_string(const placement& p) {
  const model::config& c = p.config;
  const bool moe_placement = p.strat.kind == strategy_kind::expert;
  std::string out = "placement " + to_string(p.strat) + ": " + plural(static_cast<int>(p.stages.size()), "stage", "stages") +
                    (moe_placement ? " x (1 + " + std::to_string(p.strat.experts) + " expert nodes, " +
                                         plural(p.strat.expert_replicas, "replica", "replicas") + " of each expert)"
                                   : " x " + std::to_string(p.strat.tp)) +
                    " = " + plural(static_cast<int>(p.shards.size()), "shard", "shards") +
                    ", " + plural(static_cast<int>(p.spares.size()), "spare", "spares") + "\n";
  out += "model: dim " + std::to_string(c.dim) + ", hidden " + std::to_string(c.hidden_dim) + ", " +
         plural(c.n_layers, "layer", "layers") + ", " + plural(c.n_heads, "head", "heads") + ", " +
         plural(c.n_kv_heads, "KV head", "KV heads") + ", vocab " + std::to_string(c.vocab_size) + "; context " +
         std::to_string(p.options.context) + " x " + plural(p.options.sessions, "session", "sessions") + ", " +
         p.options.weights.name + " weights\n";
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"index", "node", "profile", "role", "layers", "heads", "kv heads", "ffn units", "holds",
                  "memory need / budget"});
  for (const shard& s : p.shards) {
    if (s.expert_node) {
      rows.push_back({std::to_string(s.index), std::to_string(s.node), s.profile, role_of(s, p.strat),
                      to_string(s.layers), "-", "-", to_string(s.ffn), "experts " + set_of(s.experts),
                      format_in(s.memory.total(), report_unit(s.memory.total())) + " / " +
                          format_bytes(s.budget_bytes) + (s.fits() ? "" : "  DOES NOT FIT")});
      continue;
    }
    std::string holds = s.has_embedding ? "embedding" : "";
    if (s.has_classifier)
      holds += std::string(holds.empty() ? "" : "+") + "classifier" +
               (s.vocab.size() == c.vocab_size ? std::string() : " " + to_string(s.vocab));
    if (!s.routed) holds += std::string(holds.empty() ? "" : "+") + "router+shared";
    if (holds.empty()) holds = "-";
    rows.push_back({std::to_string(s.index), std::to_string(s.node), s.profile, role_of(s, p.strat),
                    to_string(s.layers), to_string(s.heads), to_string(s.kv_heads), to_string(s.ffn), holds,
                    format_in(s.memory.total(), report_unit(s.memory.total())) + " / " +
                        format_bytes(s.budget_bytes) + (s.fits() ? "" : "  DOES NOT FIT")});
  }
  for (const spare_node& s : p.spares) {
    rows.push_back({std::to_string(s.index), std::to_string(s.node), s.profile, "spare", "-", "-", "-", "-", "-",
                    "- / " + format_bytes(s.budget_bytes)});
  }
  out += table(rows);
  // Column slices (wo, w2) that a GGUF file's typed matrix cannot give in its
  // own blocks: those shards hold them dequantized (their memory above counts
  // 4 bytes a weight); see ffn_split for how the FFN units avoid this.
  for (const auto k : {weight_format::wo, weight_format::w2}) {
    const int b = file_block(p.options.weights, k);
    if (b == 1) continue;
    const bool wo = k == weight_format::wo;
    std::string who;
    for (const shard& s : p.shards) {
      if (s.expert_node) continue;
      const int c0 = wo ? s.heads.begin * c.head_size() : s.ffn.begin;
      const int n = wo ? s.heads.size() * c.head_size() : s.ffn.size();
      if (c0 % b == 0 && n % b == 0) continue;
      who += (who.empty() ? "" : ", ") + std::to_string(s.index) + " " + to_string(range{c0, c0 + n});
    }
    if (who.empty()) continue;
    const std::string why =
        wo ? "a rank's query heads come in whole KV heads of " + std::to_string(c.kv_mul() * c.head_size()) +
                 " columns (" + std::to_string(c.kv_mul()) + " x head size " + std::to_string(c.head_size()) + ")"
           : std::to_string(c.hidden_dim) + " FFN units " +
                 (c.hidden_dim % b != 0 ? "are not a whole number of blocks"
                                        : "are " + std::to_string(c.hidden_dim / b) + " blocks, fewer than the ranks");
    out += std::string("note: ") + (wo ? "wo" : "w2") + " is stored in blocks of " + std::to_string(b) +
           " weights, and these column slices do not start and end on one (" + why +
           "), so each is held as f32, 4 bytes a weight: placement index " + who + "\n";
  }

  // Exchanges per position, the per-layer all-reduces folded per stage.
  out += "exchanges per position:\n";
  for (size_t i = 0; i < p.steps.size(); ++i) {
    const exchange_step& s = p.steps[i];
    if (s.kind == exchange_kind::all_reduce_attention) {
      const stage& sg = p.stages[static_cast<size_t>(s.stage)];
      const std::string how =
          s.algorithm == reduce_algorithm::scatter_gather
              ? "reduce-scatter + all-gather, chunks of <= " + std::to_string(s.bytes_per_position) + " B, " +
                    std::to_string(s.bytes_per_rank) + " B sent by each rank, summed in rank order"
              : std::to_string(s.bytes_per_position) + " B from each rank to each, summed in rank order";
      out += "  stage " + std::to_string(s.stage) + ", layers " + to_string(sg.layers) +
             ": all-reduce after attention and after FFN over " + list_of(s.from) + " (" + how + "), " +
             plural(2 * sg.layers.size(), "time", "times") + "\n";
      while (i + 1 < p.steps.size() && (p.steps[i + 1].kind == exchange_kind::all_reduce_attention ||
                                        p.steps[i + 1].kind == exchange_kind::all_reduce_ffn) &&
             p.steps[i + 1].stage == s.stage) {
        ++i;
      }
      continue;
    }
    if (s.kind == exchange_kind::expert_dispatch) {
      const stage& sg = p.stages[static_cast<size_t>(s.stage)];
      out += "  stage " + std::to_string(s.stage) + ", layers " + to_string(sg.layers) + ": expert dispatch " +
             list_of(s.from) + " -> the holders of the chosen experts among " + list_of(s.to) +
             " and combine back (" + std::to_string(s.bytes_per_position) +
             " B each way: xb per chosen expert, its output back), " +
             plural(sg.layers.size(), "time", "times") + "\n";
      while (i + 1 < p.steps.size() && (p.steps[i + 1].kind == exchange_kind::expert_dispatch ||
                                        p.steps[i + 1].kind == exchange_kind::expert_combine) &&
             p.steps[i + 1].stage == s.stage)
        ++i;
      continue;
    }
    out += "  " + to_string(s) + "\n";
  }
  // Each shard's program; a TP group's four ops per layer shown once per range.
  out += "programs (per step, executed by each shard):\n";
  for (const shard& sh : p.shards) {
    std::string line;
    for (size_t i = 0; i < sh.program.size(); ++i) {
      const shard_step& op = sh.program[i];
      if (op.op == shard_op::compute && op.partial && op.layers.begin == sh.layers.begin &&
          op.part == layer_part::attention && i + 3 < sh.program.size()) {
        line += std::string(line.empty() ? "" : "; ") + "per layer of " + to_string(sh.layers) +
                ": compute attention (partial), reduce over " + list_of(sh.program[i + 1].peers) + " (" +
                to_string(sh.program[i + 1].algorithm) + "), compute ffn (partial), reduce";
        while (i + 1 < sh.program.size() &&
               (sh.program[i + 1].op == shard_op::compute || sh.program[i + 1].op == shard_op::reduce))
          ++i;
        continue;
      }
      if (op.op == shard_op::compute && !op.partial && op.part == layer_part::attention &&
          op.layers.begin == sh.layers.begin && i + 2 < sh.program.size()) {
        line += std::string(line.empty() ? "" : "; ") + "per layer of " + to_string(sh.layers) +
                ": compute attention, dispatch to " + list_of(sh.program[i + 1].peers) + ", combine (holders " +
                holders_text(sh.program[i + 1].holders) + ")";
        while (i + 1 < sh.program.size() &&
               (sh.program[i + 1].op == shard_op::compute || sh.program[i + 1].op == shard_op::dispatch ||
                sh.program[i + 1].op == shard_op::combine))
          ++i;
        continue;
      }
      line += (line.empty() ? "" : "; ") + to_string(op);
    }
    out += "  " + std::to_string(sh.index) + ": " + line + "\n";
  }
  return out;
}

}  // namespace cellshard::topologies
