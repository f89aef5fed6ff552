// kernels/reference.hpp: the reference kernels as plain functions, so other
// backends can delegate the operations they do not implement themselves.
// Semantics and shapes: kernels/backend.hpp.
#pragma once
#include "kernels/backend.hpp"

namespace cellshard::kernels::ref {
void matvec(float* out, const float* W, const float* x, int rows, int cols, int ld);
void matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols);
void matvec_q4(float* out, const q4_block* W, const float* x, int rows, int cols);
void rmsnorm(float* out, const float* x, const float* weight, int n);
void rope(float* q, int nq, float* k, int nk, int pos, int head_size);
/// rmsnorm with another epsilon (GGUF `attention.layer_norm_rms_epsilon`:
/// 1e-6 in Qwen2, 1e-5 in Llama 2/3): out[i] = weight[i] * x[i] / sqrt(mean(x^2) + eps),
/// summed in run.c's order; with eps = 1e-5 it equals rmsnorm() bit for bit.
void rmsnorm_eps(float* out, const float* x, const float* weight, int n, float eps);
/// rope with another base (GGUF `rope.freq_base`: 500000 in Llama 3, 1e6 in
/// Mistral v0.2 and Qwen2): angle = pos / base^((i mod head_size)/head_size),
/// divided by factors[(i mod head_size)/2] when `factors` is given (GGUF
/// `rope_freqs.weight`, head_size/2 floats: Llama 3.1's long-context scaling,
/// applied as ggml divides the angle by its frequency factor); with base =
/// 10000 and no factors it equals rope() bit for bit.
void rope_base(float* q, int nq, float* k, int nk, int pos, int head_size, float base,
               const float* factors = nullptr);
void softmax(float* x, int n);
void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
               float* att, int n_heads, int kv_mul, int head_size, int kv_stride, int pos);
void swiglu(float* hb, const float* hb2, int n);
void matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride, const float* x,
                  int rows, int cols, matmul_mode mode);
}  // namespace cellshard::kernels::ref
