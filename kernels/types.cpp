// Weight types in ggml's block layouts: conversions, (de)quantization and byte
// swapping. Formulas from ggml's ggml-quants.c (facts, not code).
#include "kernels/types.hpp"

#include <cmath>
#include <cstring>

namespace cellshard::kernels {

namespace {

struct type_row {
  const char* name;
  int block_elems;
  int block_bytes;
  uint32_t ggml;
};
// Indexed by dtype; ggml ids from ggml.h enum ggml_type.
constexpr type_row table[] = {
    {"f32", 1, 4, 0},           {"f16", 1, 2, 1},
    {"bf16", 1, 2, 30},         {"q8_0", 32, 34, 8},
    {"q4_0", 32, 18, 2},        {"q4_K", qk_k, 144, 12},
    {"q6_K", qk_k, 210, 14},
    {"q4_1", 32, 20, 3},        {"q5_0", 32, 22, 6},
    {"q5_1", 32, 24, 7},        {"q5_K", qk_k, 176, 13},
};
static_assert(sizeof(table) / sizeof(table[0]) == static_cast<int>(dtype::count),
              "one row per dtype");

const type_row& row_of(dtype t) { return table[static_cast<int>(t)]; }

// Round to nearest, ties to even, as ggml's nearest_int (valid for |x| < 2^22).
int nearest_int(float x) { return static_cast<int>(std::nearbyintf(x)); }

uint16_t bswap16(uint16_t v) { return static_cast<uint16_t>((v >> 8) | (v << 8)); }

// The 6-bit scale and min of sub-block j (0..7) of a q4_K block
// (ggml get_scale_min_k4): the first four sit in the low 6 bits of bytes
// 0-3 (scale) and 4-7 (min); the last four take 4 bits from bytes 8-11 and
// their top 2 bits from the spare top bits of bytes 0-7.
void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void dequant_q8_0(const q8_block* b, float* y, int cols) {
  for (int i = 0; i < cols / 32; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 32; ++j) y[i * 32 + j] = d * b[i].qs[j];
  }
}

void dequant_q4_0(const block_q4_0* b, float* y, int cols) {
  for (int i = 0; i < cols / 32; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = d * ((b[i].qs[j] & 0x0F) - 8);
      y[i * 32 + j + 16] = d * ((b[i].qs[j] >> 4) - 8);
    }
  }
}

// Q4_K and Q5_K: four groups of 64 per super-block; the low nibbles of 32
// bytes are sub-block 2g, the high nibbles sub-block 2g+1. `fifth(block, j,
// l)` is Q5_K's fifth bit of sub-block j's weight l, shifted into place (Q4_K: 0).
template <typename Block, typename Fifth>
void dequant_k_affine(const Block* b, float* y, int cols, Fifth fifth) {
  for (int i = 0; i < cols / qk_k; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int g = 0; g < 4; ++g) {
      int sc, m;
      scale_min_k4(2 * g, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      scale_min_k4(2 * g + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((q[l] & 0x0F) + fifth(b[i], 2 * g, l)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((q[l] >> 4) + fifth(b[i], 2 * g + 1, l)) - m2;
      q += 32;
    }
  }
}

void dequant_q4_k(const block_q4_k* b, float* y, int cols) {
  dequant_k_affine(b, y, cols, [](const block_q4_k&, int, int) { return 0; });
}

void dequant_q6_k(const block_q6_k* b, float* y, int cols) {
  for (int i = 0; i < cols / qk_k; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    // Two halves of 128: 64 ql bytes, 32 qh bytes and 8 scales each.
    for (int h = 0; h < 2; ++h) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l] = d * sc[is + 0] * q1;
        y[l + 32] = d * sc[is + 2] * q2;
        y[l + 64] = d * sc[is + 4] * q3;
        y[l + 96] = d * sc[is + 6] * q4;
      }
      y += 128;
      ql += 64;
      qh += 32;
      sc += 8;
    }
  }
}

// The 32 fifth bits of a q5_0/q5_1 block, read byte by byte (little-endian
// whatever the host): bit j belongs to weight j.
uint32_t fifth_bits(const uint8_t qh[4]) {
  return static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
         static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
}

void dequant_q4_1(const block_q4_1* b, float* y, int cols) {
  for (int i = 0; i < cols / 32; ++i) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < 16; ++j) {
      y[i * 32 + j] = d * (b[i].qs[j] & 0x0F) + m;
      y[i * 32 + j + 16] = d * (b[i].qs[j] >> 4) + m;
    }
  }
}

// q5_0 (offset 16, no min) and q5_1 (offset 0, min m).
template <typename B, bool with_min>
void dequant_q5(const B* b, float* y, int cols) {
  for (int i = 0; i < cols / 32; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    float m = 0.0f;
    if constexpr (with_min) m = fp16_to_fp32(b[i].m);
    const uint32_t qh = fifth_bits(b[i].qh);
    for (int j = 0; j < 16; ++j) {
      const int q0 = (b[i].qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
      const int q1 = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
      if constexpr (with_min) {
        y[i * 32 + j] = d * q0 + m;
        y[i * 32 + j + 16] = d * q1 + m;
      } else {
        y[i * 32 + j] = d * (q0 - 16);
        y[i * 32 + j + 16] = d * (q1 - 16);
      }
    }
  }
}

void dequant_q5_k(const block_q5_k* b, float* y, int cols) {
  dequant_k_affine(b, y, cols, [](const block_q5_k& blk, int j, int l) { return ((blk.qh[l] >> j) & 1) << 4; });
}

}  // namespace

const char* to_string(dtype t) {
  return static_cast<int>(t) >= 0 && t < dtype::count ? row_of(t).name : "unknown";
}

bool dtype_from_ggml(uint32_t ggml_type, dtype* out) {
  for (int i = 0; i < static_cast<int>(dtype::count); ++i)
    if (table[i].ggml == ggml_type) {
      *out = static_cast<dtype>(i);
      return true;
    }
  return false;
}

uint32_t ggml_type_of(dtype t) { return row_of(t).ggml; }
int block_elems(dtype t) { return row_of(t).block_elems; }
int block_bytes(dtype t) { return row_of(t).block_bytes; }

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7fffu + ((u >> 16) & 1))) >> 16);
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void dequantize_row(dtype t, const void* row, float* out, int cols) {
  switch (t) {
    case dtype::f32: std::memcpy(out, row, static_cast<size_t>(cols) * 4); return;
    case dtype::f16: {
      const uint16_t* h = static_cast<const uint16_t*>(row);
      for (int i = 0; i < cols; ++i) out[i] = fp16_to_fp32(h[i]);
      return;
    }
    case dtype::bf16: {
      const uint16_t* h = static_cast<const uint16_t*>(row);
      for (int i = 0; i < cols; ++i) out[i] = bf16_to_fp32(h[i]);
      return;
    }
    case dtype::q8_0: dequant_q8_0(static_cast<const q8_block*>(row), out, cols); return;
    case dtype::q4_0: dequant_q4_0(static_cast<const block_q4_0*>(row), out, cols); return;
    case dtype::q4_k: dequant_q4_k(static_cast<const block_q4_k*>(row), out, cols); return;
    case dtype::q6_k: dequant_q6_k(static_cast<const block_q6_k*>(row), out, cols); return;
    case dtype::q4_1: dequant_q4_1(static_cast<const block_q4_1*>(row), out, cols); return;
    case dtype::q5_0: dequant_q5<block_q5_0, false>(static_cast<const block_q5_0*>(row), out, cols); return;
    case dtype::q5_1: dequant_q5<block_q5_1, true>(static_cast<const block_q5_1*>(row), out, cols); return;
    case dtype::q5_k: dequant_q5_k(static_cast<const block_q5_k*>(row), out, cols); return;
    default: return;
  }
}

void quantize_row_q4_0(const float* x, block_q4_0* y, int cols) {
  for (int i = 0; i < cols / 32; ++i, x += 32) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = fp32_to_fp16(d);
    for (int j = 0; j < 16; ++j) {
      // Truncation toward zero after +8.5 rounds to nearest (values >= 0).
      const int a = static_cast<int8_t>(x[j] * id + 8.5f);
      const int b = static_cast<int8_t>(x[j + 16] * id + 8.5f);
      const uint8_t lo = static_cast<uint8_t>(a < 15 ? a : 15);
      const uint8_t hi = static_cast<uint8_t>(b < 15 ? b : 15);
      y[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row_q8_k(const float* x, block_q8_k* y, int cols) {
  for (int i = 0; i < cols / qk_k; ++i, x += qk_k) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < qk_k; ++j)
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    if (amax == 0.0f) {
      std::memset(&y[i], 0, sizeof y[i]);
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < qk_k; ++j) {
      const int v = nearest_int(iscale * x[j]);
      y[i].qs[j] = static_cast<int8_t>(v < 127 ? v : 127);
    }
    for (int g = 0; g < qk_k / 16; ++g) {
      int s = 0;
      for (int j = 0; j < 16; ++j) s += y[i].qs[g * 16 + j];
      y[i].bsums[g] = static_cast<int16_t>(s);
    }
    y[i].d = 1.0f / iscale;
  }
}

bool quantize_row(dtype t, const float* x, void* out, int cols) {
  switch (t) {
    case dtype::f32: std::memcpy(out, x, static_cast<size_t>(cols) * 4); return true;
    case dtype::f16: {
      uint16_t* h = static_cast<uint16_t*>(out);
      for (int i = 0; i < cols; ++i) h[i] = fp32_to_fp16(x[i]);
      return true;
    }
    case dtype::bf16: {
      uint16_t* h = static_cast<uint16_t*>(out);
      for (int i = 0; i < cols; ++i) h[i] = fp32_to_bf16(x[i]);
      return true;
    }
    case dtype::q8_0: quantize_row_q8(x, static_cast<q8_block*>(out), cols); return true;
    case dtype::q4_0: quantize_row_q4_0(x, static_cast<block_q4_0*>(out), cols); return true;
    case dtype::q4_k: quantize_row_q4_k(x, static_cast<block_q4_k*>(out), cols); return true;
    case dtype::q6_k: quantize_row_q6_k(x, static_cast<block_q6_k*>(out), cols); return true;
    default: return false;
  }
}

void swap_rows(dtype t, void* data, int rows, int cols) {
  uint8_t* p = static_cast<uint8_t*>(data);
  const size_t n_blocks = static_cast<size_t>(rows) * (cols / block_elems(t));
  auto swap16_at = [](uint8_t* at) {
    uint16_t v;
    std::memcpy(&v, at, 2);
    v = bswap16(v);
    std::memcpy(at, &v, 2);
  };
  switch (t) {
    case dtype::f32:
      for (size_t i = 0; i < n_blocks; ++i) {
        uint32_t v;
        std::memcpy(&v, p + 4 * i, 4);
        v = __builtin_bswap32(v);
        std::memcpy(p + 4 * i, &v, 4);
      }
      return;
    case dtype::f16:
    case dtype::bf16:
      for (size_t i = 0; i < n_blocks; ++i) swap16_at(p + 2 * i);
      return;
    case dtype::q8_0:
    case dtype::q4_0:  // d leads the block
      for (size_t i = 0; i < n_blocks; ++i) swap16_at(p + i * block_bytes(t));
      return;
    case dtype::q4_k:  // d, dmin lead the block
    case dtype::q5_k:
    case dtype::q4_1:  // d, m lead the block
    case dtype::q5_1:
      for (size_t i = 0; i < n_blocks; ++i) {
        swap16_at(p + i * block_bytes(t));
        swap16_at(p + i * block_bytes(t) + 2);
      }
      return;
    case dtype::q5_0:  // d leads the block; qh is read byte by byte
      for (size_t i = 0; i < n_blocks; ++i) swap16_at(p + i * 22);
      return;
    case dtype::q6_k:  // d ends the block
      for (size_t i = 0; i < n_blocks; ++i) swap16_at(p + i * 210 + 208);
      return;
    default: return;
  }
}

}  // namespace cellshard::kernels
