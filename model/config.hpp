// model/config.hpp: the hyper-parameters of a Llama-family model, as stored in
// a llama2.c checkpoint header (run.c `Config`). Plain value type.
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

  int head_size() const { return dim / n_heads; }
  int kv_dim() const { return n_kv_heads * head_size(); }
  int kv_mul() const { return n_heads / n_kv_heads; }

  /// Floats of weights per layer (attention norm, wq, wk, wv, wo, ffn norm, w1, w2, w3).
  uint64_t layer_params() const {
    const uint64_t d = dim, h = hidden_dim, kv = kv_dim();
    return d + d * d + 2 * d * kv + d * d + d + 3 * d * h;
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
