// model/checkpoint.hpp: llama2.c checkpoint files (format "version 0", fp32),
// as written by llama2.c's export.py legacy_export and read by run.c.
// Layout (docs/formats.md): seven int32 header fields (dim, hidden_dim,
// n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size < 0 means an
// unshared classifier), then f32 weights in run.c's order, then two unused
// RoPE tables of seq_len x head_size/2 floats, then the classifier if unshared.
//
// A model_file also opens the q8_0 format of model/quant.hpp (magic "CSQ8"):
// then the matrices are q8_0 blocks viewed in place (see quantized()).
//
// Ownership: a model_file owns its mapping (or buffer) and is immutable after
// open(); share it as std::shared_ptr<const model_file> between threads freely.
#pragma once

#include "kernels/backend.hpp"
#include "kernels/types.hpp"
#include "model/config.hpp"
#include "model/result.hpp"

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace cellshard::model {

/// A 64-bit digest as the project prints it everywhere: "0x" and 16 hex
/// digits (model and tokenizer digests, CSQ8 trailers, fingerprints, journals).
std::string format_digest(uint64_t v);

struct load_options {
  /// Treat the file as having the opposite byte order of the host (llama2.c
  /// files are little-endian; on a big-endian host such as the PS3's PPE they
  /// always need swapping). Used to test the swap path on little-endian hosts.
  bool force_swap = false;
  /// Context length (positions) to use instead of the file's (GGUF
  /// llama.context_length; 0 keeps the file's). `--ctx N`.
  int ctx = 0;
};

/// A weight matrix [rows x cols] kept in its file type (GGUF files): row r
/// starts at data + r * row_bytes. Points into the mapping, or into the
/// model_file's own converted copy on a byte-swapped file.
struct tensor_view {
  const uint8_t* data = nullptr;
  kernels::dtype type = kernels::dtype::f32;
  int rows = 0, cols = 0;
  std::size_t row_bytes = 0;
  uint64_t bytes() const { return static_cast<uint64_t>(rows) * row_bytes; }
};
/// One layer's matrices of a GGUF file (shapes as in layer_view).
struct typed_layer_view {
  tensor_view wq, wk, wv, wo, w1, w2, w3;
};

/// What one GGUF layer adds to the dense Llama layer (empty for a dense model
/// without biases): the mixture-of-experts FFN and the Q/K/V biases (qwen2,
/// qwen2moe).
/// Shapes (row-major, [out x in]): router [n_experts x dim]; for expert e,
/// w1[e] and w3[e] [hidden x dim], w2[e] [dim x hidden] (hidden = one expert's
/// width, config::hidden_dim), each a slice of the file's 3-D tensor
/// (ffn_gate_exps / ffn_up_exps / ffn_down_exps, expert e = the e-th matrix);
/// the shared expert sw1, sw3 [shared_hidden x dim], sw2 [dim x shared_hidden]
/// (rows 0 when the model has none) with its gate vector shared_gate [dim];
/// biases bq [dim], bk and bv [kv_dim] (null when absent). Vectors are f32.
struct moe_layer_view {
  tensor_view router;
  std::vector<tensor_view> w1, w2, w3;
  tensor_view sw1, sw2, sw3;
  const float* shared_gate = nullptr;
  const float* bq = nullptr;
  const float* bk = nullptr;
  const float* bv = nullptr;
};

/// Views of one layer's weights, pointing into the model_file.
/// Shapes (row-major, [out x in]): rms_att [dim], wq [dim x dim],
/// wk [kv_dim x dim], wv [kv_dim x dim], wo [dim x dim], rms_ffn [dim],
/// w1 [hidden x dim], w2 [dim x hidden], w3 [hidden x dim].
struct layer_view {
  const float* rms_att;
  const float* wq;
  const float* wk;
  const float* wv;
  const float* wo;
  const float* rms_ffn;
  const float* w1;
  const float* w2;
  const float* w3;
};

/// A q8_0 matrix in a quantized model file: `rows` rows of
/// kernels::q8_blocks_per_row(cols) blocks each, a row's last block
/// zero-padded; points into the model_file.
struct q8_matrix {
  const kernels::q8_block* blocks = nullptr;
  int rows = 0, cols = 0;
};
/// One layer's matrices in a quantized file (shapes as in layer_view).
struct q8_layer_view {
  q8_matrix wq, wk, wv, wo, w1, w2, w3;
};

class q8_reader;  // model/quant.hpp
namespace gguf {
class file;
}

class model_file {
public:
  /// Maps and validates `path`. Errors name the file, the field and the
  /// expected and actual values (e.g. a truncated file, a corrupt header).
  static result<std::shared_ptr<const model_file>> open(const std::string& path,
                                                        load_options opts = {});
  /// Validates and adopts an in-memory image of a checkpoint (e.g. synth's).
  static result<std::shared_ptr<const model_file>> from_bytes(std::vector<uint8_t> bytes,
                                                              std::string name,
                                                              load_options opts = {});
  /// A sparse image (model/manifest.hpp open_slice): `size` bytes of
  /// anonymous memory, zero until written (only written pages become
  /// resident; the address space of the whole file is reserved, not its
  /// memory), filled by `fill` and then parsed as a file of that size.
  /// digest() of such a model is of the image, not of the original file.
  static result<std::shared_ptr<const model_file>> from_sparse(uint64_t size,
                                                               const std::function<void(uint8_t*)>& fill,
                                                               std::string name, load_options opts = {});
  ~model_file();
  model_file(const model_file&) = delete;
  model_file& operator=(const model_file&) = delete;

  const config& cfg() const { return cfg_; }
  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return size_; }
  /// The file's bytes as loaded (file_bytes() long): a file of the other byte
  /// order is converted in place (see swapped()); the loaders' pointers point
  /// into it.
  const uint8_t* image() const { return base_; }
  /// The file's own bytes as they are on disk (file_bytes() long), the same
  /// on every host: what weight manifests digest and front ends ship
  /// (model/manifest.hpp). image() unless the loader converted the bytes in
  /// place; then a second, read-only mapping of the file (open(): the page
  /// cache's pages, no copy) or a copy made before the conversion
  /// (from_bytes(): twice the memory of the image while the model lives).
  /// nullptr for a converted sparse image (from_sparse(), a slice on a host
  /// of the other byte order): a slice is not sliced again.
  const uint8_t* file_image() const { return in_place_ ? original_ : base_; }
  /// True when the loader converted the byte order, in place (image() then
  /// differs from the file): the whole image for llama2.c and CSQ8 files,
  /// each tensor the loader uses for GGUF files (no copy of the model).
  bool swapped() const { return swapped_; }

  const float* token_embedding() const { return emb_; }  // [vocab x dim]
  layer_view layer(int l) const;
  const float* rms_final() const { return rms_final_; }  // [dim]
  /// GGUF `rope_freqs.weight` (Llama 3.1 RoPE scaling): head_size/2 factors
  /// that divide each pair's RoPE angle (kernels::ref::rope_base); nullptr
  /// when the file has none (every llama2.c file).
  const float* rope_factors() const { return rope_factors_; }
  const float* classifier() const { return wcls_; }      // [vocab x dim]

  /// True for a q8_0 file (model/quant.hpp). Then token_embedding(),
  /// classifier() and layer()'s matrix pointers are null and the matrices are
  /// q8_embedding(), q8_classifier() (the embedding when shared) and
  /// q8_layer(); the norms (layer().rms_att/rms_ffn, rms_final()) are f32 in
  /// both kinds. The q8 accessors return empty views for an f32 file.
  bool quantized() const { return quantized_; }
  q8_matrix q8_embedding() const { return q8_emb_; }
  q8_matrix q8_classifier() const { return q8_cls_; }
  q8_layer_view q8_layer(int l) const { return quantized_ ? q8_layers_[l] : q8_layer_view{}; }

  /// The GGUF file behind this model, or nullptr for a llama2.c / CSQ8 file.
  /// For a GGUF model every matrix is available as a tensor_view in its type
  /// (typed_layer(), typed_embedding(), typed_classifier()); when every
  /// matrix is F32 the f32 accessors above work too. Norms are always f32.
  const gguf::file* gguf() const { return gguf_.get(); }
  bool typed() const { return !t_layers_.empty(); }
  /// True when some matrix of a GGUF model is not F32.
  bool has_non_f32() const { return non_f32_; }
  typed_layer_view typed_layer(int l) const { return t_layers_[l]; }
  tensor_view typed_embedding() const { return t_emb_; }
  tensor_view typed_classifier() const { return t_cls_; }
  /// Layer l's experts, shared expert and biases (GGUF; an empty view for a
  /// dense layer or another format). See moe_layer_view.
  const moe_layer_view& moe_layer(int l) const {
    static const moe_layer_view empty;
    return static_cast<size_t>(l) < m_layers_.size() ? m_layers_[l] : empty;
  }
  /// "llama2.c", "csq8" or "gguf".
  const char* format_name() const;
  /// The matmul mode `--matmul` defaults to: exact when every matrix is f32
  /// (llama2.c, F32 GGUF), ggml otherwise (docs/formats.md).
  kernels::matmul_mode default_matmul() const;

  /// XXH64 of the whole file (computed on first call; thread-safe).
  uint64_t digest() const;

  /// Largest file a header may describe: 2^max_checkpoint_log2 bytes (64 TiB;
  /// Llama 3 405B in f32 is 1.6 TB). parse_fields() refuses more, so sizes and
  /// offsets derived from a header never overflow 64 bits.
  static constexpr int max_checkpoint_log2 = 46;
  /// Validates a header against a file size; exposed for tests and tools.
  static result<config> parse_header(const int32_t raw[7], uint64_t file_size,
                                     const std::string& name);
  /// The field checks of parse_header() alone, without the size check (the
  /// q8_0 loader checks its own size).
  static result<config> parse_fields(const int32_t raw[7], const std::string& name);

private:
  model_file() = default;
  result<void> init(const std::string& name, load_options opts);

  config cfg_;
  std::string path_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  bool mapped_ = false;
  bool swapped_ = false;
  bool sparse_ = false;  // from_sparse(): anonymous memory, no file behind it
  std::vector<uint8_t> owned_;
  // The file's own bytes when the image is converted in place (file_image()).
  void keep_original();  // call before converting base_ in place
  bool in_place_ = false;
  const uint8_t* original_ = nullptr;
  uint8_t* original_map_ = nullptr;  // open(): read-only mapping of the file, size_ bytes
  std::vector<uint8_t> original_copy_;  // from_bytes(): the bytes before conversion
  const float* emb_ = nullptr;
  const float* layers_ = nullptr;
  const float* rms_final_ = nullptr;
  const float* rope_factors_ = nullptr;
  const float* wcls_ = nullptr;
  mutable uint64_t digest_ = 0;
  mutable bool have_digest_ = false;
  // q8_0 files (filled by q8_reader, model/quant.cpp).
  friend class q8_reader;
  bool quantized_ = false;
  q8_matrix q8_emb_, q8_cls_;
  std::vector<q8_layer_view> q8_layers_;
  std::vector<layer_view> q8_norms_;  // per layer: the norm pointers, matrices null
  // GGUF files (model/gguf_model.cpp).
  result<void> init_gguf(const std::string& name, load_options opts);
  std::shared_ptr<const gguf::file> gguf_;
  std::vector<typed_layer_view> t_layers_;
  tensor_view t_emb_, t_cls_;
  std::vector<layer_view> g_layers_;  // norms always; f32 matrices when the tensor is F32
  std::vector<moe_layer_view> m_layers_;  // experts, shared expert, biases (when present)
  bool non_f32_ = false;
  std::vector<std::vector<uint8_t>> converted_;  // f32 copies of non-F32 norms
};

/// Expected size in bytes of a checkpoint with this config (header, weights,
/// RoPE tables, classifier when unshared).
uint64_t checkpoint_bytes(const config& c);

bool host_is_big_endian();

}  // namespace cellshard::model
