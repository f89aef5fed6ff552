// topologies/plan_calibrate.cpp: the sweep CSV reader and the non-negative
// least-squares fit of the planner's constants.
#include "topologies/plan_calibrate.hpp"

#include "base/parse.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <sstream>

namespace cellshard::topologies {

namespace {

// 1/eff, c_msg, c_sync, c_sync_msg, c_byte, transfer excess, message CPU,
// c_xmsg, all-reduce message CPU, 1/batch eff, all-reduce round CPU
// (plan_calibrate.hpp).
constexpr int n_params = 11;
constexpr int expert_param = 7;
constexpr int sync_cpu_param = 8;
constexpr int batch_eff_param = 9;
const char* const param_names[n_params] = {"compute_efficiency", "message_overhead_s",      "sync_overhead_s",
                                           "sync_message_overhead_s", "byte_overhead_s", "transfer_excess",
                                           "message_cpu_s", "expert_message_overhead_s", "sync_message_cpu_s",
                                           "batch_compute_efficiency", "sync_cpu_s"};

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false;
  for (char c : line) {
    if (c == '"') quoted = !quoted;
    else if (c == ',' && !quoted) {
      out.push_back(trim(cur));
      cur.clear();
    } else cur += c;
  }
  out.push_back(trim(cur));
  return out;
}

// The feature vector of a row and the fixed part of its prediction.
struct features {
  std::array<double, n_params> x{};
  double fixed = 0;  // latency + transfer at the payload rate (+ quota throttling)
};

// The serial chain (cost_terms::seconds).
features chain_features(const cost_terms& c) {
  features f;
  f.x = {c.compute_s, c.messages, c.syncs, c.sync_messages, c.bytes, c.transfer_s, 0, c.expert_messages, 0, 0, 0};
  f.fixed = c.wire_s + c.throttle_s;
  return f;
}

// `scale` steps of a busy station of the runtime (cost_terms::busy_seconds
// with one_sequence_per_step: CPU only, compute at the sustained rate; with
// several sequences interleaved, at the batch efficiency).
features busy_features(const cost_terms& c, double scale) {
  features f;
  const double q = c.quota > 0 && c.quota < 1 ? c.quota : 1.0;
  const double compute = c.compute_s / q * scale;
  f.x = {c.concurrent ? 0 : compute, 0, 0, 0, c.bytes * scale, 0, c.handled * scale, 0, c.sync_handled * scale,
         c.concurrent ? compute : 0, c.syncs * scale};
  return f;
}

plan_assumptions with_params(plan_assumptions a, const std::array<double, n_params>& th) {
  if (th[0] > 0) a.compute_efficiency = 1.0 / th[0];
  a.message_overhead_s = th[1];
  a.sync_overhead_s = th[2];
  a.sync_message_overhead_s = th[3];
  a.byte_overhead_s = th[4];
  a.transfer_excess = th[5];
  a.message_cpu_s = th[6];
  a.expert_message_overhead_s = th[7];
  a.sync_message_cpu_s = th[8];
  a.batch_compute_efficiency = th[9] > 0 ? 1.0 / th[9] : 0;
  a.sync_cpu_s = th[10];
  return a;
}

std::array<double, n_params> params_of(const plan_assumptions& a) {
  const double eff = a.compute_efficiency > 0 ? a.compute_efficiency : 1.0;
  const double beff = a.batch_compute_efficiency > 0 ? a.batch_compute_efficiency : eff;
  return {1.0 / eff,         a.message_overhead_s, a.sync_overhead_s, a.sync_message_overhead_s,
          a.byte_overhead_s, a.transfer_excess,    a.message_cpu_s,    a.expert_message_overhead_s,
          a.sync_message_cpu_s, 1.0 / beff, a.sync_cpu_s};
}

// Solves the k x k system M v = r (the leading k rows and columns of the
// arrays; the fit's subsets: no allocation) by Gaussian elimination with
// partial pivoting, in place; false when singular.
template <size_t N>
bool solve_in_place(std::array<std::array<double, N>, N>& M, std::array<double, N>& r, size_t k,
                    std::array<double, N>& v) {
  for (size_t c = 0; c < k; ++c) {
    size_t piv = c;
    for (size_t i = c + 1; i < k; ++i) {
      if (std::fabs(M[i][c]) > std::fabs(M[piv][c])) piv = i;
    }
    if (std::fabs(M[piv][c]) < 1e-300) return false;
    std::swap(M[c], M[piv]);
    std::swap(r[c], r[piv]);
    for (size_t i = c + 1; i < k; ++i) {
      const double f = M[i][c] / M[c][c];
      for (size_t j = c; j < k; ++j) M[i][j] -= f * M[c][j];
      r[i] -= f * r[c];
    }
  }
  for (size_t c = k; c-- > 0;) {
    double s = r[c];
    for (size_t j = c + 1; j < k; ++j) s -= M[c][j] * v[j];
    v[c] = s / M[c][c];
  }
  return true;
}

/// Non-negative least squares on the normal equations (Lawson and Hanson's
/// active-set method): minimises x'Gx - 2x'b over the `usable` columns with
/// x >= 0, the `free_cols` unconstrained (they stay in the solution; the
/// caller requires them positive). Writes the usable entries of x (others
/// untouched); false when a system is singular or the method does not settle
/// (the caller then searches every subset). The optimum is the one the subset
/// search finds (the convex problem's minimum; the fit of the 2026-12-02 lab
/// rows came out identical, digit for digit, in less than half the time).
template <size_t N>
bool nnls_gram(const std::array<std::array<double, N>, N>& G, const std::array<double, N>& b,
               const std::array<bool, N>& usable, const std::array<bool, N>& free_cols, std::array<double, N>& x) {
  std::array<bool, N> passive{};
  std::array<double, N> cur{};
  double scale = 0;
  for (size_t j = 0; j < N; ++j)
    if (usable[j]) {
      passive[j] = free_cols[j];
      scale = std::max(scale, std::fabs(b[j]));
    }
  const double tol = 1e-12 * (1 + scale);
  // The solution restricted to the passive set.
  auto solve_passive = [&](std::array<double, N>& s) {
    std::array<size_t, N> idx{};
    size_t k = 0;
    for (size_t j = 0; j < N; ++j)
      if (usable[j] && passive[j]) idx[k++] = j;
    std::array<std::array<double, N>, N> M;
    std::array<double, N> r, v;
    for (size_t a = 0; a < k; ++a) {
      r[a] = b[idx[a]];
      for (size_t c = 0; c < k; ++c) M[a][c] = G[idx[a]][idx[c]];
    }
    s.fill(0);
    if (k == 0) return true;
    if (!solve_in_place(M, r, k, v)) return false;
    for (size_t a = 0; a < k; ++a) s[idx[a]] = v[a];
    return true;
  };
  if (!solve_passive(cur)) return false;
  for (int outer = 0; outer < 8 * static_cast<int>(N); ++outer) {
    // The gradient of the active (zero) constrained columns.
    size_t t = N;
    double most = tol;
    for (size_t j = 0; j < N; ++j) {
      if (!usable[j] || passive[j]) continue;
      double w = b[j];
      for (size_t c = 0; c < N; ++c)
        if (usable[c]) w -= G[j][c] * cur[c];
      if (w > most) {
        most = w;
        t = j;
      }
    }
    if (t == N) {
      for (size_t j = 0; j < N; ++j)
        if (usable[j]) x[j] = cur[j];
      return true;
    }
    passive[t] = true;
    for (int inner = 0;; ++inner) {
      if (inner > 4 * static_cast<int>(N)) return false;
      std::array<double, N> s;
      if (!solve_passive(s)) return false;
      double alpha = 2;
      for (size_t j = 0; j < N; ++j)
        if (usable[j] && passive[j] && !free_cols[j] && s[j] <= 0) alpha = std::min(alpha, cur[j] / (cur[j] - s[j]));
      if (alpha > 1) {  // every constrained passive column positive
        cur = s;
        break;
      }
      for (size_t j = 0; j < N; ++j)
        if (usable[j]) cur[j] += alpha * (s[j] - cur[j]);
      for (size_t j = 0; j < N; ++j)
        if (usable[j] && passive[j] && !free_cols[j] && cur[j] <= tol) {
          passive[j] = false;
          cur[j] = 0;
        }
    }
  }
  return false;
}

}  // namespace

result<std::vector<sweep_row>> parse_sweep_csv(const std::string& text, const std::string& name) {
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  std::map<std::string, size_t> col;
  std::vector<sweep_row> rows;
  bool have_header = false;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (trim(line).empty() || trim(line)[0] == '#') continue;
    auto cells = split_csv(line);
    if (!have_header) {
      for (size_t i = 0; i < cells.size(); ++i) col[lower(cells[i])] = i;
      for (const char* need : {"model", "topology", "nodes", "tpot_ms_p50"}) {
        if (!col.count(need)) {
          return make_error(name + " line " + std::to_string(lineno) + ": the header lacks the column '" + need +
                            "' (CLI.md sweep columns: model,topology,nodes,stages,tp,link,batch,ttft_ms,"
                            "tpot_ms_p50,tpot_ms_p99,tokens_per_s,comm_share,bytes_per_token)");
        }
      }
      have_header = true;
      continue;
    }
    sweep_row r;
    r.line = lineno;
    std::string err;
    auto cell = [&](const char* key) -> std::string {
      auto it = col.find(key);
      if (it == col.end() || it->second >= cells.size()) return "";
      return cells[it->second];
    };
    auto number = [&](const char* key, double fallback) -> double {
      const std::string s = cell(key);
      if (s.empty() || s == "-" || lower(s) == "nan") return fallback;
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end != '\0') {
        if (err.empty()) err = "column '" + std::string(key) + "': '" + s + "' is not a number";
        return fallback;
      }
      return v;
    };
    r.model = cell("model");
    r.topology = lower(cell("topology"));
    r.nodes = static_cast<int>(number("nodes", 0));
    r.stages = static_cast<int>(number("stages", 0));
    r.tp = static_cast<int>(number("tp", 0));
    r.link = cell("link");
    r.batch = static_cast<int>(number("batch", 1));
    r.ttft_ms = number("ttft_ms", 0);
    r.tpot_ms_p50 = number("tpot_ms_p50", 0);
    r.tpot_ms_p99 = number("tpot_ms_p99", 0);
    r.tokens_per_s = number("tokens_per_s", 0);
    r.comm_share = number("comm_share", 0);
    r.bytes_per_token = number("bytes_per_token", 0);
    r.decode_tokens_per_s = number("decode_tokens_per_s", -1);
    r.decode_comm_share = number("decode_comm_share", -1);
    r.decode_tpot_ms = number("decode_tpot_ms", -1);
    if (!err.empty()) return make_error(name + " line " + std::to_string(lineno) + ": " + err);
    if (r.nodes < 1) return make_error(name + " line " + std::to_string(lineno) + ": nodes must be at least 1");
    if (r.tpot_ms_p50 <= 0) {
      return make_error(name + " line " + std::to_string(lineno) + ": tpot_ms_p50 must be positive");
    }
    if (r.batch < 1) r.batch = 1;
    rows.push_back(r);
  }
  if (!have_header) return make_error(name + ": empty (expected a header line and rows)");
  return rows;
}

double measured_tpot_ms(const sweep_row& row) {
  if (row.decode_tpot_ms > 0) return row.decode_tpot_ms;
  if (row.decode_tokens_per_s > 0) return std::max(1, row.batch) * 1000.0 / row.decode_tokens_per_s;
  return row.tpot_ms_p50;
}

double predicted_comm_share(const plan_result& p) {
  if (!(p.per_token_latency_s > 0)) return 0;
  // A session's own compute is its steps on the chain (throttled by a quota
  // as the chain's) in either regime: when busy stations set the pace, the
  // time it waits for the other sessions' steps is not its compute (the
  // 2026-12-02 lab: pipeline:8 at batch 8 measured 0.77 / 0.86, where the
  // compute at the sustained rate predicted 0.18).
  return std::max(0.0, 1.0 - p.chain_compute_s / p.per_token_latency_s);
}

model_resolver preset_resolver(const model_spec* fallback) {
  const bool has = fallback != nullptr;
  model_spec fb = has ? *fallback : model_spec{};
  return [has, fb](const std::string& row_model) -> result<model_spec> {
    std::string n = lower(row_model);
    const auto slash = n.find_last_of('/');
    if (slash != std::string::npos) n = n.substr(slash + 1);
    const auto dot = n.find_last_of('.');
    if (dot != std::string::npos) n = n.substr(0, dot);
    auto p = find_model_preset(n);
    if (p) return p;
    // "synth stories110m", "stories110m-synth": the preset named inside.
    for (const auto& name : model_preset_names()) {
      if (n.find(name) != std::string::npos) return find_model_preset(name);
    }
    if (has) return fb;
    return make_error("model '" + row_model + "' is not a preset (pass --model for it)");
  };
}

result<plan_request> request_for_row(const sweep_row& row, const plan_request& base, const model_resolver& resolve) {
  const std::string where = "line " + std::to_string(row.line) + ": ";
  auto m = resolve(row.model);
  if (!m) return make_error(where + m.message());
  plan_request r = base;
  r.model = *m;
  r.nodes = row.nodes;
  r.batch = row.batch;
  r.assume.one_sequence_per_step = true;  // as the runtime that measured the row
  std::string topo = row.topology;
  // The stages / tp columns pin the split where the topology text does not.
  if (topo == "pipeline" && row.stages > 0) topo += ":" + std::to_string(row.stages);
  else if (topo == "tensor" && row.tp > 0) topo += ":" + std::to_string(row.tp);
  // The runtime's expert placement (sweep's "expert": one stage shard and the
  // point's other N - 1 nodes as expert nodes; "expert:E": E expert nodes) is
  // the planner's pipeline:1,expert:E, not its own expert:T layout.
  if (topo == "expert") {
    if (row.nodes < 2) return make_error(where + "topology expert needs at least 2 nodes (a stage shard and an expert node)");
    topo = "pipeline:1,expert:" + std::to_string(row.nodes - 1);
  } else if (topo.rfind("expert:", 0) == 0) {
    topo = "pipeline:1," + topo;
  }
  auto t = parse_plan_topology(topo);
  if (!t) return make_error(where + t.message());
  r.topology = *t;
  const std::string link = lower(row.link);
  if (!link.empty() && link != "-" && link != "none" && link != "host" && link != "in-process") {
    auto l = parse_link(row.link);
    if (!l) return make_error(where + l.message());
    r.hw.node.link = *l;
  }
  return r;
}

namespace {

/// The planner's prediction for one row under `assume`, beside the row's measurements.
result<calibration_point> predict_row(const sweep_row& row, plan_request r, const plan_assumptions& assume) {
  const bool one = r.assume.one_sequence_per_step;
  r.assume = assume;
  r.assume.one_sequence_per_step = one;
  auto p = plan(r);
  if (!p) return make_error("line " + std::to_string(row.line) + ": " + p.message());
  calibration_point pt;
  pt.line = row.line;
  pt.model = r.model.name;
  pt.topology = to_string(p->layout.topology);
  pt.nodes = r.nodes;
  pt.batch = r.batch;
  pt.link = row.link;
  pt.measured_tpot_ms = measured_tpot_ms(row);
  pt.predicted_tpot_ms = p->per_token_latency_s * 1000.0;
  pt.error = (pt.predicted_tpot_ms - pt.measured_tpot_ms) / pt.measured_tpot_ms;
  pt.measured_tpot_p50_ms = row.tpot_ms_p50;
  pt.p50_error = (pt.predicted_tpot_ms - pt.measured_tpot_p50_ms) / pt.measured_tpot_p50_ms;
  // The decode-only measurements when the sweep wrote them (what the plan
  // predicts: a steady stream of tokens, no first token, no prompt).
  pt.measured_tokens_per_s = row.decode_tokens_per_s >= 0 ? row.decode_tokens_per_s : row.tokens_per_s;
  pt.predicted_tokens_per_s = p->tokens_per_s;
  if (pt.measured_tokens_per_s > 0)
    pt.tokens_per_s_error = (pt.predicted_tokens_per_s - pt.measured_tokens_per_s) / pt.measured_tokens_per_s;
  pt.measured_comm_share = row.decode_comm_share >= 0 ? row.decode_comm_share : row.comm_share;
  pt.predicted_comm_share = predicted_comm_share(*p);
  return pt;
}

}  // namespace

result<calibration> calibrate(const std::vector<sweep_row>& rows, const plan_request& base,
                              const model_resolver& resolve) {
  if (rows.empty()) return make_error("--calibrate: no rows to fit");
  struct prepared {
    plan_request req;
    plan_layout layout;
    chain_costs chain;  // at the row's micro-batch
    int micro = 1;
    double y = 0;  // measured seconds
  };
  std::vector<prepared> ps;
  std::vector<const sweep_row*> used;
  for (const auto& row : rows) {
    auto r = request_for_row(row, base, resolve);
    if (!r) return r.err();
    auto l = lay_out(*r);
    if (!l) return make_error("line " + std::to_string(row.line) + ": " + l.message());
    prepared p;
    p.req = *r;
    p.layout = *l;
    // The runtime steps concurrent sessions one at a time (a station's step
    // holds one sequence), overlapped across pipeline stages.
    p.micro = 1;
    p.chain = chain_cost(p.req, p.layout, p.micro);
    p.y = measured_tpot_ms(row) / 1000.0;
    ps.push_back(std::move(p));
    used.push_back(&row);
  }
  if (ps.empty()) return make_error("--calibrate: no rows to fit");

  const std::array<double, n_params> base_theta = params_of(base.assume);
  // A row's regime under theta: B x its busiest station's CPU (true), or the chain.
  auto regime_of = [&](const prepared& p, const std::array<double, n_params>& th, const cost_terms** top_out) {
    plan_assumptions cur = with_params(base.assume, th);
    cur.one_sequence_per_step = true;
    const cost_terms* top = &p.chain.station_work.front();
    for (const auto& w : p.chain.station_work)
      if (w.busy_seconds(cur) > top->busy_seconds(cur)) top = &w;
    if (top_out) *top_out = top;
    const double scale = static_cast<double>(p.req.batch) / p.micro;
    return scale * top->busy_seconds(cur) > p.chain.chain.seconds(cur);
  };
  auto features_in = [&](const prepared& p, bool is_busy, const cost_terms* top) {
    return is_busy ? busy_features(*top, static_cast<double>(p.req.batch) / p.micro) : chain_features(p.chain.chain);
  };
  // Under a CPU quota the chain's compute is not linear in 1/eff
  // (quota_step_seconds): the efficiency is then searched outside (fix_eff)
  // and the other constants fitted linearly at each candidate.
  const bool quota = base.hw.cpu_quota > 0 && base.hw.cpu_quota < 1;
  // The non-negative least-squares fit for fixed regimes (every subset of the
  // constants; compute must take time when its column is free).
  auto fit_fixed = [&](const std::vector<bool>& busy, const std::array<double, n_params>& start,
                       std::array<bool, n_params>& usable) {
    std::vector<features> fs;
    for (size_t i = 0; i < ps.size(); ++i) {
      const cost_terms* top = nullptr;
      regime_of(ps[i], start, &top);
      features f = features_in(ps[i], busy[i], top);
      if (quota) {  // the efficiency is given: its term is fixed
        f.fixed += f.x[0] * start[0];
        f.x[0] = 0;
      }
      fs.push_back(f);
    }
    usable = {};
    for (int j = 0; j < n_params; ++j) {
      for (size_t i = 0; i < ps.size(); ++i) usable[j] = usable[j] || fs[i].x[j] > 0;
    }
    // Relative residuals: A_ij = x_ij / y_i, rhs_i = (y_i - fixed_i) / y_i;
    // the normal equations of every subset are read off these sums.
    std::array<std::array<double, n_params>, n_params> gram{};
    std::array<double, n_params> rhs_all{};
    double rhs2 = 0;  // sum of rhs_i^2: the error of theta = 0
    for (size_t i = 0; i < ps.size(); ++i) {
      const double y = ps[i].y;
      rhs2 += (y - fs[i].fixed) / y * ((y - fs[i].fixed) / y);
      for (size_t a = 0; a < static_cast<size_t>(n_params); ++a) {
        const double xa = fs[i].x[a] / y;
        rhs_all[a] += xa * (y - fs[i].fixed) / y;
        for (size_t b = 0; b < static_cast<size_t>(n_params); ++b) gram[a][b] += xa * fs[i].x[b] / y;
      }
    }
    double best = std::numeric_limits<double>::infinity();
    std::array<double, n_params> best_theta = start;
    {
      // Non-negative least squares with the efficiencies free; accepted when
      // they come out positive (compute takes time), else the subset search.
      std::array<bool, n_params> free_cols{};
      free_cols[0] = usable[0];
      free_cols[batch_eff_param] = usable[batch_eff_param];
      std::array<double, n_params> th{};
      for (int j = 0; j < n_params; ++j)
        if (!usable[j]) th[static_cast<size_t>(j)] = start[static_cast<size_t>(j)];  // no data: as given
      if (nnls_gram(gram, rhs_all, usable, free_cols, th) && (!usable[0] || th[0] > 0) &&
          (!usable[batch_eff_param] || th[batch_eff_param] > 0))
        return th;
    }
    for (int mask = 0; mask < (1 << n_params); ++mask) {
      std::array<int, n_params> idx{};
      size_t k = 0;
      bool ok = true;
      for (int j = 0; j < n_params; ++j) {
        if (mask & (1 << j)) {
          if (!usable[j]) ok = false;
          idx[k++] = j;
        }
      }
      // Compute must take time when its column is free (both efficiencies).
      if (!ok || (usable[0] && !(mask & 1)) || (usable[batch_eff_param] && !(mask & (1 << batch_eff_param)))) continue;
      std::array<std::array<double, n_params>, n_params> M;
      std::array<double, n_params> rhs, v;
      for (size_t a = 0; a < k; ++a) {
        rhs[a] = rhs_all[static_cast<size_t>(idx[a])];
        for (size_t b = 0; b < k; ++b) M[a][b] = gram[static_cast<size_t>(idx[a])][static_cast<size_t>(idx[b])];
      }
      if (k > 0 && !solve_in_place(M, rhs, k, v)) continue;
      if (std::any_of(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(k), [](double q) { return q <= 0; })) continue;
      std::array<double, n_params> th{};
      for (int j = 0; j < n_params; ++j) {
        if (!usable[j]) th[static_cast<size_t>(j)] = start[static_cast<size_t>(j)];  // no data: as given
      }
      for (size_t a = 0; a < k; ++a) th[static_cast<size_t>(idx[a])] = v[a];
      // The summed squared relative error from the normal equations' sums
      // (sum_i (A_i theta - rhs_i)^2 = theta' G theta - 2 theta' b + sum rhs^2;
      // unusable columns are zero in every row): k^2 work, not rows x 11.
      double sse = rhs2;
      for (size_t a = 0; a < static_cast<size_t>(n_params); ++a) {
        if (!usable[a] || th[a] == 0) continue;
        double ga = 0;
        for (size_t b = 0; b < static_cast<size_t>(n_params); ++b)
          if (usable[b]) ga += gram[a][b] * th[b];
        sse += th[a] * (ga - 2 * rhs_all[a]);
      }
      if (sse < best - 1e-18) {
        best = sse;
        best_theta = th;
      }
    }
    return best_theta;
  };
  // The model's own error: max(chain, B x busiest station) against the rows.
  auto model_sse = [&](const std::array<double, n_params>& th) {
    plan_assumptions cur = with_params(base.assume, th);
    cur.one_sequence_per_step = true;
    double sse = 0;
    for (const auto& p : ps) {
      double top = 0;
      for (const auto& w : p.chain.station_work) top = std::max(top, w.busy_seconds(cur));
      const double pred = std::max(p.chain.chain.seconds(cur), static_cast<double>(p.req.batch) / p.micro * top);
      const double e = (pred - p.y) / p.y;
      sse += e * e;
    }
    return sse;
  };
  // max() makes the fit non-convex: alternate regimes and linear fits from
  // three starts (the regimes of the start constants; batch > 1 rows busy;
  // every row on the chain) and keep the lowest error of the model itself.
  struct outcome {
    std::array<double, n_params> theta{};
    std::array<bool, n_params> usable{};
    double sse = std::numeric_limits<double>::infinity();
  };
  auto fit_from = [&](const std::array<double, n_params>& start_theta) {
    outcome best;
    for (int start = 0; start < 3; ++start) {
      std::vector<bool> reg(ps.size(), false);
      for (size_t i = 0; i < ps.size(); ++i) {
        reg[i] = start == 0 ? regime_of(ps[i], start_theta, nullptr) : start == 1 ? ps[i].req.batch > 1 : false;
      }
      std::array<double, n_params> th = start_theta;
      std::array<bool, n_params> usable{};
      for (int round = 0; round < 12; ++round) {
        th = fit_fixed(reg, th, usable);
        std::vector<bool> now(ps.size());
        for (size_t i = 0; i < ps.size(); ++i) now[i] = regime_of(ps[i], th, nullptr);
        if (now == reg) break;
        reg = now;
      }
      const double sse = model_sse(th);
      if (sse < best.sse - 1e-15) best = {th, usable, sse};
    }
    return best;
  };
  // The rows' costs at efficiency eff (the quota's throttling depends on it).
  auto prepare_at = [&](double eff) {
    for (auto& p : ps) {
      plan_request q = p.req;
      q.assume.compute_efficiency = eff;
      p.chain = chain_cost(q, p.layout, p.micro);
    }
  };
  outcome fit;
  if (!quota) {
    fit = fit_from(base_theta);
  } else {
    // A log grid of efficiencies, then golden-section refinement around the best.
    auto at = [&](double eff) {
      prepare_at(eff);
      std::array<double, n_params> st = base_theta;
      st[0] = 1.0 / eff;
      return fit_from(st);
    };
    const int grid = 40;
    const double lo = std::log(0.05), hi = std::log(2.0);
    int best_i = 0;
    for (int i = 0; i <= grid; ++i) {
      outcome o = at(std::exp(lo + (hi - lo) * i / grid));
      if (o.sse < fit.sse) {
        fit = o;
        best_i = i;
      }
    }
    double a = lo + (hi - lo) * std::max(0, best_i - 1) / grid, b = lo + (hi - lo) * std::min(grid, best_i + 1) / grid;
    const double g = (std::sqrt(5.0) - 1) / 2;
    double c = b - g * (b - a), d = a + g * (b - a);
    outcome oc = at(std::exp(c)), od = at(std::exp(d));
    for (int it = 0; it < 40 && b - a > 1e-7; ++it) {
      if (oc.sse < od.sse) {
        b = d;
        d = c;
        od = oc;
        c = b - g * (b - a);
        oc = at(std::exp(c));
      } else {
        a = c;
        c = d;
        oc = od;
        d = a + g * (b - a);
        od = at(std::exp(d));
      }
    }
    for (const outcome* o : {&oc, &od})
      if (o->sse < fit.sse) fit = *o;
    prepare_at(1.0 / fit.theta[0]);
    fit.usable[0] = true;  // searched
  }
  const std::array<double, n_params> theta = fit.theta;
  std::vector<bool> busy(ps.size(), false);
  std::vector<features> fs;
  for (size_t i = 0; i < ps.size(); ++i) {
    const cost_terms* top = nullptr;
    busy[i] = regime_of(ps[i], theta, &top);
    fs.push_back(features_in(ps[i], busy[i], top));
  }
  std::vector<std::string> free_names;
  for (int j = 0; j < n_params; ++j) {
    if (fit.usable[j]) free_names.push_back(param_names[j]);
  }

  calibration c;
  c.fitted = with_params(base.assume, theta);
  c.fitted.one_sequence_per_step = base.assume.one_sequence_per_step;
  // No row of the runtime's expert placement: an expert message is priced
  // as a hop message (the one mechanism measured), not the base value.
  if (!fit.usable[expert_param]) c.fitted.expert_message_overhead_s = c.fitted.message_overhead_s;
  // No busy row of a TP group: an all-reduce message's CPU is a message's;
  // no busy row of batch > 1: the batch efficiency is the efficiency.
  if (!fit.usable[sync_cpu_param]) c.fitted.sync_message_cpu_s = c.fitted.message_cpu_s;
  if (!fit.usable[batch_eff_param]) c.fitted.batch_compute_efficiency = 0;
  c.free = free_names;
  // Each constant with the rows that determine it (a non-zero feature in the
  // row's final regime).
  for (int j = 0; j < n_params; ++j) {
    fitted_constant fc;
    fc.name = param_names[j];
    const plan_assumptions& f = c.fitted;
    const double values[n_params] = {f.compute_efficiency,      f.message_overhead_s, f.sync_overhead_s,
                                     f.sync_message_overhead_s, f.byte_overhead_s,    f.transfer_excess,
                                     f.message_cpu_s,           f.expert_message_overhead_s,
                                     f.sync_message_cpu_s,      f.batch_compute_efficiency,
                                     f.sync_cpu_s};
    fc.value = values[j];
    for (size_t i = 0; i < ps.size(); ++i) {
      const bool uses = fs[i].x[static_cast<size_t>(j)] > 0;
      if (uses) {
        fc.lines.push_back(used[i]->line);
        (busy[i] ? fc.busy_rows : fc.chain_rows) += 1;
      }
    }
    fc.fitted = !fc.lines.empty();
    c.constants.push_back(fc);
  }
  double sum2 = 0;
  for (size_t i = 0; i < ps.size(); ++i) {
    auto pt = predict_row(*used[i], ps[i].req, c.fitted);
    if (!pt) return pt.err();
    c.max_abs_error = std::max(c.max_abs_error, std::fabs(pt->error));
    sum2 += pt->error * pt->error;
    c.points.push_back(*pt);
  }
  c.rms_error = std::sqrt(sum2 / static_cast<double>(c.points.size()));
  c.skipped = static_cast<int>(rows.size() - ps.size());
  return c;
}

result<holdout_rule> parse_holdout(const std::string& text) {
  const std::string want =
      "--holdout: expected every:K[:J] (K >= 2, 0 <= J < K), nodes:N (N >= 2) or last:N (N >= 1), got '" + text + "'";
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : text) {
    if (ch == ':') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  parts.push_back(cur);
  auto number = [](const std::string& s, int& out) {
    const auto v = parse_uint<int>(s);
    if (v) out = *v;
    return v.has_value();
  };
  holdout_rule h;
  if (parts[0] == "every" && (parts.size() == 2 || parts.size() == 3)) {
    h.kind = holdout_rule::every;
    if (!number(parts[1], h.n) || h.n < 2) return make_error(want);
    h.offset = h.n - 1;
    if (parts.size() == 3 && (!number(parts[2], h.offset) || h.offset >= h.n)) return make_error(want);
    return h;
  }
  if (parts[0] == "last" && parts.size() == 2) {
    h.kind = holdout_rule::last;
    if (!number(parts[1], h.n) || h.n < 1) return make_error(want);
    h.offset = 0;
    return h;
  }
  if (parts[0] == "nodes" && parts.size() == 2) {
    h.kind = holdout_rule::nodes_at_least;
    if (!number(parts[1], h.n) || h.n < 2) return make_error(want);
    h.offset = 0;
    return h;
  }
  return make_error(want);
}

std::string to_string(const holdout_rule& h) {
  if (h.kind == holdout_rule::nodes_at_least) return "nodes:" + std::to_string(h.n);
  if (h.kind == holdout_rule::last) return "last:" + std::to_string(h.n);
  return "every:" + std::to_string(h.n) + ":" + std::to_string(h.offset);
}

result<validation> validate(const std::vector<sweep_row>& rows, const plan_request& base,
                            const model_resolver& resolve, const holdout_rule& rule) {
  std::vector<sweep_row> train, test;
  validation v;
  v.rule = rule;
  int position = 0;
  for (const auto& row : rows) {
    const bool hold = rule.kind == holdout_rule::nodes_at_least ? row.nodes >= rule.n
                      : rule.kind == holdout_rule::last
                          ? position >= static_cast<int>(rows.size()) - rule.n
                          : position % rule.n == rule.offset;
    ++position;
    (hold ? test : train).push_back(row);
  }
  if (train.empty()) return make_error("--holdout " + to_string(rule) + " holds out every row: nothing left to fit");
  if (test.empty()) return make_error("--holdout " + to_string(rule) + " holds out no row: nothing to validate");
  auto fit = calibrate(train, base, resolve);
  if (!fit) return fit.err();
  v.fit = *fit;
  for (const auto& row : test) {
    auto r = request_for_row(row, base, resolve);
    if (!r) return r.err();
    auto pt = predict_row(row, *r, v.fit.fitted);
    if (!pt) return pt.err();
    v.max_abs_error = std::max(v.max_abs_error, std::fabs(pt->error));
    v.max_abs_tokens_per_s_error = std::max(v.max_abs_tokens_per_s_error, std::fabs(pt->tokens_per_s_error));
    v.max_abs_comm_share_error =
        std::max(v.max_abs_comm_share_error, std::fabs(pt->predicted_comm_share - pt->measured_comm_share));
    v.held_out.push_back(*pt);
  }
  return v;
}

result<std::vector<plan_assumptions>> leave_one_out(const std::vector<sweep_row>& rows, const plan_request& base,
                                                    const model_resolver& resolve) {
  if (rows.size() < 3) return make_error("--calibrate: leave-one-out needs at least 3 rows");
  std::vector<plan_assumptions> out;
  for (size_t left = 0; left < rows.size(); ++left) {
    std::vector<sweep_row> rest;
    for (size_t i = 0; i < rows.size(); ++i)
      if (i != left) rest.push_back(rows[i]);
    auto c = calibrate(rest, base, resolve);
    if (!c) return c.err();
    out.push_back(c->fitted);
  }
  return out;
}

}  // namespace cellshard::topologies
