/* kernels/spu/host/spu_intrinsics.h: host emulation of the Cell SDK's
 * spu_intrinsics.h, providing exactly the forms the SPU kernels use (the
 * single-precision ones). `vec_float4` and friends are GCC vector types of
 * 16 bytes, the same model as the SPU's 128-bit registers.
 *
 * spu_madd: on an SPU a fused multiply-add rounded toward zero. With
 * SPU_HOST_FUSED_MADD defined to 1 it is computed exactly in double and
 * rounded once in the current rounding mode (the spu-host backend runs its
 * jobs with the x86 MXCSR set to round-toward-zero and flush-to-zero, so this
 * reproduces the SPU's result; rounding twice toward zero equals rounding
 * once). Otherwise it is a*b + c with the host's two roundings, as the `spe`
 * backend computes. Valid as C and as C++. */
#ifndef CELLSHARD_SPU_HOST_INTRINSICS_H
#define CELLSHARD_SPU_HOST_INTRINSICS_H

#ifndef SPU_HOST_FUSED_MADD
#define SPU_HOST_FUSED_MADD 0
#endif

typedef float vec_float4 __attribute__((vector_size(16)));
typedef int vec_int4 __attribute__((vector_size(16)));
typedef unsigned int vec_uint4 __attribute__((vector_size(16)));
typedef unsigned char vec_uchar16 __attribute__((vector_size(16)));

static inline vec_float4 spu_splats(float x) {
  vec_float4 v = {x, x, x, x};
  return v;
}
static inline vec_float4 spu_add(vec_float4 a, vec_float4 b) { return a + b; }
static inline vec_float4 spu_sub(vec_float4 a, vec_float4 b) { return a - b; }
static inline vec_float4 spu_mul(vec_float4 a, vec_float4 b) { return a * b; }
static inline vec_float4 spu_madd(vec_float4 a, vec_float4 b, vec_float4 c) {
#if SPU_HOST_FUSED_MADD
  vec_float4 r;
  int i;
  for (i = 0; i < 4; ++i) r[i] = (float)((double)a[i] * (double)b[i] + (double)c[i]);
  return r;
#else
  return a * b + c;
#endif
}
static inline float spu_extract(vec_float4 v, int i) { return v[i & 3]; }
/* int -> float, divided by 2^scale (scale is an immediate 0..127 on an SPU). */
static inline vec_float4 spu_convtf(vec_int4 v, unsigned int scale) {
  vec_float4 r;
  int i;
  for (i = 0; i < 4; ++i) r[i] = (float)v[i];
  if (scale != 0) r = r * spu_splats(1.0f / (float)(1u << scale));
  return r;
}

/* shufb: byte i of the result is byte (p[i] & 31) of the 32 bytes a||b, or
 * a constant for the special codes 10xxxxxx (0x00), 110xxxxx (0xFF) and
 * 111xxxxx (0x80) (SPU ISA, "Shuffle Bytes"). Byte i of a vector is the
 * i-th byte in memory order on an SPU and here alike; only reinterpreting
 * bytes as wider elements differs between the SPU (big-endian) and a
 * little-endian host, which the kernels avoid depending on. */
static inline vec_uchar16 spu_shuffle(vec_uchar16 a, vec_uchar16 b, vec_uchar16 p) {
  vec_uchar16 r;
  int i;
  for (i = 0; i < 16; ++i) {
    const unsigned c = p[i];
    if ((c & 0xc0u) == 0x80u)
      r[i] = 0x00;
    else if ((c & 0xe0u) == 0xc0u)
      r[i] = 0xff;
    else if ((c & 0xe0u) == 0xe0u)
      r[i] = 0x80;
    else
      r[i] = (c & 16u) ? b[c & 15u] : a[c & 15u];
  }
  return r;
}
/* Shift right algebraic of each word by -count (count is -31..0 here). */
static inline vec_int4 spu_rlmaska(vec_int4 a, int count) {
  vec_int4 r;
  int i;
  for (i = 0; i < 4; ++i) r[i] = a[i] >> (-count);
  return r;
}

#endif
