// kernels/backend.hpp: the compute kernels of a transformer block as a table of
// functions, one table per backend (llama.cpp's backend idea; STYLE.md item 1).
//
// Backends: "reference" (plain loops in llama2.c run.c's order: the oracle),
// "blas" (OpenBLAS sgemv for matvec, reference loops elsewhere), "spe"
// (local-store/DMA discipline, kernels/spe.hpp) and "spu-host" (the same SPU
// program with the SPU's arithmetic emulated: slower, for conformance). Callers never #ifdef on a
// backend; they look one up with find_backend() and ask supports().
//
// Conventions for every kernel:
// - All pointers are caller-owned; kernels allocate nothing the caller sees.
// - Matrices are row-major. A weight matrix W of shape [rows x cols] maps an
//   input x[cols] to out[rows]; `ld` is the distance in floats between rows
//   (ld >= cols), so a column slice of a bigger matrix needs no copy.
// - out never aliases an input unless the kernel says so.
// - Thread safety: every function is re-entrant; a backend holds no mutable
//   global state other than its statistics counters (atomics).
// - Errors: the kernels assume valid shapes (checked by the model loader and
//   the placement); they never exit or abort.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::kernels {

/// One block of ggml's Q8_0 layout: 32 int8 weights sharing one f16 scale;
/// weight = d * qs[i]. 34 bytes, no padding (ggml-common.h block_q8_0).
struct q8_block {
  uint16_t d;      // IEEE 754 binary16 scale
  int8_t qs[32];   // quantized weights
};
static_assert(sizeof(q8_block) == 34, "q8_block must be ggml's 34-byte layout");
constexpr int q8_block_size = 32;

/// Number of q8 blocks per row of `cols` weights (last block zero-padded).
constexpr int q8_blocks_per_row(int cols) {
  return (cols + q8_block_size - 1) / q8_block_size;
}

enum class dtype : int;  // weight element types, kernels/types.hpp

/// How a typed matvec rounds (the `--matmul` flag, docs/formats.md):
/// - exact: each weight row is dequantized to f32 and multiplied with the f32
///   activations, summed in column order (for f32 weights: matvec's order).
/// - ggml: the activations are rounded first as ggml's CPU backend does for
///   that weight type (fp16 for f16, bf16 for bf16, q8_0 blocks for q8_0 and
///   q4_0, q8_K blocks for q4_K and q6_K; nothing for f32), and quantized
///   products are integer dot products within a block scaled by the two
///   block scales, as ggml's vec_dot functions; llama.cpp's logits can then
///   be matched.
enum class matmul_mode : int { exact, ggml, count };
const char* to_string(matmul_mode m);

/// ggml's Q4_0 block: 32 weights in 4 bits sharing one f16 scale, 18 bytes.
/// Weight j (0..15) is d * ((qs[j] & 0xF) - 8); weight j+16 is
/// d * ((qs[j] >> 4) - 8) (ggml-common.h block_q4_0, dequantize_row_q4_0).
struct q4_block {
  uint16_t d;
  uint8_t qs[16];
};
static_assert(sizeof(q4_block) == 18, "q4_block must be ggml's 18-byte layout");

/// Quantizes one row of `cols` floats into q8_blocks_per_row(cols) q4 blocks
/// (ggml quantize_row_q4_0_ref: the value of largest magnitude m gives
/// d = m / -8, q = min(15, trunc(x/d + 8.5)); last block zero-padded).
void quantize_row_q4(const float* x, q4_block* out, int cols);
/// Expands one q4 row back to `cols` floats.
void dequantize_row_q4(const q4_block* in, float* out, int cols);

/// The operations a backend may provide. `count` is the number of operations.
enum class op : int {
  matvec,     // f32 matrix-vector product
  matvec_q8,  // q8_0 matrix-vector product
  rmsnorm,
  rope,
  softmax,
  attention,
  swiglu,
  matvec_typed,  // matrix-vector product with weights of any dtype

  matvec_q4,  // q4_0 matrix-vector product
  count
};
const char* to_string(op o);

struct backend {
  const char* name;

  /// out[r] = sum_c W[r*ld + c] * x[c] for r in [0,rows). Shapes: W [rows x ld]
  /// (first `cols` columns used), x [cols], out [rows].
  void (*matvec)(float* out, const float* W, const float* x, int rows, int cols,
                 int ld);

  /// Same product with q8_0 weights: W holds rows * q8_blocks_per_row(cols)
  /// blocks, row-major, each row zero-padded to whole blocks. x [cols].
  void (*matvec_q8)(float* out, const q8_block* W, const float* x, int rows,
                    int cols);

  /// out[i] = weight[i] * x[i] / sqrt(mean(x^2) + 1e-5). out may alias x.
  /// Shapes: x, weight, out [n]. (llama2.c run.c rmsnorm.)
  void (*rmsnorm)(float* out, const float* x, const float* weight, int n);

  /// Rotary position embedding in llama2.c's pairwise convention, in place:
  /// for each pair (v[i], v[i+1]), i even, angle = pos / 10000^((i mod
  /// head_size)/head_size). q has nq floats (whole heads), k has nk floats.
  /// `head_offset` is the index of q's first element within the full
  /// dim-vector modulo head_size (0 for whole heads; kept for slices).
  void (*rope)(float* q, int nq, float* k, int nk, int pos, int head_size);

  /// In-place softmax over x[n] (max-subtracted, run.c order).
  void (*softmax)(float* x, int n);

  /// Grouped-query attention for one query position `pos` over a KV cache.
  /// q: [n_heads * head_size]; k_cache, v_cache: [(pos+1) rows x kv_stride],
  /// row t holding the keys/values of position t for the cache's kv heads,
  /// kv head j at offset j*head_size; query head h reads kv head h / kv_mul.
  /// att: scratch of n_heads * (pos+1) floats; out: [n_heads * head_size].
  void (*attention)(float* out, const float* q, const float* k_cache,
                    const float* v_cache, float* att, int n_heads, int kv_mul,
                    int head_size, int kv_stride, int pos);

  /// hb[i] = silu(hb[i]) * hb2[i], silu(v) = v / (1 + exp(-v)). Shapes [n].
  void (*swiglu)(float* hb, const float* hb2, int n);

  /// Whether this backend implements `o` itself (false: the slot delegates to
  /// the reference implementation).
  bool (*supports)(op o);

  /// out[r] = sum_c W_r[c] * x[c] for r in [0,rows) with weights of type `t`
  /// (kernels/types.hpp) kept in that type: row r starts at byte
  /// r * row_stride of W and holds `cols` elements (cols a multiple of the
  /// type's block size; row_stride >= row_bytes(t, cols), so a column slice
  /// starting on a block boundary needs no copy). x [cols], out [rows].
  /// `mode` says how the product rounds (matmul_mode above). Not safe to
  /// alias out with x.
  void (*matvec_typed)(float* out, const void* W, dtype t, std::size_t row_stride,
                       const float* x, int rows, int cols, matmul_mode mode);

  /// Same product as matvec_q8 with q4_0 weights (q4_block, rows of
  /// q8_blocks_per_row(cols) blocks). May be null: callers then use
  /// ref::matvec_q4 (model::matvec does).
  void (*matvec_q4)(float* out, const q4_block* W, const float* x, int rows, int cols) = nullptr;

  // Batched products (prefill, issue #18): the matvec above over n input
  // vectors, X row-major [n x ldx] (vector j at X + j*ldx, ldx >= cols), out
  // [n x ldo] (ldo >= rows): out[j*ldo + r] is bit for bit what the matching
  // matvec slot returns in out[r] for x = X + j*ldx (the same summation order
  // per row), so a prompt prefilled in chunks gives the ids of one position
  // at a time. What they save: each weight row is read from memory once per
  // batch instead of once per vector. Each may be null: model::matmul then
  // calls the matvec slot n times.
  void (*matmul)(float* out, int ldo, const float* W, const float* X, int ldx, int n, int rows,
                 int cols, int ld) = nullptr;
  void (*matmul_q8)(float* out, int ldo, const q8_block* W, const float* X, int ldx, int n,
                    int rows, int cols) = nullptr;
  void (*matmul_q4)(float* out, int ldo, const q4_block* W, const float* X, int ldx, int n,
                    int rows, int cols) = nullptr;
  void (*matmul_typed)(float* out, int ldo, const void* W, dtype t, std::size_t row_stride,
                       const float* X, int ldx, int n, int rows, int cols,
                       matmul_mode mode) = nullptr;
};

/// The backend named `name` ("reference", "blas", "spe", ...) or nullptr.
const backend* find_backend(const std::string& name);
/// Names of every registered backend, in registration order.
std::vector<std::string> backend_names();

/// What to run when a node is asked for backend `name` (a daemon's shard
/// spawn, `run --kernels`). `be` is find_backend(name) when this build has
/// it. A backend that exists only in some builds ("blas" needs OpenBLAS,
/// which cross builds leave out: CELLSHARD_BLAS=OFF; "native") is replaced
/// by the best conforming backend this build has ("native" if present, else
/// "reference"; both give the reference's ids), and `note` says so, naming
/// both. An unknown name gives be == nullptr and a note listing the names.
struct backend_choice {
  const backend* be = nullptr;
  std::string note;  // empty when `be` is the backend asked for
};
backend_choice choose_backend(const std::string& name);

const backend& reference_backend();
/// Only in builds with OpenBLAS (CMake option CELLSHARD_BLAS, the default).
const backend& blas_backend();

/// Registers a backend table (used by backends defined in other translation
/// units, e.g. spe). Not thread-safe: call before any lookup, at start-up.
void register_backend(const backend* b);

/// Conversions between f32 and IEEE binary16 (round to nearest even), as
/// ggml's GGML_FP32_TO_FP16 / GGML_FP16_TO_FP32.
uint16_t fp32_to_fp16(float f);
float fp16_to_fp32(uint16_t h);

/// Quantizes one row of `cols` floats into q8_blocks_per_row(cols) blocks
/// (ggml quantize_row_q8_0_ref: d = max|x| / 127, q = round(x / d)).
void quantize_row_q8(const float* x, q8_block* out, int cols);
/// Expands one q8 row back to `cols` floats.
void dequantize_row_q8(const q8_block* in, float* out, int cols);
/// Rounds `n` floats in place onto the q8_0 grid: quantize_row_q8 over
/// blocks of 32 consecutive floats (the last zero-padded), then
/// dequantize_row_q8. Idempotent for finite input whose block maxima stay
/// below 127 x 65504 (the scale's binary16 range): a second rounding
/// returns the same bits, so a receiver dequantizing the blocks a sender
/// makes of rounded values sees exactly the sender's values (`--sync q8_0`,
/// issue #19). Thread safe (no state).
void round_to_q8(float* x, size_t n);

/// Caps the threads OpenBLAS uses (openblas_set_num_threads); 0 leaves it.
/// Does nothing in a build without OpenBLAS.
void set_blas_threads(int n);

}  // namespace cellshard::kernels
