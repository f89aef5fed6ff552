// The reference typed matvec (backend::matvec_typed): dequantize-on-the-fly for
// `exact`, ggml's activation rounding and block dot products for `ggml`.
// ggml's arithmetic (facts from ggml-cpu quants.c / vec.cpp):
// - q8_0 activations on x86 (AVX2 path of quantize_row_q8_0): amax per 32,
//   d = amax / 127 stored as fp16, q = round-half-even(x * (127 / amax)).
// - vec_dot_q8_0_q8_0 / q4_0_q8_0: per block, an integer sum of products,
//   times fp16(dw) * fp16(dx), accumulated in f32.
// - vec_dot_q4_K_q8_K: per block, d = fp16(d) * dx, dmin = fp16(dmin) * dx;
//   sum of sub-block scale * integer dot, minus dmin * sum of min * bsums.
// - vec_dot_q6_K_q8_K: per block, fp16(d) * dx * sum of scale * integer dot.
// - f16 / bf16: the activations rounded to the weight's 16-bit type, products
//   summed in f32.
// - q8_1 activations (x86 quantize_row_q8_1): q8_0's d and rounding, plus
//   s = fp16(d * sum of the block's q) (d before its fp16 rounding).
// - vec_dot_q4_1_q8_1 / q5_1_q8_1: per block fp16(dw) * fp16(dx) * integer sum
//   of q * xq, plus fp16(m) * fp16(s). vec_dot_q5_0_q8_0: (q - 16) * xq summed,
//   times fp16(dw) * fp16(dx).
// - vec_dot_q5_K_q8_K: vec_dot_q4_K_q8_K with 5-bit q.
#include "kernels/reference.hpp"
#include "kernels/types.hpp"

#include <cmath>
#include <cstring>
#include <vector>

namespace cellshard::kernels::ref {

namespace {

// Per-thread scratch so the kernel allocates only when a row grows.
std::vector<float>& row_scratch(int n) {
  thread_local std::vector<float> v;
  if (v.size() < static_cast<size_t>(n)) v.resize(n);
  return v;
}

void quantize_x_q8_0(const float* x, q8_block* y, int cols) {
  for (int i = 0; i < cols / 32; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < 32; ++j) y[i].qs[j] = static_cast<int8_t>(std::nearbyintf(x[j] * id));
  }
}

void ggml_q8_0(float* out, const uint8_t* W, size_t stride, const float* x, int rows,
               int cols) {
  const int nb = cols / 32;
  thread_local std::vector<q8_block> xq;
  xq.resize(nb);
  quantize_x_q8_0(x, xq.data(), cols);
  for (int r = 0; r < rows; ++r) {
    const q8_block* w = reinterpret_cast<const q8_block*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      int s = 0;
      for (int j = 0; j < 32; ++j) s += w[b].qs[j] * xq[b].qs[j];
      sum += static_cast<float>(s) * (fp16_to_fp32(w[b].d) * fp16_to_fp32(xq[b].d));
    }
    out[r] = sum;
  }
}

void ggml_q4_0(float* out, const uint8_t* W, size_t stride, const float* x, int rows,
               int cols) {
  const int nb = cols / 32;
  thread_local std::vector<q8_block> xq;
  xq.resize(nb);
  quantize_x_q8_0(x, xq.data(), cols);
  for (int r = 0; r < rows; ++r) {
    const block_q4_0* w = reinterpret_cast<const block_q4_0*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      int s = 0;
      for (int j = 0; j < 16; ++j) {
        s += ((w[b].qs[j] & 0x0F) - 8) * xq[b].qs[j];
        s += ((w[b].qs[j] >> 4) - 8) * xq[b].qs[j + 16];
      }
      sum += static_cast<float>(s) * (fp16_to_fp32(w[b].d) * fp16_to_fp32(xq[b].d));
    }
    out[r] = sum;
  }
}

void scale_min(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// Q4_K and Q5_K against q8_K activations: the same affine super-blocks (8
// sub-blocks of 32, 6-bit scales and mins); Q5_K adds a fifth bit per weight
// from qh (bit sb of qh[l]), `fifth` returns it shifted into place (Q4_K: 0).
template <typename Block, typename Fifth>
void ggml_k_affine(float* out, const uint8_t* W, size_t stride, const float* x, int rows, int cols,
                   Fifth fifth) {
  const int nb = cols / qk_k;
  thread_local std::vector<block_q8_k> xq;
  xq.resize(nb);
  quantize_row_q8_k(x, xq.data(), cols);
  for (int r = 0; r < rows; ++r) {
    const Block* w = reinterpret_cast<const Block*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const block_q8_k& y = xq[b];
      int sums = 0, mins = 0;
      for (int sb = 0; sb < 8; ++sb) {
        int sc, m;
        scale_min(sb, w[b].scales, &sc, &m);
        // Sub-block sb: nibbles (low for even, high for odd) of qs[32*(sb/2)..].
        const uint8_t* q = w[b].qs + 32 * (sb / 2);
        const int shift = (sb % 2) * 4;
        int dot = 0;
        for (int l = 0; l < 32; ++l) dot += (((q[l] >> shift) & 0x0F) | fifth(w[b], sb, l)) * y.qs[32 * sb + l];
        sums += sc * dot;
        mins += m * (y.bsums[2 * sb] + y.bsums[2 * sb + 1]);
      }
      const float d = fp16_to_fp32(w[b].d) * y.d;
      const float dmin = fp16_to_fp32(w[b].dmin) * y.d;
      sum += d * static_cast<float>(sums) - dmin * static_cast<float>(mins);
    }
    out[r] = sum;
  }
}

void ggml_q4_k(float* out, const uint8_t* W, size_t stride, const float* x, int rows,
               int cols) {
  ggml_k_affine<block_q4_k>(out, W, stride, x, rows, cols, [](const block_q4_k&, int, int) { return 0; });
}

void ggml_q6_k(float* out, const uint8_t* W, size_t stride, const float* x, int rows,
               int cols) {
  const int nb = cols / qk_k;
  thread_local std::vector<block_q8_k> xq;
  xq.resize(nb);
  quantize_row_q8_k(x, xq.data(), cols);
  for (int r = 0; r < rows; ++r) {
    const block_q6_k* w = reinterpret_cast<const block_q6_k*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const block_q8_k& y = xq[b];
      int q[qk_k];
      // Same unpacking as the dequantizer: 2 halves of 128 values.
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = w[b].ql + 64 * h;
        const uint8_t* qh = w[b].qh + 32 * h;
        int* o = q + 128 * h;
        for (int l = 0; l < 32; ++l) {
          o[l] = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
          o[l + 32] = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
          o[l + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
          o[l + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        }
      }
      int isum = 0;
      for (int sb = 0; sb < 16; ++sb) {
        int dot = 0;
        for (int l = 0; l < 16; ++l) dot += q[16 * sb + l] * y.qs[16 * sb + l];
        isum += w[b].scales[sb] * dot;
      }
      sum += fp16_to_fp32(w[b].d) * y.d * static_cast<float>(isum);
    }
    out[r] = sum;
  }
}

void quantize_x_q8_1(const float* x, block_q8_1* y, int cols) {
  for (int i = 0; i < cols / 32; ++i, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    y[i].d = fp32_to_fp16(d);
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::nearbyintf(x[j] * id));
      sum += y[i].qs[j];
    }
    y[i].s = fp32_to_fp16(d * static_cast<float>(sum));
  }
}

uint32_t fifth_bits(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

// Q4_1, Q5_0, Q5_1 against q8_1 (q8_0 for Q5_0) activation blocks.
template <dtype T>
void ggml_q32(float* out, const uint8_t* W, size_t stride, const float* x, int rows, int cols) {
  const int nb = cols / 32;
  thread_local std::vector<block_q8_1> x1;
  thread_local std::vector<q8_block> x0;
  if (T == dtype::q5_0) {
    x0.resize(nb);
    quantize_x_q8_0(x, x0.data(), cols);
  } else {
    x1.resize(nb);
    quantize_x_q8_1(x, x1.data(), cols);
  }
  for (int r = 0; r < rows; ++r) {
    const uint8_t* row = W + r * stride;
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      int s = 0;
      if constexpr (T == dtype::q4_1) {
        const block_q4_1& w = reinterpret_cast<const block_q4_1*>(row)[b];
        for (int j = 0; j < 16; ++j)
          s += (w.qs[j] & 0x0F) * x1[b].qs[j] + (w.qs[j] >> 4) * x1[b].qs[j + 16];
        sum += (fp16_to_fp32(w.d) * fp16_to_fp32(x1[b].d)) * static_cast<float>(s) +
               fp16_to_fp32(w.m) * fp16_to_fp32(x1[b].s);
      } else if constexpr (T == dtype::q5_0) {
        const block_q5_0& w = reinterpret_cast<const block_q5_0*>(row)[b];
        const uint32_t qh = fifth_bits(w.qh);
        for (int j = 0; j < 16; ++j) {
          const int q0 = ((w.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4)) - 16;
          const int q1 = ((w.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4)) - 16;
          s += q0 * x0[b].qs[j] + q1 * x0[b].qs[j + 16];
        }
        sum += static_cast<float>(s) * (fp16_to_fp32(w.d) * fp16_to_fp32(x0[b].d));
      } else {
        const block_q5_1& w = reinterpret_cast<const block_q5_1*>(row)[b];
        const uint32_t qh = fifth_bits(w.qh);
        for (int j = 0; j < 16; ++j) {
          const int q0 = (w.qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
          const int q1 = (w.qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
          s += q0 * x1[b].qs[j] + q1 * x1[b].qs[j + 16];
        }
        sum += (fp16_to_fp32(w.d) * fp16_to_fp32(x1[b].d)) * static_cast<float>(s) +
               fp16_to_fp32(w.m) * fp16_to_fp32(x1[b].s);
      }
    }
    out[r] = sum;
  }
}

void ggml_q5_k(float* out, const uint8_t* W, size_t stride, const float* x, int rows,
               int cols) {
  ggml_k_affine<block_q5_k>(out, W, stride, x, rows, cols, [](const block_q5_k& w, int sb, int l) {
    return ((w.qh[l] >> sb) & 1) << 4;
  });
}

// f16/bf16 with activations rounded to the same 16-bit type.
template <float (*to_f32)(uint16_t), uint16_t (*from_f32)(float)>
void ggml_half(float* out, const uint8_t* W, size_t stride, const float* x, int rows, int cols) {
  std::vector<float>& xr = row_scratch(cols);
  for (int c = 0; c < cols; ++c) xr[c] = to_f32(from_f32(x[c]));
  for (int r = 0; r < rows; ++r) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W + r * stride);
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) sum += to_f32(w[c]) * xr[c];
    out[r] = sum;
  }
}

}  // namespace

void matvec_typed(float* out, const void* Wv, dtype t, size_t row_stride, const float* x,
                  int rows, int cols, matmul_mode mode) {
  const uint8_t* W = static_cast<const uint8_t*>(Wv);
  if (t == dtype::f32) {
    matvec(out, reinterpret_cast<const float*>(W), x, rows, cols,
           static_cast<int>(row_stride / sizeof(float)));
    return;
  }
  if (mode == matmul_mode::ggml) {
    switch (t) {
      case dtype::f16: ggml_half<fp16_to_fp32, fp32_to_fp16>(out, W, row_stride, x, rows, cols); return;
      case dtype::bf16: ggml_half<bf16_to_fp32, fp32_to_bf16>(out, W, row_stride, x, rows, cols); return;
      case dtype::q8_0: ggml_q8_0(out, W, row_stride, x, rows, cols); return;
      case dtype::q4_0: ggml_q4_0(out, W, row_stride, x, rows, cols); return;
      case dtype::q4_k: ggml_q4_k(out, W, row_stride, x, rows, cols); return;
      case dtype::q6_k: ggml_q6_k(out, W, row_stride, x, rows, cols); return;
      case dtype::q4_1: ggml_q32<dtype::q4_1>(out, W, row_stride, x, rows, cols); return;
      case dtype::q5_0: ggml_q32<dtype::q5_0>(out, W, row_stride, x, rows, cols); return;
      case dtype::q5_1: ggml_q32<dtype::q5_1>(out, W, row_stride, x, rows, cols); return;
      case dtype::q5_k: ggml_q5_k(out, W, row_stride, x, rows, cols); return;
      default: break;
    }
  }
  // exact: dequantize each row, then run.c's column-order sum.
  std::vector<float>& w = row_scratch(cols);
  for (int r = 0; r < rows; ++r) {
    dequantize_row(t, W + r * row_stride, w.data(), cols);
    float val = 0.0f;
    for (int c = 0; c < cols; ++c) val += w[c] * x[c];
    out[r] = val;
  }
}

}  // namespace cellshard::kernels::ref
