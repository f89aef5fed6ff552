// kernels/native.hpp: the `native` backend (issue #18): matrix-vector products
// written for this CPU's vector unit, chosen at run time.
//
// The project is compiled without -march (CMakeLists.txt), so the vector code
// lives in functions with GCC/Clang target attributes and is picked once at
// start-up from __builtin_cpu_supports: AVX-512 (F+BW+VL, with F16C), AVX2+FMA
// (with F16C), NEON on aarch64, else portable C++. Every level computes the
// same products; they differ only in the order of the float additions.
//
// Matvec = one dot product per row, streaming the weights once (memory-bound
// at decode). Rows are split over the calling thread's kernels::pool
// (kernels/pool.hpp) when one is installed; a row is computed identically in
// whatever chunk it falls, so results do not depend on the thread count.
//
// Precision (docs/kernels.md, "native"):
// - exact (default): f32 activations; for quantized weights each block's
//   int8 weights are converted to float and multiplied with x in f32, the
//   block sum scaled by the block's scale. A fixed summation order per level:
//   identical run to run and for every thread count.
// - ggml: x is quantized once per matvec into 8-bit blocks of 32 as ggml's
//   CPU backend does (quantize_activations_q8), then integer dot products per
//   block scaled by d_w * d_x (ggml's vec_dot_q8_0_q8_0 / q4_0_q8_0). Also
//   independent of the thread count. f32 weights are the same as exact.
// - fast: whatever is fastest here, documented in docs/kernels.md (today the
//   same as ggml for quantized weights, exact for f32).
//
// Attention uses vector dot products (scores) and multiply-adds (values),
// heads split over the pool. rmsnorm, rope, softmax and swiglu delegate to
// the reference loops (O(dim) per token).
//
// Thread safety: every function is re-entrant. set_isa()/set_precision() are
// process-wide settings for tests and benchmarks: set them before kernels run.
#pragma once

#include "kernels/backend.hpp"

#include <cstdint>
#include <string>

namespace cellshard::kernels {

const backend& native_backend();

namespace native {

/// avx512vnni: the AVX-512 level plus integer q8_0/q4_0 kernels for ggml
/// precision (AVX512-VNNI vpdpbusd).
enum class isa { portable, avx2, avx512, avx512vnni, neon };
const char* to_string(isa i);
/// Every level, in order (for tests: set_isa() says which this CPU runs).
inline constexpr isa all_isas[] = {isa::portable, isa::avx2, isa::avx512, isa::avx512vnni, isa::neon};
/// The best level this CPU and build support.
isa best_isa();
/// The level in use (best_isa() unless set_isa() chose another).
isa active_isa();
/// Uses level `i` from now on; false (and no change) when the CPU or build
/// lacks it. For tests and benchmarks; call while no kernel runs.
bool set_isa(isa i);

enum class precision { exact, ggml, fast };
const char* to_string(precision p);
/// "exact", "ggml" or "fast"; false when unknown.
bool parse_precision(const std::string& s, precision& out);
precision active_precision();
/// Process-wide precision of the quantized matvecs; call while no kernel runs.
void set_precision(precision p);

/// x quantized as ggml's CPU backend quantizes activations for q8_0/q4_0
/// dot products (its AVX2 quantize_row_q8_0): per block of 32, d = amax/127
/// stored as f16, q = round-half-even(x * 127/amax); the last block is
/// zero-padded. `out` holds q8_blocks_per_row(cols) blocks.
void quantize_activations_q8(const float* x, q8_block* out, int cols);

// Row-range kernels: out[r] for r in [r0, r1) (out points at row 0), on the
// active level, on the calling thread. Shapes as backend::matvec.
void matvec_f32_rows(float* out, const float* W, const float* x, int r0, int r1, int cols,
                     int ld);
/// exact precision; W as backend::matvec_q8.
void matvec_q8_rows(float* out, const q8_block* W, const float* x, int r0, int r1, int cols);
/// Same with q4_0 weights: rows of q8_blocks_per_row(cols) q4 blocks. At
/// the avx512 levels each call first copies x into the kernel's column
/// order (cols floats, a thread-local buffer; docs/kernels.md "q4 order"):
/// matvec_q4 does that once per matrix, so prefer it for whole matrices.
void matvec_q4_rows(float* out, const q4_block* W, const float* x, int r0, int r1, int cols);
/// ggml precision: xq = x quantized by quantize_activations_q8.
void matvec_q8_q8_rows(float* out, const q8_block* W, const q8_block* xq, int r0, int r1,
                       int cols);
void matvec_q4_q8_rows(float* out, const q4_block* W, const q8_block* xq, int r0, int r1,
                       int cols);

/// Whole-matrix products on the calling thread's pool (if any), in the active
/// precision. These are what the backend slots call.
void matvec_f32(float* out, const float* W, const float* x, int rows, int cols, int ld);
void matvec_q8(float* out, const q8_block* W, const float* x, int rows, int cols);
void matvec_q4(float* out, const q4_block* W, const float* x, int rows, int cols);
/// backend::matvec_typed: f32, q8_0 and q4_0 with the kernels above (ggml
/// mode = ggml precision), other types with ref::matvec_typed; rows split
/// over the pool either way.
void matvec_typed(float* out, const void* W, dtype t, std::size_t row_stride, const float* x,
                  int rows, int cols, matmul_mode mode);
/// The batched slots (backend::matmul*): every (row, vector) result is the
/// matvec's above bit for bit, on every level and precision; AVX2 and
/// AVX-512 pass 3 resp. 4 vectors over each weight row in registers, the
/// other paths call the matvec row kernels tile by tile (~16 KiB of weights
/// per tile); rows split over the pool as matvec.
void matmul_f32(float* out, int ldo, const float* W, const float* X, int ldx, int n, int rows,
                int cols, int ld);
void matmul_q8(float* out, int ldo, const q8_block* W, const float* X, int ldx, int n, int rows,
               int cols);
void matmul_q4(float* out, int ldo, const q4_block* W, const float* X, int ldx, int n, int rows,
               int cols);
void matmul_typed(float* out, int ldo, const void* W, dtype t, std::size_t row_stride,
                  const float* X, int ldx, int n, int rows, int cols, matmul_mode mode);
/// backend::attention with vector dot products and updates, heads split
/// over the pool; softmax is reference's.
void attention(float* out, const float* q, const float* k_cache, const float* v_cache, float* att,
               int n_heads, int kv_mul, int head_size, int kv_stride, int pos);

}  // namespace native
}  // namespace cellshard::kernels
