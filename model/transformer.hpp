// model/transformer.hpp: the Llama block as functions of (weights slice, KV
// cache, activations), following llama2.c run.c's forward() step by step.
//
// A slice_spec says which part of the model one shard computes: a layer range
// (pipeline parallelism) and, within those layers, a range of KV heads with
// their query heads and a range of FFN hidden units (tensor parallelism). The
// whole model is the slice with every layer, head and unit.
//
// For tensor parallelism each shard returns *partial* dim-vectors (its heads'
// share of wo·attn, its units' share of w2·ffn); the caller sums the partials
// of a group in a fixed shard order and adds them to the residual stream.
// With a single whole slice that is exactly run.c's x += wo·xb.
//
// Ownership: shard_weights is immutable and shared (std::shared_ptr<const>);
// it keeps the model_file alive. kv_cache and scratch are per session and
// owned by whoever runs the session (not thread-safe; one user at a time).
#pragma once

#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/config.hpp"
#include "model/result.hpp"

#include <memory>
#include <string>
#include <vector>

namespace cellshard::model {

enum class weight_format { f32, q8_0, q4_0 };
const char* to_string(weight_format f);
result<weight_format> parse_weight_format(const std::string& s);
/// "exact" or "ggml" (the --matmul flag; kernels::matmul_mode).
result<kernels::matmul_mode> parse_matmul_mode(const std::string& s);

struct slice_spec {
  int layer_begin = 0, layer_end = 0;      // layers [begin, end)
  int kv_head_begin = 0, kv_head_end = 0;  // KV heads; query heads are kv * kv_mul
  int ffn_begin = 0, ffn_end = 0;          // FFN hidden units
  bool embedding = false;                  // holds the token embedding table
  bool classifier = false;                 // holds the final norm and classifier
  /// The classifier rows (vocabulary ids) [vocab_begin, vocab_end) this slice
  /// computes logits for; vocab_end == 0 means the whole vocabulary. A tensor
  /// group's last stage splits the vocabulary over its ranks (issue #19).
  int vocab_begin = 0, vocab_end = 0;
  /// Mixture of experts under an expert placement (issue #23,
  /// topologies/placement.hpp). `routed` false: the slice holds no routed
  /// expert of its layers (a stage shard: attention, router, shared expert).
  /// `experts` non-empty: an expert node -- of its layers only these routed
  /// experts, whole (units [ffn_begin, ffn_end) must be all of them), and
  /// nothing else (no attention, norms, router or shared expert); the other
  /// experts' matrices are empty (rows 0).
  bool routed = true;
  std::vector<int> experts;
  bool expert_only() const { return !experts.empty(); }
  /// True when the slice holds routed expert e's matrices.
  bool holds_expert(int e) const;

  static slice_spec whole(const config& c);
  int n_layers() const { return layer_end - layer_begin; }
  int n_kv_heads() const { return kv_head_end - kv_head_begin; }
  int ffn_units() const { return ffn_end - ffn_begin; }
  /// The classifier rows as [begin, end) for a model of `vocab` tokens.
  int vocab_first() const { return vocab_end == 0 ? 0 : vocab_begin; }
  int vocab_rows(int vocab) const { return vocab_end == 0 ? vocab : vocab_end - vocab_begin; }
  std::string to_string() const;
};

/// A weight matrix [rows x cols] in f32 (a view with row stride ld, possibly
/// into the mapped file) or q8_0 (an owned, row-padded block array).
/// A typed matrix (GGUF tensors in their own type): `data` is set, row r
/// starts at data + r * stride bytes, type says the element type.
struct matrix {
  const float* f32 = nullptr;
  const kernels::q8_block* q8 = nullptr;
  const uint8_t* data = nullptr;
  kernels::dtype type = kernels::dtype::f32;
  std::size_t stride = 0;
  const kernels::q4_block* q4 = nullptr;  // q4_0 quantized at load (--weights q4_0)
  int rows = 0, cols = 0, ld = 0;
  uint64_t bytes() const;
};

/// out[rows] = m · x[cols] with the backend's f32, q8 or typed kernel;
/// `mode` applies to typed matrices and to q8_0/q4_0 quantized at load (those
/// go through the backend's typed slot under ggml when cols is a multiple of
/// 32, the typed slot's block rule; otherwise the q8/q4 slot multiplies them
/// exactly); an f32 view always multiplies exactly.
void matvec(const kernels::backend& be, float* out, const matrix& m, const float* x,
            kernels::matmul_mode mode = kernels::matmul_mode::exact);

/// The same product for n vectors: out[j*ldo + r] = row r of m times
/// X[j*ldx ...] for j in [0, n). Uses the backend's batched slot
/// (backend::matmul*) when it has one, else its matvec n times; either way
/// bit-identical to n matvec() calls (prefill in chunks, issue #18).
void matmul(const kernels::backend& be, float* out, int ldo, const matrix& m, const float* X,
            int ldx, int n, kernels::matmul_mode mode = kernels::matmul_mode::exact);

class shard_weights {
public:
  struct layer {
    const float* rms_att;     // [dim]
    matrix wq;                // [n_heads_local*head_size x dim]
    matrix wk, wv;            // [n_kv_local*head_size x dim]
    matrix wo;                // [dim x n_heads_local*head_size] (column slice)
    const float* rms_ffn;     // [dim]
    matrix w1, w3;            // [units x dim] (dense models)
    matrix w2;                // [dim x units] (column slice)
    // Mixture of experts (config::moe(); model/moe.hpp). Every shard of a
    // layer holds the whole router and, of every routed expert, the same
    // units [ffn_begin, ffn_end) as a dense slice (the partial sums add up
    // as for a dense FFN); the shared expert, whole, only on the shard whose
    // slice starts at unit 0 (sw1.rows == 0 elsewhere and when absent).
    matrix router;                   // [n_experts x dim], never quantized at load
    std::vector<matrix> ew1, ew3;    // per expert [units x dim]
    std::vector<matrix> ew2;         // per expert [dim x units] (column slice)
    matrix sw1, sw3;                 // shared expert [shared_hidden x dim]
    matrix sw2;                      // [dim x shared_hidden]
    const float* shared_gate = nullptr;  // [dim]: sigmoid(shared_gate . x) scales sw2's output
    // Q/K/V biases (qwen2, qwen2moe), this slice's rows; null when absent.
    const float* bq = nullptr;
    const float* bk = nullptr;
    const float* bv = nullptr;
  };

  /// Builds the slice `spec` of `file`. Errors when the spec is out of the
  /// model's range. For an f32 file, q8_0 and q4_0 quantize the slice's matrices at
  /// load time (each row of a column slice from the slice's first column);
  /// the embedding table stays f32 and a shared classifier gets a q8 copy.
  /// A q8_0 file (model_file::quantized()) is always q8_0, whatever `fmt`:
  /// row slices view the file's blocks in place; a column slice (wo, w2 under
  /// tensor parallelism) copies whole blocks when it starts on a 32-column
  /// block boundary and ends on one or at the row's end, else dequantizes
  /// that slice and re-quantizes it (a second rounding, that slice only). The
  /// shard holding the embedding keeps a dequantized f32 table of it, because
  /// embedding() hands out f32 rows (counted in bytes()).
  ///
  /// A GGUF file with a non-F32 matrix keeps every matrix in its type
  /// (tensor_view) whatever `fmt`: row slices view the file in place, and so
  /// do column slices (wo, w2) that start and end on block boundaries; a
  /// column slice that does not is dequantized to f32 for that shard (exact,
  /// more memory; under `ggml` that slice is then not rounded).
  /// `matmul` is the --matmul mode; matmul_mode::count means the file's
  /// default (model_file::default_matmul()).
  static result<std::shared_ptr<const shard_weights>> make(
      std::shared_ptr<const model_file> file, slice_spec spec,
      weight_format fmt = weight_format::f32,
      kernels::matmul_mode matmul = kernels::matmul_mode::count);
  kernels::matmul_mode matmul() const { return matmul_; }

  const config& cfg() const { return file_->cfg(); }
  const slice_spec& spec() const { return spec_; }
  weight_format format() const { return fmt_; }
  const model_file& file() const { return *file_; }
  const layer& at(int l) const { return layers_[l - spec_.layer_begin]; }
  /// The token embedding table [vocab x dim] in f32: the file's for an f32
  /// file; for a q8_0 file the dequantized table when spec().embedding, else
  /// nullptr. embed() works in every case.
  const float* embedding() const { return emb_f32_.empty() ? file_->token_embedding() : emb_f32_.data(); }
  /// out[dim] = the embedding row of `token` (0 <= token < vocab).
  void embed(int token, float* out) const;
  const float* rms_final() const { return file_->rms_final(); }
  const matrix& classifier() const { return wcls_; }  // [vocab rows of the slice x dim]
  int n_heads_local() const { return spec_.n_kv_heads() * cfg().kv_mul(); }
  /// Bytes of weights this shard holds or reads (its slice only).
  uint64_t bytes() const { return bytes_; }

private:
  static result<std::shared_ptr<const shard_weights>> make_q8(std::shared_ptr<shard_weights> w);
  static result<std::shared_ptr<const shard_weights>> make_typed(std::shared_ptr<shard_weights> w);
  kernels::matmul_mode matmul_ = kernels::matmul_mode::exact;
  std::vector<std::vector<float>> owned_f32_;  // typed files: column slices off block boundaries

  std::shared_ptr<const model_file> file_;
  slice_spec spec_;
  weight_format fmt_ = weight_format::f32;
  std::vector<layer> layers_;
  matrix wcls_;
  matrix emb_;                    // [vocab x dim]: the file's f32 table or q8 blocks
  std::vector<float> emb_f32_;    // q8_0 file, spec.embedding: dequantized table
  std::vector<std::vector<kernels::q8_block>> owned_;  // q8_0 storage
  std::vector<std::vector<kernels::q4_block>> owned_q4_;  // q4_0 storage (quantized at load)
  uint64_t bytes_ = 0;
};

/// Per-session KV cache of a slice: for each of the slice's layers, seq_len
/// rows of kv_dim_local floats for K and for V. Rows are written by position,
/// so re-running a position overwrites it (replay is idempotent).
class kv_cache {
public:
  kv_cache() = default;
  kv_cache(int n_layers, int seq_len, int kv_dim);
  float* key(int layer_local, int pos) { return k_.data() + offset(layer_local, pos); }
  float* value(int layer_local, int pos) { return v_.data() + offset(layer_local, pos); }
  const float* key(int layer_local, int pos) const { return k_.data() + offset(layer_local, pos); }
  const float* value(int layer_local, int pos) const { return v_.data() + offset(layer_local, pos); }
  int n_layers() const { return n_layers_; }
  int seq_len() const { return seq_len_; }
  int kv_dim() const { return kv_dim_; }
  uint64_t bytes() const { return (k_.size() + v_.size()) * sizeof(float); }
  /// The rows of positions [from, to) of every layer (K then V per layer),
  /// for checkpoints; restore() writes them back.
  std::vector<float> rows(int from, int to) const;
  void restore(int from, int to, const std::vector<float>& data);

private:
  size_t offset(int l, int pos) const {
    return (static_cast<size_t>(l) * seq_len_ + pos) * kv_dim_;
  }
  int n_layers_ = 0, seq_len_ = 0, kv_dim_ = 0;
  std::vector<float> k_, v_;
};

/// Scratch buffers sized for one slice (reused across steps). The *_n
/// buffers hold a batch of positions (the *_batch functions); batch(n) grows
/// them to n positions.
struct scratch {
  explicit scratch(const shard_weights& w);
  std::vector<float> xb, q, attn, att, hb, hb2, partial;
  // Mixture of experts: router probabilities [n_experts], one expert's output
  // [dim], the chosen experts and their weights [n_experts_used].
  std::vector<float> router, expert_out, route_w;
  std::vector<int> route_ids;
  std::vector<float> xb_n, q_n, attn_n, hb_n, hb2_n, partial_n;
  void batch(int n);

private:
  int dim_ = 0, nq_ = 0, units_ = 0;
};

/// Attention half of layer `l` at position `pos`: rmsnorm(x), this slice's
/// Q/K/V, RoPE, K/V written to the cache, attention, then partial = wo_slice
/// · attn. x [dim] is read only; partial [dim] is written.
void attention_partial(const kernels::backend& be, const shard_weights& w, int l,
                       const float* x, int pos, kv_cache& kv, scratch& s, float* partial);

/// The FFN half's input: xb[dim] = rmsnorm(x) with layer l's FFN norm (what
/// ffn_partial feeds its SwiGLU or the MoE block).
void ffn_input(const kernels::backend& be, const shard_weights& w, int l, const float* x, float* xb);

/// FFN half of layer `l`: rmsnorm(x), SwiGLU over this slice's units, partial =
/// w2_slice · h. x [dim] read only; partial [dim] written. For a mixture of
/// experts the SwiGLU is model/moe.hpp's moe_ffn (router, top-k, the chosen
/// experts' slices, the shared expert).
void ffn_partial(const kernels::backend& be, const shard_weights& w, int l, const float* x,
                 scratch& s, float* partial);

/// The attention half for n consecutive positions [pos0, pos0 + n) at once
/// (prefill in chunks): x and partial are [n x dim] row-major. Q, K and V of
/// all n positions are matrix products (each weight row read once), K and V
/// go to the cache, then each position attends over the cache up to itself
/// (causal within the chunk), then partial = wo_slice times the n outputs.
/// Bit-identical to n attention_partial() calls in position order: every
/// per-position operation is the same, only their interleaving differs.
void attention_partial_batch(const kernels::backend& be, const shard_weights& w, int l,
                             const float* x, int pos0, int n, kv_cache& kv, scratch& s,
                             float* partial);

/// The FFN half for n positions: x, partial [n x dim]; bit-identical to n
/// ffn_partial() calls (a mixture of experts is exactly those n calls: each
/// position routes to its own experts).
void ffn_partial_batch(const kernels::backend& be, const shard_weights& w, int l, const float* x,
                       int n, scratch& s, float* partial);

/// stage_forward() for n consecutive positions at once, x [n x dim] in place;
/// bit-identical to n stage_forward() calls in position order.
void stage_forward_batch(const kernels::backend& be, const shard_weights& w, float* x, int pos0,
                         int n, kv_cache& kv, scratch& s);

/// Runs every layer of a whole-head/whole-FFN slice (a pipeline stage) on x
/// [dim] in place at position pos.
void stage_forward(const kernels::backend& be, const shard_weights& w, float* x, int pos,
                   kv_cache& kv, scratch& s);

/// Final RMSNorm and classifier: logits [the slice's vocab rows] from x [dim]
/// (x is modified); logits[i] is the logit of token spec().vocab_first() + i.
void classify(const kernels::backend& be, const shard_weights& w, float* x, float* logits);

/// The single-process engine: one whole slice, one KV cache. forward() is
/// run.c's forward(): logits of the token at pos. Not thread-safe.
class engine {
public:
  engine(std::shared_ptr<const shard_weights> w, const kernels::backend& be);
  const float* forward(int token, int pos);
  /// Feeds positions [pos0, pos0 + n) with tokens[0..n) in chunks of
  /// batch_size() positions (stage_forward_batch) and returns the logits
  /// [vocab] of the last one (valid until the next call). With `all_logits`
  /// [n x vocab] set, every position's logits are written there as well
  /// (the classifier as one batched product per chunk). Bit-identical to n
  /// forward() calls. n >= 1.
  const float* prefill(const int* tokens, int n, int pos0, float* all_logits = nullptr);
  /// Positions per prefill chunk (--batch-size); at least 1. Default 32.
  void set_batch_size(int n) { batch_size_ = n < 1 ? 1 : n; }
  int batch_size() const { return batch_size_; }
  const config& cfg() const { return w_->cfg(); }
  const shard_weights& weights() const { return *w_; }

private:
  std::shared_ptr<const shard_weights> w_;
  const kernels::backend* be_;
  kv_cache kv_;
  scratch s_;
  std::vector<float> x_, logits_;
  std::vector<float> xn_;  // [batch x dim] residual streams of a prefill chunk
  int batch_size_ = 32;
};

}  // namespace cellshard::model
