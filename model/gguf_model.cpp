// model_file for GGUF files of the `llama`, `qwen2` and `qwen2moe`
// architectures: the config from metadata, the tensors by their GGUF names,
// kept in their type.
//
// Names and shapes (ggml order ne = {cols, rows}; llama.cpp's llama-arch):
//   token_embd.weight {dim, vocab}, output_norm.weight {dim},
//   output.weight {dim, vocab} (absent: tied to token_embd),
//   blk.N.attn_norm.weight {dim}, blk.N.attn_q.weight {dim, dim},
//   blk.N.attn_k.weight / attn_v.weight {dim, kv_dim},
//   blk.N.attn_output.weight {dim, dim}, blk.N.ffn_norm.weight {dim},
//   blk.N.ffn_gate.weight (w1) / ffn_up.weight (w3) {dim, hidden},
//   blk.N.ffn_down.weight (w2) {hidden, dim}.
// llama.cpp's converters store Q and K rows already permuted into the
// adjacent-pair RoPE order run.c uses, so no permutation is applied here.
//
// Mixture of experts (llama.cpp's llama-arch and llama-model tensor lists):
// ARCH.expert_count E, ARCH.expert_used_count K, and per layer
//   blk.N.ffn_gate_inp.weight {dim, E} (the router),
//   blk.N.ffn_gate_exps.weight / ffn_up_exps.weight {dim, hidden, E},
//   blk.N.ffn_down_exps.weight {hidden, dim, E}
// in place of ffn_gate/ffn_up/ffn_down. Architecture `qwen2moe` adds
//   qwen2moe.expert_feed_forward_length (hidden; else feed_forward_length / K),
//   qwen2moe.expert_shared_feed_forward_length (S; else feed_forward_length),
//   blk.N.ffn_gate_inp_shexp.weight {dim}, blk.N.ffn_gate_shexp.weight /
//   ffn_up_shexp.weight {dim, S}, blk.N.ffn_down_shexp.weight {S, dim},
//   blk.N.attn_q.bias {dim}, attn_k.bias / attn_v.bias {kv_dim},
// and uses NEOX RoPE (a head's dimension i pairs with i + head_size/2, where
// llama's pairs are adjacent): the weights stay as the file stores them and
// the engine reorders each position's q and k (after the biases) so that
// element 2i holds dimension i and 2i+1 dimension i + head_size/2 before the
// pairwise RoPE kernels (neox_rope in model/transformer.cpp, chosen by
// config::arch); q.k is unchanged because q and k get the same permutation.
// qwen2moe's top-k weights are not renormalised (config::norm_topk).
//
// Architecture `qwen2` (Qwen2, Qwen2.5) is llama's dense layer with
// qwen2moe's attention: the same keys under `qwen2.`, attn_q/attn_k/attn_v
// biases and NEOX RoPE. Q/K/V biases are applied
// for any architecture whose layer 0 has attn_q.bias (llama.cpp's llama graph
// adds them when present too); any other bias tensor is refused.
#include "model/checkpoint.hpp"
#include "model/gguf.hpp"
#include "model/gguf_model.hpp"

#include <cmath>
#include <cstring>
#include <sstream>
#include <unordered_set>
#include <xxhash.h>

namespace cellshard::model {

namespace {

std::string shape_text(uint64_t cols, uint64_t rows) {
  return rows ? "[" + std::to_string(cols) + ", " + std::to_string(rows) + "]"
              : "[" + std::to_string(cols) + "]";
}

}  // namespace

const char* model_file::format_name() const {
  if (gguf_) return "gguf";
  if (quantized_) return "csq8";
  return "llama2.c";
}

kernels::matmul_mode model_file::default_matmul() const {
  return non_f32_ ? kernels::matmul_mode::ggml : kernels::matmul_mode::exact;
}

result<void> model_file::init_gguf(const std::string& name, load_options opts) {
  gguf::open_options go;
  go.force_swap = opts.force_swap;
  // The reader parses the model's own image (mapped, owned or sparse): its
  // tensor pointers point into base_, which is writable when the host must
  // convert (model_file::open maps the file privately then).
  auto gr = gguf::file::from_view(base_, size_, name, go);
  if (!gr) return gr.err();
  gguf_ = *gr;
  const gguf::file& g = *gguf_;
  if (g.swapped()) {
    // Each tensor the loader uses is converted in place, once (to_host
    // below). The digest and file_image() stay the file's own bytes, the same
    // on every host: the digest is taken now, file_image() is a second,
    // read-only mapping of the file (open()), a copy (from_bytes()) or
    // nothing (a sparse slice image).
    swapped_ = true;
    digest_ = XXH64(base_, size_, 0);
    have_digest_ = true;
    keep_original();
  }

  // llama.cpp's ggml-vocab-*.gguf files carry a tokenizer and no tensor:
  // "missing tensor token_embd.weight" did not say why.
  if (g.tensors().empty())
    return make_error(name + ": a vocabulary-only GGUF (tokenizer keys, no tensors): there are no weights to run; "
                             "expected a model file (`tokenize -m` and `inspect` read vocabulary-only files)");
  auto arch = g.get_string("general.architecture");
  if (!arch) return arch.err();
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen2moe")
    return make_error(name + ": unsupported architecture " + *arch +
                      " (general.architecture; cellshard runs llama, qwen2 and qwen2moe)");
  const std::string a = *arch + ".";
  const bool qwen = *arch == "qwen2moe";

  // Positive integer keys, bounded like the llama2.c header fields.
  constexpr int64_t limit = 1 << 24;
  auto need = [&](const std::string& key, int* out) -> result<void> {
    auto v = g.get_int(key);
    if (!v) return v.err();
    if (*v <= 0 || *v > limit)
      return make_error(name + ": key " + key + " is " + std::to_string(*v) +
                        ", expected a positive value below " + std::to_string(limit));
    *out = static_cast<int>(*v);
    return {};
  };
  config c;
  c.arch = *arch;
  for (auto r : {need(a + "embedding_length", &c.dim), need(a + "block_count", &c.n_layers),
                 need(a + "attention.head_count", &c.n_heads),
                 need(a + "context_length", &c.seq_len)})
    if (!r) return r.err();
  // Experts: both counts or neither (qwen2moe always has experts).
  if (qwen || g.has(a + "expert_count")) {
    for (auto r : {need(a + "expert_count", &c.n_experts),
                   need(a + "expert_used_count", &c.n_experts_used)})
      if (!r) return r.err();
    if (c.n_experts_used > c.n_experts)
      return make_error(name + ": key " + a + "expert_used_count is " +
                        std::to_string(c.n_experts_used) + ", expected at most " + a +
                        "expert_count (" + std::to_string(c.n_experts) + ")");
  }
  int ff = 0;
  if (!qwen || !g.has(a + "expert_feed_forward_length") ||
      !g.has(a + "expert_shared_feed_forward_length"))
    if (auto r = need(a + "feed_forward_length", &ff); !r) return r.err();
  c.hidden_dim = ff;
  if (qwen) {
    // llama.cpp's defaults when the expert widths are absent (llama-model.cpp).
    c.hidden_dim = ff / c.n_experts_used;
    c.shared_hidden = ff;
    if (g.has(a + "expert_feed_forward_length"))
      if (auto r = need(a + "expert_feed_forward_length", &c.hidden_dim); !r) return r.err();
    if (g.has(a + "expert_shared_feed_forward_length"))
      if (auto r = need(a + "expert_shared_feed_forward_length", &c.shared_hidden); !r)
        return r.err();
    if (c.hidden_dim <= 0)
      return make_error(name + ": " + a + "feed_forward_length " + std::to_string(ff) + " / " + a +
                        "expert_used_count " + std::to_string(c.n_experts_used) +
                        " leaves no expert width; expected " + a + "expert_feed_forward_length");
    c.norm_topk = false;
  }
  // Q/K/V biases (qwen2, qwen2moe; llama.cpp's llama graph adds them too when
  // a file has them): all three in every layer when layer 0 has attn_q.bias.
  // Any other bias would be ignored silently, so it is refused.
  c.qkv_bias = g.find_tensor("blk.0.attn_q.bias") != nullptr;
  for (const auto& t : g.tensors()) {
    const std::string& n = t.name;
    if (n.size() < 5 || n.compare(n.size() - 5, 5, ".bias") != 0) continue;
    const auto dot = n.rfind('.', n.size() - 6);
    const std::string kind = dot == std::string::npos ? n : n.substr(dot + 1);
    if (kind != "attn_q.bias" && kind != "attn_k.bias" && kind != "attn_v.bias")
      return make_error(name + ": tensor " + n +
                        " is a bias cellshard does not apply (supported: attn_q.bias, attn_k.bias, "
                        "attn_v.bias)");
    if (!c.qkv_bias)
      return make_error(name + ": tensor " + n +
                        " is present but blk.0.attn_q.bias is not: expected Q/K/V biases in every "
                        "layer or in none");
  }
  c.n_kv_heads = c.n_heads;
  if (g.has(a + "attention.head_count_kv")) {
    auto r = need(a + "attention.head_count_kv", &c.n_kv_heads);
    if (!r) return r.err();
  }
  if (g.has(a + "attention.layer_norm_rms_epsilon")) {
    auto e = g.get_f32(a + "attention.layer_norm_rms_epsilon");
    if (!e) return e.err();
    if (!(*e > 0.0f) || !std::isfinite(*e))
      return make_error(name + ": key " + a + "attention.layer_norm_rms_epsilon is " +
                        std::to_string(*e) + ", expected a positive finite value");
    c.rms_eps = *e;
  }
  if (g.has(a + "rope.freq_base")) {
    auto t = g.get_f32(a + "rope.freq_base");
    if (!t) return t.err();
    if (!(*t > 0.0f) || !std::isfinite(*t))
      return make_error(name + ": key " + a + "rope.freq_base is " + std::to_string(*t) +
                        ", expected a positive finite value");
    c.rope_theta = *t;
  }
  if (c.dim % c.n_heads != 0 || c.n_heads % c.n_kv_heads != 0 || c.head_size() % 2 != 0)
    return make_error(name + ": " + a + "embedding_length " + std::to_string(c.dim) +
                      ", head_count " + std::to_string(c.n_heads) + ", head_count_kv " +
                      std::to_string(c.n_kv_heads) +
                      ": expected dim divisible by heads, heads by kv heads, and an even head size");
  if (g.has(a + "rope.dimension_count")) {
    auto rd = g.get_int(a + "rope.dimension_count");
    if (!rd) return rd.err();
    if (*rd != c.head_size())
      return make_error(name + ": key " + a + "rope.dimension_count is " + std::to_string(*rd) +
                        ", expected the head size " + std::to_string(c.head_size()) +
                        " (partial rotary embeddings are not supported)");
  }
  // Any positive finite epsilon and base (checked above) runs:
  // model/transformer.cpp uses the backends' kernels for run.c's 1e-5 and
  // 10000 and parametric reference kernels for other values.

  auto emb_t = g.tensor("token_embd.weight");
  if (!emb_t) return emb_t.err();
  if ((*emb_t)->ne.size() != 2 || (*emb_t)->ne[0] != static_cast<uint64_t>(c.dim))
    return make_error(name + ": tensor token_embd.weight has shape " + (*emb_t)->shape_string() +
                      ", expected [" + std::to_string(c.dim) + ", vocab] (" + a +
                      "embedding_length " + std::to_string(c.dim) + ")");
  const uint64_t vocab = (*emb_t)->ne[1];
  if (const auto* toks = g.find("tokenizer.ggml.tokens"))
    if (toks->type == gguf::value_type::array && toks->count != vocab)
      return make_error(name + ": tokenizer.ggml.tokens has " + std::to_string(toks->count) +
                        " tokens, but token_embd.weight has " + std::to_string(vocab) + " rows");
  if (vocab == 0 || vocab > static_cast<uint64_t>(limit))
    return make_error(name + ": token_embd.weight has " + std::to_string(vocab) + " rows, expected 1.." +
                      std::to_string(limit));
  c.vocab_size = static_cast<int>(vocab);
  c.shared_classifier = g.find_tensor("output.weight") == nullptr;
  if (opts.ctx > 0) c.seq_len = opts.ctx;
  cfg_ = c;

  // A tensor's rows (rows x cols of type dt) to host order, in place, once.
  // A zero row is its own swap and is not written: a sparse slice image's
  // untouched pages stay unallocated.
  std::unordered_set<const uint8_t*> done;
  auto to_host = [&](kernels::dtype dt, const uint8_t* data, uint64_t rows, int cols) {
    if (!done.insert(data).second) return;
    uint8_t* p = base_ + (data - base_);  // base_ is writable here (see above)
    const size_t rb = kernels::row_bytes(dt, cols);
    for (uint64_t r = 0; r < rows; ++r, p += rb) {
      bool zero = true;
      for (size_t i = 0; i < rb && zero; ++i) zero = p[i] == 0;
      if (!zero) kernels::swap_rows(dt, p, 1, cols);
    }
  };
  // Looks up a tensor, checks its shape and type, converts its byte order.
  auto load = [&](const std::string& tname, uint64_t cols, uint64_t rows,
                  tensor_view* out) -> result<void> {
    auto t = g.tensor(tname);
    if (!t) return t.err();
    const gguf::tensor_info& ti = **t;
    const bool shape_ok = rows ? (ti.ne.size() == 2 && ti.ne[0] == cols && ti.ne[1] == rows)
                               : (ti.ne.size() == 1 && ti.ne[0] == cols);
    if (!shape_ok)
      return make_error(name + ": tensor " + tname + " has shape " + ti.shape_string() +
                        ", expected " + shape_text(cols, rows) + " from the metadata (" +
                        c.to_string() + ")");
    kernels::dtype dt;
    if (!kernels::dtype_from_ggml(ti.type, &dt))
      return make_error(name + ": tensor " + tname + " has type " +
                        gguf::ggml_type_name(ti.type) +
                        ", supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
    out->type = dt;
    out->cols = static_cast<int>(cols);
    out->rows = static_cast<int>(rows ? rows : 1);
    out->row_bytes = kernels::row_bytes(dt, out->cols);
    out->data = ti.data;
    if (g.swapped()) to_host(dt, ti.data, static_cast<uint64_t>(out->rows), out->cols);
    if (dt != kernels::dtype::f32 && rows) non_f32_ = true;
    return {};
  };
  // A vector of n floats as f32 (converted when the file stores another type).
  auto vec = [&](const std::string& tname, int n, const float** out) -> result<void> {
    tensor_view v;
    auto r = load(tname, n, 0, &v);
    if (!r) return r;
    if (v.type == kernels::dtype::f32 &&
        reinterpret_cast<uintptr_t>(v.data) % alignof(float) == 0) {
      *out = reinterpret_cast<const float*>(v.data);
      return {};
    }
    converted_.emplace_back(static_cast<size_t>(n) * sizeof(float));
    kernels::dequantize_row(v.type, v.data, reinterpret_cast<float*>(converted_.back().data()), n);
    *out = reinterpret_cast<const float*>(converted_.back().data());
    return {};
  };
  auto norm = [&](const std::string& tname, const float** out) { return vec(tname, c.dim, out); };
  // The 3-D expert tensor {cols, rows, E} as E matrices [rows x cols].
  auto load_experts = [&](const std::string& tname, uint64_t cols, uint64_t rows,
                          std::vector<tensor_view>* out) -> result<void> {
    const gguf::tensor_info* ti = g.find_tensor(tname);
    if (!ti)
      return make_error(name + ": missing tensor " + tname + " (" + a + "expert_count is " +
                        std::to_string(c.n_experts) +
                        ": every layer needs ffn_gate_inp, ffn_gate_exps, ffn_up_exps and "
                        "ffn_down_exps)");
    const uint64_t E = c.n_experts;
    if (ti->ne.size() != 3 || ti->ne[0] != cols || ti->ne[1] != rows || ti->ne[2] != E)
      return make_error(name + ": tensor " + tname + " has shape " + ti->shape_string() +
                        ", expected [" + std::to_string(cols) + ", " + std::to_string(rows) +
                        ", " + std::to_string(E) + "] from the metadata (" + c.to_string() + ")");
    kernels::dtype dt;
    if (!kernels::dtype_from_ggml(ti->type, &dt))
      return make_error(name + ": tensor " + tname + " has type " +
                        gguf::ggml_type_name(ti->type) +
                        ", supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K");
    const size_t rb = kernels::row_bytes(dt, static_cast<int>(cols));
    const uint8_t* data = ti->data;
    if (g.swapped()) to_host(dt, data, rows * E, static_cast<int>(cols));
    out->clear();
    for (uint64_t e = 0; e < E; ++e) {
      tensor_view v;
      v.data = data + e * rows * rb;
      v.type = dt;
      v.rows = static_cast<int>(rows);
      v.cols = static_cast<int>(cols);
      v.row_bytes = rb;
      out->push_back(v);
    }
    if (dt != kernels::dtype::f32) non_f32_ = true;
    return {};
  };
  converted_.reserve(static_cast<size_t>(c.n_layers) * 9 + 4);
  const uint64_t d = c.dim, kv = c.kv_dim(), h = c.hidden_dim;
  if (auto r = load("token_embd.weight", d, vocab, &t_emb_); !r) return r;
  if (c.shared_classifier) {
    t_cls_ = t_emb_;
  } else if (auto r = load("output.weight", d, vocab, &t_cls_); !r) {
    return r;
  }
  if (auto r = norm("output_norm.weight", &rms_final_); !r) return r;
  // Llama 3.1's RoPE scaling: one factor per rotated pair of a head.
  if (g.find_tensor("rope_freqs.weight"))
    if (auto r = vec("rope_freqs.weight", c.head_size() / 2, &rope_factors_); !r) return r;
  auto f32_of = [](const tensor_view& v) {
    return v.type == kernels::dtype::f32 ? reinterpret_cast<const float*>(v.data) : nullptr;
  };
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    typed_layer_view t;
    layer_view v{};
    moe_layer_view m;  // experts (MoE) and Q/K/V biases
    for (auto r : {load(p + "attn_q.weight", d, d, &t.wq), load(p + "attn_k.weight", d, kv, &t.wk),
                   load(p + "attn_v.weight", d, kv, &t.wv),
                   load(p + "attn_output.weight", d, d, &t.wo), norm(p + "attn_norm.weight", &v.rms_att),
                   norm(p + "ffn_norm.weight", &v.rms_ffn)})
      if (!r) return r;
    if (!c.moe()) {
      for (auto r : {load(p + "ffn_gate.weight", d, h, &t.w1), load(p + "ffn_down.weight", h, d, &t.w2),
                     load(p + "ffn_up.weight", d, h, &t.w3)})
        if (!r) return r;
    } else {
      const uint64_t E = c.n_experts, sh = c.shared_hidden;
      if (!g.find_tensor(p + "ffn_gate_inp.weight"))
        return make_error(name + ": missing tensor " + p + "ffn_gate_inp.weight (the router; " + a +
                          "expert_count is " + std::to_string(E) + ")");
      for (auto r : {load(p + "ffn_gate_inp.weight", d, E, &m.router),
                     load_experts(p + "ffn_gate_exps.weight", d, h, &m.w1),
                     load_experts(p + "ffn_down_exps.weight", h, d, &m.w2),
                     load_experts(p + "ffn_up_exps.weight", d, h, &m.w3)})
        if (!r) return r;
      if (sh)
        for (auto r : {vec(p + "ffn_gate_inp_shexp.weight", c.dim, &m.shared_gate),
                       load(p + "ffn_gate_shexp.weight", d, sh, &m.sw1),
                       load(p + "ffn_down_shexp.weight", sh, d, &m.sw2),
                       load(p + "ffn_up_shexp.weight", d, sh, &m.sw3)})
          if (!r) return r;
    }
    if (c.qkv_bias)
      for (auto r : {vec(p + "attn_q.bias", c.dim, &m.bq), vec(p + "attn_k.bias", c.kv_dim(), &m.bk),
                     vec(p + "attn_v.bias", c.kv_dim(), &m.bv)})
        if (!r) return r;
    if (c.moe() || c.qkv_bias) m_layers_.push_back(std::move(m));
    v.wq = f32_of(t.wq);
    v.wk = f32_of(t.wk);
    v.wv = f32_of(t.wv);
    v.wo = f32_of(t.wo);
    v.w1 = f32_of(t.w1);
    v.w2 = f32_of(t.w2);
    v.w3 = f32_of(t.w3);
    t_layers_.push_back(t);
    g_layers_.push_back(v);
  }
  emb_ = f32_of(t_emb_);
  wcls_ = f32_of(t_cls_);
  return {};
}

namespace {

// llama.cpp's llama_ftype for a file whose matrices are mostly `t`
// (general.file_type): MOSTLY_F16 1, MOSTLY_Q4_0 2, MOSTLY_Q8_0 7,
// MOSTLY_Q4_K_S 14, MOSTLY_Q6_K 18, MOSTLY_BF16 32.
uint32_t llama_ftype_of(kernels::dtype t) {
  switch (t) {
    case kernels::dtype::f16: return 1;
    case kernels::dtype::q4_0: return 2;
    case kernels::dtype::q8_0: return 7;
    case kernels::dtype::q4_k: return 14;
    case kernels::dtype::q6_k: return 18;
    case kernels::dtype::bf16: return 32;
    default: return 0;
  }
}

}  // namespace

result<std::vector<uint8_t>> quantize_gguf(const model_file& in, kernels::dtype type) {
  quantize_options o;
  o.type = type;
  o.pure = true;
  return quantize_gguf(in, o);
}

kernels::dtype classifier_type(kernels::dtype type, int64_t cols, bool pure) {
  using kernels::dtype;
  if (pure || type == dtype::f16 || type == dtype::bf16 || type == dtype::q8_0 || type == dtype::f32) return type;
  return cols % kernels::qk_k == 0 ? dtype::q6_k : dtype::q8_0;
}

result<std::vector<uint8_t>> quantize_gguf(const model_file& in, const quantize_options& opt) {
  const kernels::dtype type = opt.type;
  const gguf::file* g = in.gguf();
  if (!g) return make_error(in.path() + ": not a GGUF model (GGUF output needs a GGUF input)");
  if (llama_ftype_of(type) == 0)
    return make_error(std::string("quantize: type ") + kernels::to_string(type) +
                      " cannot be written, expected f16, bf16, q8_0, q4_0, q4_K or q6_K");
  // A converted model's tensors are in host order in its image: read the
  // file's own bytes instead (file_image()), as a file of this host.
  std::shared_ptr<const gguf::file> own;
  if (in.swapped()) {
    if (!in.file_image())
      return make_error(in.path() + ": a slice image converted to this host's byte order cannot be "
                                    "quantized");
    auto r = gguf::file::from_view(in.file_image(), in.file_bytes(), in.path());
    if (!r) return r.err();
    own = *r;
    g = own.get();
  }
  // The output is little-endian, as the file must be: a big-endian host (where
  // every little-endian file is swapped()) converts each row to its order to
  // requantize it and the new blocks back; untouched tensors are the file's bytes.
  const bool be_host = host_is_big_endian();
  if (g->swapped() != be_host)
    return make_error(in.path() + ": quantizing a big-endian GGUF file is not supported");
  // The classifier: output.weight, or the token embedding when it is tied.
  const std::string classifier = g->find_tensor("output.weight") ? "output.weight" : "token_embd.weight";
  const bool k_quant = type == kernels::dtype::q4_k || type == kernels::dtype::q6_k;
  gguf::writer w;
  for (const auto& k : g->keys()) w.copy_value(k, *g->find(k));
  w.set_u32("general.file_type", llama_ftype_of(type));
  w.set_u32("general.quantization_version", 2);
  std::vector<float> row;
  for (const auto& t : g->tensors()) {
    kernels::dtype src;
    // Matrices and 3-D expert tensors; 1-D tensors (norms, biases,
    // rope_freqs) stay as they are, and so do routers (as llama.cpp's
    // quantize keeps ffn_gate_inp: a small matrix whose rounding moves routing).
    const bool router = t.name.find("ffn_gate_inp") != std::string::npos;
    const bool weight_matrix = (t.ne.size() == 2 || t.ne.size() == 3) && !router && t.name.size() > 7 &&
                               t.name.compare(t.name.size() - 7, 7, ".weight") == 0 &&
                               kernels::dtype_from_ggml(t.type, &src);
    const int64_t cols64 = t.ne.empty() ? 0 : static_cast<int64_t>(t.ne[0]);
    const kernels::dtype to = t.name == classifier ? classifier_type(type, cols64, opt.pure) : type;
    if (weight_matrix && k_quant && to != kernels::dtype::q8_0 && cols64 % kernels::qk_k != 0)
      return make_error(
          in.path() + ": tensor " + t.name + " has rows of " + std::to_string(cols64) + " elements; " +
          kernels::to_string(to) + " cannot hold it (its super-blocks are 256 elements: rows must be a multiple of 256). "
          "llama.cpp's llama-quantize writes such a tensor as " +
          (to == kernels::dtype::q4_k ? "q5_0" : "q8_0") +
          " instead (a fallback type); cellshard writes no such mixture: use --type q8_0, q4_0, f16 or bf16 for this model");
    // Rows that are not whole blocks of a 32-block type stay as they are (as
    // llama.cpp's converter leaves stories260K's 172-wide ffn_down in F32).
    if (!weight_matrix || cols64 % kernels::block_elems(to) != 0) {
      w.add_tensor(t.name, t.ne, t.type, std::vector<uint8_t>(t.data, t.data + t.bytes));
      continue;
    }
    const int cols = static_cast<int>(cols64);
    const uint64_t rows = t.rows();
    const size_t in_row = kernels::row_bytes(src, cols), out_row = kernels::row_bytes(to, cols);
    std::vector<uint8_t> out(out_row * rows), in_host(be_host ? in_row : 0);
    row.resize(cols);
    for (uint64_t r = 0; r < rows; ++r) {
      const uint8_t* in_bytes = t.data + r * in_row;
      if (be_host) {
        std::memcpy(in_host.data(), in_bytes, in_row);
        kernels::swap_rows(src, in_host.data(), 1, cols);
        in_bytes = in_host.data();
      }
      kernels::dequantize_row(src, in_bytes, row.data(), cols);
      kernels::quantize_row(to, row.data(), out.data() + r * out_row, cols);
    }
    if (be_host) kernels::swap_rows(to, out.data(), static_cast<int>(rows), cols);
    w.add_tensor(t.name, t.ne, kernels::ggml_type_of(to), std::move(out));
  }
  return w.bytes(g->version() == 2 ? 2 : 3, false, g->alignment());
}

}  // namespace cellshard::model
