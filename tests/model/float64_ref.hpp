// tests/model/float64_ref.hpp: an independent float64 forward pass over an
// all-F32 GGUF file, written straight from the published formulas and sharing
// no code with model/. Tests compare the engine's logits (and MoE blocks)
// against it.
//
// Covered: the `llama` architecture, dense or Mixtral-style MoE (RMSNorm with
// the file's epsilon, RoPE on adjacent pairs with the file's base and optional
// rope_freqs.weight factors, grouped-query attention, SwiGLU, tied or untied
// classifier; routing = softmax over experts, top-k, weights renormalised over
// the k) and `qwen2moe` (Q/K/V biases, NEOX RoPE on pairs (i, i + hs/2), no
// renormalisation, plus a sigmoid-gated shared expert), and `qwen2` (dense:
// llama's layer with Q/K/V biases and NEOX RoPE). Q/K/V biases are added
// whenever the file has them.
//
// Shapes: tensors are read by name into row-major float64 arrays (ggml's ne[0]
// is the row length). Keys absent from the file take llama.cpp's defaults
// (epsilon 1e-5, RoPE base 10000). A forward() call appends position `pos` to
// the K/V caches, so positions must be fed in order 0, 1, 2, ...
#pragma once

#include "model/gguf.hpp"
#include "tests/support.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <vector>

namespace cellshard::test {

struct float64_ref {
  const model::gguf::file& g;
  std::string a;  // "<architecture>." key prefix
  bool qwen = false;   // qwen2moe: shared expert, no renormalisation
  bool neox = false;   // qwen2, qwen2moe: RoPE pairs (i, i + hs/2)
  int dim = 0, layers = 0, heads = 0, kv_heads = 0, hs = 0, vocab = 0;
  int hidden = 0;      // dense feed-forward width, or one expert's width
  int E = 0, K = 0;    // experts and experts used per token (0: dense)
  int shared = 0;      // qwen2moe shared expert width
  double eps = 1e-5, base = 10000.0;
  std::map<std::string, std::vector<double>> t;
  std::vector<std::vector<double>> kc, vc;  // per layer: [pos][kv_heads * hs]

  explicit float64_ref(const model::gguf::file& file) : g(file) {
    const std::string arch = g.get_string("general.architecture").value();
    a = arch + ".";
    qwen = arch == "qwen2moe";
    neox = qwen || arch == "qwen2";
    dim = static_cast<int>(g.get_int(a + "embedding_length").value());
    layers = static_cast<int>(g.get_int(a + "block_count").value());
    heads = static_cast<int>(g.get_int(a + "attention.head_count").value());
    kv_heads = static_cast<int>(g.get_int(a + "attention.head_count_kv").value());
    hs = dim / heads;
    if (auto e = g.get_f32(a + "attention.layer_norm_rms_epsilon"); e.ok()) eps = *e;
    if (auto b = g.get_f32(a + "rope.freq_base"); b.ok()) base = *b;
    if (auto e = g.get_int(a + "expert_count"); e.ok()) E = static_cast<int>(*e);
    if (auto k = g.get_int(a + "expert_used_count"); k.ok()) K = static_cast<int>(*k);
    for (const auto& ti : g.tensors()) {
      std::vector<double> v(ti.elements());
      for (size_t i = 0; i < v.size(); ++i) v[i] = get_le_f32(ti.data + 4 * i);
      t[ti.name] = std::move(v);
      if (ti.name == "token_embd.weight") vocab = static_cast<int>(ti.ne[1]);
      if (ti.name == "blk.0.ffn_gate.weight" || ti.name == "blk.0.ffn_gate_exps.weight")
        hidden = static_cast<int>(ti.ne[1]);
      if (ti.name == "blk.0.ffn_gate_shexp.weight") shared = static_cast<int>(ti.ne[1]);
    }
    kc.resize(layers);
    vc.resize(layers);
  }

  const std::vector<double>& T(const std::string& n) const {
    auto it = t.find(n);
    INFO("tensor " << n);
    REQUIRE(it != t.end());
    return it->second;
  }
  // out[r] = sum_c W[off + r * cols + c] x[c], cols = x.size().
  static std::vector<double> mv(const std::vector<double>& W, size_t off, const std::vector<double>& x,
                                int rows) {
    const size_t cols = x.size();
    std::vector<double> out(rows, 0.0);
    for (int r = 0; r < rows; ++r)
      for (size_t c = 0; c < cols; ++c) out[r] += W[off + r * cols + c] * x[c];
    return out;
  }
  std::vector<double> rms(const std::vector<double>& x, const std::vector<double>& w) const {
    double ss = 0;
    for (double v : x) ss += v * v;
    const double s = 1.0 / std::sqrt(ss / x.size() + eps);
    std::vector<double> o(x.size());
    for (size_t i = 0; i < x.size(); ++i) o[i] = w[i] * x[i] * s;
    return o;
  }
  void rope(std::vector<double>& v, int pos) const {
    const auto factors = t.find("rope_freqs.weight");
    for (size_t h0 = 0; h0 < v.size(); h0 += hs)
      for (int i = 0; i < hs / 2; ++i) {
        double ang = pos * std::pow(base, -2.0 * i / hs);
        if (factors != t.end()) ang /= factors->second[i];
        // llama (converted files): pairs (2i, 2i+1); NEOX: pairs (i, i + hs/2).
        const size_t p0 = h0 + (neox ? i : 2 * i), p1 = h0 + (neox ? i + hs / 2 : 2 * i + 1);
        const double x0 = v[p0], x1 = v[p1];
        v[p0] = x0 * std::cos(ang) - x1 * std::sin(ang);
        v[p1] = x0 * std::sin(ang) + x1 * std::cos(ang);
      }
  }
  static double silu(double v) { return v / (1.0 + std::exp(-v)); }
  // SwiGLU: W2 (silu(W1 x) * W3 x), matrices starting at the given offsets.
  std::vector<double> ffn(const std::vector<double>& W1, const std::vector<double>& W3,
                          const std::vector<double>& W2, size_t off13, size_t off2, int units,
                          const std::vector<double>& x) const {
    auto u = mv(W1, off13, x, units), b = mv(W3, off13, x, units);
    for (int i = 0; i < units; ++i) u[i] = silu(u[i]) * b[i];
    return mv(W2, off2, u, dim);
  }
  // The MoE block of layer l on the normalised input xb (ties: lower index first).
  std::vector<double> moe(int l, const std::vector<double>& xb) const {
    const std::string p = "blk." + std::to_string(l) + ".";
    auto w = mv(T(p + "ffn_gate_inp.weight"), 0, xb, E);
    const double mx = *std::max_element(w.begin(), w.end());
    double z = 0;
    for (double& v : w) z += (v = std::exp(v - mx));
    for (double& v : w) v /= z;
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return w[x] > w[y]; });
    double wsum = 0;
    for (int i = 0; i < K; ++i) wsum += w[order[i]];
    std::vector<double> out(dim, 0.0);
    const size_t per_expert = static_cast<size_t>(hidden) * dim;
    for (int i = 0; i < K; ++i) {
      const int e = order[i];
      const double wgt = qwen ? w[e] : w[e] / wsum;
      auto y = ffn(T(p + "ffn_gate_exps.weight"), T(p + "ffn_up_exps.weight"), T(p + "ffn_down_exps.weight"),
                   e * per_expert, e * per_expert, hidden, xb);
      for (int j = 0; j < dim; ++j) out[j] += wgt * y[j];
    }
    if (qwen) {
      const double gl = mv(T(p + "ffn_gate_inp_shexp.weight"), 0, xb, 1)[0];
      const double gate = 1.0 / (1.0 + std::exp(-gl));
      auto y = ffn(T(p + "ffn_gate_shexp.weight"), T(p + "ffn_up_shexp.weight"), T(p + "ffn_down_shexp.weight"),
                   0, 0, shared, xb);
      for (int j = 0; j < dim; ++j) out[j] += gate * y[j];
    }
    return out;
  }
  // Logits after feeding `token` at position `pos`.
  std::vector<double> forward(int token, int pos) {
    const auto& emb = T("token_embd.weight");
    std::vector<double> x(emb.begin() + static_cast<size_t>(token) * dim,
                          emb.begin() + static_cast<size_t>(token + 1) * dim);
    const int kvd = kv_heads * hs;
    for (int l = 0; l < layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      auto xb = rms(x, T(p + "attn_norm.weight"));
      auto q = mv(T(p + "attn_q.weight"), 0, xb, dim);
      auto k = mv(T(p + "attn_k.weight"), 0, xb, kvd);
      auto v = mv(T(p + "attn_v.weight"), 0, xb, kvd);
      if (t.count(p + "attn_q.bias")) {
        for (int i = 0; i < dim; ++i) q[i] += T(p + "attn_q.bias")[i];
        for (int i = 0; i < kvd; ++i) k[i] += T(p + "attn_k.bias")[i];
        for (int i = 0; i < kvd; ++i) v[i] += T(p + "attn_v.bias")[i];
      }
      rope(q, pos);
      rope(k, pos);
      kc[l].insert(kc[l].end(), k.begin(), k.end());
      vc[l].insert(vc[l].end(), v.begin(), v.end());
      std::vector<double> att(dim, 0.0);
      for (int h = 0; h < heads; ++h) {
        const int kvh = h / (heads / kv_heads);
        std::vector<double> s(pos + 1);
        double mx = -1e300, z = 0;
        for (int tt = 0; tt <= pos; ++tt) {
          double d = 0;
          for (int i = 0; i < hs; ++i) d += q[h * hs + i] * kc[l][tt * kvd + kvh * hs + i];
          mx = std::max(mx, s[tt] = d / std::sqrt(static_cast<double>(hs)));
        }
        for (double& e : s) z += (e = std::exp(e - mx));
        for (int tt = 0; tt <= pos; ++tt)
          for (int i = 0; i < hs; ++i) att[h * hs + i] += s[tt] / z * vc[l][tt * kvd + kvh * hs + i];
      }
      auto o = mv(T(p + "attn_output.weight"), 0, att, dim);
      for (int i = 0; i < dim; ++i) x[i] += o[i];
      xb = rms(x, T(p + "ffn_norm.weight"));
      auto ff = E > 0 ? moe(l, xb)
                      : ffn(T(p + "ffn_gate.weight"), T(p + "ffn_up.weight"), T(p + "ffn_down.weight"), 0, 0,
                            hidden, xb);
      for (int i = 0; i < dim; ++i) x[i] += ff[i];
    }
    const bool tied = t.count("output.weight") == 0;
    return mv(T(tied ? "token_embd.weight" : "output.weight"), 0, rms(x, T("output_norm.weight")), vocab);
  }
};

}  // namespace cellshard::test
