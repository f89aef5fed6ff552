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
void softmax(float* x, int n);
void attention(float* out, const float* q, const float* k_cache, const float* v_cache,
               float* att, int n_heads, int kv_mul, int head_size, int kv_stride, int pos);
void swiglu(float* hb, const float* hb2, int n);
void matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride, const float* x,
                  int rows, int cols, matmul_mode mode);
}  // namespace cellshard::kernels::ref
