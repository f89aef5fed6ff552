// model/config.hpp: the hyper-parameters of a Llama-family model, as stored in
// a llama2.c checkpoint header (run.c `Config`), plus what GGUF files add:
// norm and RoPE constants and the mixture-of-experts fields. Plain value type.
#pragma once

#include <cstdint>
#include <string>

namespace cellshard::model {

struct config {
  int dim = 0;          // transformer width
  int hidden_dim = 0;   // FFN hidden units
  int n_layers = 0;
  int n_heads = 0;      // query heads
  int n_kv_heads = 0;   // key/value heads (grouped-query attention)
  int vocab_size = 0;   // always positive here; the file's sign is shared_classifier
  int seq_len = 0;      // maximum context length (positions)
  bool shared_classifier = true;  // classifier weights = token embedding table
  // From GGUF metadata (llama2.c files have no such fields: run.c's constants).
  float rms_eps = 1e-5f;          // RMSNorm epsilon (llama.attention.layer_norm_rms_epsilon)
  float rope_theta = 10000.0f;    // RoPE base (llama.rope.freq_base)

  // Mixture of experts (GGUF only; 0 experts = a dense model). With experts,
  // hidden_dim is the FFN width of one routed expert, and every layer's FFN
  // is the MoE block of model/moe.hpp.
  int n_experts = 0;       // routed experts per layer (ARCH.expert_count)
  int n_experts_used = 0;  // experts chosen per token (ARCH.expert_used_count)
  int shared_hidden = 0;   // FFN width of the shared expert (qwen2moe), 0 = none
  /// Renormalise the chosen experts' weights to sum to 1 (llama.cpp does for
  /// Mixtral-style llama models, not for qwen2moe).
  bool norm_topk = true;
  /// Q, K and V have bias vectors (qwen2, qwen2moe; any GGUF whose layer 0
  /// has attn_q.bias). NEOX RoPE (qwen2, qwen2moe) is chosen by `arch`
  /// (model/transformer.cpp: q and k reordered per position, weights as stored).
  bool qkv_bias = false;
  std::string arch = "llama";  // general.architecture ("llama" for llama2.c files)

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_size(); }
  int kv_mul() const { return n_heads / n_kv_heads; }
  bool moe() const { return n_experts > 0; }

  /// Floats of weights per layer (attention norm, wq, wk, wv, wo, ffn norm, w1, w2, w3;
  /// for MoE: the router, every expert's w1/w2/w3, the shared expert and its
  /// gate vector, the Q/K/V biases).
  uint64_t layer_params() const {
    const uint64_t d = dim, h = hidden_dim, kv = kv_dim();
    const uint64_t attn = d + d * d + 2 * d * kv + d * d + d + (qkv_bias ? d + 2 * kv : 0);
    if (!moe()) return attn + 3 * d * h;
    const uint64_t e = n_experts, sh = shared_hidden;
    return attn + d * e + 3 * d * h * e + (sh ? 3 * d * sh + d : 0);
  }
  /// Floats of the weights one token reads per layer (the chosen experts only).
  uint64_t active_layer_params() const {
    if (!moe()) return layer_params();
    const uint64_t d = dim, h = hidden_dim;
    return layer_params() - 3 * d * h * static_cast<uint64_t>(n_experts - n_experts_used);
  }
  /// Floats of all weights the model uses (embedding, layers, final norm, and
  /// the classifier when unshared). Excludes the unused RoPE tables.
  uint64_t total_params() const {
    const uint64_t emb = static_cast<uint64_t>(vocab_size) * dim;
    return emb + layer_params() * n_layers + dim + (shared_classifier ? 0 : emb);
  }
  /// KV-cache bytes for `positions` positions over all layers (f32 K and V).
  uint64_t kv_cache_bytes(int positions) const {
    return 2ull * n_layers * static_cast<uint64_t>(positions) * kv_dim() * sizeof(float);
  }

  std::string to_string() const;
};

}  // namespace cellshard::model
