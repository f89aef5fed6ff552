// topologies/model_presets.hpp: the shape of a model as the planner sees it,
// big mixtures of experts included, and the named presets of `cellshard plan
// --model` (CLI.md; issue #10).
//
// A model_spec is a plain value: widths, layer kinds (GQA, MLA, KDA), dense
// and expert FFNs, number formats. Parameter counts, bytes and FLOPs are
// derived from it by the free functions below; nothing is stored twice.
// Unlike model::config (a llama2.c header), a spec can describe Kimi K2/K3:
// multi-head latent attention, Kimi Delta Attention, routed + shared experts,
// latent MoE.
//
// Sources: every preset cites /work/shared/docs/HARDWARE.md's "Models" table
// and, where that table is silent, names the other source and marks our own
// arithmetic "derived" or a guess "assumption" (a parameter: override it with
// a config.json). Thread safety: pure functions over values. Errors are
// cellshard::result values naming the preset, file or key.
#pragma once

#include "model/config.hpp"
#include "model/result.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cellshard::topologies {

/// The token mixer of one layer.
enum class attention_kind {
  gqa,  // softmax attention with (grouped) KV heads; KV cache grows with context
  mla,  // multi-head latent attention: one compressed (kv_lora + rope) vector per position
  kda,  // Kimi Delta Attention: linear attention, fixed-size recurrent state per sequence
  count
};
static_assert(static_cast<int>(attention_kind::count) == 3, "update to_string(attention_kind)");
std::string to_string(attention_kind k);

struct model_spec {
  std::string name;    // preset name or the config file
  std::string source;  // where the numbers come from (one line)

  // Shape.
  int dim = 0;         // hidden size (residual width)
  int n_layers = 0;
  int vocab = 0;
  int context = 0;     // maximum context, positions
  bool shared_classifier = true;  // classifier = embedding table (tied)

  // GQA attention: query heads, KV heads, head width (0 = dim / n_heads).
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;

  // MLA (DeepSeek-V3 / Kimi): q_lora_rank 0 = full-rank queries.
  int q_lora_rank = 0;
  int kv_lora_rank = 0;
  int qk_nope_head_dim = 0;
  int qk_rope_head_dim = 0;
  int v_head_dim = 0;
  bool mla_output_gate = false;  // sigmoid gate before the output projection (K3 "gated MLA")

  // KDA: heads and head width of the q/k/v/g/o projections; recurrent state
  // bytes per layer per sequence (fixed, not growing with context).
  int kda_heads = 0;
  int kda_head_dim = 0;
  double kda_state_bytes = 0;

  /// Attention kind of every layer (size n_layers); empty = all gqa, or all
  /// mla when kv_lora_rank > 0.
  std::vector<attention_kind> layer_attention;

  // FFN (SwiGLU-style: three matrices per FFN).
  int ffn_hidden = 0;       // dense FFN hidden units
  int n_dense_layers = 0;   // the first layers with a dense FFN (all layers when n_experts == 0)
  int n_experts = 0;        // routed experts per MoE layer
  int n_active_experts = 0; // routed experts per token (top-k)
  int n_shared_experts = 0; // experts every token uses
  int expert_ffn = 0;       // hidden units of one routed or shared expert
  int expert_dim = 0;       // routed experts' input width (latent MoE); 0 = dim

  // Number formats, bytes per element.
  double weight_bytes = 4;         // every weight except the routed experts
  double expert_weight_bytes = 4;  // routed experts
  double kv_bytes = 4;             // KV-cache elements
  double act_bytes = 4;            // activations on the wire (the runtime's raw blobs are f32)
  std::string format;              // "f32", "bf16", "bf16 + mxfp4 experts", ... (display)

  // Figures the model's authors state, for a cross-check (0 = none).
  double stated_total_params = 0;
  double stated_active_params = 0;

  bool is_moe() const { return n_experts > 0; }
  int head_width() const { return head_dim > 0 ? head_dim : (n_heads > 0 ? dim / n_heads : 0); }
  int routed_dim() const { return expert_dim > 0 ? expert_dim : dim; }
  attention_kind attention_of(int layer) const;
  /// True when `layer` has routed experts (MoE) rather than a dense FFN.
  bool moe_layer(int layer) const { return is_moe() && layer >= n_dense_layers; }
  int moe_layers() const { return is_moe() ? n_layers - n_dense_layers : 0; }
};

// ---------------------------------------------------------------------------
// Derived counts (parameters are counts of weights; bytes use the formats).

/// Weights of the attention block of `layer` (projections + norms of the layer: 2 x dim).
double attention_params(const model_spec& m, int layer);
/// Weights of a dense FFN (3 x dim x ffn_hidden).
double dense_ffn_params(const model_spec& m);
/// Weights of one routed expert: 3 x routed_dim x expert_ffn.
double expert_params(const model_spec& m);
/// Weights of an MoE layer besides its routed experts: shared experts
/// (3 x dim x expert_ffn each), router (dim x n_experts), latent down/up
/// projections (2 x dim x expert_dim when expert_dim != dim).
double moe_dense_params(const model_spec& m);
/// Weights of `layer` every token reads (attention + dense FFN or MoE dense part), excluding routed experts.
double layer_dense_params(const model_spec& m, int layer);
/// Routed expert weights stored in `layer` (n_experts x expert_params; 0 for a dense layer).
double layer_routed_params(const model_spec& m, int layer);
double embedding_params(const model_spec& m);   // vocab x dim
double classifier_params(const model_spec& m);  // vocab x dim, 0 when tied
double total_params(const model_spec& m);
/// Weights one token uses: everything but the routed experts not chosen.
/// The embedding table counts in full (as model authors count it).
double active_params(const model_spec& m);
/// Stored bytes of all weights.
double weight_bytes_total(const model_spec& m);
/// Bytes of one routed expert.
double expert_bytes(const model_spec& m);

/// KV-cache bytes one position adds in `layer`: GQA 2 x kv_heads x head x kv_bytes;
/// MLA (kv_lora + rope) x kv_bytes (one latent vector shared by all heads); KDA 0.
double kv_bytes_per_position(const model_spec& m, int layer);
/// Fixed per-sequence state of `layer` (KDA), bytes.
double state_bytes(const model_spec& m, int layer);
/// KV cache + state of one sequence at `positions`, all layers, bytes.
double sequence_cache_bytes(const model_spec& m, int positions);
/// FLOPs of attention over `positions` cached positions in `layer` for one
/// token (scores + weighted sum: 4 x heads x width x positions; MLA with the
/// latent absorbed: 2 x heads x (2 x kv_lora + rope) x positions; KDA: the
/// state update and read, 4 x heads x head^2).
double attention_flops(const model_spec& m, int layer, int positions);

/// The presets of `plan --model`: stories260k, stories15m, stories42m,
/// stories110m, llama2-7b, llama3-8b, llama3-70b, kimi-k2, kimi-k3.
const std::vector<std::string>& model_preset_names();
/// The preset called `name` (case-insensitive); error lists the valid names.
result<model_spec> find_model_preset(std::string_view name);

/// A spec from a llama2.c header (f32, the runtime's format): the same weights
/// model::config counts (total_params(spec) == cfg.total_params()).
model_spec spec_from_config(const model::config& cfg, std::string name);

/// A spec from a model file the runtime runs (`plan -m FILE`): a GGUF file
/// (llama, qwen2, qwen2moe) or a llama2.c / CSQ8 .bin, opened as `run` opens
/// it (model::model_file::open: mapped, nothing computed). The shape is the
/// file's config (spec_from_config; MoE: its experts, experts per token, expert
/// width, one shared expert when it has one, every layer MoE). The formats
/// are the file's own: weight_bytes = bytes / weights of every tensor that
/// is not a routed expert (names with `_exps`), expert_weight_bytes the same
/// over the routed experts' tensors, so weight_bytes_total(spec) equals the
/// file's tensor bytes when its tensors are the ones the spec counts (a
/// mixed-type file: its average, per class); llama2.c f32: 4 bytes, CSQ8:
/// 34/32 for the matrices. Approximations, named in `source`: a qwen2moe
/// shared expert of another width than the routed ones is counted at the
/// routed width; Q/K/V biases are not counted (dim + 2 kv_dim per layer).
/// Errors: the loader's, naming the file and field.
result<model_spec> spec_from_model_file(const std::string& path);

/// A spec from Hugging Face config.json text. Keys: hidden_size,
/// intermediate_size, num_hidden_layers, num_attention_heads,
/// num_key_value_heads, vocab_size, head_dim, max_position_embeddings,
/// tie_word_embeddings; MoE: n_routed_experts | num_experts,
/// num_experts_per_tok | num_experts_per_token, moe_intermediate_size,
/// n_shared_experts | num_shared_experts, first_k_dense_replace,
/// routed_expert_hidden_size; MLA: q_lora_rank, kv_lora_rank,
/// qk_nope_head_dim, qk_rope_head_dim, v_head_dim; KDA:
/// linear_attn_config {kda_layers (1-based), num_heads, head_dim};
/// torch_dtype | dtype (float32 -> 4 bytes, else 2). A "text_config" object
/// is read instead of the top level when present. Errors name the missing key.
result<model_spec> spec_from_hf_json(const std::string& json_text, const std::string& name);

/// The spec adjusted to weights stored as `format`: "native" (unchanged), f32,
/// bf16, f16, q8_0 (34/32 bytes), mxfp4 (4.25 bits: 17/32 bytes). Applies to
/// dense and expert weights alike.
result<model_spec> with_weight_format(model_spec m, std::string_view format);

}  // namespace cellshard::topologies
