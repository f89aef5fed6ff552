#include "model/moe.hpp"

#include <cmath>

namespace cellshard::model {

void route_top_k(const float* scores, int n_experts, int k, bool renormalise, int* chosen,
                 float* weights) {
  // k passes of a linear scan: k and n_experts are small (<= a few hundred),
  // and the scan makes the tie rule obvious (strictly greater replaces).
  for (int i = 0; i < k; ++i) {
    int best = -1;
    for (int e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int j = 0; j < i; ++j) taken = taken || chosen[j] == e;
      if (taken) continue;
      if (best < 0 || scores[e] > scores[best] || (std::isnan(scores[best]) && !std::isnan(scores[e])))
        best = e;
    }
    chosen[i] = best;
    weights[i] = scores[best];
  }
  if (renormalise) {
    float sum = 0.0f;
    for (int i = 0; i < k; ++i) sum += weights[i];
    for (int i = 0; i < k; ++i) weights[i] /= sum;
  }
}

void moe_route(const kernels::backend& be, const shard_weights& w, int l, const float* xb, scratch& s) {
  const config& c = w.cfg();
  matvec(be, s.router.data(), w.at(l).router, xb, w.matmul());
  be.softmax(s.router.data(), c.n_experts);
  route_top_k(s.router.data(), c.n_experts, c.n_experts_used, c.norm_topk, s.route_ids.data(), s.route_w.data());
}

void moe_expert(const kernels::backend& be, const shard_weights& w, int l, int e, const float* xb, scratch& s,
                float* y) {
  const auto& L = w.at(l);
  const matrix& w1 = L.ew1[e];
  matvec(be, s.hb.data(), w1, xb, w.matmul());
  matvec(be, s.hb2.data(), L.ew3[e], xb, w.matmul());
  be.swiglu(s.hb.data(), s.hb2.data(), w1.rows);
  matvec(be, y, L.ew2[e], s.hb.data(), w.matmul());
}

bool moe_shared(const kernels::backend& be, const shard_weights& w, int l, const float* xb, scratch& s,
                float* y, float* gate) {
  const auto& L = w.at(l);
  if (L.sw1.rows == 0) return false;
  const int dim = w.cfg().dim;
  float logit = 0.0f;
  be.matvec(&logit, L.shared_gate, xb, 1, dim, dim);
  *gate = 1.0f / (1.0f + std::exp(-logit));
  matvec(be, s.hb.data(), L.sw1, xb, w.matmul());
  matvec(be, s.hb2.data(), L.sw3, xb, w.matmul());
  be.swiglu(s.hb.data(), s.hb2.data(), L.sw1.rows);
  matvec(be, y, L.sw2, s.hb.data(), w.matmul());
  return true;
}

void moe_accumulate(float* partial, float g, const float* y, int dim) {
  for (int i = 0; i < dim; ++i) partial[i] += g * y[i];
}

void moe_ffn(const kernels::backend& be, const shard_weights& w, int l, const float* xb,
             scratch& s, float* partial) {
  const config& c = w.cfg();
  const int dim = c.dim, k = c.n_experts_used;
  moe_route(be, w, l, xb, s);
  for (int i = 0; i < dim; ++i) partial[i] = 0.0f;
  float* y = s.expert_out.data();
  for (int r = 0; r < k; ++r) {
    moe_expert(be, w, l, s.route_ids[r], xb, s, y);
    moe_accumulate(partial, s.route_w[r], y, dim);
  }
  float g = 0.0f;
  if (moe_shared(be, w, l, xb, s, y, &g)) moe_accumulate(partial, g, y, dim);
}

}  // namespace cellshard::model
