// topologies/model_presets.cpp: model shapes for the planner, their counts,
// the presets and the config.json reader.
#include "topologies/model_presets.hpp"

#include "model/checkpoint.hpp"
#include "model/gguf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <map>
#include <cctype>
#include <cmath>

namespace cellshard::topologies {

namespace {

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// A llama2.c-shaped preset (GQA everywhere, dense SwiGLU FFN).
model_spec llama_like(std::string name, int dim, int hidden, int layers, int heads, int kv_heads, int vocab,
                      int context, bool tied, double wbytes, std::string format, std::string source) {
  model_spec m;
  m.name = std::move(name);
  m.source = std::move(source);
  m.dim = dim;
  m.ffn_hidden = hidden;
  m.n_layers = layers;
  m.n_heads = heads;
  m.n_kv_heads = kv_heads;
  m.vocab = vocab;
  m.context = context;
  m.shared_classifier = tied;
  m.weight_bytes = wbytes;
  m.expert_weight_bytes = wbytes;
  m.kv_bytes = wbytes >= 4 ? 4 : 2;  // the runtime keeps an f32 cache; bf16 models a bf16 cache
  m.act_bytes = 4;                    // raw-blob f32 activations (actors/messages.hpp)
  m.format = std::move(format);
  return m;
}

// Stories models run in the runtime's own format: f32 (llama2.c .bin).
model_spec stories(std::string name, int dim, int hidden, int layers, int heads, int kv_heads, int vocab, int ctx,
                   std::string source) {
  return llama_like(std::move(name), dim, hidden, layers, heads, kv_heads, vocab, ctx, true, 4.0, "f32",
                    std::move(source));
}

model_spec kimi_k2() {
  // HARDWARE.md "Models", Kimi K2 (MoonshotAI/Kimi-K2 README): 1.04T total /
  // 32B active; 61 layers (1 dense); hidden 7168; MLA 64 heads; 384 experts,
  // 8 per token, 1 shared, expert FFN 2048; vocab 163,840; context 131,072;
  // block-fp8.
  model_spec m;
  m.name = "kimi-k2";
  m.source = "HARDWARE.md Models: Kimi K2 (MoonshotAI/Kimi-K2 README); MLA ranks and dense FFN from its config.json";
  m.dim = 7168;
  m.n_layers = 61;
  m.vocab = 163840;
  m.context = 131072;
  m.shared_classifier = false;
  m.n_heads = 64;
  m.n_kv_heads = 64;
  // MLA ranks: the DeepSeek-V3 shapes Kimi K2's config.json uses (q_lora 1536,
  // kv_lora 512, nope 128, rope 64, v 128); HARDWARE.md lists the same for K3.
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  // Dense FFN of the one dense layer: intermediate_size 18432 (config.json).
  m.ffn_hidden = 18432;
  m.n_dense_layers = 1;
  m.n_experts = 384;
  m.n_active_experts = 8;
  m.n_shared_experts = 1;
  m.expert_ffn = 2048;
  // block-fp8 (README): 1 byte per weight plus one f32 scale per 128 x 128
  // block (the DeepSeek-V3 fp8 layout; assumption): 1 + 4/16384 bytes.
  m.weight_bytes = 1.0 + 4.0 / 16384.0;
  m.expert_weight_bytes = m.weight_bytes;
  m.kv_bytes = 2;  // bf16 latent cache (assumption)
  m.act_bytes = 4;
  m.format = "fp8 (block scales)";
  m.stated_total_params = 1.04e12;
  m.stated_active_params = 32e9;
  return m;
}

model_spec kimi_k3() {
  // HARDWARE.md "Models", Kimi K3 (NVIDIA NeMo AutoModel kimi-k3 doc;
  // third-party architecture notes): 2.78T total / 104B active; checkpoint 1.56 TB; 93 layers (69
  // KDA + 24 gated MLA); hidden 7168; MLA 96 heads, q_lora 1536, kv_lora 512,
  // nope 128 + rope 64, v 128; 896 routed experts, top-16, 2 shared, expert
  // FFN 3072; vocab 163,840; context 1,048,576; experts MXFP4, rest BF16.
  model_spec m;
  m.name = "kimi-k3";
  m.source =
      "HARDWARE.md Models: Kimi K3 (NVIDIA NeMo AutoModel kimi-k3 doc; third-party architecture notes); "
      "latent width 3584 from FlashInfer's Kimi K3 MoE docs; KDA widths assumed";
  m.dim = 7168;
  m.n_layers = 93;
  m.vocab = 163840;
  m.context = 1048576;
  m.shared_classifier = false;
  m.n_heads = 96;
  m.n_kv_heads = 96;
  m.q_lora_rank = 1536;
  m.kv_lora_rank = 512;
  m.qk_nope_head_dim = 128;
  m.qk_rope_head_dim = 64;
  m.v_head_dim = 128;
  m.mla_output_gate = true;  // "gated MLA"
  // Layer order: groups of three KDA layers then one MLA layer (NeMo doc:
  // "alternates groups of three KDA layers with a Gated MLA"); 23 groups give
  // 69 KDA + 23 MLA, and the 93rd layer is the 24th MLA.
  m.layer_attention.resize(93, attention_kind::kda);
  for (int l = 3; l < 93; l += 4) m.layer_attention[l] = attention_kind::mla;
  m.layer_attention[92] = attention_kind::mla;
  // KDA projection widths: no source gives them. Assumption: 96 heads x 128
  // (as MLA), q/k/v/gate/output projections of 7168 x 12288 each. With this
  // guess the counted active parameters come to ~104.8B against the stated
  // 104B (the check total_params/active_params vs stated is printed).
  m.kda_heads = 96;
  m.kda_head_dim = 128;
  // KDA state per layer per sequence: unknown (HARDWARE.md: "treat as a
  // parameter"). Default: an f32 matrix of head x head per head
  // (96 x 128 x 128 x 4 bytes = 6 MiB), fixed in context.
  m.kda_state_bytes = 96.0 * 128 * 128 * 4;
  // Dense FFN of the first layer: intermediate_size 18432 (NeMo KimiK3TextConfig
  // default); one dense layer then MoE (first_k_dense_replace = 1 as Kimi
  // K2 / Kimi Linear; third-party notes count 92 MoE layers).
  m.ffn_hidden = 18432;
  m.n_dense_layers = 1;
  m.n_experts = 896;
  m.n_active_experts = 16;
  m.n_shared_experts = 2;
  m.expert_ffn = 3072;
  // Latent MoE: routed experts run at width 3584 (FlashInfer Kimi K3 MoE docs:
  // "routed hidden size 3584, intermediate size 3072, top-16"), so one expert
  // is 3 x 3584 x 3072 = 33.0M weights and 92 x 896 of them are 2.72T: the
  // bulk of the stated 2.78T.
  m.expert_dim = 3584;
  // MXFP4 (OCP MX): 32 E2M1 4-bit values + one 8-bit E8M0 scale = 17 bytes
  // per 32 weights; everything else BF16.
  m.expert_weight_bytes = 17.0 / 32.0;
  m.weight_bytes = 2;
  m.kv_bytes = 2;
  m.act_bytes = 4;
  m.format = "bf16 + mxfp4 experts";
  // HARDWARE.md: 2.78T total (marketed as 2.8T), ~104B active.
  m.stated_total_params = 2.78e12;
  m.stated_active_params = 104e9;
  return m;
}

double flt(const nlohmann::json& j, const char* key, double fallback) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return fallback;
  if (it->is_number()) return it->get<double>();
  if (it->is_boolean()) return it->get<bool>() ? 1 : 0;
  return fallback;
}

}  // namespace

std::string to_string(attention_kind k) {
  switch (k) {
    case attention_kind::gqa: return "gqa";
    case attention_kind::mla: return "mla";
    case attention_kind::kda: return "kda";
    case attention_kind::count: break;
  }
  return "?";
}

attention_kind model_spec::attention_of(int layer) const {
  if (!layer_attention.empty() && layer >= 0 && layer < static_cast<int>(layer_attention.size())) {
    return layer_attention[static_cast<size_t>(layer)];
  }
  return kv_lora_rank > 0 ? attention_kind::mla : attention_kind::gqa;
}

double attention_params(const model_spec& m, int layer) {
  const double d = m.dim;
  const double norms = 2 * d;  // attention norm + FFN norm
  switch (m.attention_of(layer)) {
    case attention_kind::gqa: {
      const double hw = m.head_width();
      return d * m.n_heads * hw + 2 * d * m.n_kv_heads * hw + m.n_heads * hw * d + norms;
    }
    case attention_kind::mla: {
      const double h = m.n_heads, qk = m.qk_nope_head_dim + m.qk_rope_head_dim;
      const double q = m.q_lora_rank > 0 ? d * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * h * qk : d * h * qk;
      const double kv_a = d * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank;
      const double kv_b = static_cast<double>(m.kv_lora_rank) * h * (m.qk_nope_head_dim + m.v_head_dim);
      const double o = h * m.v_head_dim * d;
      const double gate = m.mla_output_gate ? d * h * m.v_head_dim : 0;
      return q + kv_a + kv_b + o + gate + norms;
    }
    case attention_kind::kda: {
      // q, k, v, gate and output projections (assumption; see kimi_k3()).
      const double w = static_cast<double>(m.kda_heads) * m.kda_head_dim;
      return 5 * d * w + norms;
    }
    case attention_kind::count: break;
  }
  return 0;
}

double dense_ffn_params(const model_spec& m) { return 3.0 * m.dim * m.ffn_hidden; }

double expert_params(const model_spec& m) { return m.is_moe() ? 3.0 * m.routed_dim() * m.expert_ffn : 0; }

double moe_dense_params(const model_spec& m) {
  if (!m.is_moe()) return 0;
  const double d = m.dim;
  const double shared = m.n_shared_experts * 3.0 * d * m.expert_ffn;
  const double router = d * m.n_experts;
  const double latent = m.routed_dim() != m.dim ? 2.0 * d * m.routed_dim() : 0;
  return shared + router + latent;
}

double layer_dense_params(const model_spec& m, int layer) {
  return attention_params(m, layer) + (m.moe_layer(layer) ? moe_dense_params(m) : dense_ffn_params(m));
}

double layer_routed_params(const model_spec& m, int layer) {
  return m.moe_layer(layer) ? m.n_experts * expert_params(m) : 0;
}

double embedding_params(const model_spec& m) { return static_cast<double>(m.vocab) * m.dim; }
double classifier_params(const model_spec& m) { return m.shared_classifier ? 0 : embedding_params(m); }

double total_params(const model_spec& m) {
  double t = embedding_params(m) + classifier_params(m) + m.dim;  // + final norm
  for (int l = 0; l < m.n_layers; ++l) t += layer_dense_params(m, l) + layer_routed_params(m, l);
  return t;
}

double active_params(const model_spec& m) {
  double t = embedding_params(m) + classifier_params(m) + m.dim;
  for (int l = 0; l < m.n_layers; ++l) {
    t += layer_dense_params(m, l);
    if (m.moe_layer(l)) t += m.n_active_experts * expert_params(m);
  }
  return t;
}

double expert_bytes(const model_spec& m) { return expert_params(m) * m.expert_weight_bytes; }

double weight_bytes_total(const model_spec& m) {
  double routed = 0;
  for (int l = 0; l < m.n_layers; ++l) routed += layer_routed_params(m, l);
  return (total_params(m) - routed) * m.weight_bytes + routed * m.expert_weight_bytes;
}

double kv_bytes_per_position(const model_spec& m, int layer) {
  switch (m.attention_of(layer)) {
    case attention_kind::gqa: return 2.0 * m.n_kv_heads * m.head_width() * m.kv_bytes;
    case attention_kind::mla: return static_cast<double>(m.kv_lora_rank + m.qk_rope_head_dim) * m.kv_bytes;
    case attention_kind::kda: return 0;
    case attention_kind::count: break;
  }
  return 0;
}

double state_bytes(const model_spec& m, int layer) {
  return m.attention_of(layer) == attention_kind::kda ? m.kda_state_bytes : 0;
}

double sequence_cache_bytes(const model_spec& m, int positions) {
  double t = 0;
  for (int l = 0; l < m.n_layers; ++l) t += kv_bytes_per_position(m, l) * positions + state_bytes(m, l);
  return t;
}

double attention_flops(const model_spec& m, int layer, int positions) {
  const double p = positions;
  switch (m.attention_of(layer)) {
    case attention_kind::gqa: return 4.0 * m.n_heads * m.head_width() * p;
    case attention_kind::mla: return 2.0 * m.n_heads * (2.0 * m.kv_lora_rank + m.qk_rope_head_dim) * p;
    case attention_kind::kda: return 4.0 * m.kda_heads * static_cast<double>(m.kda_head_dim) * m.kda_head_dim;
    case attention_kind::count: break;
  }
  return 0;
}

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names{"stories260k", "stories15m", "stories42m", "stories110m", "llama2-7b",
                                              "llama3-8b",   "llama3-70b", "kimi-k2",    "kimi-k3"};
  return names;
}

result<model_spec> find_model_preset(std::string_view name_in) {
  const std::string name = lower(name_in);
  // llama2.c README model table (HARDWARE.md "Models"); stories260K from
  // llama2.c doc/stories260K.md. f32, tied classifier.
  const std::string llama2c = "HARDWARE.md Models: llama2.c README model table";
  if (name == "stories260k")
    return stories("stories260k", 64, 172, 5, 8, 4, 512, 512, "HARDWARE.md Models: llama2.c doc/stories260K.md");
  if (name == "stories15m") return stories("stories15m", 288, 768, 6, 6, 6, 32000, 256, llama2c);
  if (name == "stories42m") return stories("stories42m", 512, 1376, 8, 8, 8, 32000, 1024, llama2c);
  if (name == "stories110m") return stories("stories110m", 768, 2048, 12, 12, 12, 32000, 1024, llama2c);
  // Llama 2/3 (HARDWARE.md "Models": HF config); BF16 weights as published,
  // untied classifier; context = max_position_embeddings of the HF config.
  if (name == "llama2-7b")
    return llama_like("llama2-7b", 4096, 11008, 32, 32, 32, 32000, 4096, false, 2.0, "bf16",
                      "HARDWARE.md Models: Llama 2 7B (HF config)");
  if (name == "llama3-8b")
    return llama_like("llama3-8b", 4096, 14336, 32, 32, 8, 128256, 8192, false, 2.0, "bf16",
                      "HARDWARE.md Models: Llama 3 8B (HF config)");
  if (name == "llama3-70b")
    return llama_like("llama3-70b", 8192, 28672, 80, 64, 8, 128256, 8192, false, 2.0, "bf16",
                      "HARDWARE.md Models: Llama 3 70B (HF config)");
  if (name == "kimi-k2") return kimi_k2();
  if (name == "kimi-k3") return kimi_k3();
  std::string valid;
  for (const auto& n : model_preset_names()) valid += (valid.empty() ? "" : ", ") + n;
  return make_error("unknown model preset '" + std::string(name_in) + "' (expected one of: " + valid +
                    ", or the path of a config.json or model file)");
}

model_spec spec_from_config(const model::config& cfg, std::string name) {
  model_spec m = stories(std::move(name), cfg.dim, cfg.hidden_dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
                         cfg.vocab_size, cfg.seq_len, "llama2.c header");
  m.shared_classifier = cfg.shared_classifier;
  return m;
}

result<model_spec> spec_from_model_file(const std::string& path) {
  auto f = model::model_file::open(path);
  if (!f) return f.err();
  const model::model_file& mf = **f;
  const model::config& c = mf.cfg();
  model_spec m = spec_from_config(c, path);
  std::string notes;
  if (c.moe()) {
    m.ffn_hidden = 0;
    m.n_experts = c.n_experts;
    m.n_active_experts = c.n_experts_used;
    m.expert_ffn = c.hidden_dim;
    m.n_shared_experts = c.shared_hidden > 0 ? 1 : 0;
    m.n_dense_layers = 0;
    if (c.shared_hidden > 0 && c.shared_hidden != c.hidden_dim)
      notes += "; its shared expert (" + std::to_string(c.shared_hidden) + " wide) counted at the routed width " +
               std::to_string(c.hidden_dim);
  }
  if (c.qkv_bias) notes += "; Q/K/V biases not counted";
  if (const model::gguf::file* g = mf.gguf()) {
    double other_bytes = 0, other_elems = 0, expert_bytes_sum = 0, expert_elems = 0;
    std::map<std::string, double> by_type;  // bytes of each ggml type
    for (const auto& t : g->tensors()) {
      const bool expert = t.name.find("_exps") != std::string::npos;
      (expert ? expert_bytes_sum : other_bytes) += static_cast<double>(t.bytes);
      (expert ? expert_elems : other_elems) += static_cast<double>(t.elements());
      by_type[model::gguf::ggml_type_name(t.type)] += static_cast<double>(t.bytes);
    }
    if (other_elems > 0) m.weight_bytes = other_bytes / other_elems;
    m.expert_weight_bytes = expert_elems > 0 ? expert_bytes_sum / expert_elems : m.weight_bytes;
    // "GGUF Q4_K 71% + Q6_K 21% + F32 8% of bytes", largest first.
    std::vector<std::pair<double, std::string>> types;
    double all = 0;
    for (const auto& [name, b] : by_type) {
      types.emplace_back(b, name);
      all += b;
    }
    std::sort(types.rbegin(), types.rend());
    m.format = "GGUF";
    for (size_t i = 0; i < types.size(); ++i) {
      char pct[32];
      const double share = all > 0 ? 100 * types[i].first / all : 0.0;
      std::snprintf(pct, sizeof pct, share < 1 ? " %.2g%%" : " %.0f%%", share);
      m.format += (i ? " + " : " ") + types[i].second + pct;
    }
    m.format += " of bytes";
    char avg[64];
    std::snprintf(avg, sizeof avg, "; %.2f bits per weight", 8 * m.weight_bytes);
    m.source = path + " (GGUF " + c.arch + " metadata and tensor types" + avg + notes + ")";
  } else {
    if (mf.quantized()) {
      // CSQ8: every matrix in ggml Q8_0 blocks, norms f32; as one average over the weights.
      const double norms = static_cast<double>(c.n_layers) * 2 * c.dim + c.dim;
      const double all = total_params(m);
      m.weight_bytes = ((all - norms) * 34.0 / 32.0 + norms * 4) / all;
      m.expert_weight_bytes = m.weight_bytes;
      m.format = "q8_0";
    }
    m.source = path + " (llama2.c header" + std::string(mf.quantized() ? ", CSQ8 q8_0" : ", f32") + notes + ")";
  }
  return m;
}

result<model_spec> spec_from_hf_json(const std::string& text, const std::string& name) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    return make_error(name + ": not JSON (" + std::string(e.what()) + ")");
  }
  if (!root.is_object()) return make_error(name + ": expected a JSON object of Hugging Face config keys");
  const nlohmann::json& j = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;
  model_spec m;
  m.name = name;
  m.source = name + " (Hugging Face config keys)";
  auto need = [&](const char* key) -> result<int> {
    const double v = flt(j, key, -1);
    if (v <= 0) return make_error(name + ": missing or non-positive key '" + std::string(key) + "'");
    return static_cast<int>(v);
  };
  for (const char* key : {"hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size"}) {
    auto v = need(key);
    if (!v) return v.err();
  }
  m.dim = static_cast<int>(flt(j, "hidden_size", 0));
  m.n_layers = static_cast<int>(flt(j, "num_hidden_layers", 0));
  m.n_heads = static_cast<int>(flt(j, "num_attention_heads", 0));
  m.n_kv_heads = static_cast<int>(flt(j, "num_key_value_heads", m.n_heads));
  m.head_dim = static_cast<int>(flt(j, "head_dim", 0));
  m.vocab = static_cast<int>(flt(j, "vocab_size", 0));
  m.context = static_cast<int>(flt(j, "max_position_embeddings", 4096));
  m.shared_classifier = flt(j, "tie_word_embeddings", 0) != 0;
  m.ffn_hidden = static_cast<int>(flt(j, "intermediate_size", 0));
  m.n_experts = static_cast<int>(flt(j, "n_routed_experts", flt(j, "num_experts", 0)));
  m.n_active_experts = static_cast<int>(flt(j, "num_experts_per_tok", flt(j, "num_experts_per_token", 0)));
  m.n_shared_experts = static_cast<int>(flt(j, "n_shared_experts", flt(j, "num_shared_experts", 0)));
  m.expert_ffn = static_cast<int>(flt(j, "moe_intermediate_size", 0));
  m.expert_dim = static_cast<int>(flt(j, "routed_expert_hidden_size", 0));
  m.n_dense_layers = m.n_experts > 0 ? static_cast<int>(flt(j, "first_k_dense_replace", 0)) : m.n_layers;
  m.q_lora_rank = static_cast<int>(flt(j, "q_lora_rank", 0));
  m.kv_lora_rank = static_cast<int>(flt(j, "kv_lora_rank", 0));
  m.qk_rope_head_dim = static_cast<int>(flt(j, "qk_rope_head_dim", 0));
  m.qk_nope_head_dim = static_cast<int>(flt(j, "qk_nope_head_dim", m.kv_lora_rank > 0 ? 128 : 0));
  m.v_head_dim = static_cast<int>(flt(j, "v_head_dim", m.kv_lora_rank > 0 ? m.qk_nope_head_dim : 0));
  if (m.n_experts > 0 && (m.n_active_experts <= 0 || m.expert_ffn <= 0)) {
    return make_error(name + ": a mixture of experts needs num_experts_per_tok and moe_intermediate_size");
  }
  if (m.n_experts == 0 && m.ffn_hidden <= 0) return make_error(name + ": missing key 'intermediate_size'");
  if (j.contains("linear_attn_config") && j["linear_attn_config"].is_object()) {
    const auto& la = j["linear_attn_config"];
    m.kda_heads = static_cast<int>(flt(la, "num_heads", m.n_heads));
    m.kda_head_dim = static_cast<int>(flt(la, "head_dim", 128));
    m.kda_state_bytes = static_cast<double>(m.kda_heads) * m.kda_head_dim * m.kda_head_dim * 4;
    if (la.contains("kda_layers") && la["kda_layers"].is_array()) {
      m.layer_attention.assign(static_cast<size_t>(m.n_layers),
                               m.kv_lora_rank > 0 ? attention_kind::mla : attention_kind::gqa);
      for (const auto& v : la["kda_layers"]) {
        if (!v.is_number_integer()) continue;
        const int l = v.get<int>() - 1;  // 1-based in the Kimi configs
        if (l >= 0 && l < m.n_layers) m.layer_attention[static_cast<size_t>(l)] = attention_kind::kda;
      }
    }
  }
  std::string dtype;
  for (const char* key : {"torch_dtype", "dtype"}) {
    if (j.contains(key) && j[key].is_string()) dtype = lower(j[key].get<std::string>());
    else if (root.contains(key) && root[key].is_string()) dtype = lower(root[key].get<std::string>());
    if (!dtype.empty()) break;
  }
  const double wb = dtype == "float32" ? 4.0 : 2.0;
  m.weight_bytes = m.expert_weight_bytes = wb;
  m.kv_bytes = wb;
  m.act_bytes = 4;
  m.format = dtype.empty() ? "bf16 (assumed)" : dtype;
  return m;
}

result<model_spec> with_weight_format(model_spec m, std::string_view format_in) {
  const std::string f = lower(format_in);
  double b = 0;
  if (f == "native" || f.empty()) return m;
  if (f == "f32") b = 4;
  else if (f == "bf16" || f == "f16") b = 2;
  else if (f == "q8_0") b = 34.0 / 32.0;  // ggml Q8_0 block: 32 int8 + f16 scale (placement.hpp)
  else if (f == "mxfp4") b = 17.0 / 32.0;  // OCP MX: 32 x 4 bit + 8-bit shared scale
  else return make_error("--weights '" + std::string(format_in) + "': expected native, f32, bf16, f16, q8_0 or mxfp4");
  m.weight_bytes = m.expert_weight_bytes = b;
  m.format = f;
  return m;
}

}  // namespace cellshard::topologies
