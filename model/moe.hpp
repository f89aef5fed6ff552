// model/moe.hpp: the mixture-of-experts feed-forward block (Mixtral-style
// llama models and qwen2moe), as llama.cpp's build_moe_ffn computes it for
// those architectures (softmax gating):
//   xb      = rmsnorm(x) (the caller's)
//   p       = softmax(router . xb)                      [n_experts]
//   chosen  = the k = n_experts_used largest p, largest first; equal
//             probabilities go to the lower expert index
//   w_i     = p[chosen_i], divided by sum_j p[chosen_j] when config::norm_topk
//             (llama: yes; qwen2moe: no)
//   y_i     = down_e . (silu(gate_e . xb) * (up_e . xb)),  e = chosen_i
//   out     = w_0 y_0 + w_1 y_1 + ... + w_{k-1} y_{k-1}  (in that order, f32)
//   qwen2moe: out += sigmoid(shared_gate . xb) * shared_down . (silu(shared_gate_w . xb) * (shared_up . xb))
// Every matrix product goes through the backend (kernels::backend), so the
// block runs on every backend and every weight type the dense FFN runs on.
//
// Thread safety: pure functions of their arguments; scratch is the caller's.
#pragma once

#include "kernels/backend.hpp"
#include "model/transformer.hpp"

namespace cellshard::model {

/// Top-k routing over `n_experts` probabilities (or any scores): writes the k
/// chosen expert indices to chosen[0..k), largest score first, a tie going to
/// the lower index, and their weights to weights[0..k): the scores
/// themselves, or divided by their f32 sum (summed in chosen order) when
/// `renormalise`. Requires 1 <= k <= n_experts. NaN scores are never chosen
/// before a number.
void route_top_k(const float* scores, int n_experts, int k, bool renormalise, int* chosen,
                 float* weights);

/// The router of layer `l` on xb [dim]: softmax(router . xb), then
/// route_top_k into s.route_ids / s.route_w [n_experts_used] (uses s.router).
void moe_route(const kernels::backend& be, const shard_weights& w, int l, const float* xb, scratch& s);

/// Routed expert e's output y [dim] = down_e . (silu(gate_e . xb) * (up_e . xb))
/// over the units of e the slice holds (uses s.hb, s.hb2). The expert
/// nodes of an expert placement run exactly this (issue #23).
void moe_expert(const kernels::backend& be, const shard_weights& w, int l, int e, const float* xb, scratch& s,
                float* y);

/// The shared expert (qwen2moe) when the slice holds it: y [dim] = its
/// output and *gate = sigmoid(shared_gate . xb); false (nothing written)
/// when the slice has none.
bool moe_shared(const kernels::backend& be, const shard_weights& w, int l, const float* xb, scratch& s,
                float* y, float* gate);

/// partial[i] += g * y[i] for i < dim: the one accumulation of the block,
/// used in the same order by moe_ffn and by an expert placement's combine.
void moe_accumulate(float* partial, float g, const float* y, int dim);

/// The MoE FFN of layer `l` on the normalised input xb [dim]: partial [dim] =
/// this shard's share of the block's output (the routed experts' units of its
/// slice, and the shared expert when the slice holds it). Uses s.router,
/// s.expert_out, s.hb, s.hb2, s.route_ids, s.route_w. xb must not alias
/// partial.
void moe_ffn(const kernels::backend& be, const shard_weights& w, int l, const float* xb,
             scratch& s, float* partial);

}  // namespace cellshard::model
