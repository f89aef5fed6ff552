// kernels/types.hpp: the weight element types cellshard computes with, in
// ggml's exact block layouts (ggml-common.h), so GGUF tensors are used in
// place, and the conversions between them and f32.
//
// A row of `cols` elements of type t occupies row_bytes(t, cols) bytes:
// cols / block_elems(t) blocks (cols must be a multiple of the block size;
// GGUF guarantees it for its tensors). Quantized blocks hold a scale (f16,
// or f32 for q8_K) and small integers; see each struct for the formula.
//
// Byte order: blocks are stored little-endian as in GGUF files; swap_rows()
// converts file data in place for a big-endian host.
//
// Thread safety: every function is re-entrant and allocates nothing.
#pragma once

#include "kernels/backend.hpp"

#include <cstddef>
#include <cstdint>

namespace cellshard::kernels {

/// Weight element types. `count` is the number of types.
enum class dtype : int { f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_1, q5_0, q5_1, q5_k, count };
/// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_K", "q6_K", "q4_1", "q5_0", "q5_1", "q5_K"
const char* to_string(dtype t);
/// The dtype of a ggml type id (GGUF tensor info), false when unsupported.
bool dtype_from_ggml(uint32_t ggml_type, dtype* out);
uint32_t ggml_type_of(dtype t);

constexpr int qk_k = 256;  // elements per K-quant super-block (ggml QK_K)

/// ggml block_q4_0: 32 weights, w = d * (nibble - 8); element j < 16 is the
/// low nibble of qs[j], element j + 16 its high nibble. 18 bytes.
struct block_q4_0 {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 must be ggml's 18-byte layout");

/// ggml block_q4_K: 256 weights in 8 sub-blocks of 32 with 6-bit scale and
/// min each (packed into `scales`, see get_scale_min_k4 in types.cpp);
/// w = d * sc * q - dmin * m, q a 4-bit value. 144 bytes.
struct block_q4_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(block_q4_k) == 144, "block_q4_K must be ggml's 144-byte layout");

/// ggml block_q6_K: 256 weights in 16 sub-blocks of 16 with an int8 scale;
/// q = (4 low bits from ql | 2 high bits from qh) - 32, w = d * scale * q. 210 bytes.
struct block_q6_k {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(block_q6_k) == 210, "block_q6_K must be ggml's 210-byte layout");

/// ggml block_q4_1: 32 weights, w = d * nibble + m (nibbles as block_q4_0). 20 bytes.
struct block_q4_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qs[16];
};
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 must be ggml's 20-byte layout");

/// ggml block_q5_0: 32 weights, w = d * (q - 16), q = nibble (as block_q4_0)
/// | bit j of qh << 4, qh the little-endian 32-bit word of the 4 bytes. 22 bytes.
struct block_q5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 must be ggml's 22-byte layout");

/// ggml block_q5_1: w = d * q + m, q as block_q5_0's (0..31). 24 bytes.
struct block_q5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 must be ggml's 24-byte layout");

/// ggml block_q5_K: block_q4_K's scales and mins, a fifth bit per weight in
/// qh (weight 64g + l of the low nibbles: bit 2g of qh[l]; of the high
/// nibbles: bit 2g+1); w = d * sc * q - dmin * m, q in 0..31. 176 bytes.
struct block_q5_k {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(block_q5_k) == 176, "block_q5_K must be ggml's 176-byte layout");

/// ggml block_q8_1: the activation blocks of Q4_1/Q5_1 dot products: x = d *
/// qs, s = d * sum(qs) (both binary16). 36 bytes.
struct block_q8_1 {
  uint16_t d;
  uint16_t s;
  int8_t qs[32];
};
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 must be ggml's 36-byte layout");

/// ggml block_q8_K: the activation blocks ggml's K-quant dot products use:
/// 256 values x = d * qs, d an f32, bsums[i] = sum of qs[16i .. 16i+15]. 292 bytes.
struct block_q8_k {
  float d;
  int8_t qs[256];
  int16_t bsums[16];
};
static_assert(sizeof(block_q8_k) == 292, "block_q8_K must be ggml's 292-byte layout");

/// Elements per block and bytes per block of each type.
int block_elems(dtype t);
int block_bytes(dtype t);
/// Bytes of one row of `cols` elements (cols a multiple of block_elems(t)).
inline std::size_t row_bytes(dtype t, int cols) {
  return static_cast<std::size_t>(cols / block_elems(t)) * block_bytes(t);
}

/// bfloat16: the top 16 bits of an f32; rounding to nearest even, NaN kept
/// quiet (ggml's GGML_FP32_TO_BF16).
uint16_t fp32_to_bf16(float f);
float bf16_to_fp32(uint16_t h);

/// out[cols] = the values of one row of type t.
void dequantize_row(dtype t, const void* row, float* out, int cols);

/// ggml quantize_row_q4_0_ref: per block of 32, the value of largest
/// magnitude `max` gives d = max / -8, q = min(15, (int)(x / d + 8.5)).
void quantize_row_q4_0(const float* x, block_q4_0* out, int cols);
/// ggml quantize_row_q8_K_ref: per block of 256, iscale = -127 / max (max the
/// value of largest magnitude), q = min(127, nearest_int(iscale * x)),
/// d = 1 / iscale, bsums over 16s. cols a multiple of 256.
void quantize_row_q8_k(const float* x, block_q8_k* out, int cols);
/// ggml quantize_row_q4_K_ref (kernels/quantize_k.cpp says how): per block
/// of 256, 8 weighted affine fits of 32 values, their scales and mins
/// quantized to 6 bits, the values to 4 bits against the rounded ones.
/// cols a multiple of 256.
void quantize_row_q4_k(const float* x, block_q4_k* out, int cols);
/// ggml quantize_row_q6_K_ref: per block of 256, 16 symmetric fits of 16
/// values (int8 scales against d = -max_scale / 128), values in -32..31.
/// cols a multiple of 256.
void quantize_row_q6_k(const float* x, block_q6_k* out, int cols);
/// Quantizes a row of f32 into type t with ggml's reference quantizer of
/// that type (f32 copies). cols must be a multiple of block_elems(t); false
/// for a type read but not written here (q4_1, q5_0, q5_1, q5_K).
bool quantize_row(dtype t, const float* x, void* out, int cols);

/// Converts `rows` rows of type t from the other byte order in place (every
/// multi-byte field of every block).
void swap_rows(dtype t, void* data, int rows, int cols);

}  // namespace cellshard::kernels
