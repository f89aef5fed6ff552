// model/quant.hpp: the q8_0 model file ("CSQ8", docs/formats.md): a llama2.c
// model whose matrices are stored in ggml's Q8_0 layout (kernels::q8_block:
// 32 int8 weights and one binary16 scale), written by `cellshard quantize`
// and loaded by model_file::open(), which maps it and views the blocks in
// place (the weights stay quantized in memory).
//
// Layout (little-endian; every array starts at a multiple of 64 bytes from
// the start of the file, the gaps are zero bytes):
//   header, 64 bytes: char[4] "CSQ8", u32 version (1), the seven int32 fields
//     of the llama2.c header (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
//     vocab_size, negative when the classifier is unshared, seq_len), u32
//     block size (32), u32 alignment (64), 20 zero bytes;
//   arrays in llama2.c run.c order, one per layer for per-layer weights:
//     token_embedding q8 [vocab x dim], rms_att f32 [dim] x L, wq q8
//     [dim x dim] x L, wk, wv q8 [kv_dim x dim] x L, wo q8 [dim x dim] x L,
//     rms_ffn f32 [dim] x L, w1 q8 [hidden x dim] x L, w2 q8 [dim x hidden]
//     x L, w3 q8 [hidden x dim] x L, rms_final f32 [dim], and wcls q8
//     [vocab x dim] only when unshared. A q8 array of [rows x cols] is rows
//     x q8_blocks_per_row(cols) blocks of 34 bytes, each row zero-padded to a
//     whole block. The RoPE tables of the f32 format are not stored (unused).
//   trailer, at the next multiple of 64: u64 XXH64 (seed 0) of every byte
//     before it.
// The blocks are what kernels::quantize_row_q8 gives for each f32 row, so a
// file's blocks equal the load-time quantization (`--weights q8_0`).
//
// Thread safety: the functions are re-entrant; nothing here holds state.
// Errors: values (result<T>) whose message names the file, the field and the
// expected and actual values.
#pragma once

#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace cellshard::model {

constexpr char q8_magic[4] = {'C', 'S', 'Q', '8'};
constexpr uint32_t q8_version = 1;
constexpr uint32_t q8_header_bytes = 64;
constexpr uint32_t q8_alignment = 64;  // of every array and of the trailer
constexpr uint32_t q8_trailer_bytes = 8;

/// One array of a q8_0 file, in file order.
struct q8_array {
  enum kind_t { embedding, rms_att, wq, wk, wv, wo, rms_ffn, w1, w2, w3, rms_final, classifier };
  kind_t kind;
  int layer;        // -1 for the whole-model arrays
  bool q8;          // q8 blocks (else f32)
  int rows, cols;   // f32 norms: rows = 1
  uint64_t offset;  // bytes from the start of the file (a multiple of 64)
  uint64_t bytes;   // without the padding that follows
};
const char* to_string(q8_array::kind_t k);

/// The arrays of a q8_0 file of config `c`, in file order.
std::vector<q8_array> q8_layout(const config& c);
/// Exact size in bytes of a q8_0 file of config `c` (header, arrays with
/// their padding, trailer).
uint64_t q8_file_bytes(const config& c);
/// Whether `p` [n bytes] starts with the magic "CSQ8". ("CSQ8" read as the
/// llama2.c dim field is 944,853,827, beyond the loader's 2^24 bound, so the
/// two formats cannot be confused.)
bool is_q8_image(const uint8_t* p, uint64_t n);

/// Quantizes an f32 model file into a q8_0 image held in memory. Errors if
/// `in` is already quantized.
result<std::vector<uint8_t>> quantize_to_bytes(const model_file& in);
/// Quantizes an f32 model file into the file `path`, streaming (memory: one
/// array at a time). Writes `path`.tmp and renames it, so `path` is either
/// absent, its old self or complete. Returns the bytes written.
result<uint64_t> quantize_to_file(const model_file& in, const std::string& path);

/// For tests of the big-endian load path: the image with every multi-byte
/// field in the opposite byte order (header words, f32 norms, block scales,
/// digest) and its digest recomputed over the swapped bytes, i.e. what a
/// big-endian writer would produce. Loading it with load_options::force_swap
/// exercises the conversion a big-endian host runs. `image` must be valid.
result<std::vector<uint8_t>> q8_byte_swapped(std::vector<uint8_t> image);

/// Fills a model_file from a mapped q8_0 image (called by model_file::init).
/// Validates the header fields, the exact size and the digest, byte-swaps in
/// place when the host order differs (the mapping is then writable), and
/// sets the q8 views.
class q8_reader {
public:
  static result<void> init(model_file& m, const std::string& name, load_options opts);
};

}  // namespace cellshard::model
