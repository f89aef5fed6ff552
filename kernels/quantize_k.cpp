// K-quant quantizers: f32 rows -> ggml's block_q4_K and block_q6_K, the way
// ggml's reference quantizers (ggml-quants.c quantize_row_q4_K_ref and
// quantize_row_q6_K_ref, which llama-quantize uses without an importance
// matrix) choose scales and rounds. Written from the published description of
// the algorithm (facts: search ranges, weights, clamps), not from its code.
//
// q4_K, per super-block of 256 = 8 sub-blocks of 32:
//   1. each sub-block gets an affine fit x ~ scale * L - min, L in 0..15,
//      found by a weighted least-squares search (fit_affine below) with
//      weights w_i = rms(sub-block) + |x_i|;
//   2. the 8 scales and 8 mins are quantized to 6 bits against the largest
//      of each: d = max_scale / 63, dmin = max_min / 63 (both binary16),
//      sc_j = min(63, round(63 * scale_j / max_scale)), likewise m_j;
//   3. every value is quantized again against its sub-block's rounded scale
//      and min: L = clamp(round((x + dmin * m_j) / (d * sc_j)), 0, 15).
// q6_K, per super-block of 256 = 16 sub-blocks of 16:
//   1. each sub-block gets a symmetric scale (fit_symmetric below: L in
//      -32..31, weights x^2, 19 candidate scales around -32 / max);
//   2. the scale of largest magnitude s_max sets d = -s_max / 128 (binary16)
//      and sc_j = min(127, round(-128 * s_j / s_max)) (int8);
//   3. L = clamp(round(x / (d * sc_j)), -32, 31) + 32.
// "round" is ggml's nearest_int: to nearest, ties to even (nearbyintf in
// the default rounding mode; arguments stay far below 2^22).
#include "kernels/types.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace cellshard::kernels {

namespace {

int round_even(float x) { return static_cast<int>(std::nearbyintf(x)); }
int clamp(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// Below this magnitude a group counts as all zero (ggml's GROUP_MAX_EPS).
constexpr float group_eps = 1e-15f;

// Weighted affine fit of n values onto L in 0..nmax: x ~ scale * L + lo, lo
// <= 0. Starts from the min/max grid, then tries nstep + 1 grids with
// nmax + rmin + rdelta * k steps over the range and, for each, the weighted
// least-squares scale and offset of the levels it picks (offset clamped to
// <= 0); keeps the candidate with the smallest weighted squared error.
// Returns the scale, writes the levels and *neg_min = -lo.
float fit_affine(int n, int nmax, const float* x, const float* w, uint8_t* L, float* neg_min,
                 float rmin, float rdelta, int nstep) {
  float lo = x[0], hi = x[0], sum_w = w[0], sum_x = w[0] * x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::fmin(lo, x[i]);
    hi = std::fmax(hi, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  if (lo > 0) lo = 0;
  if (hi == lo) {
    std::memset(L, 0, static_cast<size_t>(n));
    *neg_min = -lo;
    return 0.0f;
  }
  float iscale = nmax / (hi - lo);
  float scale = 1 / iscale;
  float best = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(clamp(round_even(iscale * (x[i] - lo)), 0, nmax));
    const float diff = scale * L[i] + lo - x[i];
    best += w[i] * (diff * diff);
  }
  uint8_t cand[32];
  for (int k = 0; k <= nstep; ++k) {
    iscale = (rmin + rdelta * k + nmax) / (hi - lo);
    float sl = 0, sl2 = 0, sxl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(round_even(iscale * (x[i] - lo)), 0, nmax);
      cand[i] = static_cast<uint8_t>(l);
      sl += w[i] * l;
      sl2 += w[i] * l * l;
      sxl += w[i] * l * x[i];
    }
    const float det = sum_w * sl2 - sl * sl;
    if (!(det > 0)) continue;
    float s = (sum_w * sxl - sum_x * sl) / det;
    float m = (sl2 * sum_x - sl * sxl) / det;
    if (m > 0) {  // the offset must not be positive: refit the scale alone
      m = 0;
      s = sxl / sl2;
    }
    float err = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = s * cand[i] + m - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best) {
      std::memcpy(L, cand, static_cast<size_t>(n));
      best = err;
      scale = s;
      lo = m;
    }
  }
  *neg_min = -lo;
  return scale;
}

// Symmetric fit of n values onto L in -nmax..nmax-1, weights x^2: the grid
// of the value of largest magnitude (-nmax / max), then 18 more grids
// -(nmax + 0.1 k) / max, k = -9..9 (k != 0), each with its least-squares
// scale; keeps the one that explains the most of sum(w x^2) (largest
// sumlx^2 / suml2). Returns the scale (negative when max > 0) and writes
// that grid's levels + nmax to L (all 0 for an all-zero group).
float fit_symmetric(int n, int nmax, const float* x, uint8_t* L) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i)
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  if (amax < group_eps) {
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.0f;
  }
  auto fit = [&](float iscale, float* sumlx, float* suml2, uint8_t* levels) {
    *sumlx = 0;
    *suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp(round_even(iscale * x[i]), -nmax, nmax - 1);
      levels[i] = static_cast<uint8_t>(l + nmax);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * l;
      *suml2 += w * l * l;
    }
  };
  float sumlx, suml2;
  uint8_t cand[32];
  fit(-nmax / max, &sumlx, &suml2, L);
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int k = -9; k <= 9; ++k) {
    if (k == 0) continue;
    fit(-(nmax + 0.1f * k) / max, &sumlx, &suml2, cand);
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      std::memcpy(L, cand, static_cast<size_t>(n));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

}  // namespace

void quantize_row_q4_k(const float* x, block_q4_k* y, int cols) {
  for (int b = 0; b < cols / qk_k; ++b, x += qk_k) {
    block_q4_k& o = y[b];
    uint8_t L[qk_k];
    float scales[8], mins[8], w[32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 8; ++j) {
      const float* xs = x + 32 * j;
      float sum2 = 0;
      for (int l = 0; l < 32; ++l) sum2 += xs[l] * xs[l];
      const float rms = std::sqrt(sum2 / 32);
      for (int l = 0; l < 32; ++l) w[l] = rms + std::fabs(xs[l]);
      scales[j] = fit_affine(32, 15, xs, w, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
      max_scale = std::fmax(max_scale, scales[j]);
      max_min = std::fmax(max_min, mins[j]);
    }
    const float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    std::memset(o.scales, 0, sizeof o.scales);
    for (int j = 0; j < 8; ++j) {
      // As ggml: the rounded value is taken modulo 256 (a negative fit wraps
      // high), then capped at 63.
      const int ls = std::min(63, static_cast<int>(static_cast<uint8_t>(round_even(inv_scale * scales[j]))));
      const int lm = std::min(63, static_cast<int>(static_cast<uint8_t>(round_even(inv_min * mins[j]))));
      // The packing get_scale_min_k4 (types.cpp) reads.
      if (j < 4) {
        o.scales[j] = static_cast<uint8_t>(ls);
        o.scales[j + 4] = static_cast<uint8_t>(lm);
      } else {
        o.scales[j + 4] = static_cast<uint8_t>((ls & 0x0F) | ((lm & 0x0F) << 4));
        o.scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
        o.scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
      }
    }
    o.d = fp32_to_fp16(max_scale / 63.0f);
    o.dmin = fp32_to_fp16(max_min / 63.0f);
    const float d = fp16_to_fp32(o.d), dmin = fp16_to_fp32(o.dmin);
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      if (j < 4) {
        sc = o.scales[j] & 63;
        m = o.scales[j + 4] & 63;
      } else {
        sc = (o.scales[j + 4] & 0x0F) | ((o.scales[j - 4] >> 6) << 4);
        m = (o.scales[j + 4] >> 4) | ((o.scales[j] >> 6) << 4);
      }
      const float ds = d * sc;
      if (ds == 0.0f) continue;  // keeps the first fit's levels (they dequantize to -dm)
      const float dm = dmin * m;
      for (int l = 0; l < 32; ++l)
        L[32 * j + l] = static_cast<uint8_t>(clamp(round_even((x[32 * j + l] + dm) / ds), 0, 15));
    }
    // 4 groups of 64: sub-block 2g in the low nibbles, 2g+1 in the high ones.
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l)
        o.qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
  }
}

void quantize_row_q6_k(const float* x, block_q6_k* y, int cols) {
  for (int b = 0; b < cols / qk_k; ++b, x += qk_k) {
    block_q6_k& o = y[b];
    float scales[16];
    uint8_t L[qk_k];  // a sub-block whose scale rounds to 0 keeps its first fit's levels
    float max_scale = 0, max_abs = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs) {
        max_abs = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(&o, 0, sizeof o);
    if (max_abs < group_eps) continue;  // all zero: d = 0
    const float iscale = -128.0f / max_scale;
    o.d = fp32_to_fp16(1 / iscale);
    for (int j = 0; j < 16; ++j) {
      const int s = round_even(iscale * scales[j]);
      o.scales[j] = static_cast<int8_t>(s < 127 ? s : 127);
    }
    const float d = fp16_to_fp32(o.d);
    for (int j = 0; j < 16; ++j) {
      const float ds = d * o.scales[j];
      if (ds == 0.0f) continue;
      for (int l = 0; l < 16; ++l)
        L[16 * j + l] = static_cast<uint8_t>(clamp(round_even(x[16 * j + l] / ds), -32, 31) + 32);
    }
    // Two halves of 128: ql[l] holds values l (low nibble) and l+64 (high),
    // ql[l+32] values l+32 and l+96; qh[l] their top 2 bits in that order.
    for (int h = 0; h < 2; ++h) {
      const uint8_t* q = L + 128 * h;
      uint8_t* ql = o.ql + 64 * h;
      uint8_t* qh = o.qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((q[l] & 0x0F) | ((q[l + 64] & 0x0F) << 4));
        ql[l + 32] = static_cast<uint8_t>((q[l + 32] & 0x0F) | ((q[l + 96] & 0x0F) << 4));
        qh[l] = static_cast<uint8_t>((q[l] >> 4) | ((q[l + 32] >> 4) << 2) | ((q[l + 64] >> 4) << 4) |
                                     ((q[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace cellshard::kernels
