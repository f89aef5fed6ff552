// The native backend: see kernels/native.hpp. Vector code is written with
// intrinsics in functions carrying target attributes (no -march for the
// translation unit, so nothing outside these functions uses the wider ISA).
#include "kernels/native.hpp"

#include "kernels/pool.hpp"
#include "kernels/reference.hpp"
#include "kernels/types.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define CS_X86 1
#include <immintrin.h>
// GCC 12's AVX-512 headers build some results from _mm256_undefined_*() and
// then warn about them at every inlined use (a known false positive).
#pragma GCC diagnostic ignored "-Wuninitialized"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
// Complete unrolling of the short loops over rows / vectors held in register
// arrays (GCC's -O2 keeps some of them rolled and the arrays in memory).
#define CS_UNROLL _Pragma("GCC unroll 8")
#define CS_AVX2 __attribute__((target("avx2,fma,f16c")))
#define CS_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define CS_VNNI                                                                                  \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#endif
#if defined(__aarch64__) && defined(__ARM_NEON)
#define CS_NEON 1
#include <arm_neon.h>
#endif

namespace cellshard::kernels {

namespace native {
namespace {

// ---------------------------------------------------------------------------
// Portable level: 8 partial sums per row (lane l takes columns = l mod 8),
// added pairwise at the end. The compiler may vectorise it; the order is fixed.

inline float reduce8(const float* a) {
  return ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
}

void f32_portable(float* out, const float* W, const float* x, int r0, int r1, int cols, int ld) {
  for (int r = r0; r < r1; ++r) {
    const float* w = W + static_cast<std::size_t>(r) * ld;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int c = 0;
    for (; c + 8 <= cols; c += 8)
      for (int l = 0; l < 8; ++l) acc[l] += w[c + l] * x[c + l];
    for (int l = 0; c + l < cols; ++l) acc[l] += w[c + l] * x[c + l];
    out[r] = reduce8(acc);
  }
}

// Unpacks block b's weights (as floats) into q[32].
inline void unpack_q8(const q8_block& b, float* q) {
  for (int i = 0; i < 32; ++i) q[i] = static_cast<float>(b.qs[i]);
}
inline void unpack_q4(const q4_block& b, float* q) {
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<float>((b.qs[j] & 0x0f) - 8);
    q[j + 16] = static_cast<float>((b.qs[j] >> 4) - 8);
  }
}
inline void unpack_q(const q8_block& b, float* q) { unpack_q8(b, q); }
inline void unpack_q(const q4_block& b, float* q) { unpack_q4(b, q); }

template <class B>
void quant_portable(float* out, const B* W, std::size_t stride, const float* x, int r0, int r1, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int r = r0; r < r1; ++r) {
    const B* row = reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride);
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    float q[32];
    for (int b = 0; b < nb; ++b) {
      unpack_q(row[b], q);
      const int base = b * 32;
      const int n = std::min(32, cols - base);
      float t[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int i = 0; i < n; ++i) t[i % 8] += q[i] * x[base + i];
      const float d = fp16_to_fp32(row[b].d);
      for (int l = 0; l < 8; ++l) acc[l] += d * t[l];
    }
    out[r] = reduce8(acc);
  }
}

// Integer dot of a weight block with an activation block (ggml precision).
inline int idot(const q8_block& w, const q8_block& xq) {
  int s = 0;
  for (int i = 0; i < 32; ++i) s += static_cast<int>(w.qs[i]) * xq.qs[i];
  return s;
}
inline int idot(const q4_block& w, const q8_block& xq) {
  int s = 0;
  for (int j = 0; j < 16; ++j) {
    s += ((w.qs[j] & 0x0f) - 8) * xq.qs[j];
    s += ((w.qs[j] >> 4) - 8) * xq.qs[j + 16];
  }
  return s;
}

template <class B>
void quant_q8_portable(float* out, const B* W, std::size_t stride, const q8_block* xq, int r0, int r1, int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int r = r0; r < r1; ++r) {
    const B* row = reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride);
    float acc = 0.0f;
    for (int b = 0; b < nb; ++b)
      acc += static_cast<float>(idot(row[b], xq[b])) *
             (fp16_to_fp32(row[b].d) * fp16_to_fp32(xq[b].d));
    out[r] = acc;
  }
}

#if CS_X86
// ---------------------------------------------------------------------------
// AVX2 + FMA level (8 lanes).

// The prefetch distance of a pass over 4 rows: the same bytes in the rows
// k groups of 4 further on, k the smallest that puts them at least 8 KiB
// ahead. Measured (1 thread, CPU time, 65536 x 768 rows: 432 bytes of q4_0
// per row) against one group (1728 bytes): q4_0 exact 16-17 -> 19-22 GB/s,
// q4_0 ggml 23-26 -> 38-54, q8_0 ggml 31-35 -> 45-49; 2 KiB and 4 KiB
// fell between; no change at 2048 columns and wider.
constexpr std::ptrdiff_t min_prefetch_bytes = 8192;
inline std::ptrdiff_t group_prefetch(std::size_t stride) {
  const std::ptrdiff_t g = 4 * static_cast<std::ptrdiff_t>(stride);
  return g * std::max<std::ptrdiff_t>(1, (min_prefetch_bytes + g - 1) / g);
}


CS_AVX2 inline float hsum256(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  __m128 sh = _mm_movehl_ps(lo, lo);
  lo = _mm_add_ps(lo, sh);
  sh = _mm_shuffle_ps(lo, lo, 1);
  return _mm_cvtss_f32(_mm_add_ss(lo, sh));
}

CS_AVX2 inline __m256i tail_mask256(int n) {  // first n (0..8) lanes on
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

// f32: one row at a time (a single sequential stream per row measured
// fastest here), four named accumulators. A head of up to 7 columns (masked)
// brings w to a 32-byte boundary so that no load splits a cache line
// (llama2.c files put weights 28 bytes into the file: every row is
// misaligned); then 32-column steps into a0..a3, up to three 8-column groups
// into a0, a1, a2, and a masked tail. Head and tail go into a3. The order
// depends only on the row's address, never on the thread count.
CS_AVX2 void f32_avx2(float* out, const float* W, const float* x, int r0, int r1, int cols,
                      int ld) {
  for (int r = r0; r < r1; ++r) {
    const float* w = W + static_cast<std::size_t>(r) * ld;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = static_cast<int>(((32 - (reinterpret_cast<uintptr_t>(w) & 31)) & 31) / 4);
    if (c > cols) c = cols;
    if (c > 0) {
      const __m256i m = tail_mask256(c);
      a3 = _mm256_fmadd_ps(_mm256_maskload_ps(w, m), _mm256_maskload_ps(x, m), a3);
    }
    for (; c + 32 <= cols; c += 32) {
      a0 = _mm256_fmadd_ps(_mm256_load_ps(w + c), _mm256_loadu_ps(x + c), a0);
      a1 = _mm256_fmadd_ps(_mm256_load_ps(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
      a2 = _mm256_fmadd_ps(_mm256_load_ps(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
      a3 = _mm256_fmadd_ps(_mm256_load_ps(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    if (c + 8 <= cols) {
      a0 = _mm256_fmadd_ps(_mm256_load_ps(w + c), _mm256_loadu_ps(x + c), a0);
      c += 8;
    }
    if (c + 8 <= cols) {
      a1 = _mm256_fmadd_ps(_mm256_load_ps(w + c), _mm256_loadu_ps(x + c), a1);
      c += 8;
    }
    if (c + 8 <= cols) {
      a2 = _mm256_fmadd_ps(_mm256_load_ps(w + c), _mm256_loadu_ps(x + c), a2);
      c += 8;
    }
    if (c < cols) {
      const __m256i m = tail_mask256(cols - c);
      a3 = _mm256_fmadd_ps(_mm256_maskload_ps(w + c, m), _mm256_maskload_ps(x + c, m), a3);
    }
    out[r] = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

CS_AVX2 inline __m256 load_scale256(uint16_t h) {
  return _mm256_set1_ps(_cvtsh_ss(h));
}

// x[base..base+8*k) with lanes at or beyond `cols` read as zero.
CS_AVX2 inline __m256 load_x8(const float* x, int at, int cols) {
  if (at + 8 <= cols) return _mm256_loadu_ps(x + at);
  return _mm256_maskload_ps(x + at, tail_mask256(std::max(0, cols - at)));
}

// Block of 32 int8 weights (as 4 x 8 floats) times x: t = sum of 4 products.
CS_AVX2 inline __m256 q8_block_dot_avx2(const int8_t* qs, const float* x, int base, int cols,
                                        bool full) {
  const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + 16));
  const __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  const __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  const __m256 q2 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  const __m256 q3 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  if (full) {
    __m256 t = _mm256_mul_ps(q0, _mm256_loadu_ps(x + base));
    t = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x + base + 8), t);
    t = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x + base + 16), t);
    return _mm256_fmadd_ps(q3, _mm256_loadu_ps(x + base + 24), t);
  }
  __m256 t = _mm256_mul_ps(q0, load_x8(x, base, cols));
  t = _mm256_fmadd_ps(q1, load_x8(x, base + 8, cols), t);
  t = _mm256_fmadd_ps(q2, load_x8(x, base + 16, cols), t);
  return _mm256_fmadd_ps(q3, load_x8(x, base + 24, cols), t);
}

// The 32 weights of a q4 block as int8 in [-8, 7]: bytes 0..15 the low
// nibbles (weights 0..15), bytes 16..31 the high ones (weights 16..31).
CS_AVX2 inline __m256i q4_bytes_avx2(const uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m256i both = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  return _mm256_sub_epi8(both, _mm256_set1_epi8(8));
}

// The same floats n - 8 in the same lanes as unpacking q4_bytes_avx2, in 14
// operations instead of 17: bytes 0..7 and 8..15 zero-extended to 32-bit
// lanes by one load each, then low nibble (mask) or high nibble (shift),
// minus 8, to float. (Measured 1 thread, CPU time: q4_0 exact at this level
// x1.2-1.25 faster: 6.1 -> 7.6 GB/s at 131072 x 768 and 4096 x 4096.)
CS_AVX2 inline __m256 q4_block_dot_avx2(const uint8_t* qs, const float* x, int base, int cols,
                                        bool full) {
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs)));
  const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(qs + 8)));
  const __m256i m = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  const __m256 q0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m), eight));
  const __m256 q1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m), eight));
  const __m256 q2 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), eight));
  const __m256 q3 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), eight));
  if (full) {
    __m256 t = _mm256_mul_ps(q0, _mm256_loadu_ps(x + base));
    t = _mm256_fmadd_ps(q1, _mm256_loadu_ps(x + base + 8), t);
    t = _mm256_fmadd_ps(q2, _mm256_loadu_ps(x + base + 16), t);
    return _mm256_fmadd_ps(q3, _mm256_loadu_ps(x + base + 24), t);
  }
  __m256 t = _mm256_mul_ps(q0, load_x8(x, base, cols));
  t = _mm256_fmadd_ps(q1, load_x8(x, base + 8, cols), t);
  t = _mm256_fmadd_ps(q2, load_x8(x, base + 16, cols), t);
  return _mm256_fmadd_ps(q3, load_x8(x, base + 24, cols), t);
}

CS_AVX2 inline __m256 block_dot_avx2(const q8_block& b, const float* x, int base, int cols,
                                     bool full) {
  return q8_block_dot_avx2(b.qs, x, base, cols, full);
}
CS_AVX2 inline __m256 block_dot_avx2(const q4_block& b, const float* x, int base, int cols,
                                     bool full) {
  return q4_block_dot_avx2(b.qs, x, base, cols, full);
}

// Exact precision: acc[b % 2] += d_b * (block b's lane products), per row.
// NR rows (1..4) pass together so that each load of x serves NR rows, and
// each pair of blocks prefetches the same bytes `pf` further on (the next
// group of rows), as quant_avx512_rows. A row's operations and their order
// are those of one row at a time (before session 8 this level did one row
// at a time; results are bit-identical to it).
template <class B, int NR, bool PF = true>
CS_AVX2 inline void quant_avx2_rows(const B* const* row, const float* x, float* res, int cols, std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols);
  const int full = cols / 32;
  __m256 a0[NR], a1[NR];
  CS_UNROLL
  for (int i = 0; i < NR; ++i) a0[i] = a1[i] = _mm256_setzero_ps();
  int b = 0;
  for (; b + 2 <= full; b += 2) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      if (PF) {
        const char* p = reinterpret_cast<const char*>(row[i] + b);
        _mm_prefetch(p + pf, _MM_HINT_T0);
        if (2 * sizeof(B) > 64) _mm_prefetch(p + pf + 64, _MM_HINT_T0);
      }
      a0[i] = _mm256_fmadd_ps(load_scale256(row[i][b].d), block_dot_avx2(row[i][b], x, b * 32, cols, true), a0[i]);
      a1[i] = _mm256_fmadd_ps(load_scale256(row[i][b + 1].d),
                              block_dot_avx2(row[i][b + 1], x, b * 32 + 32, cols, true), a1[i]);
    }
  }
  for (; b < nb; ++b) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m256 t = block_dot_avx2(row[i][b], x, b * 32, cols, b < full);
      if (b % 2 == 0) a0[i] = _mm256_fmadd_ps(load_scale256(row[i][b].d), t, a0[i]);
      else a1[i] = _mm256_fmadd_ps(load_scale256(row[i][b].d), t, a1[i]);
    }
  }
  CS_UNROLL
  for (int i = 0; i < NR; ++i) res[i] = hsum256(_mm256_add_ps(a0[i], a1[i]));
}

// Rows [r0, r1): groups of avx2_rows rows, then one at a time -- when x
// (the bytes of it a row reads) is larger than 16 KiB, half of L1. With a
// smaller x, one row at a time without prefetch was faster at this level
// (measured, 1 thread, CPU time, against the 4-row kernel: 768 and 4096
// columns, in and beyond the caches: q8_0 exact 18-22 vs 15-20 GB/s, q4_0
// exact 7.4-8.1 vs 6.1-7.0, q8_0 ggml 30 vs 18-22 beyond the caches; the 16
// ymm registers do not hold 4 rows' accumulators and the block's values);
// at 16384 columns the 4 rows won (q8_0 exact 8.3 -> 12-17 GB/s). Either
// way a row's result is the same bits (quant_avx2_rows).
constexpr int avx2_rows = 4;
inline bool avx2_row_groups(std::size_t x_bytes) { return x_bytes > 16 * 1024; }
template <class B>
CS_AVX2 void quant_avx2(float* out, const B* W, std::size_t stride, const float* x, int r0, int r1, int cols) {
  auto row_at = [&](int r) { return reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride); };
  int r = r0;
  if (!avx2_row_groups(static_cast<std::size_t>(cols) * sizeof(float))) {
    for (; r < r1; ++r) {
      const B* rows[1] = {row_at(r)};
      quant_avx2_rows<B, 1, false>(rows, x, out + r, cols, 0);
    }
    return;
  }
  for (; r + avx2_rows <= r1; r += avx2_rows) {
    const B* rows[avx2_rows];
    for (int i = 0; i < avx2_rows; ++i) rows[i] = row_at(r + i);
    quant_avx2_rows<B, avx2_rows>(rows, x, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const B* rows[1] = {row_at(r)};
    quant_avx2_rows<B, 1>(rows, x, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// Sum of products of 32 signed bytes w and 32 signed bytes y as 8 int32
// lanes: |w| as unsigned times y with w's sign (maddubs), pairs widened.
CS_AVX2 inline __m256 i8_dot_avx2(__m256i w, __m256i y) {
  const __m256i aw = _mm256_sign_epi8(w, w);
  const __m256i sy = _mm256_sign_epi8(y, w);
  const __m256i p16 = _mm256_maddubs_epi16(aw, sy);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

CS_AVX2 inline __m256i w_bytes_avx2(const q8_block& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}
CS_AVX2 inline __m256i w_bytes_avx2(const q4_block& b) { return q4_bytes_avx2(b.qs); }

// ggml precision: acc[b % 2] += (d_w * d_x) * int lanes of block b, per
// row; NR rows share the loads of x_q and its scales, prefetch as above
// (bit-identical to one row at a time, this level's kernel before session 8).
template <class B, int NR, bool PF = true>
CS_AVX2 inline void quant_q8_avx2_rows(const B* const* row, const q8_block* xq, float* res, int cols,
                                       std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols);
  __m256 a0[NR], a1[NR];
  CS_UNROLL
  for (int i = 0; i < NR; ++i) a0[i] = a1[i] = _mm256_setzero_ps();
  int b = 0;
  for (; b + 2 <= nb; b += 2) {
    const __m256i y0 = w_bytes_avx2(xq[b]), y1 = w_bytes_avx2(xq[b + 1]);
    const float dx0 = _cvtsh_ss(xq[b].d), dx1 = _cvtsh_ss(xq[b + 1].d);
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      if (PF) {
        const char* p = reinterpret_cast<const char*>(row[i] + b);
        _mm_prefetch(p + pf, _MM_HINT_T0);
        if (2 * sizeof(B) > 64) _mm_prefetch(p + pf + 64, _MM_HINT_T0);
      }
      const __m256 p0 = i8_dot_avx2(w_bytes_avx2(row[i][b]), y0);
      const __m256 p1 = i8_dot_avx2(w_bytes_avx2(row[i][b + 1]), y1);
      a0[i] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(row[i][b].d) * dx0), p0, a0[i]);
      a1[i] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(row[i][b + 1].d) * dx1), p1, a1[i]);
    }
  }
  if (b < nb) {
    const __m256i y0 = w_bytes_avx2(xq[b]);
    const float dx0 = _cvtsh_ss(xq[b].d);
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m256 p0 = i8_dot_avx2(w_bytes_avx2(row[i][b]), y0);
      a0[i] = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(row[i][b].d) * dx0), p0, a0[i]);
    }
  }
  CS_UNROLL
  for (int i = 0; i < NR; ++i) res[i] = hsum256(_mm256_add_ps(a0[i], a1[i]));
}

template <class B>
CS_AVX2 void quant_q8_avx2(float* out, const B* W, std::size_t stride, const q8_block* xq, int r0, int r1, int cols) {
  auto row_at = [&](int r) { return reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride); };
  int r = r0;
  if (!avx2_row_groups(static_cast<std::size_t>(q8_blocks_per_row(cols)) * sizeof(q8_block))) {
    for (; r < r1; ++r) {
      const B* rows[1] = {row_at(r)};
      quant_q8_avx2_rows<B, 1, false>(rows, xq, out + r, cols, 0);
    }
    return;
  }
  for (; r + avx2_rows <= r1; r += avx2_rows) {
    const B* rows[avx2_rows];
    for (int i = 0; i < avx2_rows; ++i) rows[i] = row_at(r + i);
    quant_q8_avx2_rows<B, avx2_rows>(rows, xq, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const B* rows[1] = {row_at(r)};
    quant_q8_avx2_rows<B, 1>(rows, xq, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// ---------------------------------------------------------------------------
// AVX-512 level (16 lanes).

CS_AVX512 inline float hsum512(__m512 v) {
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0x4e));  // + other 256-bit half
  v = _mm512_add_ps(v, _mm512_shuffle_f32x4(v, v, 0xb1));  // + neighbouring 128 bits
  __m128 lo = _mm512_castps512_ps128(v);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  return _mm_cvtss_f32(_mm_add_ss(lo, _mm_shuffle_ps(lo, lo, 1)));
}

// hsum512 of four vectors at once, with the same additions in the same order
// per vector: each stage adds the same lane pairs as hsum512 (the other 256
// bits, the neighbouring 128 bits, lanes 0+2 and 1+3, then those two), with
// two vectors' halves (stage 1) or four vectors' quarters (stages 2-4)
// packed into one register: 7 shuffles and 6 additions for four sums instead
// of 16 and 16 (short q4_0 rows: 768 columns are 6 groups per row).
CS_AVX512 inline void hsum512_x4(__m512 v0, __m512 v1, __m512 v2, __m512 v3, float* res) {
  const __m512 w01 = _mm512_add_ps(_mm512_shuffle_f32x4(v0, v1, 0x44), _mm512_shuffle_f32x4(v0, v1, 0xee));
  const __m512 w23 = _mm512_add_ps(_mm512_shuffle_f32x4(v2, v3, 0x44), _mm512_shuffle_f32x4(v2, v3, 0xee));
  // 128-bit block r: vector r's lanes 0..3 of stage 1, plus its lanes 4..7.
  const __m512 x = _mm512_add_ps(_mm512_shuffle_f32x4(w01, w23, 0x88), _mm512_shuffle_f32x4(w01, w23, 0xdd));
  const __m512 y = _mm512_add_ps(x, _mm512_permute_ps(x, 0xee));  // lanes 0, 1: x0 + x2, x1 + x3
  const __m512 z = _mm512_add_ps(y, _mm512_permute_ps(y, 0x55));  // lane 0: y0 + y1
  const __m512 r = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), z);
  _mm_storeu_ps(res, _mm512_castps512_ps128(r));
}

// f32 as AVX2, with 16-column groups and a head to a 64-byte boundary
// (up to 15 columns).
CS_AVX512 void f32_avx512(float* out, const float* W, const float* x, int r0, int r1, int cols,
                          int ld) {
  for (int r = r0; r < r1; ++r) {
    const float* w = W + static_cast<std::size_t>(r) * ld;
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = static_cast<int>(((64 - (reinterpret_cast<uintptr_t>(w) & 63)) & 63) / 4);
    if (c > cols) c = cols;
    if (c > 0) {
      const __mmask16 m = static_cast<__mmask16>((1u << c) - 1u);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w), _mm512_maskz_loadu_ps(m, x), a3);
    }
    for (; c + 64 <= cols; c += 64) {
      a0 = _mm512_fmadd_ps(_mm512_load_ps(w + c), _mm512_loadu_ps(x + c), a0);
      a1 = _mm512_fmadd_ps(_mm512_load_ps(w + c + 16), _mm512_loadu_ps(x + c + 16), a1);
      a2 = _mm512_fmadd_ps(_mm512_load_ps(w + c + 32), _mm512_loadu_ps(x + c + 32), a2);
      a3 = _mm512_fmadd_ps(_mm512_load_ps(w + c + 48), _mm512_loadu_ps(x + c + 48), a3);
    }
    if (c + 16 <= cols) {
      a0 = _mm512_fmadd_ps(_mm512_load_ps(w + c), _mm512_loadu_ps(x + c), a0);
      c += 16;
    }
    if (c + 16 <= cols) {
      a1 = _mm512_fmadd_ps(_mm512_load_ps(w + c), _mm512_loadu_ps(x + c), a1);
      c += 16;
    }
    if (c + 16 <= cols) {
      a2 = _mm512_fmadd_ps(_mm512_load_ps(w + c), _mm512_loadu_ps(x + c), a2);
      c += 16;
    }
    if (c < cols) {
      const __mmask16 m = static_cast<__mmask16>((1u << (cols - c)) - 1u);
      a3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, w + c), _mm512_maskz_loadu_ps(m, x + c), a3);
    }
    out[r] = hsum512(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  }
}

CS_AVX512 inline __m512 load_x16(const float* x, int at, int cols) {
  if (at + 16 <= cols) return _mm512_loadu_ps(x + at);
  const int n = std::max(0, cols - at);
  return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), x + at);
}

// A block's 32 weights as two vectors of 16 floats (weights 0..15 and
// 16..31), exact small integers. q8: sign-extended bytes. q4: byte j holds
// weight j (low nibble) and j + 16 (high); each byte is widened to a 32-bit
// lane and the float n - 8 looked up in a 16-entry table by vpermps, which
// reads only the low 4 bits of each index lane (so the low nibble needs no
// mask, the high one one shift): 4 operations for 32 weights.
CS_AVX512 inline void block_f32_avx512(const q8_block& b, __m512& q0, __m512& q1) {
  q0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs))));
  q1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16))));
}
CS_AVX512 inline void block_f32_avx512(const q4_block& b, __m512& q0, __m512& q1) {
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)));
  q0 = _mm512_permutexvar_ps(v, table);
  q1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}
// The f16 scales of G consecutive blocks as f32 in lanes 0..G-1 (q4: G = 8
// blocks of 18 bytes, scales at 16-bit words 0, 9, .., 63; q8: G = 4 blocks
// of 34 bytes, words 0, 17, 34, 51): one two-source word permute of the
// group's first 128 bytes (inside its 144 resp. 136 bytes) and one vcvtph2ps.
// The same conversion as _cvtsh_ss per block, G at a time.
template <class B> constexpr int scale_group = std::is_same_v<B, q4_block> ? 8 : 4;
template <class B>
CS_AVX512 inline __m512 group_scales_avx512(const B* b) {
  constexpr int step = static_cast<int>(sizeof(B) / 2);
  alignas(64) static const uint16_t idx[32] = {0, step, 2 * step, 3 * step, 4 * step, 5 * step, 6 * step, 7 * step};
  const char* p = reinterpret_cast<const char*>(b);
  const __m512i h = _mm512_permutex2var_epi16(_mm512_loadu_si512(p), _mm512_load_si512(idx), _mm512_loadu_si512(p + 64));
  return _mm512_castps256_ps512(_mm256_cvtph_ps(_mm512_castsi512_si128(h)));
}
// t = q0 . x[base..+16) + q1 . x[base+16..+32) as 16 lanes (x past cols as 0).
CS_AVX512 inline __m512 dot2_avx512(__m512 q0, __m512 q1, const float* x, int base, int cols,
                                    bool full) {
  if (full)
    return _mm512_fmadd_ps(q1, _mm512_loadu_ps(x + base + 16), _mm512_mul_ps(q0, _mm512_loadu_ps(x + base)));
  return _mm512_fmadd_ps(q1, load_x16(x, base + 16, cols), _mm512_mul_ps(q0, load_x16(x, base, cols)));
}
template <class B>
CS_AVX512 inline __m512 block_dot_avx512(const B& blk, const float* x, int base, int cols, bool full) {
  __m512 q0, q1;
  block_f32_avx512(blk, q0, q1);
  return dot2_avx512(q0, q1, x, base, cols, full);
}

CS_AVX512 inline __m256i w_bytes_avx512(const q8_block& b) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
}
CS_AVX512 inline __m256i w_bytes_avx512(const q4_block& b) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m256i both =
      _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  return _mm256_sub_epi8(both, _mm256_set1_epi8(8));
}

// Exact precision. Per row: t_b = q[0..16) . x + q[16..32) . x (16 lanes,
// the second product fused), acc[b % 2] += d_b t_b, out = hsum(acc0 + acc1).
// NR rows (1..4) pass together so that each load of x serves NR rows: with
// one row at a time a row wider than L1 (16384 columns: 64 KiB of x) reads
// 7 bytes of x from L2 per byte of q4 weights, which bound it at a third
// of the memory bandwidth. A row's operations do not depend on NR or on
// the rows beside it, so results are those of one row at a time.
// Each group of blocks also prefetches the same bytes `pf` further on (the
// caller passes NR rows: the next group of rows), so the NR interleaved row
// streams, which the hardware prefetcher follows poorly when rows are
// short, arrive ahead of use (measured: q8_0 65536 x 2048 beyond the caches
// fell from 25 to 18 GB/s with 4 rows and no prefetch; 25-36 with it).
template <class B, int NR>
CS_AVX512 inline void quant_avx512_rows(const B* const* row, const float* x, float* res, int cols, std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols);
  const int full = cols / 32;
  constexpr int G = scale_group<B>;
  __m512 a0[NR], a1[NR];
  CS_UNROLL
  for (int i = 0; i < NR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  int b = 0;
  for (; b + G <= full; b += G) {
    __m512 d[NR];
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const char* p = reinterpret_cast<const char*>(row[i] + b);
      CS_UNROLL
      for (int l = 0; l < 3; ++l) _mm_prefetch(p + pf + 64 * l, _MM_HINT_T0);
      d[i] = group_scales_avx512(row[i] + b);
    }
    CS_UNROLL
    for (int k = 0; k < G; k += 2) {
      const float* xb = x + (b + k) * 32;
      const __m512 x0 = _mm512_loadu_ps(xb), x1 = _mm512_loadu_ps(xb + 16);
      const __m512 x2 = _mm512_loadu_ps(xb + 32), x3 = _mm512_loadu_ps(xb + 48);
      CS_UNROLL
      for (int i = 0; i < NR; ++i) {
        __m512 q0, q1, q2, q3;
        block_f32_avx512(row[i][b + k], q0, q1);
        block_f32_avx512(row[i][b + k + 1], q2, q3);
        const __m512 t0 = _mm512_fmadd_ps(q1, x1, _mm512_mul_ps(q0, x0));
        const __m512 t1 = _mm512_fmadd_ps(q3, x3, _mm512_mul_ps(q2, x2));
        a0[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(k), d[i]), t0, a0[i]);
        a1[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_set1_epi32(k + 1), d[i]), t1, a1[i]);
      }
    }
  }
  for (; b + 2 <= full; b += 2) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m512 t0 = block_dot_avx512(row[i][b], x, b * 32, cols, true);
      const __m512 t1 = block_dot_avx512(row[i][b + 1], x, b * 32 + 32, cols, true);
      a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(row[i][b].d)), t0, a0[i]);
      a1[i] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(row[i][b + 1].d)), t1, a1[i]);
    }
  }
  for (; b < nb; ++b) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m512 t = block_dot_avx512(row[i][b], x, b * 32, cols, b < full);
      if (b % 2 == 0) a0[i] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(row[i][b].d)), t, a0[i]);
      else a1[i] = _mm512_fmadd_ps(_mm512_set1_ps(_cvtsh_ss(row[i][b].d)), t, a1[i]);
    }
  }
  CS_UNROLL
  for (int i = 0; i < NR; ++i) res[i] = hsum512(_mm512_add_ps(a0[i], a1[i]));
}

template <class B>
CS_AVX512 void quant_avx512(float* out, const B* W, std::size_t stride, const float* x, int r0, int r1, int cols) {
  auto row_at = [&](int r) { return reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride); };
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    const B* rows[4] = {row_at(r), row_at(r + 1), row_at(r + 2), row_at(r + 3)};
    quant_avx512_rows<B, 4>(rows, x, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const B* rows[1] = {row_at(r)};
    quant_avx512_rows<B, 1>(rows, x, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// q4_0, exact precision, AVX-512: 4 blocks per register. A 4-block group
// (72 bytes) is read as two overlapping 64-byte loads; one word permute puts
// block k's 16 bytes of nibbles in 128-bit lane k, so 32-bit lane L = 4k + m
// holds bytes 4m..4m+3 of block k: 8 nibbles, i.e. weights 4m + i (low
// nibble of byte i) and 16 + 4m + i (high nibble). Nibble position p
// (bits 4p..4p+3) of every lane becomes 16 floats n - 8 by one vpermps of a
// 16-entry table (vpermps reads only the low 4 bits of each index lane), so
// a shift and a permute per 16 weights, no widening; x is read in the
// matching order from x' ("q4 order", q4_order_x), a permutation of x made
// once per matvec. Per row and group: t0 = sum over even p of q_p x'_p (in
// p order, first a multiply then multiply-adds), t1 the same over odd p,
// s = each lane's block scale (one word permute of the same load + vcvtph2ps),
// a0 += s t0, a1 += s t1. Blocks after the last whole group (0..3 whole ones
// and a partial one) go one at a time as in quant_avx512_rows (their x' is x
// unchanged). out = hsum(a0 + a1). Vector operations per block and row:
// quant_avx512_rows 8 (widen, shift, 2 permutes, multiply, 2 multiply-adds,
// scale broadcast), this 6.75 (27 per group). Measured against it (1 thread,
// CPU time, stand-alone driver, medians of 21-201 alternating pairs, load
// average 5-8): time x0.90-0.93 at 4096 x 4096, 2048 x 768 and 32000 x 768,
// x0.96 at 32768 x 8192, x0.99 at 16384 x 16384 (beyond the caches). Both
// run at about 2 512-bit operations per cycle (20-22 GB/s of q4_0 here):
// bound by the vector pipes, not by memory.
// NR rows x NX vectors pass together (matvec: 4 or 5 x 1 with prefetch as
// quant_avx512_rows; batched: 1 x 4); the operations of one (row, vector)
// pair do not depend on NR, NX or the neighbours, so batched = matvec.

// Column of x read by lane `lane` of nibble position p in a group.
inline int q4_order_col(int p, int lane) {
  return (lane / 4) * 32 + (p & 1) * 16 + 4 * (lane % 4) + p / 2;
}

// x' for q4_avx512_rows: the columns of whole 4-block groups permuted
// (x'[128 g + 16 p + L] = x[128 g + q4_order_col(p, L)]), the rest copied.
// Register p of a group takes lanes 4m + p/2 (m = 0..3) of the four 16-float
// chunks 2k + (p & 1) of x (k = 0..3, lanes 4k..4k+3): two two-source
// permutes (chunks 0, 1 and 2, 3 with the same indices) and a blend. Only
// moves, so x' holds x's values bit for bit (the scalar loop before session
// 12 was ~2% of a q4_0 decode's samples).
CS_AVX512 void q4_order_x(const float* x, float* xp, int cols) {
  const int g4 = (cols / 32) / 4;
  __m512i idx[4];
  for (int h = 0; h < 4; ++h) {  // h = p / 2
    alignas(64) int32_t t[16];
    for (int l = 0; l < 16; ++l) t[l] = ((l / 4) & 1) * 16 + q4_order_col(2 * h, l) % 16;
    idx[h] = _mm512_load_si512(t);
  }
  for (int g = 0; g < g4; ++g) {
    const float* s = x + 128 * g;
    float* d = xp + 128 * g;
    __m512 c[8];
    CS_UNROLL
    for (int i = 0; i < 8; ++i) c[i] = _mm512_loadu_ps(s + 16 * i);
    CS_UNROLL
    for (int p = 0; p < 8; ++p) {
      const int e = p & 1;
      const __m512 lo = _mm512_permutex2var_ps(c[e], idx[p / 2], c[2 + e]);
      const __m512 hi = _mm512_permutex2var_ps(c[4 + e], idx[p / 2], c[6 + e]);
      _mm512_store_ps(d + 16 * p, _mm512_mask_blend_ps(0xFF00, lo, hi));
    }
  }
  std::copy(x + 128 * g4, x + cols, xp + 128 * g4);
}

// always_inline: GCC 12 stopped inlining it once the NX == 1 branch grew
// (perf showed it as a function of its own, its accumulators in memory).
template <int NR, int NX>
CS_AVX512 __attribute__((always_inline)) inline void q4_group_avx512(const char* const* p, const float* const* xg,
                                                                     __m512* a0, __m512* a1) {
  // Words of the 72-byte group: block k's nibbles are words 9k+1..9k+8;
  // words 32..35 come from the second load (starting 8 bytes in) as its
  // words 28..31. Scales: words 0, 9, 18, 27, each for 4 lanes.
  alignas(64) static const uint16_t gidx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  10, 11, 12,
                                                13, 14, 15, 16, 17, 19, 20, 21, 22, 23, 24,
                                                25, 26, 28, 29, 30, 31, 60, 61, 62, 63};
  alignas(64) static const uint16_t sidx[32] = {0, 0, 0, 0, 9, 9, 9, 9, 18, 18, 18, 18, 27, 27, 27, 27};
  const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  if constexpr (NX == 1) {
    // One vector (matvec): the instructions go nibble position by nibble
    // position across the NR rows (first every row's gather, then for each
    // pair of positions every row's shifts, permutes and multiply-adds, last
    // every row's scales), so that neighbouring instructions are independent
    // and the out-of-order window holds work of all NR rows. Each row's
    // operations and their order are those of the row alone (the NX > 1
    // branch below), so the results are too, bit for bit. Measured against
    // the row-by-row order (stand-alone driver, 1 thread, CPU time): 8-9%
    // faster with the weights in L2, 2-6% beyond the caches (session 12).
    __m512i v[NR];
    __m512 t0[NR], t1[NR];
    CS_UNROLL
    for (int i = 0; i < NR; ++i)
      v[i] = _mm512_permutex2var_epi16(_mm512_loadu_si512(p[i]), _mm512_load_si512(gidx), _mm512_loadu_si512(p[i] + 8));
    {
      const __m512 x0 = _mm512_load_ps(xg[0]), x1 = _mm512_load_ps(xg[0] + 16);
      CS_UNROLL
      for (int i = 0; i < NR; ++i) {
        t0[i] = _mm512_mul_ps(_mm512_permutexvar_ps(v[i], table), x0);
        t1[i] = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v[i], 4), table), x1);
      }
    }
    CS_UNROLL
    for (int k = 2; k < 8; k += 2) {
      const __m512 xa = _mm512_load_ps(xg[0] + 16 * k), xb = _mm512_load_ps(xg[0] + 16 * k + 16);
      CS_UNROLL
      for (int i = 0; i < NR; ++i) {
        t0[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v[i], 4 * k), table), xa, t0[i]);
        t1[i] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(v[i], 4 * k + 4), table), xb, t1[i]);
      }
    }
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m512 s =
          _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(sidx), _mm512_loadu_si512(p[i]))));
      a0[i] = _mm512_fmadd_ps(s, t0[i], a0[i]);
      a1[i] = _mm512_fmadd_ps(s, t1[i], a1[i]);
    }
  } else {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const __m512i lo = _mm512_loadu_si512(p[i]);
      const __m512i v = _mm512_permutex2var_epi16(lo, _mm512_load_si512(gidx), _mm512_loadu_si512(p[i] + 8));
      const __m512 s = _mm512_cvtph_ps(_mm512_castsi512_si256(_mm512_permutexvar_epi16(_mm512_load_si512(sidx), lo)));
      __m512 q[8];
      q[0] = _mm512_permutexvar_ps(v, table);
      CS_UNROLL
      for (int k = 1; k < 8; ++k) q[k] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4 * k), table);
      CS_UNROLL
      for (int j = 0; j < NX; ++j) {
        __m512 t0 = _mm512_mul_ps(q[0], _mm512_load_ps(xg[j]));
        __m512 t1 = _mm512_mul_ps(q[1], _mm512_load_ps(xg[j] + 16));
        CS_UNROLL
        for (int k = 2; k < 8; k += 2) {
          t0 = _mm512_fmadd_ps(q[k], _mm512_load_ps(xg[j] + 16 * k), t0);
          t1 = _mm512_fmadd_ps(q[k + 1], _mm512_load_ps(xg[j] + 16 * k + 16), t1);
        }
        a0[i * NX + j] = _mm512_fmadd_ps(s, t0, a0[i * NX + j]);
        a1[i * NX + j] = _mm512_fmadd_ps(s, t1, a1[i * NX + j]);
      }
    }
  }
}

// res[i * NX + j] = row i times vector j (xp: x' of each vector). PF: prefetch
// the same bytes `pf` further on (matvec only; the batched path tiles).
template <int NR, int NX, bool PF>
CS_AVX512 inline void q4_avx512_rows(const q4_block* const* row, const float* const* xp, float* res, int cols,
                                     std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols);
  const int full = cols / 32;
  const int groups = full / 4;
  __m512 a0[NR * NX], a1[NR * NX];
  CS_UNROLL
  for (int i = 0; i < NR * NX; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  const char* p[NR];
  const float* xg[NX];
  int g = 0;
  for (; g + 2 <= groups; g += 2) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      p[i] = reinterpret_cast<const char*>(row[i] + 4 * g);
      if (PF) {
        CS_UNROLL
        for (int l = 0; l < 3; ++l) _mm_prefetch(p[i] + pf + 64 * l, _MM_HINT_T0);
      }
    }
    CS_UNROLL
    for (int j = 0; j < NX; ++j) xg[j] = xp[j] + 128 * g;
    q4_group_avx512<NR, NX>(p, xg, a0, a1);
    CS_UNROLL
    for (int i = 0; i < NR; ++i) p[i] += 4 * sizeof(q4_block);
    CS_UNROLL
    for (int j = 0; j < NX; ++j) xg[j] += 128;
    q4_group_avx512<NR, NX>(p, xg, a0, a1);
  }
  if (g < groups) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) p[i] = reinterpret_cast<const char*>(row[i] + 4 * g);
    CS_UNROLL
    for (int j = 0; j < NX; ++j) xg[j] = xp[j] + 128 * g;
    q4_group_avx512<NR, NX>(p, xg, a0, a1);
  }
  for (int b = 4 * groups; b < nb; ++b) {
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      __m512 q0, q1;
      block_f32_avx512(row[i][b], q0, q1);
      const __m512 d = _mm512_set1_ps(_cvtsh_ss(row[i][b].d));
      CS_UNROLL
      for (int j = 0; j < NX; ++j) {
        const __m512 t = dot2_avx512(q0, q1, xp[j], b * 32, cols, b < full);
        if (b % 2 == 0) a0[i * NX + j] = _mm512_fmadd_ps(d, t, a0[i * NX + j]);
        else a1[i * NX + j] = _mm512_fmadd_ps(d, t, a1[i * NX + j]);
      }
    }
  }
  if constexpr (NR * NX == 4) {
    hsum512_x4(_mm512_add_ps(a0[0], a1[0]), _mm512_add_ps(a0[1], a1[1]), _mm512_add_ps(a0[2], a1[2]),
               _mm512_add_ps(a0[3], a1[3]), res);
  } else {
    CS_UNROLL
    for (int i = 0; i < NR * NX; ++i) res[i] = hsum512(_mm512_add_ps(a0[i], a1[i]));
  }
}

// Matvec rows [r0, r1) with x' = q4_order_x(x). Rows go 4 at a time, or 5
// when the rows of the call hold at least q4_stream5_bytes (weights streamed
// from memory): 5 rows interleaved keep more lines in flight there, while in
// L2 the fifth row's registers spill. Measured (stand-alone driver, 1
// thread, CPU time, medians of 25-40 alternating pairs per run, load average
// 5-6, session 13), time with 5 rows over time with 4: 16384 x 16384
// 0.87-0.97 (9 runs), 8192 x 32768 0.94, 131072 x 2048 0.95, 65536 x 4096
// 0.94, 16384 x 11008 0.97, 32768 x 8192 0.98; in the caches 4096 x 4096
// 0.99, 32000 x 768 1.04, 2048 x 768 1.04, 768 x 768 1.08 (hence the
// threshold). A copy of the 4-row kernel elsewhere in the binary measured
// 0.93-1.04 against it in the same runs (code placement). Each row's
// operations do not depend on the row count of a pass, so the results are
// the same bit for bit either way.
constexpr std::size_t q4_stream5_bytes = std::size_t{16} << 20;
CS_AVX512 void q4_avx512(float* out, const q4_block* W, std::size_t stride, const float* xp, int r0, int r1,
                         int cols) {
  auto row_at = [&](int r) {
    return reinterpret_cast<const q4_block*>(reinterpret_cast<const char*>(W) + r * stride);
  };
  const float* xs[1] = {xp};
  int r = r0;
  if (static_cast<std::size_t>(r1 - r0) * stride >= q4_stream5_bytes) {
    // The prefetch distance as group_prefetch's, in passes of 5 rows.
    const std::ptrdiff_t g = 5 * static_cast<std::ptrdiff_t>(stride);
    const std::ptrdiff_t pf = g * std::max<std::ptrdiff_t>(1, (min_prefetch_bytes + g - 1) / g);
    for (; r + 5 <= r1; r += 5) {
      const q4_block* rows[5] = {row_at(r), row_at(r + 1), row_at(r + 2), row_at(r + 3), row_at(r + 4)};
      q4_avx512_rows<5, 1, true>(rows, xs, out + r, cols, pf);
    }
  }
  for (; r + 4 <= r1; r += 4) {
    const q4_block* rows[4] = {row_at(r), row_at(r + 1), row_at(r + 2), row_at(r + 3)};
    q4_avx512_rows<4, 1, true>(rows, xs, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const q4_block* rows[1] = {row_at(r)};
    q4_avx512_rows<1, 1, true>(rows, xs, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// ggml precision, two blocks per 512-bit register: lanes 0..7 block b,
// 8..15 block b+1; an odd last block goes alone into the low half.
CS_AVX512 inline __m512 i8_dot_avx512(__m512i w, __m512i y) {
  const __m512i aw = _mm512_abs_epi8(w);
  const __mmask64 neg = _mm512_movepi8_mask(w);
  const __m512i sy = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
  const __m512i p16 = _mm512_maddubs_epi16(aw, sy);
  return _mm512_cvtepi32_ps(_mm512_madd_epi16(p16, _mm512_set1_epi16(1)));
}

CS_AVX512 inline __m512i pair512(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

template <class B>
CS_AVX512 void quant_q8_avx512(float* out, const B* W, std::size_t stride, const q8_block* xq, int r0, int r1,
                               int cols) {
  const int nb = q8_blocks_per_row(cols);
  for (int r = r0; r < r1; ++r) {
    const B* row = reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride);
    __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
      const __m512 p0 = i8_dot_avx512(pair512(w_bytes_avx512(row[b]), w_bytes_avx512(row[b + 1])),
                                      pair512(w_bytes_avx512(xq[b]), w_bytes_avx512(xq[b + 1])));
      const __m512 p1 =
          i8_dot_avx512(pair512(w_bytes_avx512(row[b + 2]), w_bytes_avx512(row[b + 3])),
                        pair512(w_bytes_avx512(xq[b + 2]), w_bytes_avx512(xq[b + 3])));
      const __m512 s0 = _mm512_insertf32x8(
          _mm512_set1_ps(_cvtsh_ss(row[b].d) * _cvtsh_ss(xq[b].d)),
          _mm256_set1_ps(_cvtsh_ss(row[b + 1].d) * _cvtsh_ss(xq[b + 1].d)), 1);
      const __m512 s1 = _mm512_insertf32x8(
          _mm512_set1_ps(_cvtsh_ss(row[b + 2].d) * _cvtsh_ss(xq[b + 2].d)),
          _mm256_set1_ps(_cvtsh_ss(row[b + 3].d) * _cvtsh_ss(xq[b + 3].d)), 1);
      a0 = _mm512_fmadd_ps(s0, p0, a0);
      a1 = _mm512_fmadd_ps(s1, p1, a1);
    }
    for (; b < nb; ++b) {  // 0..3 blocks left: one at a time, low half
      const __m512 p = i8_dot_avx512(_mm512_zextsi256_si512(w_bytes_avx512(row[b])),
                                     _mm512_zextsi256_si512(w_bytes_avx512(xq[b])));
      const __m512 s = _mm512_maskz_mov_ps(0x00ff, _mm512_set1_ps(_cvtsh_ss(row[b].d) * _cvtsh_ss(xq[b].d)));
      a0 = _mm512_fmadd_ps(s, p, a0);
    }
    out[r] = hsum512(_mm512_add_ps(a0, a1));
  }
}

// x quantized to q8 blocks (quantize_activations_q8's rule) 16 lanes at a
// time: the same amax (max of |x| is order-free), the same products x * id
// in f32, rounded half-even by vcvtps2dq under the default MXCSR as
// nearbyintf rounds; lanes past `cols` load as zero and give 0.
CS_AVX512 void quantize_x_avx512(const float* x, q8_block* out, int cols) {
  const int nb = q8_blocks_per_row(cols);
  const __m512 sign = _mm512_set1_ps(-0.0f);
  for (int b = 0; b < nb; ++b) {
    const int base = b * q8_block_size, n = std::min(q8_block_size, cols - base);
    const __mmask16 m0 = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u);
    const __mmask16 m1 = n >= 32 ? 0xffff : n > 16 ? static_cast<__mmask16>((1u << (n - 16)) - 1u) : 0;
    const __m512 v0 = _mm512_maskz_loadu_ps(m0, x + base), v1 = _mm512_maskz_loadu_ps(m1, x + base + 16);
    const float amax =
        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v0), _mm512_andnot_ps(sign, v1)));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    out[b].d = fp32_to_fp16(amax / 127.0f);
    const __m512 vid = _mm512_set1_ps(id);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, vid))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out[b].qs + 16),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, vid))));
  }
}

// ---------------------------------------------------------------------------
// AVX-512 VNNI level (ggml precision of q8_0/q4_0; everything else as
// AVX-512). vpdpbusd multiplies unsigned bytes by signed bytes and adds each
// group of 4 products to an int32 lane, so:
// - q4_0: the nibbles n (0..15) are the unsigned side and x the signed one;
//   (n - 8) . x = n . x - 8 * sum(x), and the -8 * sum(x) of each lane's 8
//   bytes is the accumulator's starting value (computed once per call).
// - q8_0: x + 128 (0..255) is the unsigned side and w the signed one;
//   w . x = w . (x + 128) - 128 * sum(w), the second term one more vpdpbusd.
// Both give each block's integer dot product exactly (split over lanes), so
// the integers are ggml's; lanes go to f32 and are scaled by d_w * d_x per
// block. 4 q4 blocks (16-byte loads into 128-bit lanes) or 2 q8 blocks
// (32-byte loads) fill a 512-bit register; 8 resp. 4 blocks per step, their
// scales converted together. (Gathering the blocks out of 64-byte loads with
// VBMI byte permutes was measured 30-40% slower here.)

// The activations rearranged for one call (thread-local, cheap: cols/32
// blocks against rows * cols/32 weight blocks).
struct vnni_x {
  std::vector<float> dx;         // block scales as f32
  std::vector<uint8_t> a, b;     // q4: low/high 16 bytes of 4 blocks per 64; q8: x + 128
  std::vector<int32_t> corr;     // q4: -8 * (sum of each lane's 8 bytes of x), 16 per group
};

vnni_x& vnni_scratch() {
  thread_local vnni_x v;
  return v;
}

CS_VNNI void prepare_q4_x(vnni_x& v, const q8_block* xq, int nb) {
  const int ng = nb / 4;
  v.dx.resize(nb);
  for (int i = 0; i < nb; ++i) v.dx[i] = _cvtsh_ss(xq[i].d);
  v.a.resize(static_cast<std::size_t>(ng) * 64);
  v.b.resize(static_cast<std::size_t>(ng) * 64);
  v.corr.resize(static_cast<std::size_t>(ng) * 16);
  const __m512i eight = _mm512_set1_epi8(8);
  for (int g = 0; g < ng; ++g) {
    for (int k = 0; k < 4; ++k) {
      const int8_t* q = xq[4 * g + k].qs;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&v.a[g * 64 + 16 * k]),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(&v.b[g * 64 + 16 * k]),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16)));
    }
    __m512i c = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, _mm512_loadu_si512(&v.a[g * 64]));
    c = _mm512_dpbusd_epi32(c, eight, _mm512_loadu_si512(&v.b[g * 64]));
    _mm512_storeu_si512(&v.corr[g * 16], _mm512_sub_epi32(_mm512_setzero_si512(), c));
  }
}

CS_VNNI void prepare_q8_x(vnni_x& v, const q8_block* xq, int nb) {
  v.dx.resize(nb);
  v.a.resize(static_cast<std::size_t>(nb) * 32);
  const __m256i c80 = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int i = 0; i < nb; ++i) {
    v.dx[i] = _cvtsh_ss(xq[i].d);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(&v.a[i * 32]),
                        _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[i].qs)), c80));
  }
}

// One block's integer dot as 8 int32 lanes (a row's last blocks).
CS_VNNI inline __m256i q4_tail_vnni(const q4_block& w, const q8_block& y) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.qs));
  const __m128i m = _mm_set1_epi8(0x0f);
  const __m256i n = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y.qs));
  const __m256i corr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), x);
  return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), n, x), corr);
}
CS_VNNI inline __m256i q8_tail_vnni(const q8_block& w, const uint8_t* u) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w.qs));
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(u));
  const __m256i corr = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(static_cast<char>(0x80)), q);
  return _mm256_sub_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), x, q), corr);
}

// Weight bytes of blocks b[0..3] (q4: 16 bytes each) in the four 128-bit
// lanes, and the four blocks' scales d_w * d_x as f32.
CS_VNNI inline __m512i q4_gather4(const q4_block* b) {
  __m512i q = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs)));
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1].qs)), 1);
  q = _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[2].qs)), 2);
  return _mm512_inserti32x4(q, _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[3].qs)), 3);
}
// Blocks b[0], b[1] (q8: 32 bytes each) in the two 256-bit halves.
CS_VNNI inline __m512i q8_gather2(const q8_block* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[0].qs))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[1].qs)), 1);
}
template <class B>
CS_VNNI inline __m128 scales4(const B* b, const float* dx) {
  const __m128i h = _mm_set_epi16(0, 0, 0, 0, static_cast<short>(b[3].d), static_cast<short>(b[2].d),
                                  static_cast<short>(b[1].d), static_cast<short>(b[0].d));
  return _mm_mul_ps(_mm_cvtph_ps(h), _mm_loadu_ps(dx));
}
// A group of 4 q4 blocks: the 16 int32 lanes (4 per block, each the exact
// dot of 8 weights with their x bytes) after both vpdpbusd.
CS_VNNI inline __m512i q4_group(const q4_block* b, const vnni_x& v, int g) {
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  const __m512i q = q4_gather4(b);
  __m512i acc = _mm512_loadu_si512(&v.corr[16 * g]);
  acc = _mm512_dpbusd_epi32(acc, _mm512_and_si512(q, m4), _mm512_loadu_si512(&v.a[64 * g]));
  return _mm512_dpbusd_epi32(acc, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4),
                             _mm512_loadu_si512(&v.b[64 * g]));
}

// Lane patterns that spread 4 scales over 4 groups of 4 lanes (q4), or
// scales 0,1 / 2,3 over 2 groups of 8 lanes (q8).
CS_VNNI inline __m512i spread4(int first) {
  return _mm512_add_epi32(_mm512_set1_epi32(first),
                          _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3));
}
CS_VNNI inline __m512i spread2(int first) {
  return _mm512_add_epi32(_mm512_set1_epi32(first),
                          _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1));
}

// q4_0 x q8_0: 8 blocks per step (two groups into a0 and a1), then one
// group of 4 into a0, then single blocks (256-bit) into t. NR rows (1..4)
// per pass share the loads of the rearranged x and prefetch `pf` bytes
// ahead, as quant_avx512_rows; a row's operations do not depend on NR.
// The 8 scales of a step are converted together (group_scales_avx512),
// the same values as 4 at a time (scales4).
template <int NR>
CS_VNNI inline void q4_q8_vnni_rows(const q4_block* const* row, const vnni_x& v, const q8_block* xq, float* res,
                                    int cols, std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols), ng = nb / 4;
  const __m512i sp0 = spread4(0), sp1 = spread4(4);
  const __m512i m4 = _mm512_set1_epi8(0x0f);
  __m512 a0[NR], a1[NR];
  CS_UNROLL
  for (int i = 0; i < NR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  int g = 0;
  for (; g + 2 <= ng; g += 2) {
    const __m512i xa0 = _mm512_loadu_si512(&v.a[64 * g]), xb0 = _mm512_loadu_si512(&v.b[64 * g]);
    const __m512i xa1 = _mm512_loadu_si512(&v.a[64 * g + 64]), xb1 = _mm512_loadu_si512(&v.b[64 * g + 64]);
    const __m512i k0 = _mm512_loadu_si512(&v.corr[16 * g]), k1 = _mm512_loadu_si512(&v.corr[16 * g + 16]);
    const __m256 dx = _mm256_loadu_ps(&v.dx[4 * g]);
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const q4_block* b = row[i] + 4 * g;
      const char* p = reinterpret_cast<const char*>(b);
      CS_UNROLL
      for (int l = 0; l < 3; ++l) _mm_prefetch(p + pf + 64 * l, _MM_HINT_T0);
      const __m512 s8 = _mm512_castps256_ps512(_mm256_mul_ps(_mm512_castps512_ps256(group_scales_avx512(b)), dx));
      const __m512i q0 = q4_gather4(b), q1 = q4_gather4(b + 4);
      __m512i c0 = _mm512_dpbusd_epi32(k0, _mm512_and_si512(q0, m4), xa0);
      c0 = _mm512_dpbusd_epi32(c0, _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4), xb0);
      __m512i c1 = _mm512_dpbusd_epi32(k1, _mm512_and_si512(q1, m4), xa1);
      c1 = _mm512_dpbusd_epi32(c1, _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4), xb1);
      a0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c0), _mm512_permutexvar_ps(sp0, s8), a0[i]);
      a1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c1), _mm512_permutexvar_ps(sp1, s8), a1[i]);
    }
  }
  CS_UNROLL
  for (int i = 0; i < NR; ++i) {
    if (g < ng) {
      const __m512 s4 = _mm512_castps128_ps512(scales4(row[i] + 4 * g, &v.dx[4 * g]));
      a0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(q4_group(row[i] + 4 * g, v, g)), _mm512_permutexvar_ps(sp0, s4), a0[i]);
    }
    __m256 t = _mm256_setzero_ps();
    for (int b = 4 * ng; b < nb; ++b)
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q4_tail_vnni(row[i][b], xq[b])),
                          _mm256_set1_ps(_cvtsh_ss(row[i][b].d) * v.dx[b]), t);
    res[i] = hsum512(_mm512_add_ps(a0[i], a1[i])) + hsum256(t);
  }
}

CS_VNNI void q4_q8_vnni(float* out, const q4_block* W, std::size_t stride, const q8_block* xq, int r0,
                        int r1, int cols) {
  vnni_x& v = vnni_scratch();
  prepare_q4_x(v, xq, q8_blocks_per_row(cols));
  auto row_at = [&](int r) { return reinterpret_cast<const q4_block*>(reinterpret_cast<const char*>(W) + r * stride); };
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    const q4_block* rows[4] = {row_at(r), row_at(r + 1), row_at(r + 2), row_at(r + 3)};
    q4_q8_vnni_rows<4>(rows, v, xq, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const q4_block* rows[1] = {row_at(r)};
    q4_q8_vnni_rows<1>(rows, v, xq, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// q8_0 x q8_0: 4 blocks per step (two pairs into a0 and a1), then single
// blocks (256-bit) into t; NR rows per pass as q4_q8_vnni_rows.
template <int NR>
CS_VNNI inline void q8_q8_vnni_rows(const q8_block* const* row, const vnni_x& v, float* res, int cols,
                                    std::ptrdiff_t pf) {
  const int nb = q8_blocks_per_row(cols);
  const __m512i sp0 = spread2(0), sp1 = spread2(2);
  const __m512i c80 = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 a0[NR], a1[NR];
  CS_UNROLL
  for (int i = 0; i < NR; ++i) a0[i] = a1[i] = _mm512_setzero_ps();
  int b = 0;
  for (; b + 4 <= nb; b += 4) {
    const __m512i u0 = _mm512_loadu_si512(&v.a[32 * b]), u1 = _mm512_loadu_si512(&v.a[32 * b + 64]);
    const __m128 dx = _mm_loadu_ps(&v.dx[b]);
    CS_UNROLL
    for (int i = 0; i < NR; ++i) {
      const q8_block* w = row[i] + b;
      const char* p = reinterpret_cast<const char*>(w);
      CS_UNROLL
      for (int l = 0; l < 3; ++l) _mm_prefetch(p + pf + 64 * l, _MM_HINT_T0);
      const __m512 s4 = _mm512_castps128_ps512(_mm_mul_ps(_mm512_castps512_ps128(group_scales_avx512(w)), dx));
      const __m512i q0 = q8_gather2(w), q1 = q8_gather2(w + 2);
      const __m512i p0 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u0, q0),
                                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, q0));
      const __m512i p1 = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), u1, q1),
                                          _mm512_dpbusd_epi32(_mm512_setzero_si512(), c80, q1));
      a0[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p0), _mm512_permutexvar_ps(sp0, s4), a0[i]);
      a1[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p1), _mm512_permutexvar_ps(sp1, s4), a1[i]);
    }
  }
  CS_UNROLL
  for (int i = 0; i < NR; ++i) {
    __m256 t = _mm256_setzero_ps();
    for (int k = b; k < nb; ++k)
      t = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q8_tail_vnni(row[i][k], &v.a[32 * k])),
                          _mm256_set1_ps(_cvtsh_ss(row[i][k].d) * v.dx[k]), t);
    res[i] = hsum512(_mm512_add_ps(a0[i], a1[i])) + hsum256(t);
  }
}

CS_VNNI void q8_q8_vnni(float* out, const q8_block* W, std::size_t stride, const q8_block* xq, int r0,
                        int r1, int cols) {
  vnni_x& v = vnni_scratch();
  prepare_q8_x(v, xq, q8_blocks_per_row(cols));
  auto row_at = [&](int r) { return reinterpret_cast<const q8_block*>(reinterpret_cast<const char*>(W) + r * stride); };
  int r = r0;
  for (; r + 4 <= r1; r += 4) {
    const q8_block* rows[4] = {row_at(r), row_at(r + 1), row_at(r + 2), row_at(r + 3)};
    q8_q8_vnni_rows<4>(rows, v, out + r, cols, group_prefetch(stride));
  }
  for (; r < r1; ++r) {
    const q8_block* rows[1] = {row_at(r)};
    q8_q8_vnni_rows<1>(rows, v, out + r, cols, static_cast<std::ptrdiff_t>(stride));
  }
}

// ---------------------------------------------------------------------------
// Batched row kernels (prefill): one weight row times NX input vectors, each
// (row, x) pair summed in exactly the order of the single-vector kernel above
// (same accumulators, same steps, same final adds), so a batched product is
// bit-identical to NX matvecs. The weight row is loaded once for all NX.

template <int NX>
CS_AVX2 inline void f32_avx2_mx(const float* w, const float* const* x, float* res, int cols) {
  __m256 a0[NX], a1[NX], a2[NX], a3[NX];
  for (int j = 0; j < NX; ++j) a0[j] = a1[j] = a2[j] = a3[j] = _mm256_setzero_ps();
  int c = static_cast<int>(((32 - (reinterpret_cast<uintptr_t>(w) & 31)) & 31) / 4);
  if (c > cols) c = cols;
  if (c > 0) {
    const __m256i m = tail_mask256(c);
    const __m256 wv = _mm256_maskload_ps(w, m);
    for (int j = 0; j < NX; ++j) a3[j] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x[j], m), a3[j]);
  }
  for (; c + 32 <= cols; c += 32) {
    __m256 wv = _mm256_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a0[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c), a0[j]);
    wv = _mm256_load_ps(w + c + 8);
    for (int j = 0; j < NX; ++j) a1[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c + 8), a1[j]);
    wv = _mm256_load_ps(w + c + 16);
    for (int j = 0; j < NX; ++j) a2[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c + 16), a2[j]);
    wv = _mm256_load_ps(w + c + 24);
    for (int j = 0; j < NX; ++j) a3[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c + 24), a3[j]);
  }
  if (c + 8 <= cols) {
    const __m256 wv = _mm256_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a0[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c), a0[j]);
    c += 8;
  }
  if (c + 8 <= cols) {
    const __m256 wv = _mm256_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a1[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c), a1[j]);
    c += 8;
  }
  if (c + 8 <= cols) {
    const __m256 wv = _mm256_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a2[j] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + c), a2[j]);
    c += 8;
  }
  if (c < cols) {
    const __m256i m = tail_mask256(cols - c);
    const __m256 wv = _mm256_maskload_ps(w + c, m);
    for (int j = 0; j < NX; ++j)
      a3[j] = _mm256_fmadd_ps(wv, _mm256_maskload_ps(x[j] + c, m), a3[j]);
  }
  for (int j = 0; j < NX; ++j)
    res[j] = hsum256(_mm256_add_ps(_mm256_add_ps(a0[j], a1[j]), _mm256_add_ps(a2[j], a3[j])));
}

// A block's 32 weights as 4 x 8 floats (the conversions of q8/q4_block_dot_avx2).
CS_AVX2 inline void unpack_avx2(const __m128i lo, const __m128i hi, __m256* q) {
  q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
  q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
  q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
  q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
}
CS_AVX2 inline void unpack_avx2(const q8_block& b, __m256* q) {
  unpack_avx2(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)),
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)), q);
}
CS_AVX2 inline void unpack_avx2(const q4_block& b, __m256* q) {  // as q4_block_dot_avx2
  const __m256i b0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs)));
  const __m256i b1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8)));
  const __m256i m = _mm256_set1_epi32(0x0f), eight = _mm256_set1_epi32(8);
  q[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b0, m), eight));
  q[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(b1, m), eight));
  q[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b0, 4), eight));
  q[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(b1, 4), eight));
}
CS_AVX2 inline __m256 dot4_avx2(const __m256* q, const float* x, int base, int cols, bool full) {
  if (full) {
    __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(x + base));
    t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + base + 8), t);
    t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(x + base + 16), t);
    return _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + base + 24), t);
  }
  __m256 t = _mm256_mul_ps(q[0], load_x8(x, base, cols));
  t = _mm256_fmadd_ps(q[1], load_x8(x, base + 8, cols), t);
  t = _mm256_fmadd_ps(q[2], load_x8(x, base + 16, cols), t);
  return _mm256_fmadd_ps(q[3], load_x8(x, base + 24, cols), t);
}

template <class B, int NX>
CS_AVX2 inline void quant_avx2_mx(const B* row, const float* const* x, float* res, int cols) {
  const int nb = q8_blocks_per_row(cols);
  const int full = cols / 32;
  __m256 a0[NX], a1[NX];
  for (int j = 0; j < NX; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
  __m256 q[4];
  int b = 0;
  for (; b + 2 <= full; b += 2) {
    unpack_avx2(row[b], q);
    __m256 s = load_scale256(row[b].d);
    for (int j = 0; j < NX; ++j) a0[j] = _mm256_fmadd_ps(s, dot4_avx2(q, x[j], b * 32, cols, true), a0[j]);
    unpack_avx2(row[b + 1], q);
    s = load_scale256(row[b + 1].d);
    for (int j = 0; j < NX; ++j)
      a1[j] = _mm256_fmadd_ps(s, dot4_avx2(q, x[j], b * 32 + 32, cols, true), a1[j]);
  }
  for (; b < nb; ++b) {
    unpack_avx2(row[b], q);
    const __m256 s = load_scale256(row[b].d);
    for (int j = 0; j < NX; ++j) {
      const __m256 t = dot4_avx2(q, x[j], b * 32, cols, b < full);
      if (b % 2 == 0) a0[j] = _mm256_fmadd_ps(s, t, a0[j]);
      else a1[j] = _mm256_fmadd_ps(s, t, a1[j]);
    }
  }
  for (int j = 0; j < NX; ++j) res[j] = hsum256(_mm256_add_ps(a0[j], a1[j]));
}

template <int NX>
CS_AVX512 inline void f32_avx512_mx(const float* w, const float* const* x, float* res, int cols) {
  __m512 a0[NX], a1[NX], a2[NX], a3[NX];
  for (int j = 0; j < NX; ++j) a0[j] = a1[j] = a2[j] = a3[j] = _mm512_setzero_ps();
  int c = static_cast<int>(((64 - (reinterpret_cast<uintptr_t>(w) & 63)) & 63) / 4);
  if (c > cols) c = cols;
  if (c > 0) {
    const __mmask16 m = static_cast<__mmask16>((1u << c) - 1u);
    const __m512 wv = _mm512_maskz_loadu_ps(m, w);
    for (int j = 0; j < NX; ++j) a3[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[j]), a3[j]);
  }
  for (; c + 64 <= cols; c += 64) {
    __m512 wv = _mm512_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a0[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c), a0[j]);
    wv = _mm512_load_ps(w + c + 16);
    for (int j = 0; j < NX; ++j) a1[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c + 16), a1[j]);
    wv = _mm512_load_ps(w + c + 32);
    for (int j = 0; j < NX; ++j) a2[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c + 32), a2[j]);
    wv = _mm512_load_ps(w + c + 48);
    for (int j = 0; j < NX; ++j) a3[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c + 48), a3[j]);
  }
  if (c + 16 <= cols) {
    const __m512 wv = _mm512_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a0[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c), a0[j]);
    c += 16;
  }
  if (c + 16 <= cols) {
    const __m512 wv = _mm512_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a1[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c), a1[j]);
    c += 16;
  }
  if (c + 16 <= cols) {
    const __m512 wv = _mm512_load_ps(w + c);
    for (int j = 0; j < NX; ++j) a2[j] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(x[j] + c), a2[j]);
    c += 16;
  }
  if (c < cols) {
    const __mmask16 m = static_cast<__mmask16>((1u << (cols - c)) - 1u);
    const __m512 wv = _mm512_maskz_loadu_ps(m, w + c);
    for (int j = 0; j < NX; ++j)
      a3[j] = _mm512_fmadd_ps(wv, _mm512_maskz_loadu_ps(m, x[j] + c), a3[j]);
  }
  for (int j = 0; j < NX; ++j)
    res[j] = hsum512(_mm512_add_ps(_mm512_add_ps(a0[j], a1[j]), _mm512_add_ps(a2[j], a3[j])));
}

template <class B, int NX>
CS_AVX512 inline void quant_avx512_mx(const B* row, const float* const* x, float* res, int cols) {
  const int nb = q8_blocks_per_row(cols);
  const int full = cols / 32;
  __m512 a0[NX], a1[NX];
  for (int j = 0; j < NX; ++j) a0[j] = a1[j] = _mm512_setzero_ps();
  __m512 q0, q1;
  int b = 0;
  for (; b + 2 <= full; b += 2) {
    block_f32_avx512(row[b], q0, q1);
    __m512 s = _mm512_set1_ps(_cvtsh_ss(row[b].d));
    for (int j = 0; j < NX; ++j) a0[j] = _mm512_fmadd_ps(s, dot2_avx512(q0, q1, x[j], b * 32, cols, true), a0[j]);
    block_f32_avx512(row[b + 1], q0, q1);
    s = _mm512_set1_ps(_cvtsh_ss(row[b + 1].d));
    for (int j = 0; j < NX; ++j)
      a1[j] = _mm512_fmadd_ps(s, dot2_avx512(q0, q1, x[j], b * 32 + 32, cols, true), a1[j]);
  }
  for (; b < nb; ++b) {
    block_f32_avx512(row[b], q0, q1);
    const __m512 s = _mm512_set1_ps(_cvtsh_ss(row[b].d));
    for (int j = 0; j < NX; ++j) {
      const __m512 t = dot2_avx512(q0, q1, x[j], b * 32, cols, b < full);
      if (b % 2 == 0) a0[j] = _mm512_fmadd_ps(s, t, a0[j]);
      else a1[j] = _mm512_fmadd_ps(s, t, a1[j]);
    }
  }
  for (int j = 0; j < NX; ++j) res[j] = hsum512(_mm512_add_ps(a0[j], a1[j]));
}

// ---------------------------------------------------------------------------
// Typed rows on AVX2 (also used at the AVX-512 level): f16, bf16, q4_K and
// q6_K. Exact precision: the row's values in f32 times x in f32, a fixed
// order per row (as f32: 4 accumulators over 32-column steps). ggml
// precision: f16/bf16 with x rounded to the weight's type first, then the
// same; q4_K/q6_K as integer dot products per sub-block with x quantized to
// q8_K blocks (ref::quantize_row_q8_k): the integer sums are the
// reference's exactly, the per-block float arithmetic is written in ggml's
// (and ref::matvec_typed's) order, though the compiler may fuse a multiply
// and add here (FMA) where the reference build cannot: equal to rounding.

// 8 halves (f16 or bf16) at p as 8 floats.
CS_AVX2 inline __m256 load8_f16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
CS_AVX2 inline __m256 load8_bf16(const uint16_t* p) {
  const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

template <bool BF16>
CS_AVX2 inline __m256 load8_half(const uint16_t* p) {
  if constexpr (BF16) return load8_bf16(p);
  else return load8_f16(p);
}

template <bool BF16>
CS_AVX2 void half_avx2(float* out, const uint8_t* W, std::size_t stride, const float* x, int rows,
                       int cols) {
  for (int r = 0; r < rows; ++r) {
    const uint16_t* w = reinterpret_cast<const uint16_t*>(W + r * stride);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 32 <= cols; c += 32) {
      a0 = _mm256_fmadd_ps(load8_half<BF16>(w + c), _mm256_loadu_ps(x + c), a0);
      a1 = _mm256_fmadd_ps(load8_half<BF16>(w + c + 8), _mm256_loadu_ps(x + c + 8), a1);
      a2 = _mm256_fmadd_ps(load8_half<BF16>(w + c + 16), _mm256_loadu_ps(x + c + 16), a2);
      a3 = _mm256_fmadd_ps(load8_half<BF16>(w + c + 24), _mm256_loadu_ps(x + c + 24), a3);
    }
    for (; c + 8 <= cols; c += 8)
      a0 = _mm256_fmadd_ps(load8_half<BF16>(w + c), _mm256_loadu_ps(x + c), a0);
    if (c < cols) {  // a tail of 1..7: through a zero-padded copy
      uint16_t tw[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      std::memcpy(tw, w + c, (cols - c) * sizeof(uint16_t));
      const __m256i m = tail_mask256(cols - c);
      a3 = _mm256_fmadd_ps(load8_half<BF16>(tw), _mm256_maskload_ps(x + c, m), a3);
    }
    out[r] = hsum256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  }
}

// The 8 6-bit scales and 8 mins of a q4_K block, sub-block j in byte j of
// *sc and *m, all at once (the layout ggml's get_scale_min_k4 reads: for
// j < 4, sc = q[j] & 63 and m = q[j+4] & 63; for j >= 4, sc = (q[j+4] & 15) |
// (q[j-4] >> 6) << 4 and m = (q[j+4] >> 4) | (q[j] >> 6) << 4), byte-wise
// in 32-bit words; x86 is little-endian (byte j = bits 8j..8j+7).
inline void q4k_scales_mins(const uint8_t* q, uint64_t* sc, uint64_t* m) {
  uint32_t u0, u1, u2;
  std::memcpy(&u0, q, 4);
  std::memcpy(&u1, q + 4, 4);
  std::memcpy(&u2, q + 8, 4);
  const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, bits45 = 0x30303030u;
  const uint32_t sc_hi = (u2 & low4) | ((u0 >> 2) & bits45);
  const uint32_t m_hi = ((u2 >> 4) & low4) | ((u1 >> 2) & bits45);
  *sc = static_cast<uint64_t>(u0 & low6) | (static_cast<uint64_t>(sc_hi) << 32);
  *m = static_cast<uint64_t>(u1 & low6) | (static_cast<uint64_t>(m_hi) << 32);
}
inline int byte_of(uint64_t v, int j) { return static_cast<int>((v >> (8 * j)) & 0xff); }

CS_AVX2 inline int hsum_i32x8(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
  return _mm_cvtsi128_si32(s);
}

// 32 bytes as 4 x 8 floats (unsigned when U, else signed).
template <bool U>
CS_AVX2 inline void bytes_to_f32(__m256i v, __m256* q) {
  const __m128i lo = _mm256_castsi256_si128(v), hi = _mm256_extracti128_si256(v, 1);
  if constexpr (U) {
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8)));
  } else {
    q[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo));
    q[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)));
    q[2] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi));
    q[3] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)));
  }
}

// q4_K, exact: per sub-block of 32, acc += (d*sc) * (q . x); the mins term
// -(dmin*m) * sum(x of the sub-block) summed separately (xsum precomputed
// per call: sub-block sums of x); out = hsum(acc) - mins.
CS_AVX2 void q4k_exact_avx2(float* out, const uint8_t* W, std::size_t stride, const float* x,
                            const float* xsum, int rows, int cols) {
  const int nb = cols / qk_k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int r = 0; r < rows; ++r) {
    const block_q4_k* blk = reinterpret_cast<const block_q4_k*>(W + r * stride);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < nb; ++b) {
      const float d = _cvtsh_ss(blk[b].d), dmin = _cvtsh_ss(blk[b].dmin);
      const float* xb = x + b * qk_k;
      uint64_t scs, ms;
      q4k_scales_mins(blk[b].scales, &scs, &ms);
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[b].qs + 32 * j));
        const __m256i nib[2] = {_mm256_and_si256(v, m4), _mm256_and_si256(_mm256_srli_epi16(v, 4), m4)};
        for (int h = 0; h < 2; ++h) {
          const int sb = 2 * j + h;
          const int sc = byte_of(scs, sb), m = byte_of(ms, sb);
          __m256 q[4];
          bytes_to_f32<true>(nib[h], q);
          const float* xs = xb + 32 * sb;
          __m256 t = _mm256_mul_ps(q[0], _mm256_loadu_ps(xs));
          t = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xs + 8), t);
          t = _mm256_fmadd_ps(q[2], _mm256_loadu_ps(xs + 16), t);
          t = _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xs + 24), t);
          acc = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(sc)), t, acc);
          mins += dmin * static_cast<float>(m) * xsum[b * 8 + sb];
        }
      }
    }
    out[r] = hsum256(acc) - mins;
  }
}

// q4_K, ggml: integer dots against q8_K activations, ggml's arithmetic. The
// sub-block scale is the second factor of the 16-bit multiply-add (vpmaddwd
// with sc instead of 1), so the 8 sub-blocks of a block add up in 8 int32
// lanes and one horizontal sum per block gives sum(sc * dot): the same
// integers as the reference, with no overflow (per lane at most
// 8 * 63 * 2 * 2 * 15 * 128 < 2^31).
CS_AVX2 void q4k_ggml_avx2(float* out, const uint8_t* W, std::size_t stride, const block_q8_k* y,
                           int rows, int cols) {
  const int nb = cols / qk_k;
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  for (int r = 0; r < rows; ++r) {
    const block_q4_k* blk = reinterpret_cast<const block_q4_k*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      uint64_t scs, ms;
      q4k_scales_mins(blk[b].scales, &scs, &ms);
      __m256i acc = _mm256_setzero_si256();
      for (int j = 0; j < 4; ++j) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[b].qs + 32 * j));
        const __m256i y0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs + 64 * j));
        const __m256i y1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs + 64 * j + 32));
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(v, m4), y0);
        const __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), m4), y1);
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p0, _mm256_set1_epi16(static_cast<short>(byte_of(scs, 2 * j)))));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p1, _mm256_set1_epi16(static_cast<short>(byte_of(scs, 2 * j + 1)))));
      }
      // sum over sub-blocks of m * (its two bsums): each m twice as 16-bit
      // factors of the 16 bsums.
      const __m128i mb = _mm_cvtsi64_si128(static_cast<long long>(ms));
      const __m256i m16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mb, mb));
      const int mins = hsum_i32x8(
          _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].bsums)), m16));
      const int sums = hsum_i32x8(acc);
      const float d = _cvtsh_ss(blk[b].d) * y[b].d;
      const float dmin = _cvtsh_ss(blk[b].dmin) * y[b].d;
      sum += d * static_cast<float>(sums) - dmin * static_cast<float>(mins);
    }
    out[r] = sum;
  }
}

// The 4 groups of 32 6-bit values of half h of a q6_K block, as signed bytes
// (q - 32): group g holds elements 128h + 32g + l, l in [0, 32).
CS_AVX2 inline void q6k_groups(const block_q6_k& b, int h, __m256i* g) {
  const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(0x03), k32 = _mm256_set1_epi8(32);
  const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h));
  const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * h + 32));
  const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * h));
  const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4);
  const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4);
  const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4);
  const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4);
  g[0] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(qa, m4), h0), k32);
  g[1] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(qb, m4), h1), k32);
  g[2] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4), h2), k32);
  g[3] = _mm256_sub_epi8(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4), h3), k32);
}

CS_AVX2 void q6k_exact_avx2(float* out, const uint8_t* W, std::size_t stride, const float* x, int rows,
                            int cols) {
  const int nb = cols / qk_k;
  for (int r = 0; r < rows; ++r) {
    const block_q6_k* blk = reinterpret_cast<const block_q6_k*>(W + r * stride);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    for (int b = 0; b < nb; ++b) {
      const float d = _cvtsh_ss(blk[b].d);
      for (int h = 0; h < 2; ++h) {
        __m256i g[4];
        q6k_groups(blk[b], h, g);
        for (int k = 0; k < 4; ++k) {
          const int e0 = 128 * h + 32 * k, sb = e0 / 16;
          const float* xs = x + b * qk_k + e0;
          __m256 q[4];
          bytes_to_f32<false>(g[k], q);
          const __m256 t0 = _mm256_fmadd_ps(q[1], _mm256_loadu_ps(xs + 8), _mm256_mul_ps(q[0], _mm256_loadu_ps(xs)));
          const __m256 t1 =
              _mm256_fmadd_ps(q[3], _mm256_loadu_ps(xs + 24), _mm256_mul_ps(q[2], _mm256_loadu_ps(xs + 16)));
          a0 = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(blk[b].scales[sb])), t0, a0);
          a1 = _mm256_fmadd_ps(_mm256_set1_ps(d * static_cast<float>(blk[b].scales[sb + 1])), t1, a1);
        }
      }
    }
    out[r] = hsum256(_mm256_add_ps(a0, a1));
  }
}

// q6_K, ggml: as q4_K, each 32-value group's two 16-value sub-block scales
// in the two 128-bit halves of the vpmaddwd factor; one horizontal sum per
// block (per lane at most 16 * 127 * 2 * 2 * 32 * 128 < 2^31).
CS_AVX2 void q6k_ggml_avx2(float* out, const uint8_t* W, std::size_t stride, const block_q8_k* y, int rows,
                           int cols) {
  const int nb = cols / qk_k;
  for (int r = 0; r < rows; ++r) {
    const block_q6_k* blk = reinterpret_cast<const block_q6_k*>(W + r * stride);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      __m256i acc = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        __m256i g[4];
        q6k_groups(blk[b], h, g);
        for (int k = 0; k < 4; ++k) {
          const int e0 = 128 * h + 32 * k, sb = e0 / 16;
          const __m256i ys = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y[b].qs + e0));
          // |w| (<= 32) times y with w's sign: 16-bit pair sums, then scaled
          // 32-bit sums (elements e0..e0+15 by scale sb, the rest by sb+1).
          const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(g[k], g[k]), _mm256_sign_epi8(ys, g[k]));
          const __m256i scv = _mm256_set_m128i(_mm_set1_epi16(blk[b].scales[sb + 1]),
                                               _mm_set1_epi16(blk[b].scales[sb]));
          acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p16, scv));
        }
      }
      sum += _cvtsh_ss(blk[b].d) * y[b].d * static_cast<float>(hsum_i32x8(acc));
    }
    out[r] = sum;
  }
}
#endif  // CS_X86

#if CS_NEON
// ---------------------------------------------------------------------------
// NEON level (4 lanes, 4 accumulators per row for columns mod 16 groups).
float hsum_neon(float32x4_t v) { return vaddvq_f32(v); }

void f32_neon(float* out, const float* W, const float* x, int r0, int r1, int cols, int ld) {
  for (int r = r0; r < r1; ++r) {
    const float* w = W + static_cast<std::size_t>(r) * ld;
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;
    int c = 0;
    for (; c + 16 <= cols; c += 16) {
      a0 = vfmaq_f32(a0, vld1q_f32(w + c), vld1q_f32(x + c));
      a1 = vfmaq_f32(a1, vld1q_f32(w + c + 4), vld1q_f32(x + c + 4));
      a2 = vfmaq_f32(a2, vld1q_f32(w + c + 8), vld1q_f32(x + c + 8));
      a3 = vfmaq_f32(a3, vld1q_f32(w + c + 12), vld1q_f32(x + c + 12));
    }
    for (; c + 4 <= cols; c += 4) a0 = vfmaq_f32(a0, vld1q_f32(w + c), vld1q_f32(x + c));
    float tail = 0.0f;
    for (; c < cols; ++c) tail += w[c] * x[c];
    out[r] = hsum_neon(vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3))) + tail;
  }
}
#endif

// ---------------------------------------------------------------------------
// Attention: per head, scores q.k_t (a dot product of head_size), run.c's
// softmax, then out += a_t v_t. Dot and axpy per level; heads are split over
// the pool (each head computed the same way wherever it runs).

float dot_portable(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * b[i + l];
  return reduce8(acc);
}
void axpy_portable(float* y, float a, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += a * x[i];
}

#if CS_X86
CS_AVX2 float dot_avx2(const float* a, const float* b, int n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
  }
  if (i + 8 <= n) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    i += 8;
  }
  if (i < n) {
    const __m256i m = tail_mask256(n - i);
    s1 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), s1);
  }
  return hsum256(_mm256_add_ps(s0, s1));
}
CS_AVX2 void axpy_avx2(float* y, float a, const float* x, int n) {
  const __m256 av = _mm256_set1_ps(a);
  int i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] = std::fma(a, x[i], y[i]);
}
CS_AVX512 float dot_avx512(const float* a, const float* b, int n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    s1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), s1);
  }
  if (i + 16 <= n) {
    s0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s0);
    i += 16;
  }
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), s1);
  }
  return hsum512(_mm512_add_ps(s0, s1));
}
CS_AVX512 void axpy_avx512(float* y, float a, const float* x, int n) {
  const __m512 av = _mm512_set1_ps(a);
  int i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(av, _mm512_loadu_ps(x + i), _mm512_loadu_ps(y + i)));
  if (i < n) {
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}
#endif

using dot_fn = float (*)(const float*, const float*, int);
using axpy_fn = void (*)(float*, float, const float*, int);

void attention_heads(int h0, int h1, dot_fn dot, axpy_fn axpy, float* out, const float* q,
                     const float* k_cache, const float* v_cache, float* att, int kv_mul,
                     int head_size, int kv_stride, int pos) {
  const float scale = sqrtf(static_cast<float>(head_size));
  for (int h = h0; h < h1; ++h) {
    const float* qh = q + h * head_size;
    float* a = att + static_cast<std::size_t>(h) * (pos + 1);
    const int kvo = (h / kv_mul) * head_size;
    for (int t = 0; t <= pos; ++t)
      a[t] = dot(qh, k_cache + static_cast<std::size_t>(t) * kv_stride + kvo, head_size) / scale;
    ref::softmax(a, pos + 1);
    float* xb = out + h * head_size;
    std::memset(xb, 0, sizeof(float) * head_size);
    for (int t = 0; t <= pos; ++t)
      axpy(xb, a[t], v_cache + static_cast<std::size_t>(t) * kv_stride + kvo, head_size);
  }
}

#if CS_X86
// attention_heads at the avx512 level for head_size <= 128 (up to 8
// registers of 16 lanes): the same floating-point operations in the same
// order as attention_heads with dot_avx512 / axpy_avx512, so the same bits
// (tests/kernels/native.cpp compares the two). What changes is the
// overhead around them: q stays in registers for all positions (4 at a
// time), and the head's output accumulates in registers over the positions
// instead of being loaded and stored once per position by axpy. Measured
// in a q4_0 decode of stories110m (perf, session 12): the two calls per
// position and head were ~8% of the per-token samples.
//
// dot_avx512(q, k, n) with q in registers (NC = ceil(n / 16) of them, the
// last zero-padded): s0 over 32-column steps (first 16), s1 (second 16),
// then one more 16-column step into s0, then the masked tail into s1.
// TAIL: n is not a multiple of 16 (the last register is the masked tail).
template <int NC, bool TAIL>
CS_AVX512 __attribute__((always_inline)) inline float dot_regs_avx512(const __m512* qv, const float* k,
                                                                      __mmask16 tail) {
  __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps();
  constexpr int full = TAIL ? NC - 1 : NC;  // whole 16-column chunks
  CS_UNROLL
  for (int c = 0; c < NC; ++c) {
    if (c < full) {
      if (c % 2 == 0 && c + 1 < full) s0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), s0);
      else if (c % 2 == 1) s1 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), s1);
      else s0 = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + 16 * c), s0);  // the lone 16-column step
    } else {
      s1 = _mm512_fmadd_ps(qv[c], _mm512_maskz_loadu_ps(tail, k + 16 * c), s1);  // masked tail
    }
  }
  return hsum512(_mm512_add_ps(s0, s1));
}
template <int NC, bool TAIL>
CS_AVX512 void attention_heads_avx512(int h0, int h1, float* out, const float* q, const float* k_cache,
                                      const float* v_cache, float* att, int kv_mul, int head_size,
                                      int kv_stride, int pos) {
  const float scale = sqrtf(static_cast<float>(head_size));
  const int rem = head_size % 16;
  const __mmask16 tail = rem ? static_cast<__mmask16>((1u << rem) - 1u) : static_cast<__mmask16>(0xffff);
  auto mask_of = [&](int c) { return (c == NC - 1) ? tail : static_cast<__mmask16>(0xffff); };
  const std::size_t ks = static_cast<std::size_t>(kv_stride);
  for (int h = h0; h < h1; ++h) {
    const float* qh = q + h * head_size;
    float* a = att + static_cast<std::size_t>(h) * (pos + 1);
    const int kvo = (h / kv_mul) * head_size;
    __m512 qv[NC];
    CS_UNROLL
    for (int c = 0; c < NC; ++c) qv[c] = _mm512_maskz_loadu_ps(mask_of(c), qh + 16 * c);
    int t = 0;
    for (; t + 4 <= pos + 1; t += 4) {
      const float* k0 = k_cache + static_cast<std::size_t>(t) * ks + kvo;
      const float d0 = dot_regs_avx512<NC, TAIL>(qv, k0, tail);
      const float d1 = dot_regs_avx512<NC, TAIL>(qv, k0 + ks, tail);
      const float d2 = dot_regs_avx512<NC, TAIL>(qv, k0 + 2 * ks, tail);
      const float d3 = dot_regs_avx512<NC, TAIL>(qv, k0 + 3 * ks, tail);
      a[t] = d0 / scale;
      a[t + 1] = d1 / scale;
      a[t + 2] = d2 / scale;
      a[t + 3] = d3 / scale;
    }
    for (; t <= pos; ++t)
      a[t] = dot_regs_avx512<NC, TAIL>(qv, k_cache + static_cast<std::size_t>(t) * ks + kvo, tail) / scale;
    ref::softmax(a, pos + 1);
    // axpy_avx512(xb, a[t], v_t) for t = 0..pos, xb starting at +0: per lane
    // xb = fma(a[t], v_t, xb) in t order (masked tail: the same lanes).
    __m512 acc[NC];
    CS_UNROLL
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
    const float* vt = v_cache + kvo;
    for (t = 0; t <= pos; ++t, vt += ks) {
      const __m512 av = _mm512_set1_ps(a[t]);
      CS_UNROLL
      for (int c = 0; c < NC; ++c)
        acc[c] = _mm512_fmadd_ps(av, TAIL && c == NC - 1 ? _mm512_maskz_loadu_ps(tail, vt + 16 * c) : _mm512_loadu_ps(vt + 16 * c),
                                 acc[c]);
    }
    float* xb = out + h * head_size;
    CS_UNROLL
    for (int c = 0; c < NC; ++c) _mm512_mask_storeu_ps(xb + 16 * c, mask_of(c), acc[c]);
  }
}
using attention_heads_fn = void (*)(int, int, float*, const float*, const float*, const float*, float*, int, int,
                                    int, int);
// The instance for head_size (1..128).
attention_heads_fn attention_heads_avx512_for(int head_size) {
  static constexpr attention_heads_fn whole[8] = {
      attention_heads_avx512<1, false>, attention_heads_avx512<2, false>, attention_heads_avx512<3, false>,
      attention_heads_avx512<4, false>, attention_heads_avx512<5, false>, attention_heads_avx512<6, false>,
      attention_heads_avx512<7, false>, attention_heads_avx512<8, false>};
  static constexpr attention_heads_fn tailed[8] = {
      attention_heads_avx512<1, true>, attention_heads_avx512<2, true>, attention_heads_avx512<3, true>,
      attention_heads_avx512<4, true>, attention_heads_avx512<5, true>, attention_heads_avx512<6, true>,
      attention_heads_avx512<7, true>, attention_heads_avx512<8, true>};
  const int nc = (head_size + 15) / 16;
  return head_size % 16 ? tailed[nc - 1] : whole[nc - 1];
}
#endif

// ---------------------------------------------------------------------------
// Dispatch.

isa detect() {
#if CS_X86
  __builtin_cpu_init();
  // F16C is CPUID leaf 1, ECX bit 29 (Intel SDM vol. 2A, CPUID); asked through
  // cpuid.h because clang 14's __builtin_cpu_supports does not know "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && ((ecx >> 29) & 1u);
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
    if (__builtin_cpu_supports("avx512vnni"))
      return isa::avx512vnni;
    return isa::avx512;
  }
  if (avx2) return isa::avx2;
  return isa::portable;
#elif CS_NEON
  return isa::neon;
#else
  return isa::portable;
#endif
}

std::atomic<isa>& active() {
  static std::atomic<isa> a{detect()};
  return a;
}
std::atomic<precision> g_precision{precision::exact};

// The level whose kernels run everything but the VNNI ones: AVX-512 VNNI
// adds integer q8_0/q4_0 kernels to the AVX-512 level.
isa simd_level() {
  const isa i = active().load(std::memory_order_relaxed);
  return i == isa::avx512vnni ? isa::avx512 : i;
}

bool supported(isa i) {
  switch (i) {
    case isa::portable: return true;
    case isa::avx2:
      return best_isa() == isa::avx2 || best_isa() == isa::avx512 || best_isa() == isa::avx512vnni;
    case isa::avx512: return best_isa() == isa::avx512 || best_isa() == isa::avx512vnni;
    case isa::avx512vnni: return best_isa() == isa::avx512vnni;
    case isa::neon: return best_isa() == isa::neon;
  }
  return false;
}

// Rows per chunk: about 64 KiB of weights, at least 4 rows, so a chunk is
// worth a hand-off; a matrix below ~128 KiB runs on the caller only.
int chunk_rows(std::size_t row_bytes) {
  const std::size_t target = 64 * 1024;
  std::size_t r = row_bytes ? target / row_bytes : 64;
  r = std::max<std::size_t>(4, (r + 3) / 4 * 4);
  return static_cast<int>(std::min<std::size_t>(r, 1 << 20));
}

template <class K>
void split_rows(int rows, std::size_t row_bytes, K&& kernel) {
  pool* p = pool::current();
  if (!p || p->threads() == 1 || static_cast<std::size_t>(rows) * row_bytes < 128 * 1024) {
    kernel(0, rows);
    return;
  }
  int chunk = chunk_rows(row_bytes);
  // At least ~4 chunks per thread so a busy core takes fewer.
  const int per_thread = (rows + p->threads() * 4 - 1) / (p->threads() * 4);
  chunk = std::max(4, std::min(chunk, (per_thread + 3) / 4 * 4));
  p->parallel_for(rows, chunk, kernel);
}

// x quantized once per matvec, per thread (ggml precision).
std::vector<q8_block>& xq_scratch(int cols) {
  thread_local std::vector<q8_block> v;
  const std::size_t nb = static_cast<std::size_t>(q8_blocks_per_row(cols));
  if (v.size() < nb) v.resize(nb);
  return v;
}

}  // namespace

void quantize_activations_q8(const float* x, q8_block* out, int cols) {
#if CS_X86
  if (simd_level() == isa::avx512) return quantize_x_avx512(x, out, cols);
#endif
  const int nb = q8_blocks_per_row(cols);
  for (int b = 0; b < nb; ++b) {
    const int base = b * q8_block_size;
    const int n = std::min(q8_block_size, cols - base);
    float amax = 0.0f;
    for (int i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[base + i]));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    out[b].d = fp32_to_fp16(amax / 127.0f);
    for (int i = 0; i < q8_block_size; ++i)
      out[b].qs[i] = i < n ? static_cast<int8_t>(std::nearbyintf(x[base + i] * id)) : 0;
  }
}

namespace {

bool use_integer_path() { return g_precision.load(std::memory_order_relaxed) != precision::exact; }

// n floats at a 64-byte boundary inside buf (grown as needed). x' must be
// aligned: its 64-byte loads split cache lines otherwise, which made the q4
// kernel 25-40% slower than quant_avx512_rows with rows of 8192-16384
// columns (x' beyond L1), where aligned it is as fast or faster.
#if CS_X86
float* aligned64(std::vector<float>& buf, std::size_t n) {
  if (buf.size() < n + 16) buf.resize(n + 16);
  const auto a = reinterpret_cast<std::uintptr_t>(buf.data());
  return buf.data() + ((64 - (a & 63)) & 63) / sizeof(float);
}
#endif

// x as the exact row kernels of B read it at the active level: x' (q4 order,
// q4_order_x) for q4_0 at AVX-512, made once per matvec into buf; x itself
// everywhere else.
template <class B>
const float* exact_x(const float* x, int cols, std::vector<float>& buf) {
#if CS_X86
  if constexpr (std::is_same_v<B, q4_block>) {
    if (simd_level() == isa::avx512) {
      float* xp = aligned64(buf, static_cast<std::size_t>(cols));
      q4_order_x(x, xp, cols);
      return xp;
    }
  }
#endif
  return x;
}
std::vector<float>& exact_x_scratch() {
  thread_local std::vector<float> v;
  return v;
}

// Exact rows; xr = exact_x(x).
template <class B>
void rows_exact(float* out, const B* W, std::size_t stride, const float* xr, int r0, int r1, int cols) {
  switch (simd_level()) {
#if CS_X86
    case isa::avx512:
      if constexpr (std::is_same_v<B, q4_block>) return q4_avx512(out, W, stride, xr, r0, r1, cols);
      else return quant_avx512(out, W, stride, xr, r0, r1, cols);
    case isa::avx2: return quant_avx2(out, W, stride, xr, r0, r1, cols);
#endif
    default: return quant_portable(out, W, stride, xr, r0, r1, cols);
  }
}
template <class B>
void rows_int(float* out, const B* W, std::size_t stride, const q8_block* xq, int r0, int r1, int cols) {
#if CS_X86
  if (active_isa() == isa::avx512vnni) {
    if constexpr (std::is_same_v<B, q8_block>) return q8_q8_vnni(out, W, stride, xq, r0, r1, cols);
    else return q4_q8_vnni(out, W, stride, xq, r0, r1, cols);
  }
#endif
  switch (simd_level()) {
#if CS_X86
    case isa::avx512: return quant_q8_avx512(out, W, stride, xq, r0, r1, cols);
    case isa::avx2: return quant_q8_avx2(out, W, stride, xq, r0, r1, cols);
#endif
    default: return quant_q8_portable(out, W, stride, xq, r0, r1, cols);
  }
}

// Rows of `stride` bytes (typed slot: a column slice of a GGUF tensor).
template <class B>
void quant_matvec_strided(float* out, const B* W, std::size_t stride, const float* x, int rows,
                          int cols, bool integer) {
  if (integer) {
    auto& xq = xq_scratch(cols);
    quantize_activations_q8(x, xq.data(), cols);
    const q8_block* xqp = xq.data();
    auto k = [&](int b, int e) { rows_int(out, W, stride, xqp, b, e, cols); };
    split_rows(rows, stride, k);
    return;
  }
  const float* xr = exact_x<B>(x, cols, exact_x_scratch());
  auto k = [&](int b, int e) { rows_exact(out, W, stride, xr, b, e, cols); };
  split_rows(rows, stride, k);
}

template <class B>
void quant_matvec(float* out, const B* W, const float* x, int rows, int cols) {
  const std::size_t row_bytes = static_cast<std::size_t>(q8_blocks_per_row(cols)) * sizeof(B);
  if (use_integer_path()) {
    auto& xq = xq_scratch(cols);
    quantize_activations_q8(x, xq.data(), cols);
    const q8_block* xqp = xq.data();
    auto k = [&](int b, int e) {
      if constexpr (std::is_same_v<B, q8_block>) matvec_q8_q8_rows(out, W, xqp, b, e, cols);
      else matvec_q4_q8_rows(out, W, xqp, b, e, cols);
    };
    split_rows(rows, row_bytes, k);
    return;
  }
  const float* xr = exact_x<B>(x, cols, exact_x_scratch());
  auto k = [&](int b, int e) { rows_exact(out, W, row_bytes, xr, b, e, cols); };
  split_rows(rows, row_bytes, k);
}

// Rows of a type without a kernel of its own here (f16, bf16, K-quants):
// the reference loops. One function for matvec_typed and matmul_typed.
void typed_rows(float* out, const uint8_t* W, dtype t, std::size_t stride, const float* x, int rows,
                int cols, matmul_mode mode) {
#if CS_X86
  const isa lv = simd_level();
  if ((lv == isa::avx2 || lv == isa::avx512) && rows > 0) {
    const bool ggml = mode == matmul_mode::ggml;
    thread_local std::vector<float> xr;
    thread_local std::vector<block_q8_k> xk;
    switch (t) {
      case dtype::f16:
      case dtype::bf16: {
        const bool bf = t == dtype::bf16;
        const float* xp = x;
        if (ggml) {  // x rounded to the weight's 16-bit type first
          xr.resize(cols);
          for (int c = 0; c < cols; ++c)
            xr[c] = bf ? bf16_to_fp32(fp32_to_bf16(x[c])) : fp16_to_fp32(fp32_to_fp16(x[c]));
          xp = xr.data();
        }
        if (bf) half_avx2<true>(out, W, stride, xp, rows, cols);
        else half_avx2<false>(out, W, stride, xp, rows, cols);
        return;
      }
      case dtype::q4_k:
      case dtype::q6_k:
        if (ggml) {
          xk.resize(cols / qk_k);
          quantize_row_q8_k(x, xk.data(), cols);
          if (t == dtype::q4_k) q4k_ggml_avx2(out, W, stride, xk.data(), rows, cols);
          else q6k_ggml_avx2(out, W, stride, xk.data(), rows, cols);
        } else if (t == dtype::q4_k) {
          xr.assign(cols / 32, 0.0f);  // sums of x over each 32-element sub-block
          for (int i = 0; i < cols / 32; ++i)
            for (int l = 0; l < 32; ++l) xr[i] += x[32 * i + l];
          q4k_exact_avx2(out, W, stride, x, xr.data(), rows, cols);
        } else {
          q6k_exact_avx2(out, W, stride, x, rows, cols);
        }
        return;
      default: break;
    }
  }
#endif
  ref::matvec_typed(out, W, t, stride, x, rows, cols, mode);
}

bool native_supports(op o) {
  return o == op::matvec || o == op::matvec_q8 || o == op::matvec_q4 || o == op::attention ||
         o == op::matvec_typed;
}

}  // namespace

const char* to_string(isa i) {
  switch (i) {
    case isa::portable: return "portable";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
    case isa::avx512vnni: return "avx512vnni";
    case isa::neon: return "neon";
  }
  return "?";
}

isa best_isa() {
  static const isa b = detect();
  return b;
}
isa active_isa() { return active().load(std::memory_order_relaxed); }
bool set_isa(isa i) {
  if (!supported(i)) return false;
  active().store(i, std::memory_order_relaxed);
  return true;
}

const char* to_string(precision p) {
  switch (p) {
    case precision::exact: return "exact";
    case precision::ggml: return "ggml";
    case precision::fast: return "fast";
  }
  return "?";
}
bool parse_precision(const std::string& s, precision& out) {
  if (s == "exact") out = precision::exact;
  else if (s == "ggml") out = precision::ggml;
  else if (s == "fast") out = precision::fast;
  else return false;
  return true;
}
precision active_precision() { return g_precision.load(std::memory_order_relaxed); }
void set_precision(precision p) { g_precision.store(p, std::memory_order_relaxed); }

void matvec_f32_rows(float* out, const float* W, const float* x, int r0, int r1, int cols,
                     int ld) {
  switch (simd_level()) {
#if CS_X86
    case isa::avx512: return f32_avx512(out, W, x, r0, r1, cols, ld);
    case isa::avx2: return f32_avx2(out, W, x, r0, r1, cols, ld);
#endif
#if CS_NEON
    case isa::neon: return f32_neon(out, W, x, r0, r1, cols, ld);
#endif
    default: return f32_portable(out, W, x, r0, r1, cols, ld);
  }
}

void matvec_q8_rows(float* out, const q8_block* W, const float* x, int r0, int r1, int cols) {
  rows_exact(out, W, q8_blocks_per_row(cols) * sizeof(q8_block), exact_x<q8_block>(x, cols, exact_x_scratch()),
             r0, r1, cols);
}

void matvec_q4_rows(float* out, const q4_block* W, const float* x, int r0, int r1, int cols) {
  rows_exact(out, W, q8_blocks_per_row(cols) * sizeof(q4_block), exact_x<q4_block>(x, cols, exact_x_scratch()),
             r0, r1, cols);
}

void matvec_q8_q8_rows(float* out, const q8_block* W, const q8_block* xq, int r0, int r1,
                       int cols) {
  rows_int(out, W, q8_blocks_per_row(cols) * sizeof(q8_block), xq, r0, r1, cols);
}

void matvec_q4_q8_rows(float* out, const q4_block* W, const q8_block* xq, int r0, int r1,
                       int cols) {
  rows_int(out, W, q8_blocks_per_row(cols) * sizeof(q4_block), xq, r0, r1, cols);
}

void matvec_f32(float* out, const float* W, const float* x, int rows, int cols, int ld) {
  auto k = [&](int b, int e) { matvec_f32_rows(out, W, x, b, e, cols, ld); };
  split_rows(rows, static_cast<std::size_t>(cols) * sizeof(float), k);
}

void matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols) {
  quant_matvec(out, W, x, rows, cols);
}

void matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride, const float* x,
                  int rows, int cols, matmul_mode mode) {
  const bool integer = mode == matmul_mode::ggml;
  switch (t) {
    case dtype::f32:
      matvec_f32(out, static_cast<const float*>(W), x, rows, cols,
                 static_cast<int>(row_stride / sizeof(float)));
      return;
    case dtype::q8_0:
      quant_matvec_strided(out, static_cast<const q8_block*>(W), row_stride, x, rows, cols, integer);
      return;
    case dtype::q4_0:  // block_q4_0 and q4_block are the same 18-byte layout
      quant_matvec_strided(out, static_cast<const q4_block*>(W), row_stride, x, rows, cols, integer);
      return;
    default: {  // other types: typed_rows, rows split over the pool
      const uint8_t* base = static_cast<const uint8_t*>(W);
      auto k = [&](int b, int e) {
        typed_rows(out + b, base + static_cast<std::size_t>(b) * row_stride, t, row_stride, x, e - b,
                   cols, mode);
      };
      split_rows(rows, row_stride, k);
    }
  }
}

void attention(float* out, const float* q, const float* k_cache, const float* v_cache, float* att,
               int n_heads, int kv_mul, int head_size, int kv_stride, int pos) {
  dot_fn dot = dot_portable;
  axpy_fn axpy = axpy_portable;
  switch (simd_level()) {
#if CS_X86
    case isa::avx512: dot = dot_avx512; axpy = axpy_avx512; break;
    case isa::avx2: dot = dot_avx2; axpy = axpy_avx2; break;
#endif
    default: break;
  }
#if CS_X86
  const attention_heads_fn regs =
      simd_level() == isa::avx512 && head_size <= 128 ? attention_heads_avx512_for(head_size) : nullptr;
#endif
  auto k = [&](int b, int e) {
#if CS_X86
    if (regs) {
      regs(b, e, out, q, k_cache, v_cache, att, kv_mul, head_size, kv_stride, pos);
      return;
    }
#endif
    attention_heads(b, e, dot, axpy, out, q, k_cache, v_cache, att, kv_mul, head_size, kv_stride, pos);
  };
  pool* p = pool::current();
  // 2 x head_size x (pos+1) floats of K and V per head: split once that is
  // worth a hand-off (~64 KiB in all).
  const std::size_t work = static_cast<std::size_t>(n_heads) * head_size * (pos + 1) * 8;
  if (p && p->threads() > 1 && work >= 64 * 1024) p->parallel_for(n_heads, 1, k);
  else k(0, n_heads);
}

void matvec_q4(float* out, const q4_block* W, const float* x, int rows, int cols) {
  quant_matvec(out, W, x, rows, cols);
}

// ---------------------------------------------------------------------------
// Batched products (prefill). Rows are split over the pool as for matvec;
// within a thread's rows, a tile of about 16 KiB of weights stays in L1 while
// every input vector passes over it, so each weight row comes from memory
// once per batch. Every (row, vector) result is the matvec kernel's, bit for
// bit: the AVX2/AVX-512 kernels run the same steps per vector (the *_mx
// kernels above), every other path calls the matvec row kernel itself.

namespace {

int tile_rows(std::size_t row_bytes) {
  return static_cast<int>(std::max<std::size_t>(1, 16384 / std::max<std::size_t>(1, row_bytes)));
}

// Tiles of [r0, r1), each times every vector: rows_fn(out_j, x_j, t0, t1)
// writes out_j[r] for r in [t0, t1).
template <class RowsFn>
void tiled(float* out, int ldo, const float* X, int ldx, int n, int r0, int r1,
           std::size_t row_bytes, RowsFn&& rows_fn) {
  const int T = tile_rows(row_bytes);
  for (int t0 = r0; t0 < r1; t0 += T) {
    const int t1 = std::min(r1, t0 + T);
    for (int j = 0; j < n; ++j)
      rows_fn(out + static_cast<std::size_t>(j) * ldo, X + static_cast<std::size_t>(j) * ldx, t0, t1);
  }
}

// Tiles of [r0, r1) with NX vectors per weight-row pass: k.template
// run<NX>(r, xs, res) computes res[i] = row r times xs[i].
template <int NX, class K>
void tiled_mx(const K& k, float* out, int ldo, const float* X, int ldx, int n, int r0, int r1,
              std::size_t row_bytes) {
  const int T = tile_rows(row_bytes);
  for (int t0 = r0; t0 < r1; t0 += T) {
    const int t1 = std::min(r1, t0 + T);
    int j = 0;
    for (; j + NX <= n; j += NX) {
      const float* xs[NX];
      for (int i = 0; i < NX; ++i) xs[i] = X + static_cast<std::size_t>(j + i) * ldx;
      for (int r = t0; r < t1; ++r) {
        float res[NX];
        k.template run<NX>(r, xs, res);
        for (int i = 0; i < NX; ++i) out[static_cast<std::size_t>(j + i) * ldo + r] = res[i];
      }
    }
    for (; j < n; ++j) {
      const float* xs[1] = {X + static_cast<std::size_t>(j) * ldx};
      for (int r = t0; r < t1; ++r) {
        float res[1];
        k.template run<1>(r, xs, res);
        out[static_cast<std::size_t>(j) * ldo + r] = res[0];
      }
    }
  }
}

#if CS_X86
struct f32_avx2_k {
  const float* W;
  int ld, cols;
  template <int NX>
  void run(int r, const float* const* xs, float* res) const {
    f32_avx2_mx<NX>(W + static_cast<std::size_t>(r) * ld, xs, res, cols);
  }
};
struct f32_avx512_k {
  const float* W;
  int ld, cols;
  template <int NX>
  void run(int r, const float* const* xs, float* res) const {
    f32_avx512_mx<NX>(W + static_cast<std::size_t>(r) * ld, xs, res, cols);
  }
};
template <class B>
struct quant_avx2_k {
  const B* W;
  std::size_t stride;
  int cols;
  template <int NX>
  void run(int r, const float* const* xs, float* res) const {
    quant_avx2_mx<B, NX>(reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride), xs,
                         res, cols);
  }
};
struct q4_avx512_k {
  const q4_block* W;
  std::size_t stride;
  int cols;
  template <int NX>
  void run(int r, const float* const* xs, float* res) const {
    const q4_block* rows[1] = {
        reinterpret_cast<const q4_block*>(reinterpret_cast<const char*>(W) + r * stride)};
    q4_avx512_rows<1, NX, false>(rows, xs, res, cols, 0);
  }
};
template <class B>
struct quant_avx512_k {
  const B* W;
  std::size_t stride;
  int cols;
  template <int NX>
  void run(int r, const float* const* xs, float* res) const {
    quant_avx512_mx<B, NX>(reinterpret_cast<const B*>(reinterpret_cast<const char*>(W) + r * stride),
                           xs, res, cols);
  }
};
#endif

template <class B>
void quant_matmul(float* out, int ldo, const B* W, std::size_t stride, const float* X, int ldx,
                  int n, int rows, int cols, bool integer) {
  if (integer) {  // each vector quantized once, then the matvec's integer rows
    const int nb = q8_blocks_per_row(cols);
    std::vector<q8_block> xq(static_cast<std::size_t>(n) * nb);
    for (int j = 0; j < n; ++j)
      quantize_activations_q8(X + static_cast<std::size_t>(j) * ldx, &xq[static_cast<std::size_t>(j) * nb],
                              cols);
    auto k = [&](int b, int e) {
      const int T = tile_rows(stride);
      for (int t0 = b; t0 < e; t0 += T)
        for (int j = 0; j < n; ++j)
          rows_int(out + static_cast<std::size_t>(j) * ldo, W, stride, &xq[static_cast<std::size_t>(j) * nb],
                   t0, std::min(e, t0 + T), cols);
    };
    split_rows(rows, stride, k);
    return;
  }
#if CS_X86
  if constexpr (std::is_same_v<B, q4_block>) {
    if (simd_level() == isa::avx512) {  // every vector in q4 order first (q4_order_x)
      const int ldp = (cols + 15) / 16 * 16;  // each x' 64-byte aligned
      std::vector<float> buf;
      float* xp = aligned64(buf, static_cast<std::size_t>(n) * ldp);
      for (int j = 0; j < n; ++j)
        q4_order_x(X + static_cast<std::size_t>(j) * ldx, xp + static_cast<std::size_t>(j) * ldp, cols);
      auto k = [&](int b, int e) { tiled_mx<4>(q4_avx512_k{W, stride, cols}, out, ldo, xp, ldp, n, b, e, stride); };
      split_rows(rows, stride, k);
      return;
    }
  }
#endif
  auto k = [&](int b, int e) {
    switch (simd_level()) {
#if CS_X86
      case isa::avx512:
        return tiled_mx<4>(quant_avx512_k<B>{W, stride, cols}, out, ldo, X, ldx, n, b, e, stride);
      case isa::avx2:
        return tiled_mx<3>(quant_avx2_k<B>{W, stride, cols}, out, ldo, X, ldx, n, b, e, stride);
#endif
      default:
        return tiled(out, ldo, X, ldx, n, b, e, stride, [&](float* o, const float* x, int t0, int t1) {
          rows_exact(o, W, stride, x, t0, t1, cols);
        });
    }
  };
  split_rows(rows, stride, k);
}

}  // namespace

void matmul_f32(float* out, int ldo, const float* W, const float* X, int ldx, int n, int rows,
                int cols, int ld) {
  const std::size_t row_bytes = static_cast<std::size_t>(cols) * sizeof(float);
  auto k = [&](int b, int e) {
    switch (simd_level()) {
#if CS_X86
      case isa::avx512:
        return tiled_mx<4>(f32_avx512_k{W, ld, cols}, out, ldo, X, ldx, n, b, e, row_bytes);
      case isa::avx2:
        return tiled_mx<3>(f32_avx2_k{W, ld, cols}, out, ldo, X, ldx, n, b, e, row_bytes);
#endif
      default:
        return tiled(out, ldo, X, ldx, n, b, e, row_bytes, [&](float* o, const float* x, int t0, int t1) {
          matvec_f32_rows(o, W, x, t0, t1, cols, ld);
        });
    }
  };
  split_rows(rows, row_bytes, k);
}

void matmul_q8(float* out, int ldo, const q8_block* W, const float* X, int ldx, int n, int rows,
               int cols) {
  quant_matmul(out, ldo, W, q8_blocks_per_row(cols) * sizeof(q8_block), X, ldx, n, rows, cols,
               use_integer_path());
}

void matmul_q4(float* out, int ldo, const q4_block* W, const float* X, int ldx, int n, int rows,
               int cols) {
  quant_matmul(out, ldo, W, q8_blocks_per_row(cols) * sizeof(q4_block), X, ldx, n, rows, cols,
               use_integer_path());
}

void matmul_typed(float* out, int ldo, const void* W, dtype t, std::size_t row_stride,
                  const float* X, int ldx, int n, int rows, int cols, matmul_mode mode) {
  const bool integer = mode == matmul_mode::ggml;
  switch (t) {
    case dtype::f32:
      matmul_f32(out, ldo, static_cast<const float*>(W), X, ldx, n, rows, cols,
                 static_cast<int>(row_stride / sizeof(float)));
      return;
    case dtype::q8_0:
      quant_matmul(out, ldo, static_cast<const q8_block*>(W), row_stride, X, ldx, n, rows, cols, integer);
      return;
    case dtype::q4_0:
      quant_matmul(out, ldo, static_cast<const q4_block*>(W), row_stride, X, ldx, n, rows, cols, integer);
      return;
    default: {  // the matvec's per-type path (matvec_typed above), tile by tile
      const uint8_t* base = static_cast<const uint8_t*>(W);
      auto k = [&](int b, int e) {
        tiled(out, ldo, X, ldx, n, b, e, row_stride, [&](float* o, const float* x, int t0, int t1) {
          typed_rows(o + t0, base + static_cast<std::size_t>(t0) * row_stride, t, row_stride, x, t1 - t0,
                     cols, mode);
        });
      };
      split_rows(rows, row_stride, k);
    }
  }
}

}  // namespace native

const backend& native_backend() {
  static const backend b{"native",       native::matvec_f32, native::matvec_q8,
                         ref::rmsnorm,   ref::rope,          ref::softmax,
                         native::attention, ref::swiglu,     native::native_supports,
                         native::matvec_typed, native::matvec_q4,
                         native::matmul_f32, native::matmul_q8,
                         native::matmul_q4,  native::matmul_typed};
  return b;
}

}  // namespace cellshard::kernels
